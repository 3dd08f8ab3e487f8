defmodule Zygo.ErrorsTest do
  use ExUnit.Case, async: true

  setup do
    api = FakeAPI.start()
    on_exit(fn -> FakeAPI.stop(api) end)
    %{api: api}
  end

  defp answer(api, status, body, headers \\ []) do
    FakeAPI.set_handler(api, fn _ -> {:reply, status, body, headers: headers} end)
    {:error, e} = Zygo.call(Zygo.connect(api.url), "f")
    e
  end

  test "every status has its kind", %{api: api} do
    for {status, code, kind} <- [
          {400, "bad_request", :bad_request},
          {400, "bad_spec", :bad_request},
          {400, "missing_secret", :bad_request},
          {401, "unauthorized", :auth},
          {403, "forbidden", :auth},
          {404, "not_found", :not_found},
          {408, "api_timeout", :timeout},
          {429, "busy", :busy},
          {499, "cancelled", :cancelled},
          {500, "handler", :handler},
          {503, "unavailable", :unavailable},
          {504, "timeout", :timeout},
          {504, "stuck", :stuck},
          {409, "conflict", :error},
          {413, "too_large", :error},
          {422, "above_ceiling", :error},
          {500, "internal", :error}
        ] do
      e = answer(api, status, %{"error" => "it was #{code}", "code" => code})

      assert {e.kind, e.status, e.code, e.message} == {kind, status, code, "it was #{code}"},
             "#{status} #{code}"
    end
  end

  test "a handler error carries what the handler did", %{api: api} do
    e =
      answer(api, 500, %{
        "error" => "ValueError",
        "code" => "handler",
        "request_id" => "req-9",
        "stdout" => "out",
        "stderr" => "err",
        "traceback" => "tb",
        "exit_code" => 3
      })

    assert {e.stdout, e.stderr, e.exit_code, e.request_id, e.traceback, e.started} ==
             {"out", "err", 3, "req-9", "tb", true}

    assert_raise Zygo.Error, "ValueError", fn -> raise e end
  end

  test "busy carries retry_after in milliseconds; request id from the header", %{api: api} do
    e = answer(api, 429, %{"error" => "busy", "code" => "busy"}, [{"Retry-After", "2"}])
    assert e.retry_after == 2_000
    assert e.request_id == "req-x"
  end

  test "a body that is not JSON still names the status", %{api: api} do
    e = answer(api, 502, "<html>bad gateway</html>")
    assert e.kind == :error
    assert e.message =~ "502"
  end

  test "health: stopping is :unavailable", %{api: api} do
    FakeAPI.set_handler(api, fn _ -> {:reply, 503, %{"status" => "stopping"}} end)
    assert {:error, %Zygo.Error{kind: :unavailable, message: m}} = Zygo.health(Zygo.connect(api.url))
    assert m =~ "stopping"
  end

  test "batch returns errors as elements", %{api: api} do
    FakeAPI.set_handler(api, fn _ ->
      {:reply, 200,
       %{
         "results" => [
           Map.put(FakeAPI.result(), "status", 200),
           %{"status" => 429, "error" => "busy", "code" => "busy"},
           %{"status" => 500, "error" => "boom", "code" => "handler", "stderr" => "tb"}
         ]
       }}
    end)

    assert [%Zygo.Result{}, %Zygo.Error{kind: :busy}, %Zygo.Error{kind: :handler, stderr: "tb"}] =
             Zygo.batch!(Zygo.connect(api.url), "f", [1, 2, 3])

    assert FakeAPI.json(List.last(FakeAPI.requests(api))) == %{"events" => [1, 2, 3]}
  end

  defp refusing(api, n, status \\ 429, retry_after \\ "0") do
    counter = :counters.new(1, [])

    FakeAPI.set_handler(api, fn _ ->
      :counters.add(counter, 1, 1)

      if :counters.get(counter, 1) <= n do
        code = if status == 429, do: "busy", else: "unavailable"
        {:reply, status, %{"error" => code, "code" => code}, headers: [{"Retry-After", retry_after}]}
      else
        {:reply, 200, FakeAPI.result()}
      end
    end)
  end

  defp recording(client) do
    me = self()
    %{client | sleep: fn ms -> send(me, {:slept, ms}) end}
  end

  defp slept do
    receive do
      {:slept, ms} -> [ms | slept()]
    after
      0 -> []
    end
  end

  test "no retries by default", %{api: api} do
    refusing(api, 1)
    assert {:error, %Zygo.Error{kind: :busy}} = Zygo.call(recording(Zygo.connect(api.url)), "f")
    assert length(FakeAPI.requests(api)) == 1
    assert slept() == []
  end

  test "busy is resent, backoff doubling", %{api: api} do
    refusing(api, 3)
    c = recording(Zygo.connect(api.url, retries: 3, backoff: 500))
    assert Zygo.call!(c, "f").result == %{"ok" => true}
    assert length(FakeAPI.requests(api)) == 4
    assert slept() == [500, 1000, 2000]
  end

  test "Retry-After wins when longer; the last refusal is what the caller sees", %{api: api} do
    refusing(api, 2, 503, "3")
    Zygo.call!(recording(Zygo.connect(api.url, retries: 2, backoff: 2000)), "f")
    assert slept() == [3000, 4000]

    api2 = FakeAPI.start()
    refusing(api2, 10, 503, "1")
    c = recording(Zygo.connect(api2.url, retries: 2, backoff: 100))
    assert {:error, %Zygo.Error{kind: :unavailable, retry_after: 1000}} = Zygo.call(c, "f")
    assert length(FakeAPI.requests(api2)) == 3
    FakeAPI.stop(api2)
  end

  test "other errors are never resent", %{api: api} do
    for {status, code} <- [{500, "handler"}, {504, "timeout"}, {404, "not_found"}] do
      FakeAPI.set_handler(api, fn _ -> {:reply, status, %{"error" => code, "code" => code}} end)
      before = length(FakeAPI.requests(api))
      assert {:error, _} = Zygo.call(recording(Zygo.connect(api.url, retries: 3)), "f")
      assert length(FakeAPI.requests(api)) == before + 1
    end

    assert slept() == []
  end

  test "for_tenant views keep the retry settings", %{api: api} do
    refusing(api, 1)
    c = recording(Zygo.connect(api.url, retries: 1, backoff: 250))
    Zygo.call!(Zygo.for_tenant(c, "acme"), "f")
    assert slept() == [250]
  end
end
