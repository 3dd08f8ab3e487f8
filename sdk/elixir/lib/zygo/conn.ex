defmodule Zygo.Address do
  @moduledoc """
  Where the API is: the argument, else `ZYGO_API_URL`, else `http://127.0.0.1:7700`.
  Accepted: `unix:///path`, `http://host[:port]`, `https://host[:port]`, bare `host:port`.
  """

  defstruct kind: :tcp, host: nil, port: nil, path: nil, tls: false, prefix: "", host_header: "", text: ""
  @type t :: %__MODULE__{}

  @default "http://127.0.0.1:7700"

  @spec parse(String.t() | nil) :: {:ok, t} | {:error, String.t()}
  def parse(url) do
    url = String.trim(url || System.get_env("ZYGO_API_URL") || "")
    url = if url == "", do: @default, else: url

    cond do
      String.starts_with?(url, "unix://") ->
        path = String.replace_prefix(url, "unix://", "")

        if String.starts_with?(path, "/"),
          do: {:ok, %__MODULE__{kind: :unix, path: path, host_header: "localhost", text: url}},
          else: {:error, "bad address #{inspect(url)}: a unix socket is unix:///absolute/path"}

      String.starts_with?(url, "http://") ->
        scheme(url, "http://", false, 80)

      String.starts_with?(url, "https://") ->
        scheme(url, "https://", true, 443)

      String.contains?(url, "://") ->
        {:error, "bad address #{inspect(url)}: use unix://, http://, https:// or host:port"}

      true ->
        with {:ok, host, port} <- host_port(url, nil, url) do
          if port,
            do: {:ok, tcp(host, port, false, "")},
            else: {:error, "bad address #{inspect(url)}: a bare address needs a port, host:port"}
        end
    end
  end

  defp scheme(url, s, tls, default) do
    rest = String.replace_prefix(url, s, "")

    {hp, prefix} =
      case String.split(rest, "/", parts: 2) do
        [hp] -> {hp, ""}
        [hp, p] -> {hp, String.trim_trailing("/" <> p, "/")}
      end

    with {:ok, host, port} <- host_port(hp, default, url), do: {:ok, tcp(host, port, tls, prefix)}
  end

  defp host_port(s, default, url) do
    {host, port} =
      cond do
        String.starts_with?(s, "[") ->
          case String.split(String.trim_leading(s, "["), "]", parts: 2) do
            [h, ""] -> {h, ""}
            [h, ":" <> p] -> {h, p}
            _ -> {nil, nil}
          end

        length(String.split(s, ":")) == 2 ->
          [h, p] = String.split(s, ":")
          {h, p}

        String.contains?(s, ":") ->
          {nil, :v6}

        true ->
          {s, ""}
      end

    cond do
      port == :v6 ->
        {:error, "bad address #{inspect(url)}: an IPv6 host goes in brackets, [::1]:7700"}

      host in [nil, ""] ->
        {:error, "bad address #{inspect(url)}: no host"}

      port == "" ->
        {:ok, host, default}

      true ->
        case Integer.parse(port) do
          {n, ""} when n in 1..65535 -> {:ok, host, n}
          _ -> {:error, "bad address #{inspect(url)}: the port must be a number from 1 to 65535"}
        end
    end
  end

  defp tcp(host, port, tls, prefix) do
    h = if String.contains?(host, ":"), do: "[#{host}]", else: host
    hh = if port == if(tls, do: 443, else: 80), do: h, else: "#{h}:#{port}"

    %__MODULE__{
      kind: :tcp,
      host: host,
      port: port,
      tls: tls,
      prefix: prefix,
      host_header: hh,
      text: "#{if tls, do: "https", else: "http"}://#{hh}#{prefix}"
    }
  end
end

