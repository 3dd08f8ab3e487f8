defmodule Zygo.Streaming do
  @moduledoc false
  # A streamed request as a lazy Stream: the request is sent when the stream is first read,
  # each NDJSON line becomes an item, and the connection is closed when the stream halts
  # (finished or abandoned). It is never given back to the pool.

  alias Zygo.{Conn, Error, HTTP, JSON, Pool}

  def stream(client, op) do
    Stream.resource(
      fn ->
        %{
          client: client,
          op: op,
          attempt: 0,
          phase: :start,
          ref: nil,
          conn: nil,
          framing: nil,
          rest: "",
          lines: [],
          yielded: false,
          deadline: nil,
          began: nil
        }
      end,
      &next/1,
      &finish/1
    )
  end

  defp finish(st) do
    if st.conn, do: Conn.close(st.conn)
    if st.ref, do: Pool.checkin(st.client.pool, st.ref, nil)
    :ok
  end

  defp next(%{phase: :done} = st), do: {:halt, st}

  defp next(%{phase: :start} = st) do
    {data, read_timeout} = HTTP.request_bytes(st.client, st.op)
    deadline = System.monotonic_time(:millisecond) + read_timeout
    {:ok, ref, conn} = Pool.checkout(st.client.pool)
    st = %{st | ref: ref, deadline: deadline, began: st.began || st.client.clock.()}

    case HTTP.exchange(st.client, conn, data, deadline) do
      {:ok, status, headers, conn} when status in 200..299 ->
        case Conn.framing(status, headers) do
          {:ok, framing} -> next(%{st | conn: conn, framing: framing, phase: :reading})
          {:error, e} -> fail(%{st | conn: conn}, e)
        end

      {:ok, status, headers, conn} ->
        st = %{st | conn: conn}

        with {:ok, framing} <- Conn.framing(status, headers),
             {:ok, raw, _} <- Conn.body(conn, framing, deadline),
             {:ok, body} <- HTTP.parse_json(raw, status) do
          refusal(
            st,
            Error.from_answer(status, body, HTTP.retry_after(headers), headers["x-zygo-request-id"])
          )
        else
          {:error, e} -> fail(st, e)
        end

      {:error, e} ->
        fail(st, e)
    end
  end

  defp next(%{phase: :reading, lines: [line | lines]} = st) do
    st = %{st | lines: lines}

    case JSON.decode(line) do
      {:ok, %{"stream" => kind, "data" => data} = v} when is_binary(kind) and not is_map_key(v, "status") ->
        item =
          case kind do
            "stdout" -> {:stdout, data}
            "stderr" -> {:stderr, data}
            "progress" -> {:progress, data}
            other -> {String.to_atom(other), data}
          end

        {[item], %{st | yielded: true}}

      {:ok, %{} = v} ->
        case Map.get(v, "status", 200) do
          200 ->
            try do
              {[{:result, Zygo.Result.from_json(v)}], done(st)}
            catch
              {:zygo_error, e} -> {[{:error, e}], done(st)}
            end

          status ->
            refusal(st, Error.from_answer(if(is_integer(status), do: status, else: 500), v))
        end

      {:ok, _} ->
        fail(st, Error.transport("a line of the stream is not an object"))

      {:error, reason} ->
        fail(st, Error.transport("a line of the stream is not JSON: #{reason}"))
    end
  end

  defp next(%{phase: :reading} = st) do
    case Conn.piece(st.conn, st.framing, st.deadline) do
      {:piece, p, framing, conn} ->
        parts = String.split(st.rest <> p, "\n")
        {parts, [rest]} = Enum.split(parts, -1)

        if byte_size(rest) > Conn.max_line() do
          fail(st, Error.transport("a line of the stream is longer than 64 MiB"))
        else
          lines = Enum.reject(parts, &(String.trim(&1) == ""))
          next(%{st | conn: conn, framing: framing, rest: rest, lines: lines})
        end

      {:done, conn} ->
        if String.trim(st.rest) != "" do
          next(%{st | conn: conn, lines: [st.rest], rest: ""})
        else
          fail(%{st | conn: conn}, Error.transport("the stream ended before its result"))
        end

      {:error, :timeout} ->
        fail(
          st,
          Error.transport("no answer from #{st.client.address.text} in time; the request may have run")
        )

      {:error, e} ->
        fail(st, e)
    end
  end

  # A refusal: resent as HTTP.again/5 says, and only when nothing was yielded (nothing ran).
  defp refusal(st, %Error{} = e) do
    case if(st.yielded, do: nil, else: HTTP.again(st.client, e, st.attempt, st.op, st.began)) do
      nil ->
        {[{:error, e}], done(st)}

      wait ->
        finish(st)
        st.client.sleep.(wait)
        next(%{st | attempt: st.attempt + 1, phase: :start, ref: nil, conn: nil, rest: "", lines: []})
    end
  end

  defp fail(st, :timeout),
    do:
      fail(st, Error.transport("no answer from #{st.client.address.text} in time; the request may have run"))

  defp fail(st, %Error{} = e), do: {[{:error, e}], done(st)}

  defp done(st) do
    finish(st)
    %{st | phase: :done, conn: nil, ref: nil}
  end
end
