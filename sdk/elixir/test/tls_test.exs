defmodule Zygo.TLSTest do
  use ExUnit.Case, async: true

  # A certificate for localhost, made with the openssl command, and a small
  # TLS server that answers every request on a connection with a canned call answer.
  setup do
    dir = Path.join(System.tmp_dir!(), "zygo-sdk-ex-tls-#{System.unique_integer([:positive])}")
    File.mkdir_p!(dir)
    on_exit(fn -> File.rm_rf(dir) end)
    cert = Path.join(dir, "cert.pem")
    key = Path.join(dir, "key.pem")

    # A CA of the test's own and a certificate for localhost signed by it (Erlang's ssl
    # refuses a self-signed server certificate even when it is trusted).
    ca = Path.join(dir, "ca.pem")
    ext = Path.join(dir, "ext.cnf")
    File.write!(ext, "subjectAltName=DNS:localhost,IP:127.0.0.1\n")

    for args <- [
          ~w(req -x509 -newkey rsa:2048 -nodes -keyout #{dir}/ca.key -out #{ca} -days 2 -subj /CN=zygo-sdk-test-ca),
          ~w(req -newkey rsa:2048 -nodes -keyout #{key} -out #{dir}/leaf.csr -subj /CN=localhost),
          ~w(x509 -req -in #{dir}/leaf.csr -CA #{ca} -CAkey #{dir}/ca.key -CAcreateserial -out #{cert} -days 2 -extfile #{ext})
        ] do
      {out, status} = System.cmd("openssl", args, stderr_to_stdout: true)
      assert status == 0, out
    end

    {:ok, l} =
      :ssl.listen(0, [
        :binary,
        active: false,
        reuseaddr: true,
        certfile: String.to_charlist(cert),
        keyfile: String.to_charlist(key)
      ])

    {:ok, {_, port}} = :ssl.sockname(l)
    me = self()
    spawn_link(fn -> accept(l, me) end)
    %{port: port, cert: ca}
  end

  defp accept(l, owner) do
    with {:ok, t} <- :ssl.transport_accept(l),
         {:ok, s} <- :ssl.handshake(t, 5000) do
      send(owner, :connection)
      pid = spawn(fn -> receive(do: (:go -> serve(s, ""))) end)
      :ssl.controlling_process(s, pid)
      send(pid, :go)
      accept(l, owner)
    end
  end

  defp serve(s, buf) do
    case :binary.match(buf, "\r\n\r\n") do
      {pos, 4} ->
        # the requests here have no body but "null" (5 bytes, Content-Length: 4 + 1 for "null"?)
        <<head::binary-size(pos), "\r\n\r\n", rest::binary>> = buf
        [_, len] = Regex.run(~r/content-length: (\d+)/i, head)
        len = String.to_integer(len)
        rest = fill(s, rest, len)
        <<_body::binary-size(len), rest::binary>> = rest
        body = Zygo.JSON.encode!(FakeAPI.result())

        :ssl.send(s, [
          "HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: #{byte_size(body)}\r\n\r\n",
          body
        ])

        serve(s, rest)

      :nomatch ->
        case :ssl.recv(s, 0) do
          {:ok, d} -> serve(s, buf <> d)
          {:error, _} -> :ok
        end
    end
  end

  defp fill(_s, buf, len) when byte_size(buf) >= len, do: buf

  defp fill(s, buf, len) do
    {:ok, d} = :ssl.recv(s, 0)
    fill(s, buf <> d, len)
  end

  test "https with a trusted certificate", %{port: port, cert: cert} do
    c =
      Zygo.connect("https://localhost:#{port}",
        ssl: [cacertfile: String.to_charlist(cert)]
      )

    assert Zygo.call!(c, "f").result == %{"ok" => true}
    assert Zygo.call!(c, "f").result == %{"ok" => true}
    assert_received :connection
    refute_received :connection
  end

  test "an untrusted certificate is a transport error", %{port: port} do
    assert {:error, %Zygo.Error{kind: :transport, message: m}} =
             Zygo.health(Zygo.connect("https://localhost:#{port}"))

    assert m =~ "cannot connect"
  end
end