defmodule Zygo.Conn do
  @moduledoc false
  # One HTTP/1.1 connection in passive mode: the socket, what has arrived but has not been
  # used yet, and whether any byte of the current answer arrived (which decides whether a
  # request on a reused connection may be sent again).

  alias Zygo.Error

  defstruct transport: :gen_tcp, socket: nil, buf: "", got: false, idle_since: 0, reused: false

  @max_head 64 * 1024
  @max_body 1024 * 1024 * 1024
  @max_line 64 * 1024 * 1024

  def open(%Zygo.Address{} = a, timeout, ssl_opts) do
    opts = [:binary, active: false, packet: :raw]

    result =
      case a do
        %{kind: :unix, path: path} ->
          {:gen_tcp, :gen_tcp.connect({:local, String.to_charlist(path)}, 0, opts, timeout)}

        %{tls: true, host: host, port: port} ->
          {:ssl, :ssl.connect(String.to_charlist(host), port, opts ++ tls_opts(host, ssl_opts), timeout)}

        %{host: host, port: port} ->
          {:gen_tcp, :gen_tcp.connect(address(host), port, opts ++ [nodelay: true], timeout)}
      end

    case result do
      {t, {:ok, s}} ->
        {:ok, %__MODULE__{transport: t, socket: s}}

      {_, {:error, reason}} ->
        {:error, Error.transport("cannot connect to the Zygo API at #{a.text}: #{format(reason)}")}
    end
  end

  defp address(host) do
    case :inet.parse_address(String.to_charlist(host)) do
      {:ok, ip} -> ip
      _ -> String.to_charlist(host)
    end
  end

  # Verified against the system's CAs by default, with the host name checked; the
  # client's `ssl:` options are merged over these (a `cacertfile:` or `cacerts:` of its own
  # replaces the system's CAs).
  defp tls_opts(host, extra) do
    cas =
      cond do
        Keyword.has_key?(extra, :cacertfile) or Keyword.has_key?(extra, :cacerts) ->
          []

        # OTP 25 and later know the system's CAs; before, Debian's bundle is the file to read
        Code.ensure_loaded?(:public_key) and function_exported?(:public_key, :cacerts_get, 0) ->
          [cacerts: apply(:public_key, :cacerts_get, [])]

        true ->
          [cacertfile: ~c"/etc/ssl/certs/ca-certificates.crt"]
      end

    base =
      [
        verify: :verify_peer,
        server_name_indication: String.to_charlist(host),
        customize_hostname_check: [match_fun: :public_key.pkix_verify_hostname_match_fun(:https)]
      ] ++ cas

    Keyword.merge(base, extra)
  end

  def format(:econnrefused), do: "connection refused"
  def format(:enoent), do: "no such socket"
  def format(:timeout), do: "timed out"
  def format(:closed), do: "the connection was closed"
  def format(reason), do: inspect(reason)

  def close(%__MODULE__{transport: t, socket: s}), do: t.close(s)

  def controlling_process(%__MODULE__{transport: t, socket: s}, pid), do: t.controlling_process(s, pid)

  def send_data(%__MODULE__{transport: t, socket: s} = c, data) do
    case t.send(s, data) do
      :ok -> {:ok, %{c | got: false}}
      {:error, reason} -> {:error, reason}
    end
  end

  defp remaining(deadline), do: max(deadline - System.monotonic_time(:millisecond), 0)

  # {:ok, conn} with more bytes in buf, {:closed, conn}, or {:error, reason, conn}
  defp more(%__MODULE__{transport: t, socket: s} = c, deadline) do
    case t.recv(s, 0, remaining(deadline)) do
      {:ok, data} -> {:ok, %{c | buf: c.buf <> data, got: true}}
      {:error, :closed} -> {:closed, c}
      {:error, reason} -> {:error, reason, c}
    end
  end

  @doc """
  Reads the answer's head: `{:ok, status, headers, conn}`, `{:before_first_byte, reason}`
  (the connection ended or was reset before any byte arrived), or `{:error, %Error{}}`.
  """
  def head(c, deadline) do
    case :binary.match(c.buf, "\r\n\r\n") do
      {pos, 4} when pos > @max_head ->
        {:error, Error.transport("the answer's headers are larger than 64 KiB")}

      {pos, 4} ->
        <<raw::binary-size(pos), "\r\n\r\n", rest::binary>> = c.buf

        case parse_head(raw) do
          {:ok, status, _} when status in 100..199 -> head(%{c | buf: rest}, deadline)
          {:ok, status, headers} -> {:ok, status, headers, %{c | buf: rest}}
          {:error, e} -> {:error, e}
        end

      :nomatch ->
        if byte_size(c.buf) > @max_head do
          {:error, Error.transport("the answer's headers are larger than 64 KiB")}
        else
          case more(c, deadline) do
            {:ok, c} ->
              head(c, deadline)

            {:closed, %{got: false}} ->
              {:before_first_byte, "the connection was closed"}

            {:closed, _} ->
              {:error, Error.transport("the connection closed in the middle of the answer's headers")}

            {:error, r, %{got: false}} when r in [:econnreset, :epipe] ->
              {:before_first_byte, format(r)}

            {:error, :timeout, _} ->
              {:error, :timeout}

            {:error, r, %{got: got}} ->
              {:error,
               Error.transport(
                 "the connection failed #{if got, do: "in the middle of", else: "before"} the answer: #{format(r)}"
               )}
          end
        end
    end
  end

  defp parse_head(raw) do
    [status_line | lines] = String.split(raw, "\r\n")

    with [_, code] <- Regex.run(~r/\AHTTP\/1\.\d (\d{3})/, status_line),
         {:ok, headers} <- parse_headers(lines, %{}) do
      {:ok, String.to_integer(code), headers}
    else
      _ -> {:error, Error.transport("the answer is not HTTP: #{inspect(String.slice(status_line, 0, 100))}")}
    end
  end

  defp parse_headers([], acc), do: {:ok, acc}
  defp parse_headers(["" | rest], acc), do: parse_headers(rest, acc)

  defp parse_headers([line | rest], acc) do
    case String.split(line, ":", parts: 2) do
      [k, v] ->
        k = k |> String.trim() |> String.downcase()
        v = String.trim(v)
        parse_headers(rest, Map.update(acc, k, v, &(&1 <> ", " <> v)))

      _ ->
        :error
    end
  end

  @doc "How the body is delimited."
  def framing(status, headers) do
    cond do
      String.contains?(String.downcase(headers["transfer-encoding"] || ""), "chunked") ->
        {:ok, {:chunked, :size}}

      cl = headers["content-length"] ->
        case Integer.parse(cl) do
          {n, ""} when n >= 0 and n <= @max_body -> {:ok, {:length, n}}
          _ -> {:error, Error.transport("bad Content-Length #{inspect(cl)}")}
        end

      status in [204, 304] ->
        {:ok, {:length, 0}}

      true ->
        {:ok, {:close, 0}}
    end
  end

  def keeps_alive?(headers), do: not String.contains?(String.downcase(headers["connection"] || ""), "close")

  @doc """
  The next piece of the body: `{:piece, bytes, state, conn}`, `{:done, conn}` or
  `{:error, %Error{}}`.
  """
  def piece(c, {:length, 0}, _deadline), do: {:done, c}

  def piece(c, {:length, n}, deadline) do
    if c.buf == "" do
      case more(c, deadline) do
        {:ok, c} -> piece(c, {:length, n}, deadline)
        other -> mid_answer(other)
      end
    else
      take = min(n, byte_size(c.buf))
      <<p::binary-size(take), rest::binary>> = c.buf
      {:piece, p, {:length, n - take}, %{c | buf: rest}}
    end
  end

  def piece(c, {:chunked, :size}, deadline) do
    with {:ok, line, c} <- line(c, 4096, deadline) do
      size_s = line |> String.split(";") |> hd() |> String.trim()

      case Integer.parse(size_s, 16) do
        {0, ""} -> trailers(c, deadline)
        {n, ""} when n > 0 and n <= @max_body -> piece(c, {:chunked, n}, deadline)
        _ -> {:error, Error.transport("bad chunk size #{inspect(String.slice(size_s, 0, 20))}")}
      end
    end
  end

  def piece(c, {:chunked, n}, deadline) do
    with {:ok, data, c} <- exact(c, n + 2, deadline) do
      {:piece, binary_part(data, 0, n), {:chunked, :size}, c}
    end
  end

  def piece(c, {:close, total}, deadline) do
    cond do
      c.buf != "" and total + byte_size(c.buf) > @max_body ->
        {:error, Error.transport("the answer is larger than 1 GiB")}

      c.buf != "" ->
        {:piece, c.buf, {:close, total + byte_size(c.buf)}, %{c | buf: ""}}

      true ->
        case more(c, deadline) do
          {:ok, c} -> piece(c, {:close, total}, deadline)
          {:closed, c} -> {:done, c}
          other -> mid_answer(other)
        end
    end
  end

  defp trailers(c, deadline) do
    with {:ok, line, c} <- line(c, @max_head, deadline) do
      if String.trim(line) == "", do: {:done, c}, else: trailers(c, deadline)
    end
  end

  defp mid_answer({:closed, _}),
    do: {:error, Error.transport("the connection closed in the middle of the answer")}

  defp mid_answer({:error, :timeout, _}), do: {:error, :timeout}

  defp mid_answer({:error, r, _}),
    do: {:error, Error.transport("the connection failed in the middle of the answer: #{format(r)}")}

  defp exact(c, n, deadline) do
    if byte_size(c.buf) >= n do
      <<data::binary-size(n), rest::binary>> = c.buf
      {:ok, data, %{c | buf: rest}}
    else
      case more(c, deadline) do
        {:ok, c} -> exact(c, n, deadline)
        other -> mid_answer(other)
      end
    end
  end

  defp line(c, cap, deadline) do
    case :binary.match(c.buf, "\n") do
      {pos, 1} ->
        <<l::binary-size(pos), "\n", rest::binary>> = c.buf
        {:ok, l, %{c | buf: rest}}

      :nomatch ->
        if byte_size(c.buf) > cap do
          {:error, Error.transport("a line of the answer is too long")}
        else
          case more(c, deadline) do
            {:ok, c} -> line(c, cap, deadline)
            other -> mid_answer(other)
          end
        end
    end
  end

  @doc "The whole body: `{:ok, body, conn}` or `{:error, %Error{} | :timeout}`."
  def body(c, state, deadline, acc \\ []) do
    case piece(c, state, deadline) do
      {:piece, p, state, c} -> body(c, state, deadline, [p | acc])
      {:done, c} -> {:ok, IO.iodata_to_binary(Enum.reverse(acc)), c}
      {:error, e} -> {:error, e}
    end
  end

  def max_line, do: @max_line
end
