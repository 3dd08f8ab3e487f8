defmodule Zygo.Client do
  @moduledoc """
  A client: a plain struct any process may use. Its connections live in a `Zygo.Pool`
  process (`pool`), shared by every view `Zygo.for_tenant/2` makes of it.
  """

  defstruct pool: nil,
            address: nil,
            base_headers: [],
            tenant: nil,
            retries: 0,
            backoff: 1_000,
            retry_busy: true,
            timeout: nil,
            pool_size: 32,
            ssl: [],
            sleep: nil,
            clock: nil

  @type t :: %__MODULE__{}
end

defmodule Zygo.HTTP do
  @moduledoc false
  # Sending one request through the pool: a reused connection that turns out closed before
  # the first byte of the answer is replaced by a fresh one, once; anything else that goes
  # wrong on the connection is a :transport error. Busy and Unavailable are resent when the
  # client has retries; past them, Busy is resent while retry_busy is on (see again/5).

  alias Zygo.{Conn, Error, JSON, Pool}

  @default_wait 60_000
  @slack 10_000
  @connect_timeout 10_000

  # A request refused as Busy (429: nothing of it ran) once `retries` are used up is sent
  # again while `retry_busy` is on: after the server's Retry-After (@busy_wait without
  # one), each wait between @busy_wait_min and @busy_wait_max, for as long as the next send
  # comes within @busy_for of the first, and within the call's own timeout when it has
  # one. Milliseconds.
  @busy_wait 1_000
  @busy_wait_min 100
  @busy_wait_max 5_000
  @busy_for 30_000

  defmodule Op do
    @moduledoc false
    defstruct method: "GET",
              path: "/",
              query: [],
              body: nil,
              ctype: nil,
              timeout: nil,
              key: nil,
              decode: nil,
              cancellable: false,
              wait: nil
  end

  @doc "The timeout (ms) `op` is sent with (`X-Zygo-Timeout-Ms`), or nil."
  def timeout_of(client, %Op{} = op), do: op.timeout || if(op.cancellable, do: client.timeout)

  def request_bytes(client, %Op{} = op) do
    headers = client.base_headers
    headers = if client.tenant, do: headers ++ [{"X-Zygo-Tenant", client.tenant}], else: headers
    timeout = timeout_of(client, op)

    {headers, wait} =
      if timeout do
        unless is_integer(timeout) and timeout > 0,
          do: raise(ArgumentError, "timeout is a positive number of milliseconds")

        {headers ++ [{"X-Zygo-Timeout-Ms", Integer.to_string(timeout)}], timeout}
      else
        {headers, op.wait || @default_wait}
      end

    headers = if op.key, do: headers ++ [{"X-Zygo-Request-Key", check_header(op.key)}], else: headers

    headers =
      if op.body != nil, do: headers ++ [{"Content-Type", op.ctype || "application/json"}], else: headers

    headers =
      if op.body != nil or op.method in ["POST", "PUT", "PATCH", "DELETE"],
        do: headers ++ [{"Content-Length", Integer.to_string(byte_size(op.body || ""))}],
        else: headers

    target =
      client.address.prefix <>
        op.path <>
        case op.query do
          [] ->
            ""

          q ->
            "?" <>
              Enum.map_join(q, "&", fn {k, v} ->
                URI.encode_www_form(k) <> "=" <> String.replace(URI.encode_www_form(v), "%3A", ":")
              end)
        end

    head = [
      op.method,
      " ",
      target,
      " HTTP/1.1\r\n",
      Enum.map(headers, fn {k, v} -> [k, ": ", v, "\r\n"] end),
      "\r\n"
    ]

    {IO.iodata_to_binary([head, op.body || ""]), wait + @slack}
  end

  defp check_header(v) do
    if String.contains?(v, ["\r", "\n"]),
      do: raise(ArgumentError, "a header value must not contain a line break")

    v
  end

  @doc "Sends `op` with the client's retries; `{:ok, value}` or `{:error, %Error{}}`."
  def send_op(client, op), do: send_op(client, op, 0, client.clock.())

  defp send_op(client, op, attempt, began) do
    case once(client, op) do
      {:error, %Error{} = e} = refused ->
        case again(client, e, attempt, op, began) do
          nil ->
            refused

          wait ->
            client.sleep.(wait)
            send_op(client, op, attempt + 1, began)
        end

      other ->
        other
    end
  end

  @doc """
  How long (ms) to wait before sending `op` again after refusal `e` (its `attempt`-th,
  counting from 0; `began`: when it was first sent, on `client.clock`), or nil to return
  `e`. Only Busy and Unavailable are ever sent again: both mean the request never ran.
  """
  def again(client, %Error{kind: kind} = e, attempt, op, began) do
    cond do
      kind not in [:busy, :unavailable] ->
        nil

      attempt < client.retries ->
        max(e.retry_after || 0, client.backoff * Integer.pow(2, attempt))

      kind != :busy or not client.retry_busy ->
        nil

      true ->
        wait = (e.retry_after || @busy_wait) |> max(@busy_wait_min) |> min(@busy_wait_max)
        limit = min(@busy_for, timeout_of(client, op) || @busy_for)
        if client.clock.() - began + wait > limit, do: nil, else: wait
    end
  end

  defp once(client, op) do
    {data, read_timeout} = request_bytes(client, op)
    deadline = System.monotonic_time(:millisecond) + read_timeout
    {:ok, ref, conn} = Pool.checkout(client.pool)

    answer =
      try do
        transfer(client, ref, conn, data, deadline)
      rescue
        e ->
          Pool.checkin(client.pool, ref, nil)
          reraise e, __STACKTRACE__
      end

    case answer do
      {:ok, status, headers, raw} ->
        try do
          decode(status, headers, raw, op)
        catch
          {:zygo_error, e} -> {:error, e}
        end

      {:error, e} ->
        {:error, timeout_error(e, client, read_timeout)}
    end
  end

  # Sends, reads the whole answer and gives the slot back (with the connection when it can
  # carry another request).
  defp transfer(client, ref, conn, data, deadline) do
    case exchange(client, conn, data, deadline) do
      {:ok, status, headers, conn} ->
        with {:ok, framing} <- Conn.framing(status, headers),
             {:ok, raw, conn} <- Conn.body(conn, framing, deadline) do
          if Conn.keeps_alive?(headers) and framing != {:close, 0} do
            Pool.checkin(client.pool, ref, conn)
          else
            Conn.close(conn)
            Pool.checkin(client.pool, ref, nil)
          end

          {:ok, status, headers, raw}
        else
          {:error, e} ->
            Conn.close(conn)
            Pool.checkin(client.pool, ref, nil)
            {:error, e}
        end

      {:error, e} ->
        Pool.checkin(client.pool, ref, nil)
        {:error, e}
    end
  end

  defp timeout_error(:timeout, client, ms),
    do:
      Error.transport(
        "no answer from #{client.address.text} within #{div(ms, 1000)} s; the request may have run"
      )

  defp timeout_error(e, _, _), do: e

  @doc """
  Sends the request and reads the answer's head on `conn` (a pooled connection, or nil to
  open one): `{:ok, status, headers, conn}` or `{:error, %Error{} | :timeout}`. The socket
  is closed on every error.
  """
  def exchange(client, nil, data, deadline) do
    case Conn.open(
           client.address,
           min(@connect_timeout, max(deadline - System.monotonic_time(:millisecond), 1)),
           client.ssl
         ) do
      {:ok, conn} -> exchange(client, conn, data, deadline)
      {:error, e} -> {:error, e}
    end
  end

  def exchange(client, conn, data, deadline) do
    result =
      case Conn.send_data(conn, data) do
        {:ok, conn} -> {Conn.head(conn, deadline), conn}
        {:error, reason} -> {{:send_failed, reason}, conn}
      end

    case result do
      {{:ok, _, _, _} = ok, _} ->
        ok

      {failure, conn} ->
        Conn.close(conn)

        case failure do
          {:before_first_byte, _} when conn.reused ->
            exchange(client, nil, data, deadline)

          {:send_failed, _} when conn.reused ->
            exchange(client, nil, data, deadline)

          {:before_first_byte, reason} ->
            {:error,
             Error.transport("the connection to #{client.address.text} failed before the answer: #{reason}")}

          {:send_failed, reason} ->
            {:error,
             Error.transport(
               "the connection to #{client.address.text} failed before the answer: #{Conn.format(reason)}"
             )}

          {:error, e} ->
            {:error, e}
        end
    end
  end

  def retry_after(headers) do
    case headers["retry-after"] do
      nil ->
        nil

      v ->
        case Float.parse(v) do
          {f, ""} when f >= 0 -> round(f * 1000)
          _ -> nil
        end
    end
  end

  def parse_json("", _status), do: {:ok, nil}

  def parse_json(raw, status) do
    case JSON.decode(raw) do
      {:ok, v} -> {:ok, v}
      {:error, _} when status >= 400 -> {:ok, raw}
      {:error, reason} -> {:error, Error.transport("the answer (HTTP #{status}) is not JSON: #{reason}")}
    end
  end

  defp decode(status, headers, raw, op) do
    with {:ok, body} <- parse_json(raw, status) do
      if status in 200..299 do
        {:ok, if(op.decode, do: op.decode.(body), else: body)}
      else
        {:error, Error.from_answer(status, body, retry_after(headers), headers["x-zygo-request-id"])}
      end
    end
  end
end
