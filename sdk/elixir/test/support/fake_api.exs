defmodule FakeAPI do
  @moduledoc """
  A stand-in for `zygo api`: a real HTTP/1.1 server on a loopback port or a unix socket,
  on raw sockets so that a test can make it hang up, reset, or stop in the middle of an
  answer exactly where it needs to.

  A handler gets each request (`%{method, path, query, headers, body, conn}`) and answers
  with `{:reply, status, body}`, `{:reply, status, body, opts}` (`headers:`, `close:`,
  `hangup_after:`, `chunked:`), `:hangup`, `:reset`, `{:partial, bytes}` or
  `{:stream, items}` / `{:stream, items, hang: true}`.
  """

  use GenServer

  @digest "sha256:" <> String.duplicate("ab", 32)
  def digest, do: @digest

  def result do
    %{
      "result" => %{"ok" => true},
      "request_id" => "req-1",
      "stdout" => "",
      "stderr" => "",
      "stdout_truncated" => false,
      "stderr_truncated" => false,
      "started" => true,
      "metrics" => %{"wall_ms" => 1.5, "cpu_ms" => 1.0, "peak_rss_kb" => 1000}
    }
  end

  def start(opts \\ []) do
    {:ok, pid} = GenServer.start(__MODULE__, opts)

    GenServer.call(pid, :url)
    |> then(&%{pid: pid, url: &1})
  end

  def stop(%{pid: pid}), do: GenServer.stop(pid)
  def set_handler(%{pid: pid}, fun), do: GenServer.call(pid, {:handler, fun})
  def requests(%{pid: pid}), do: GenServer.call(pid, :requests)
  def connections(%{pid: pid}), do: GenServer.call(pid, :connections)
  def closed_by_client(%{pid: pid}), do: GenServer.call(pid, :closed_by_client)
  def routes(api), do: Enum.map(requests(api), &{&1.method, &1.path})

  def wait_for(fun, ms \\ 5000) do
    cond do
      fun.() -> true
      ms <= 0 -> false
      true -> Process.sleep(10) && wait_for(fun, ms - 10)
    end
  end

  @impl true
  def init(opts) do
    {listen, url, path} =
      if opts[:unix] do
        path = Path.join(System.tmp_dir!(), "zygo-sdk-ex-#{System.unique_integer([:positive])}.sock")
        File.rm(path)

        {:ok, l} =
          :gen_tcp.listen(0, [
            :binary,
            active: false,
            reuseaddr: true,
            ifaddr: {:local, String.to_charlist(path)}
          ])

        {l, "unix://" <> path, path}
      else
        {:ok, l} = :gen_tcp.listen(0, [:binary, active: false, reuseaddr: true, ip: {127, 0, 0, 1}])
        {:ok, port} = :inet.port(l)
        {l, "http://127.0.0.1:#{port}", nil}
      end

    me = self()
    acceptor = spawn_link(fn -> accept(listen, me, 0) end)

    {:ok,
     %{
       listen: listen,
       url: url,
       path: path,
       acceptor: acceptor,
       handler: &default/1,
       requests: [],
       connections: 0,
       closed: 0
     }}
  end

  @impl true
  def terminate(_, s) do
    :gen_tcp.close(s.listen)
    if s.path, do: File.rm(s.path)
  end

  @impl true
  def handle_call(:url, _, s), do: {:reply, s.url, s}
  def handle_call({:handler, f}, _, s), do: {:reply, :ok, %{s | handler: f}}
  def handle_call(:requests, _, s), do: {:reply, Enum.reverse(s.requests), s}
  def handle_call(:connections, _, s), do: {:reply, s.connections, s}
  def handle_call(:closed_by_client, _, s), do: {:reply, s.closed, s}
  def handle_call(:new_conn, _, s), do: {:reply, s.connections + 1, %{s | connections: s.connections + 1}}
  def handle_call({:request, r}, _, s), do: {:reply, s.handler, %{s | requests: [r | s.requests]}}
  def handle_call(:closed, _, s), do: {:reply, :ok, %{s | closed: s.closed + 1}}

  defp accept(listen, server, _) do
    case :gen_tcp.accept(listen) do
      {:ok, sock} ->
        n = GenServer.call(server, :new_conn)
        pid = spawn(fn -> receive(do: (:go -> serve(sock, server, n, ""))) end)
        :gen_tcp.controlling_process(sock, pid)
        send(pid, :go)
        accept(listen, server, n)

      {:error, _} ->
        :ok
    end
  end

  defp serve(sock, server, n, buf) do
    case read_request(sock, buf) do
      {:ok, req, rest} ->
        handler = GenServer.call(server, {:request, Map.put(req, :conn, n)})

        case act(sock, handler.(Map.put(req, :conn, n))) do
          :continue -> serve(sock, server, n, rest)
          :stop -> :ok
          :hang -> drain(sock, server)
        end

      :closed ->
        GenServer.call(server, :closed)
        :gen_tcp.close(sock)
    end
  end

  defp drain(sock, server) do
    case :gen_tcp.recv(sock, 0) do
      {:ok, _} -> drain(sock, server)
      {:error, _} -> GenServer.call(server, :closed)
    end
  end

  defp read_request(sock, buf) do
    case :binary.match(buf, "\r\n\r\n") do
      {pos, 4} ->
        <<head::binary-size(pos), "\r\n\r\n", rest::binary>> = buf
        [line | lines] = String.split(head, "\r\n")
        [method, target, _] = String.split(line, " ")

        headers =
          Map.new(lines, fn l ->
            [k, v] = String.split(l, ":", parts: 2)
            {String.downcase(String.trim(k)), String.trim(v)}
          end)

        len = String.to_integer(headers["content-length"] || "0")

        case fill(sock, rest, len) do
          {:ok, all} ->
            <<body::binary-size(len), rest::binary>> = all
            uri = URI.parse(target)
            query = URI.decode_query(uri.query || "")

            {:ok,
             %{
               method: method,
               path: URI.decode(uri.path),
               raw: target,
               query: query,
               headers: headers,
               body: body
             }, rest}

          :closed ->
            :closed
        end

      :nomatch ->
        case :gen_tcp.recv(sock, 0) do
          {:ok, d} -> read_request(sock, buf <> d)
          {:error, _} -> :closed
        end
    end
  end

  defp fill(_sock, buf, len) when byte_size(buf) >= len, do: {:ok, buf}

  defp fill(sock, buf, len) do
    case :gen_tcp.recv(sock, 0) do
      {:ok, d} -> fill(sock, buf <> d, len)
      {:error, _} -> :closed
    end
  end

  defp act(sock, :hangup), do: :gen_tcp.close(sock) && :stop

  defp act(sock, :reset) do
    :inet.setopts(sock, linger: {true, 0})
    :gen_tcp.close(sock)
    :stop
  end

  defp act(sock, {:partial, bytes}) do
    :gen_tcp.send(sock, bytes)
    :gen_tcp.close(sock)
    :stop
  end

  defp act(sock, {:stream, items}), do: act(sock, {:stream, items, []})

  defp act(sock, {:stream, items, opts}) do
    :gen_tcp.send(
      sock,
      "HTTP/1.1 200 OK\r\nContent-Type: application/x-ndjson\r\nTransfer-Encoding: chunked\r\n\r\n"
    )

    for item <- items do
      line = Zygo.JSON.encode!(item) <> "\n"
      :gen_tcp.send(sock, [Integer.to_string(byte_size(line), 16), "\r\n", line, "\r\n"])
    end

    if opts[:hang] do
      :hang
    else
      :gen_tcp.send(sock, "0\r\n\r\n")
      :continue
    end
  end

  defp act(sock, {:reply, status, body}), do: act(sock, {:reply, status, body, []})

  defp act(sock, {:reply, status, body, opts}) do
    raw = if is_binary(body), do: body, else: Zygo.JSON.encode!(body)

    headers = [
      {"Content-Type", "application/json"},
      {"X-Zygo-Request-Id", "req-x"} | Keyword.get(opts, :headers, [])
    ]

    headers = if opts[:close], do: headers ++ [{"Connection", "close"}], else: headers
    head = ["HTTP/1.1 #{status} X\r\n", Enum.map(headers, fn {k, v} -> [k, ": ", v, "\r\n"] end)]

    if opts[:chunked] do
      chunks = for <<c::binary-size(7) <- raw>>, do: c
      tail = binary_part(raw, length(chunks) * 7, byte_size(raw) - length(chunks) * 7)
      parts = Enum.reject(chunks ++ [tail], &(&1 == ""))

      :gen_tcp.send(sock, [
        head,
        "Transfer-Encoding: chunked\r\n\r\n",
        Enum.map(parts, &[Integer.to_string(byte_size(&1), 16), "\r\n", &1, "\r\n"]),
        "0\r\n\r\n"
      ])
    else
      :gen_tcp.send(sock, [head, "Content-Length: #{byte_size(raw)}\r\n\r\n", raw])
    end

    if opts[:close] || opts[:hangup_after] do
      :gen_tcp.close(sock)
      :stop
    else
      :continue
    end
  end

  def json(req) do
    case req.body do
      "" -> nil
      b -> elem(Zygo.JSON.decode(b), 1)
    end
  end

  @fn_info %{
    "name" => "f",
    "kind" => "function",
    "state" => "ready",
    "zygotes" => %{"ready" => 1},
    "in_flight" => 0
  }
  @tenant %{
    "id" => "acme",
    "created_ms" => 1,
    "limits" => %{},
    "functions" => [],
    "scripts" => [],
    "tokens" => 0
  }

  def default(req) do
    m = req.method
    p = req.path
    j = json(req)
    ok = fn body -> {:reply, 200, body} end

    cond do
      p == "/healthz" ->
        ok.(%{"status" => "ok"})

      p == "/version" ->
        ok.(%{"version" => "0.1.5", "api" => 1})

      p == "/fn" and m == "GET" ->
        ok.(%{"functions" => [@fn_info]})

      Regex.match?(~r{^/fn/[^/]+$}, p) and m == "POST" ->
        if req.query["stream"] == "1",
          do: {:stream, [%{"stream" => "stdout", "data" => "hi\n"}, Map.put(result(), "status", 200)]},
          else: ok.(result())

      Regex.match?(~r{^/fn/[^/]+$}, p) and m == "PUT" ->
        ok.(%{"name" => "f", "kind" => "function", "state" => "serving"})

      Regex.match?(~r{^/fn/[^/]+$}, p) ->
        ok.(%{"stopped" => "f"})

      String.ends_with?(p, "/batch") ->
        ok.(%{"results" => Enum.map(j["events"], fn _ -> Map.put(result(), "status", 200) end)})

      String.ends_with?(p, "/logs") ->
        ok.(%{"logs" => [%{"request_id" => "req-1"}]})

      String.ends_with?(p, "/stats") ->
        ok.(%{"name" => "f", "requests" => 1})

      String.ends_with?(p, "/warm") ->
        ok.(%{"name" => "f", "ready" => 1})

      p == "/run" ->
        ok.(%{"exit_code" => 0, "stdout" => "hi\n", "started" => true, "phase" => "run"})

      p == "/runtimes" and m == "GET" ->
        ok.(%{"runtimes" => [Map.put(@fn_info, "kind", "pool")]})

      p == "/runtimes" ->
        ok.(%{"name" => j["name"], "kind" => "pool", "state" => "serving"})

      String.ends_with?(p, "/call") ->
        if req.query["stream"] == "1",
          do: {:stream, [%{"stream" => "progress", "data" => "1 of 2"}, Map.put(result(), "status", 200)]},
          else: ok.(result())

      String.starts_with?(p, "/runtimes/") ->
        ok.(%{"stopped" => "py"})

      p in ["/scripts", "/blobs"] ->
        ok.(%{"sha256" => @digest, "size" => byte_size(req.body), "existed" => false})

      String.starts_with?(p, "/scripts/") and m == "GET" ->
        ok.(%{"sha256" => @digest, "size" => 3, "held" => true})

      String.starts_with?(p, "/scripts/") or String.starts_with?(p, "/blobs/") ->
        ok.(%{"deleted" => @digest})

      p == "/deps" and m == "POST" ->
        {:reply, 202, %{"id" => "deps_1", "state" => "building"}}

      p == "/deps" ->
        ok.(%{"deps" => [%{"id" => "deps_1", "state" => "ready"}]})

      String.starts_with?(p, "/deps/") ->
        ok.(%{"id" => "deps_1", "state" => "ready"})

      String.starts_with?(p, "/requests/") ->
        ok.(%{"cancelled" => 1})

      p == "/tenants" and m == "POST" ->
        ok.(%{"tenant" => Map.put(@tenant, "id", j["id"]), "created" => true})

      p == "/tenants" ->
        ok.(%{"tenants" => [@tenant]})

      Regex.match?(~r{^/tenants/[^/]+$}, p) and m == "GET" ->
        ok.(@tenant)

      Regex.match?(~r{^/tenants/[^/]+$}, p) ->
        ok.(%{"id" => "acme", "stopped" => []})

      String.ends_with?(p, "/limits") ->
        ok.(Map.put(@tenant, "limits", j))

      String.ends_with?(p, "/secrets") ->
        ok.(%{"secrets" => ["STRIPE_KEY"]})

      String.contains?(p, "/secrets/") ->
        ok.(%{"name" => "K"})

      m == "POST" and String.ends_with?(p, "/tokens") ->
        ok.(%{"id" => "tok_1", "secret" => "zygo_" <> String.duplicate("0", 64), "tenant" => nil})

      p == "/tokens" ->
        ok.(%{"tokens" => [%{"id" => "tok_1"}]})

      String.starts_with?(p, "/tokens/") ->
        ok.(%{"id" => "tok_1", "revoked" => true})

      p == "/drain" ->
        ok.(%{"drained" => true, "in_flight" => 0})

      true ->
        {:reply, 404, %{"error" => "no route #{m} #{p}", "code" => "not_found"}}
    end
  end
end
