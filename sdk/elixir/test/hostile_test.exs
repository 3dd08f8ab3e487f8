defmodule Zygo.HostileTest do
  @moduledoc """
  Answers that are not what an API sends: each is a `:transport` error naming the problem,
  never a hang, another kind of crash, or a value made up from it.
  """
  use ExUnit.Case, async: true

  @hostile %{
    "not HTTP" => "SSH-2.0-OpenSSH_9.2\r\n\r\n",
    "a bad status line" => "HTTP/1.1 2xx OK\r\n\r\n",
    "a header line without a colon" => "HTTP/1.1 200 OK\r\nbroken\r\n\r\n",
    "headers over 64 KiB" => "HTTP/1.1 200 OK\r\nX: " <> String.duplicate("a", 70_000) <> "\r\n\r\n",
    "a bad Content-Length" => "HTTP/1.1 200 OK\r\nContent-Length: -5\r\n\r\n",
    "a bad chunk size" => "HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\nzz\r\n",
    "a body shorter than its length" => "HTTP/1.1 200 OK\r\nContent-Length: 100\r\n\r\n{}",
    "a 200 that is not JSON" => "HTTP/1.1 200 OK\r\nContent-Length: 5\r\nConnection: close\r\n\r\nhello"
  }

  test "each is a transport error" do
    for {name, data} <- @hostile do
      api = FakeAPI.start()
      FakeAPI.set_handler(api, fn _ -> {:partial, data} end)
      assert {:error, %Zygo.Error{kind: :transport}} = Zygo.call(Zygo.connect(api.url), "f"), name
      FakeAPI.stop(api)
    end
  end

  test "a stream line that is not JSON" do
    api = FakeAPI.start()
    FakeAPI.set_handler(api, fn _ -> {:stream, ["not an object"]} end)
    assert [{:error, %Zygo.Error{kind: :transport}}] = Enum.to_list(Zygo.stream(Zygo.connect(api.url), "f"))
    FakeAPI.stop(api)
  end

  test "an answer of the wrong shape is an error, not a guess" do
    api = FakeAPI.start()
    c = Zygo.connect(api.url)
    FakeAPI.set_handler(api, fn _ -> {:reply, 200, %{"result" => 1, "workspace" => "!!not base64!!"}} end)
    assert {:error, %Zygo.Error{}} = Zygo.call(c, "f", nil, out: true)
    FakeAPI.set_handler(api, fn _ -> {:reply, 200, %{"nothing" => "here"}} end)
    assert {:error, %Zygo.Error{}} = Zygo.functions(c)

    FakeAPI.set_handler(api, fn _ ->
      {:reply, 200, %{"result" => 1, "metrics" => "nope", "stdout" => 5, "started" => "yes"}}
    end)

    r = Zygo.call!(c, "f")
    assert {r.result, r.stdout, r.started, r.metrics.wall_ms} == {1, "", true, nil}
    FakeAPI.stop(api)
  end
end
