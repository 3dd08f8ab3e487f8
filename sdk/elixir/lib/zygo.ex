defmodule Zygo.Defapi do
  @moduledoc false
  # `defapi name(args) do … end` defines the function and its `!` twin, which returns the
  # value or raises the Zygo.Error.

  defmacro defapi(call, do: body) do
    {name, meta, args} = call
    bang = :"#{name}!"

    plain_args =
      Enum.map(args, fn
        {:\\, _, [v, _]} -> v
        v -> v
      end)

    quote do
      def unquote(call), do: unquote(body)

      @doc "Like `#{unquote(name)}/#{unquote(length(args))}`, returning the value or raising `Zygo.Error`."
      def unquote({bang, meta, args}), do: Zygo.bang(unquote(name)(unquote_splicing(plain_args)))
    end
  end
end

defmodule Zygo do
  @moduledoc """
  A client for the Zygo HTTP API.

      client = Zygo.connect()                      # ZYGO_API_URL, ZYGO_API_TOKEN
      {:ok, out} = Zygo.call(client, "resize", %{"url" => "…"}, timeout: 5_000)
      IO.inspect({out.result, out.stdout, out.metrics.wall_ms})

  Every call returns `{:ok, value}` or `{:error, %Zygo.Error{}}` and has a `!` twin that
  returns the value or raises. Durations (`timeout:`, `backoff:`, `retry_after`) are
  milliseconds. The streams (`stream/4`, `stream_script/5`) yield an error as their last
  element instead; their `!` twins raise it after the output before it.

  A client that should live as long as your application goes under your supervisor:

      children = [{Zygo, name: MyApp.Zygo, url: "unix:///run/zygo/api.sock", retries: 3}]
      Zygo.functions!(Zygo.client(MyApp.Zygo))

  No dependencies: `:gen_tcp` (unix sockets included) and `:ssl`, and the standard
  library's JSON where Elixir has one (1.18+), else a small strict codec of its own.
  """

  alias Zygo.{Client, Error, JSON, Pool}
  alias Zygo.HTTP
  alias Zygo.HTTP.Op
  import Zygo.Defapi

  @version "0.1.5"

  @connect_opts [:url, :token, :retries, :backoff, :retry_busy, :timeout, :tenant, :pool_size, :ssl, :name]

  # ---- connecting --------------------------------------------------------------------------

  @doc """
  A client with its pool started and linked to the caller. Options: `url` (else
  `ZYGO_API_URL`, else `http://127.0.0.1:7700`; `unix:///path`, `http://`, `https://` or
  `host:port`), `token` (else `ZYGO_API_TOKEN`), `retries` (default 0), `backoff` (ms,
  default 1000), `retry_busy` (default true: past `retries`, a request refused as busy is
  sent again after the server's Retry-After, 1 s without one and each wait at most 5 s,
  for up to 30 s after it was first sent and never past its timeout; false returns the
  busy error as it comes), `timeout` (ms, the default wait of a call), `tenant`,
  `pool_size` (default 32), `ssl` (extra `:ssl.connect/4` options). Raises
  `ArgumentError` on a bad address. Nothing is connected until the first request.
  """
  @spec connect(String.t() | keyword) :: Client.t()
  def connect(opts \\ [])
  def connect(url) when is_binary(url), do: connect(url, [])
  def connect(opts) when is_list(opts), do: connect(Keyword.get(opts, :url), opts)

  @spec connect(String.t() | nil, keyword) :: Client.t()
  def connect(url, opts) do
    client = new_client(Keyword.put(opts, :url, url))
    {:ok, pid} = Pool.start_link(client: client)
    %{client | pool: pid}
  end

  @doc "A child spec: `{Zygo, name: MyApp.Zygo, url: …}` under your supervisor."
  def child_spec(opts) do
    name = Keyword.fetch!(opts, :name)
    %{id: {Zygo, name}, start: {Zygo, :start_link, [opts]}, type: :worker}
  end

  @doc "Starts a named client's pool; `client/1` fetches the client."
  def start_link(opts) do
    name = Keyword.fetch!(opts, :name)
    client = %{new_client(opts) | pool: name}
    Pool.start_link(client: client, name: name)
  end

  @doc "The client a supervised `{Zygo, name: name, …}` child holds."
  @spec client(GenServer.name()) :: Client.t()
  def client(name), do: GenServer.call(name, :client)

  @doc "A view acting for tenant `id` (the `X-Zygo-Tenant` header): a new struct, the same pool."
  @spec for_tenant(Client.t(), String.t()) :: Client.t()
  def for_tenant(%Client{} = client, id) when is_binary(id) and id != "", do: %{client | tenant: id}

  @doc "Closes a client started by `connect/2` (its pool and idle connections)."
  def close(%Client{pool: pool}) when is_pid(pool), do: GenServer.stop(pool)

  defp new_client(opts) do
    for {k, _} <- opts, k not in @connect_opts do
      raise ArgumentError, "unknown option #{inspect(k)}; the options are #{inspect(@connect_opts)}"
    end

    address =
      case Zygo.Address.parse(opts[:url]) do
        {:ok, a} -> a
        {:error, message} -> raise ArgumentError, message
      end

    token =
      case Keyword.fetch(opts, :token) do
        {:ok, t} -> t
        :error -> System.get_env("ZYGO_API_TOKEN") |> then(&if(&1 in [nil, ""], do: nil, else: &1))
      end

    retries = Keyword.get(opts, :retries, 0)
    backoff = Keyword.get(opts, :backoff, 1_000)

    unless is_integer(retries) and retries >= 0 and is_integer(backoff) and backoff >= 0 do
      raise ArgumentError, "retries and backoff (milliseconds) are non-negative integers"
    end

    retry_busy = Keyword.get(opts, :retry_busy, true)

    unless is_boolean(retry_busy) do
      raise ArgumentError, "retry_busy is true or false"
    end

    base = [{"Host", address.host_header}, {"User-Agent", "zygo-sdk-elixir/#{@version}"}]
    base = if token, do: base ++ [{"Authorization", "Bearer " <> token}], else: base

    %Client{
      address: address,
      base_headers: base,
      tenant: opts[:tenant],
      retries: retries,
      backoff: backoff,
      retry_busy: retry_busy,
      timeout: opts[:timeout],
      pool_size: Keyword.get(opts, :pool_size, 32),
      ssl: Keyword.get(opts, :ssl, []),
      sleep: &Process.sleep/1,
      clock: fn -> System.monotonic_time(:millisecond) end
    }
  end

  # ---- one function and its ! twin per route -----------------------------------------------

  @doc false
  def bang({:ok, v}), do: v
  def bang({:error, %Error{} = e}), do: raise(e)

  defp send_op(client, fields), do: HTTP.send_op(client, struct!(Op, fields))
  defp json(v), do: JSON.encode!(v)
  defp seg(s) when is_binary(s) and s != "", do: URI.encode(s, &URI.char_unreserved?/1)
  defp seg(s), do: raise(ArgumentError, "expected a non-empty name, got #{inspect(s)}")

  defp digest(%{sha256: d}), do: digest(d)
  defp digest(d) when is_binary(d) and d != "", do: d
  defp digest(d), do: raise(ArgumentError, "expected a digest (\"sha256:…\"), got #{inspect(d)}")

  defp list(key, fun) do
    fn
      %{^key => items} when is_list(items) -> Enum.map(items, fun)
      _ -> throw({:zygo_error, %Error{message: "the answer has no #{inspect(key)} list"}})
    end
  end

  defp duration(nil), do: nil
  defp duration(s) when is_binary(s), do: s

  defp duration(ms) when is_integer(ms) and ms > 0,
    do: if(rem(ms, 1000) == 0, do: "#{div(ms, 1000)}s", else: "#{ms}ms")

  defp duration(v),
    do:
      raise(
        ArgumentError,
        "a duration is a positive number of milliseconds or a string like \"30s\", got #{inspect(v)}"
      )

  # -- host --

  @doc "`GET /healthz` (no token): `%{\"status\" => \"ok\" | \"degraded\", …}`; `:unavailable` once stopping."
  defapi health(client) do
    send_op(client, method: "GET", path: "/healthz")
  end

  @doc "`GET /version`."
  defapi version(client) do
    send_op(client, method: "GET", path: "/version")
  end

  @doc "`POST /drain` (deploy rights); `grace:` in milliseconds (default 30 s)."
  defapi drain(client, opts \\ []) do
    grace = Keyword.get(opts, :grace, 30_000)

    send_op(client,
      method: "POST",
      path: "/drain",
      body: json(%{"grace" => if(rem(grace, 1000) == 0, do: div(grace, 1000), else: grace / 1000)}),
      wait: grace + 30_000
    )
  end

  # -- functions --

  @doc "`GET /fn`: the functions and pools the caller can see."
  defapi functions(client) do
    send_op(client, method: "GET", path: "/fn", decode: list("functions", &Zygo.FunctionInfo.from_json/1))
  end

  @doc "`PUT /fn/{name}` (deploy rights): serve a function from a layer; `base_dir:`."
  defapi serve(client, name, layer, opts \\ []) do
    body = %{"layer" => layer}
    body = if opts[:base_dir], do: Map.put(body, "base_dir", opts[:base_dir]), else: body
    send_op(client, method: "PUT", path: "/fn/" <> seg(name), body: json(body), wait: 600_000)
  end

  @doc "`DELETE /fn/{name}` (deploy rights)."
  defapi stop(client, name) do
    send_op(client, method: "DELETE", path: "/fn/" <> seg(name), wait: 120_000)
  end

  @doc """
  `POST /fn/{name}`: call a warm function. Options: `timeout:` (ms), `key:` (for
  `cancel/2`), `workspace:` (a blob digest), `out: true` (the directory comes back as a
  tar in `result.workspace`).
  """
  defapi call(client, name, event \\ nil, opts \\ []) do
    send_op(client,
      method: "POST",
      path: "/fn/" <> seg(name),
      query: ws_query(opts),
      body: json(event),
      timeout: opts[:timeout],
      key: opts[:key],
      decode: &Zygo.Result.from_json/1,
      cancellable: true
    )
  end

  defp ws_query(opts) do
    q =
      case opts[:workspace] do
        nil ->
          []

        %{inline: _} ->
          raise ArgumentError, "a warm function's workspace is a blob digest (put_blob the tar first)"

        %{"inline" => _} ->
          raise ArgumentError, "a warm function's workspace is a blob digest (put_blob the tar first)"

        ws ->
          [{"workspace", digest(ws)}]
      end

    if opts[:out], do: q ++ [{"out", "1"}], else: q
  end

  @doc "`POST /fn/{name}/batch`: a `%Zygo.Result{}` or `%Zygo.Error{}` per event, in order."
  defapi batch(client, name, events, opts \\ []) do
    send_op(client,
      method: "POST",
      path: "/fn/" <> seg(name) <> "/batch",
      body: json(%{"events" => Enum.to_list(events)}),
      timeout: opts[:timeout],
      key: opts[:key],
      decode: list("results", &batch_element/1),
      cancellable: true
    )
  end

  defp batch_element(%{"status" => 200} = d), do: Zygo.Result.from_json(d)
  defp batch_element(%{"status" => s} = d) when is_integer(s), do: Error.from_answer(s, d)
  defp batch_element(%{"error" => _} = d), do: Error.from_answer(500, d)
  defp batch_element(d), do: Zygo.Result.from_json(d)

  @doc "`DELETE /requests/{key}`: cancel the caller's requests under `key`; how many."
  defapi cancel(client, key) do
    send_op(client,
      method: "DELETE",
      path: "/requests/" <> seg(key),
      decode: fn
        %{"cancelled" => n} when is_integer(n) -> n
        _ -> 0
      end
    )
  end

  @doc "`GET /fn/{name}/logs`; `limit:` (default 100)."
  defapi logs(client, name, opts \\ []) do
    limit = Keyword.get(opts, :limit, 100)

    send_op(client,
      method: "GET",
      path: "/fn/#{seg(name)}/logs",
      query: [{"limit", Integer.to_string(limit)}],
      decode: list("logs", & &1)
    )
  end

  @doc "`GET /fn/{name}/stats`."
  defapi stats(client, name) do
    send_op(client, method: "GET", path: "/fn/#{seg(name)}/stats")
  end

  @doc "`POST /fn/{name}/warm`: start zygotes until `n` are ready."
  defapi warm(client, name, n \\ 1) do
    send_op(client, method: "POST", path: "/fn/#{seg(name)}/warm", body: json(%{"n" => n}), wait: 300_000)
  end

  @doc """
  `POST /run` (deploy rights): run `cmd` once. Options: `image`, `mem`, `cpu`, `pids`,
  `timeout` (the sandbox's deadline: ms or "30s"), `scratch`, `network`, `allow` (with
  `network: "egress"`, the "host:port" destinations it may reach), `env`, `stdin`, `key`,
  `wait` (ms the API waits before a 408; default the deadline plus 10 s).
  """
  defapi run(client, cmd, opts \\ []) do
    unless is_list(cmd) and cmd != [], do: raise(ArgumentError, "cmd is a non-empty list of strings")

    body =
      for k <- [:image, :mem, :cpu, :pids, :timeout, :scratch, :network, :allow, :env, :stdin],
          opts[k] != nil,
          into: %{"cmd" => cmd} do
        {Atom.to_string(k), if(k == :timeout, do: duration(opts[k]), else: opts[k])}
      end

    wait = opts[:wait] || if(is_integer(opts[:timeout]), do: opts[:timeout] + 10_000)

    send_op(client,
      method: "POST",
      path: "/run",
      body: json(body),
      timeout: wait,
      key: opts[:key],
      decode: &Zygo.RunResult.from_json/1,
      cancellable: true
    )
  end

  # -- runtime pools --

  @doc "`GET /runtimes`: the pools the caller can see."
  defapi runtimes(client) do
    send_op(client, method: "GET", path: "/runtimes", decode: list("runtimes", &Zygo.FunctionInfo.from_json/1))
  end

  @doc """
  `POST /runtimes` (deploy rights): declare a pool from a layer. Options: `base_dir`,
  `secrets` (names each call gets from the calling tenant's store), `deps` (an id).
  """
  defapi serve_runtime(client, name, layer, opts \\ []) do
    layer = Map.new(layer, fn {k, v} -> {to_string(k), v} end)
    layer = if opts[:secrets], do: Map.put(layer, "secrets", opts[:secrets]), else: layer

    layer =
      case opts[:deps] do
        nil -> layer
        %{id: id} -> Map.put(layer, "deps", id)
        id -> Map.put(layer, "deps", id)
      end

    body = %{"name" => name, "layer" => layer}
    body = if opts[:base_dir], do: Map.put(body, "base_dir", opts[:base_dir]), else: body
    send_op(client, method: "POST", path: "/runtimes", body: json(body), wait: 600_000)
  end

  @doc "`DELETE /runtimes/{name}` (deploy rights)."
  defapi stop_runtime(client, name) do
    send_op(client, method: "DELETE", path: "/runtimes/" <> seg(name), wait: 120_000)
  end

  @doc """
  `POST /runtimes/{runtime}/call`: run a registered script (its digest or `%Zygo.Script{}`)
  with `event`, or pass `nil` and `source:`. Options: `timeout`, `key`, `workspace`
  (`%{"inline" => base64}`, `%{"blob" => digest}` or `{:tar, bytes}`), `out`.
  """
  defapi run_script(client, runtime, script, event \\ nil, opts \\ []) do
    send_op(client,
      method: "POST",
      path: "/runtimes/#{seg(runtime)}/call",
      body: script_body(script, event, opts),
      timeout: opts[:timeout],
      key: opts[:key],
      decode: &Zygo.Result.from_json/1,
      cancellable: true
    )
  end

  defp script_body(script, event, opts) do
    body =
      case {script, opts[:source]} do
        {nil, src} when is_binary(src) ->
          %{"source" => src}

        {s, nil} when s != nil ->
          %{"script" => digest(s)}

        _ ->
          raise ArgumentError,
                "name the script by its digest, or pass nil and source:, exactly one of the two"
      end

    body = Map.put(body, "event", event)

    body =
      case opts[:workspace] do
        nil -> body
        {:tar, bytes} -> Map.put(body, "workspace", %{"inline" => Base.encode64(bytes)})
        %{inline: b} -> Map.put(body, "workspace", %{"inline" => b})
        %{blob: d} -> Map.put(body, "workspace", %{"blob" => digest(d)})
        %{"inline" => _} = w when map_size(w) == 1 -> Map.put(body, "workspace", w)
        %{"blob" => _} = w when map_size(w) == 1 -> Map.put(body, "workspace", w)
        other -> Map.put(body, "workspace", %{"blob" => digest(other)})
      end

    json(if opts[:out], do: Map.put(body, "out", true), else: body)
  end

  # -- scripts, blobs, dependency sets --

  @doc "`PUT /scripts`: register a script (its raw bytes); idempotent."
  defapi put_script(client, source) do
    send_op(client,
      method: "PUT",
      path: "/scripts",
      body: IO.iodata_to_binary(source),
      ctype: "application/octet-stream",
      decode: &Zygo.Script.from_json/1
    )
  end

  @doc "`GET /scripts/{digest}`: whether the host holds it for you; never the bytes."
  defapi script(client, digest) do
    send_op(client, method: "GET", path: "/scripts/" <> seg(digest(digest)), decode: &Zygo.Script.from_json/1)
  end

  @doc "`DELETE /scripts/{digest}` (deploy rights)."
  defapi delete_script(client, digest) do
    send_op(client, method: "DELETE", path: "/scripts/" <> seg(digest(digest)))
  end

  @doc "`PUT /blobs`: store a workspace tar once; idempotent."
  defapi put_blob(client, data) do
    send_op(client,
      method: "PUT",
      path: "/blobs",
      body: IO.iodata_to_binary(data),
      ctype: "application/octet-stream",
      decode: &Zygo.Blob.from_json/1
    )
  end

  @doc "`DELETE /blobs/{digest}` (deploy rights)."
  defapi delete_blob(client, digest) do
    send_op(client, method: "DELETE", path: "/blobs/" <> seg(digest(digest)))
  end

  @doc "`POST /deps`: build a dependency set for `image` from lock files (`%{name => text}`)."
  defapi put_deps(client, image, files) do
    send_op(client,
      method: "POST",
      path: "/deps",
      body: json(%{"image" => image, "files" => Map.new(files)}),
      decode: &Zygo.Deps.from_json/1
    )
  end

  @doc "`GET /deps/{id}`: one dependency set; with `nil`, `GET /deps`: every one you can see."
  defapi deps(client, id \\ nil) do
    if id == nil,
      do: send_op(client, method: "GET", path: "/deps", decode: list("deps", &Zygo.Deps.from_json/1)),
      else: send_op(client, method: "GET", path: "/deps/" <> seg(id), decode: &Zygo.Deps.from_json/1)
  end

  @doc "`DELETE /deps/{id}` (deploy rights); refused while a pool is built on it."
  defapi delete_deps(client, id) do
    send_op(client, method: "DELETE", path: "/deps/" <> seg(id))
  end

  # -- tenants, limits, secrets --

  @doc "`POST /tenants` (operator): idempotent; `created` says whether it is new."
  defapi create_tenant(client, id) do
    send_op(client,
      method: "POST",
      path: "/tenants",
      body: json(%{"id" => id}),
      decode: fn v ->
        d = if is_map(v), do: v, else: %{}
        Zygo.Tenant.from_json(d["tenant"], if(is_boolean(d["created"]), do: d["created"]))
      end
    )
  end

  @doc "`GET /tenants` (operator)."
  defapi tenants(client) do
    send_op(client, method: "GET", path: "/tenants", decode: list("tenants", &Zygo.Tenant.from_json/1))
  end

  @doc "`GET /tenants/{id}`: the operator, or that tenant itself."
  defapi tenant(client, id) do
    send_op(client, method: "GET", path: "/tenants/" <> seg(id), decode: &Zygo.Tenant.from_json/1)
  end

  @doc "`DELETE /tenants/{id}` (deploy rights)."
  defapi delete_tenant(client, id) do
    send_op(client, method: "DELETE", path: "/tenants/" <> seg(id), wait: 300_000)
  end

  @limit_keys [:mem, :cpu, :pids, :timeout, :scratch, :network, :allow]

  @doc """
  `PATCH /tenants/{id}/limits` (deploy rights): the keys given are set (`nil` clears one),
  the rest left alone. Keys: `mem`, `cpu`, `pids`, `timeout` (ms or "30s"), `scratch`,
  `network`, `allow`. A value above every ceiling is `{:error, %Zygo.Error{kind: :error,
  status: 422}}`.
  """
  defapi set_limits(client, id, limits) do
    body =
      Map.new(limits, fn {k, v} ->
        k = if is_binary(k), do: String.to_existing_atom(k), else: k

        unless k in @limit_keys,
          do: raise(ArgumentError, "unknown limit #{inspect(k)}; the keys are #{inspect(@limit_keys)}")

        {Atom.to_string(k), if(k == :timeout, do: duration(v), else: v)}
      end)

    send_op(client,
      method: "PATCH",
      path: "/tenants/#{seg(id)}/limits",
      body: json(body),
      decode: &Zygo.Tenant.from_json/1
    )
  end

  @doc "`PUT /tenants/{tenant}/secrets/{name}` (deploy rights): store a value, sealed."
  defapi put_secret(client, tenant, name, value) do
    send_op(client,
      method: "PUT",
      path: "/tenants/#{seg(tenant)}/secrets/#{seg(name)}",
      body: json(%{"value" => value})
    )
  end

  @doc "`DELETE /tenants/{tenant}/secrets/{name}` (deploy rights)."
  defapi delete_secret(client, tenant, name) do
    send_op(client, method: "DELETE", path: "/tenants/#{seg(tenant)}/secrets/#{seg(name)}")
  end

  @doc "`GET /tenants/{tenant}/secrets` (operator): the names, never the values."
  defapi secrets(client, tenant) do
    send_op(client,
      method: "GET",
      path: "/tenants/#{seg(tenant)}/secrets",
      decode:
        list("secrets", fn
          %{"name" => n} -> n
          n -> n
        end)
    )
  end

  # -- tokens --

  @doc "`POST /tenants/{tenant}/tokens`, or `POST /tokens` (operator token) with `nil`."
  defapi mint_token(client, tenant \\ nil) do
    path = if tenant == nil, do: "/tokens", else: "/tenants/#{seg(tenant)}/tokens"
    send_op(client, method: "POST", path: path, decode: &Zygo.Token.from_json/1)
  end

  @doc "`GET /tokens` (deploy rights): every token's record, never a secret."
  defapi tokens(client) do
    send_op(client, method: "GET", path: "/tokens", decode: list("tokens", &Zygo.Token.from_json/1))
  end

  @doc "`DELETE /tokens/{id}` (deploy rights)."
  defapi revoke_token(client, id) do
    send_op(client, method: "DELETE", path: "/tokens/" <> seg(id))
  end

  # ---- streams -----------------------------------------------------------------------------

  @doc """
  `POST /fn/{name}?stream=1` as a lazy `Stream`: nothing is sent until it is read. Items
  are `{:stdout, text}`, `{:stderr, text}`, `{:progress, text}`, then one last item:
  `{:result, %Zygo.Result{}}` or `{:error, %Zygo.Error{}}` (alone when refused before
  anything ran). Halting early closes its connection, which does not cancel the request.
  Options as `call/4`.
  """
  @spec stream(Client.t(), String.t(), term, keyword) :: Enumerable.t()
  def stream(client, name, event \\ nil, opts \\ []) do
    Zygo.Streaming.stream(client, %Op{
      method: "POST",
      path: "/fn/" <> seg(name),
      query: [{"stream", "1"} | ws_query(opts)],
      body: json(event),
      timeout: opts[:timeout],
      key: opts[:key],
      cancellable: true
    })
  end

  @doc "Like `stream/4`, raising the error after the output before it."
  def stream!(client, name, event \\ nil, opts \\ []), do: raising(stream(client, name, event, opts))

  @doc "`run_script/5` as a stream, like `stream/4`."
  @spec stream_script(Client.t(), String.t(), term, term, keyword) :: Enumerable.t()
  def stream_script(client, runtime, script, event \\ nil, opts \\ []) do
    Zygo.Streaming.stream(client, %Op{
      method: "POST",
      path: "/runtimes/#{seg(runtime)}/call",
      query: [{"stream", "1"}],
      body: script_body(script, event, opts),
      timeout: opts[:timeout],
      key: opts[:key],
      cancellable: true
    })
  end

  @doc "Like `stream_script/5`, raising the error after the output before it."
  def stream_script!(client, runtime, script, event \\ nil, opts \\ []),
    do: raising(stream_script(client, runtime, script, event, opts))

  defp raising(stream) do
    Stream.map(stream, fn
      {:error, %Error{} = e} -> raise e
      item -> item
    end)
  end
end
