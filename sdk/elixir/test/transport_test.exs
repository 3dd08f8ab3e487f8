defmodule Zygo.TransportTest do
  use ExUnit.Case, async: true

  setup do
    api = FakeAPI.start()
    on_exit(fn -> FakeAPI.stop(api) end)
    %{api: api}
  end

  defp conns(api), do: Enum.map(FakeAPI.requests(api), &{&1.conn, FakeAPI.json(&1)})

  test "every address form" do
    assert {:ok, %{kind: :unix, path: "/run/zygo/api.sock"}} = Zygo.Address.parse("unix:///run/zygo/api.sock")

    assert {:ok, %{kind: :tcp, host: "127.0.0.1", port: 7700, tls: false}} =
             Zygo.Address.parse("http://127.0.0.1:7700")

    assert {:ok, %{host: "zygo.internal", port: 8443, tls: true}} =
             Zygo.Address.parse("https://zygo.internal:8443")

    assert {:ok, %{port: 443}} = Zygo.Address.parse("https://zygo.internal")
    assert {:ok, %{host: "box", port: 9000, tls: false}} = Zygo.Address.parse("box:9000")

    assert {:ok, %{host: "::1", port: 7700, prefix: "/prefix"}} =
             Zygo.Address.parse("http://[::1]:7700/prefix/")

    for bad <- ["unix://relative.sock", "ftp://x:1", "box", "box:0", "box:99999", "http://"] do
      assert {:error, _} = Zygo.Address.parse(bad), bad
    end

    assert_raise ArgumentError, ~r/bad address/, fn -> Zygo.connect("box") end
    assert_raise ArgumentError, ~r/unknown option :retry/, fn -> Zygo.connect(retry: 3) end
  end

  test "argument, then ZYGO_API_URL, then the default" do
    saved = System.get_env("ZYGO_API_URL")

    try do
      System.put_env("ZYGO_API_URL", "unix:///tmp/x.sock")
      assert Zygo.connect().address.text == "unix:///tmp/x.sock"
      assert Zygo.connect("box:1").address.text == "http://box:1"
      System.delete_env("ZYGO_API_URL")
      assert Zygo.connect().address.text == "http://127.0.0.1:7700"
    after
      if saved, do: System.put_env("ZYGO_API_URL", saved), else: System.delete_env("ZYGO_API_URL")
    end
  end

  test "headers: token, tenant, key, timeout in milliseconds", %{api: api} do
    c = Zygo.connect(api.url, token: "zygo_abc")

    assert {:ok, %Zygo.Result{result: %{"ok" => true}} = r} =
             Zygo.call(Zygo.for_tenant(c, "acme"), "resize", %{"a" => 1}, timeout: 2_500, key: "job-1")

    assert r.metrics.wall_ms == 1.5
    [req] = FakeAPI.requests(api)
    assert {req.method, req.path} == {"POST", "/fn/resize"}
    assert req.headers["authorization"] == "Bearer zygo_abc"
    assert req.headers["x-zygo-tenant"] == "acme"
    assert req.headers["x-zygo-request-key"] == "job-1"
    assert req.headers["x-zygo-timeout-ms"] == "2500"
    assert FakeAPI.json(req) == %{"a" => 1}
    assert Zygo.call!(c, "resize").result == %{"ok" => true}
    last = List.last(FakeAPI.requests(api))
    refute Map.has_key?(last.headers, "x-zygo-tenant")
    assert last.body == "null"
  end

  test "token from ZYGO_API_TOKEN unless one is given", %{api: api} do
    System.put_env("ZYGO_API_TOKEN", "zygo_env")

    try do
      Zygo.functions!(Zygo.connect(api.url))
      assert List.last(FakeAPI.requests(api)).headers["authorization"] == "Bearer zygo_env"
      Zygo.functions!(Zygo.connect(api.url, token: "zygo_arg"))
      assert List.last(FakeAPI.requests(api)).headers["authorization"] == "Bearer zygo_arg"
    after
      System.delete_env("ZYGO_API_TOKEN")
    end
  end

  test "unix socket" do
    api = FakeAPI.start(unix: true)
    c = Zygo.connect(api.url)
    assert Zygo.call!(c, "f").result == %{"ok" => true}
    assert Zygo.call!(c, "f").result == %{"ok" => true}
    assert FakeAPI.connections(api) == 1
    assert hd(FakeAPI.requests(api)).headers["host"] == "localhost"
    FakeAPI.stop(api)
  end

  test "chunked answers, and connections reused across views", %{api: api} do
    FakeAPI.set_handler(api, fn _ -> {:reply, 200, FakeAPI.result(), chunked: true} end)
    c = Zygo.connect(api.url)
    for _ <- 1..5, do: assert(Zygo.call!(c, "f").result == %{"ok" => true})
    Zygo.call!(Zygo.for_tenant(c, "acme"), "f")
    assert FakeAPI.connections(api) == 1
  end

  test "Connection: close is honoured", %{api: api} do
    FakeAPI.set_handler(api, fn _ -> {:reply, 200, FakeAPI.result(), close: true} end)
    c = Zygo.connect(api.url)
    Zygo.call!(c, "f")
    Zygo.call!(c, "f")
    assert FakeAPI.connections(api) == 2
  end

  test "many processes share one client", %{api: api} do
    c = Zygo.connect(api.url, pool_size: 4)

    results =
      1..40
      |> Task.async_stream(fn i -> Zygo.call!(c, "f", i).result end, max_concurrency: 10)
      |> Enum.map(fn {:ok, r} -> r end)

    assert results == List.duplicate(%{"ok" => true}, 40)
    assert FakeAPI.connections(api) <= 4
    assert Enum.sort(Enum.map(FakeAPI.requests(api), &FakeAPI.json/1)) == Enum.to_list(1..40)
    assert %{out: 0, waiting: 0} = Zygo.Pool.info(c.pool)
  end

  test "a connection idle for more than 20 s is dropped", %{api: api} do
    c = Zygo.connect(api.url)
    Zygo.call!(c, "f")
    age(c, 19_500)
    Zygo.call!(c, "f")
    assert FakeAPI.connections(api) == 1
    age(c, 20_500)
    Zygo.call!(c, "f")
    assert FakeAPI.connections(api) == 2
    assert FakeAPI.wait_for(fn -> FakeAPI.closed_by_client(api) >= 1 end), "the stale connection was closed"
    assert Enum.map(FakeAPI.requests(api), & &1.conn) == [1, 1, 2]
  end

  # Makes the pool's idle connections look `ms` older than they are.
  defp age(c, ms) do
    :sys.replace_state(c.pool, fn s ->
      %{s | idle: Enum.map(s.idle, &%{&1 | idle_since: &1.idle_since - ms})}
    end)
  end

  test "a reused connection that ends before the answer is retried once on a fresh one", %{api: api} do
    counter = :counters.new(1, [])

    FakeAPI.set_handler(api, fn _ ->
      :counters.add(counter, 1, 1)
      if :counters.get(counter, 1) == 2, do: :hangup, else: {:reply, 200, FakeAPI.result()}
    end)

    c = Zygo.connect(api.url)
    Zygo.call!(c, "f", 1)
    assert Zygo.call!(c, "f", 2).result == %{"ok" => true}
    assert conns(api) == [{1, 1}, {1, 2}, {2, 2}]
  end

  test "a reused connection reset before the answer is retried once", %{api: api} do
    counter = :counters.new(1, [])

    FakeAPI.set_handler(api, fn _ ->
      :counters.add(counter, 1, 1)
      if :counters.get(counter, 1) == 2, do: :reset, else: {:reply, 200, FakeAPI.result()}
    end)

    c = Zygo.connect(api.url)
    Zygo.call!(c, "f", 1)
    assert Zygo.call!(c, "f", 2).result == %{"ok" => true}
    assert conns(api) == [{1, 1}, {1, 2}, {2, 2}]
  end

  test "a connection the server closed while idle is replaced, the request sent once", %{api: api} do
    counter = :counters.new(1, [])

    FakeAPI.set_handler(api, fn _ ->
      :counters.add(counter, 1, 1)
      {:reply, 200, FakeAPI.result(), hangup_after: :counters.get(counter, 1) == 1}
    end)

    c = Zygo.connect(api.url)
    Zygo.call!(c, "f", 1)
    Process.sleep(50)
    assert Zygo.call!(c, "f", 2).result == %{"ok" => true}
    assert conns(api) == [{1, 1}, {2, 2}]
  end

  test "a fresh connection that fails is a transport error, sent once", %{api: api} do
    FakeAPI.set_handler(api, fn _ -> :hangup end)
    assert {:error, %Zygo.Error{kind: :transport}} = Zygo.call(Zygo.connect(api.url), "f")
    assert length(FakeAPI.requests(api)) == 1
  end

  test "the retry on a fresh connection is not retried again", %{api: api} do
    counter = :counters.new(1, [])

    FakeAPI.set_handler(api, fn _ ->
      :counters.add(counter, 1, 1)
      if :counters.get(counter, 1) == 1, do: {:reply, 200, FakeAPI.result()}, else: :hangup
    end)

    c = Zygo.connect(api.url)
    Zygo.call!(c, "f", 1)
    assert {:error, %Zygo.Error{kind: :transport}} = Zygo.call(c, "f", 2)
    assert conns(api) == [{1, 1}, {1, 2}, {2, 2}]
  end

  test "a failure after the first byte is never retried", %{api: api} do
    counter = :counters.new(1, [])

    FakeAPI.set_handler(api, fn _ ->
      :counters.add(counter, 1, 1)

      if :counters.get(counter, 1) == 2,
        do: {:partial, "HTTP/1.1 200 OK\r\nContent-"},
        else: {:reply, 200, FakeAPI.result()}
    end)

    c = Zygo.connect(api.url)
    Zygo.call!(c, "f", 1)
    assert {:error, %Zygo.Error{kind: :transport, message: m}} = Zygo.call(c, "f", 2)
    assert m =~ "middle"
    assert conns(api) == [{1, 1}, {1, 2}]
    FakeAPI.set_handler(api, fn _ -> :hangup end)
    assert_raise Zygo.Error, ~r/failed/, fn -> Zygo.call!(c, "f", 3) end
  end

  test "nothing listening is a transport error naming the address" do
    {:ok, l} = :gen_tcp.listen(0, ip: {127, 0, 0, 1})
    {:ok, port} = :inet.port(l)
    :gen_tcp.close(l)

    assert {:error, %Zygo.Error{kind: :transport, message: m}} =
             Zygo.health(Zygo.connect("127.0.0.1:#{port}"))

    assert m =~ "127.0.0.1:#{port}"
  end

  test "a caller that crashes mid-request takes its socket with it", %{api: api} do
    me = self()

    FakeAPI.set_handler(api, fn req ->
      if req.method == "POST" do
        send(me, :in_handler)
        Process.sleep(300)
      end

      FakeAPI.default(req)
    end)

    c = Zygo.connect(api.url, pool_size: 1)
    Zygo.functions!(c)
    {pid, mon} = spawn_monitor(fn -> Zygo.call(c, "f") end)
    assert_receive :in_handler, 2000
    Process.exit(pid, :kill)
    assert_receive {:DOWN, ^mon, :process, ^pid, :killed}
    # the slot is free again, and the socket went with the caller: the next request runs on
    # a new connection instead of reading the dead caller's answer
    assert FakeAPI.wait_for(fn -> FakeAPI.closed_by_client(api) >= 1 end)
    assert {:ok, [_]} = Zygo.functions(c)
    assert FakeAPI.connections(api) == 2
    assert %{out: 0, idle: 1} = Zygo.Pool.info(c.pool)
  end

  test "more callers than pool_size wait for a connection", %{api: api} do
    release = :counters.new(1, [])

    FakeAPI.set_handler(api, fn _ ->
      FakeAPI.wait_for(fn -> :counters.get(release, 1) == 1 end, 10_000)
      {:reply, 200, FakeAPI.result()}
    end)

    c = Zygo.connect(api.url, pool_size: 2)
    tasks = for i <- 1..6, do: Task.async(fn -> Zygo.call!(c, "f", i) end)
    assert FakeAPI.wait_for(fn -> match?(%{out: 2, waiting: 4}, Zygo.Pool.info(c.pool)) end)
    :counters.put(release, 1, 1)
    Enum.each(tasks, &Task.await(&1, 15_000))
    assert FakeAPI.connections(api) == 2
    assert %{out: 0, waiting: 0, idle: 2} = Zygo.Pool.info(c.pool)
  end

  test "a supervised client is fetched by name", %{api: api} do
    {:ok, sup} =
      Supervisor.start_link([{Zygo, name: Zygo.TestClient, url: api.url, retries: 3}], strategy: :one_for_one)

    client = Zygo.client(Zygo.TestClient)
    assert client.retries == 3
    assert [%Zygo.FunctionInfo{name: "f"}] = Zygo.functions!(client)
    Supervisor.stop(sup)
  end
end
