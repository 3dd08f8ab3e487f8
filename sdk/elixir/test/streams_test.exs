defmodule Zygo.StreamsTest do
  use ExUnit.Case, async: true

  setup do
    api = FakeAPI.start()
    on_exit(fn -> FakeAPI.stop(api) end)
    %{api: api, c: Zygo.connect(api.url)}
  end

  test "output, then the result", %{api: api, c: c} do
    FakeAPI.set_handler(api, fn _ ->
      {:stream,
       [
         %{"stream" => "stdout", "data" => "loading\n"},
         %{"stream" => "progress", "data" => "1 of 2"},
         %{"stream" => "stderr", "data" => "warn\n"},
         FakeAPI.result() |> Map.put("status", 200) |> Map.put("stdout", "loading\n")
       ]}
    end)

    items = Enum.to_list(Zygo.stream(c, "render", %{"pages" => 2}, key: "k1"))

    assert [{:stdout, "loading\n"}, {:progress, "1 of 2"}, {:stderr, "warn\n"}, {:result, %Zygo.Result{} = r}] =
             items

    assert r.result == %{"ok" => true}
    [req] = FakeAPI.requests(api)
    assert {req.path, req.query} == {"/fn/render", %{"stream" => "1"}}
    assert req.headers["x-zygo-request-key"] == "k1"
  end

  test "a stream cut for reading slowly says so in its result", %{api: api, c: c} do
    FakeAPI.set_handler(api, fn _ ->
      {:stream,
       [
         %{"stream" => "stdout", "data" => "x"},
         FakeAPI.result()
         |> Map.put("status", 200)
         |> Map.put("stdout", "xyz")
         |> Map.put("stream_truncated", true)
       ]}
    end)

    assert [{:stdout, "x"}, {:result, %Zygo.Result{stream_truncated: true, stdout: "xyz"}}] =
             Enum.to_list(Zygo.stream(c, "spew"))

    FakeAPI.set_handler(api, fn _ -> {:stream, [FakeAPI.result() |> Map.put("status", 200)]} end)
    assert [{:result, %Zygo.Result{stream_truncated: false}}] = Enum.to_list(Zygo.stream(c, "f"))
  end

  test "nothing is sent until it is read", %{api: api, c: c} do
    s = Zygo.stream(c, "render")
    Process.sleep(50)
    assert FakeAPI.requests(api) == []
    assert [{:stdout, "hi\n"}] = Enum.take(s, 1)
    assert length(FakeAPI.requests(api)) == 1
  end

  test "a failed handler delivers its output, then the error", %{api: api, c: c} do
    FakeAPI.set_handler(api, fn _ ->
      {:stream,
       [
         %{"stream" => "stdout", "data" => "partial\n"},
         %{"status" => 500, "error" => "ZeroDivisionError", "code" => "handler", "stdout" => "partial\n"}
       ]}
    end)

    assert [{:stdout, "partial\n"}, {:error, %Zygo.Error{kind: :handler, stdout: "partial\n"}}] =
             Enum.to_list(Zygo.stream(c, "render"))

    seen = :ets.new(:seen, [:public])

    assert_raise Zygo.Error, "ZeroDivisionError", fn ->
      c |> Zygo.stream!("render") |> Enum.each(&:ets.insert(seen, {&1}))
    end

    assert :ets.tab2list(seen) == [{{:stdout, "partial\n"}}]
  end

  test "a refusal before anything ran is that error alone", %{api: api, c: c} do
    FakeAPI.set_handler(api, fn _ ->
      {:reply, 404, %{"error" => "no function render", "code" => "not_found"}}
    end)

    assert [{:error, %Zygo.Error{kind: :not_found}}] = Enum.to_list(Zygo.stream(c, "render"))
    FakeAPI.set_handler(api, fn _ -> {:stream, [%{"status" => 429, "error" => "busy", "code" => "busy"}]} end)
    c = %{c | retry_busy: false}
    assert [{:error, %Zygo.Error{kind: :busy}}] = Enum.to_list(Zygo.stream(c, "render"))
    assert %{out: 0} = Zygo.Pool.info(c.pool)
  end

  test "a busy stream is resent by default after its Retry-After, never after output", %{api: api} do
    counter = :counters.new(1, [])

    FakeAPI.set_handler(api, fn _ ->
      :counters.add(counter, 1, 1)

      case :counters.get(counter, 1) do
        1 -> {:reply, 429, %{"error" => "busy", "code" => "busy"}, headers: [{"Retry-After", "2"}]}
        2 -> {:stream, [%{"status" => 429, "error" => "busy", "code" => "busy", "retry_after" => 3}]}
        _ -> {:stream, [%{"stream" => "stdout", "data" => "x"}, Map.put(FakeAPI.result(), "status", 200)]}
      end
    end)

    me = self()
    c = %{Zygo.connect(api.url) | sleep: fn ms -> send(me, {:slept, ms}) end}
    assert [{:stdout, "x"}, {:result, _}] = Enum.to_list(Zygo.stream(c, "render"))
    assert_received {:slept, 2000}
    assert_received {:slept, 3000}
    assert length(FakeAPI.requests(api)) == 3

    FakeAPI.set_handler(api, fn _ ->
      {:stream,
       [%{"stream" => "stdout", "data" => "x"}, %{"status" => 429, "error" => "busy", "code" => "busy"}]}
    end)

    assert [{:stdout, "x"}, {:error, %Zygo.Error{kind: :busy}}] = Enum.to_list(Zygo.stream(c, "render"))
    assert length(FakeAPI.requests(api)) == 4
  end

  test "a busy stream is resent when nothing was yielded", %{api: api} do
    counter = :counters.new(1, [])

    FakeAPI.set_handler(api, fn _ ->
      :counters.add(counter, 1, 1)

      if :counters.get(counter, 1) == 1,
        do: {:stream, [%{"status" => 429, "error" => "busy", "code" => "busy"}]},
        else: {:stream, [%{"stream" => "stdout", "data" => "x"}, Map.put(FakeAPI.result(), "status", 200)]}
    end)

    c = Zygo.connect(api.url, retries: 1, backoff: 0)
    assert [{:stdout, "x"}, {:result, _}] = Enum.to_list(Zygo.stream(c, "render"))
    assert length(FakeAPI.requests(api)) == 2
  end

  test "a stream that ends without its result is a transport error", %{api: api, c: c} do
    FakeAPI.set_handler(api, fn _ -> {:stream, [%{"stream" => "stdout", "data" => "x"}]} end)
    assert [{:stdout, "x"}, {:error, %Zygo.Error{kind: :transport}}] = Enum.to_list(Zygo.stream(c, "render"))
  end

  test "halting early closes the connection and does not cancel", %{api: api, c: c} do
    FakeAPI.set_handler(api, fn req ->
      if req.method == "POST",
        do:
          {:stream, [%{"stream" => "stdout", "data" => "1"}, %{"stream" => "stdout", "data" => "2"}],
           hang: true},
        else: FakeAPI.default(req)
    end)

    assert [{:stdout, "1"}] = c |> Zygo.stream("render", nil, key: "job") |> Enum.take(1)
    assert FakeAPI.wait_for(fn -> FakeAPI.closed_by_client(api) == 1 end)
    assert FakeAPI.routes(api) == [{"POST", "/fn/render"}]
    Zygo.functions!(c)
    assert FakeAPI.connections(api) == 2
    assert %{out: 0} = Zygo.Pool.info(c.pool)
  end

  test "stream_script", %{api: api, c: c} do
    assert [{:progress, "1 of 2"}, {:result, _}] =
             Enum.to_list(Zygo.stream_script(c, "py312", FakeAPI.digest(), %{"n" => 1}))

    req = List.last(FakeAPI.requests(api))
    assert {req.path, req.query} == {"/runtimes/py312/call", %{"stream" => "1"}}
    assert FakeAPI.json(req) == %{"script" => FakeAPI.digest(), "event" => %{"n" => 1}}
  end

  test "workspaces: a blob in the query for functions, inline or blob for scripts; out decoded", %{
    api: api,
    c: c
  } do
    tar = <<"pretend this is a tar", 0, 255>>
    blob = "sha256:" <> String.duplicate("cd", 32)

    FakeAPI.set_handler(api, fn req ->
      if req.method == "POST",
        do: {:reply, 200, Map.put(FakeAPI.result(), "workspace", Base.encode64(tar))},
        else: FakeAPI.default(req)
    end)

    r = Zygo.call!(c, "convert", %{"to" => "png"}, workspace: %Zygo.Blob{sha256: blob}, out: true)
    assert r.workspace == tar
    assert List.last(FakeAPI.requests(api)).query == %{"workspace" => blob, "out" => "1"}
    assert List.last(FakeAPI.requests(api)).raw =~ "workspace=sha256:"
    assert_raise ArgumentError, fn -> Zygo.call(c, "convert", nil, workspace: %{"inline" => "AAAA"}) end

    Zygo.run_script!(c, "convert", FakeAPI.digest(), %{"to" => "png"},
      workspace: %{"inline" => Base.encode64(tar)},
      out: true
    )

    body = FakeAPI.json(List.last(FakeAPI.requests(api)))
    assert body["workspace"] == %{"inline" => Base.encode64(tar)}
    assert body["out"] == true
    Zygo.run_script!(c, "convert", FakeAPI.digest(), nil, workspace: %{"blob" => blob})
    assert FakeAPI.json(List.last(FakeAPI.requests(api)))["workspace"] == %{"blob" => blob}
    Zygo.run_script!(c, "convert", nil, nil, source: "print(1)", workspace: {:tar, tar})
    body = FakeAPI.json(List.last(FakeAPI.requests(api)))
    assert body["source"] == "print(1)"
    assert Base.decode64!(body["workspace"]["inline"]) == tar
    assert_raise ArgumentError, fn -> Zygo.run_script(c, "convert", nil) end
  end

  test "put_blob and put_script send raw bytes", %{api: api, c: c} do
    b = Zygo.put_blob!(c, <<1, 2, 3>>)
    req = List.last(FakeAPI.requests(api))
    assert req.body == <<1, 2, 3>>
    assert req.headers["content-type"] == "application/octet-stream"
    assert b.sha256 =~ "sha256:"
    s = Zygo.put_script!(c, "def handler(e):\n    return e\n")
    assert List.last(FakeAPI.requests(api)).body == "def handler(e):\n    return e\n"
    assert s.size == 29
  end

  test "started defaults to true when the answer has no such field", %{api: api, c: c} do
    FakeAPI.set_handler(api, fn _ -> {:reply, 200, Map.delete(FakeAPI.result(), "started")} end)
    assert Zygo.call!(c, "f").started == true
    FakeAPI.set_handler(api, fn _ -> {:reply, 200, %{"exit_code" => 0, "stdout" => ""}} end)
    assert %Zygo.RunResult{started: true, ok: true} = Zygo.run!(c, ["true"])

    FakeAPI.set_handler(api, fn _ ->
      {:reply, 200, %{"exit_code" => nil, "started" => false, "phase" => "start"}}
    end)

    assert %Zygo.RunResult{started: false, ok: false, phase: "start"} = Zygo.run!(c, ["true"])
  end
end
