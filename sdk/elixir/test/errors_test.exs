defmodule Zygo.ErrorsTest do
  use ExUnit.Case, async: true

  setup do
    api = FakeAPI.start()
    on_exit(fn -> FakeAPI.stop(api) end)
    %{api: api}
  end

  defp answer(api, status, body, headers \\ []) do
    FakeAPI.set_handler(api, fn _ -> {:reply, status, body, headers: headers} end)
    # What each answer returns, as it comes (busy is not sent again here).
    {:error, e} = Zygo.call(Zygo.connect(api.url, retry_busy: false), "f")
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

  # The first `n` requests are refused (`retry_after` nil: without Retry-After), each
  # `took` ms on `clock` (see recording/2).
  defp refusing(api, n, status \\ 429, retry_after \\ "0", took \\ 0, clock \\ nil) do
    counter = :counters.new(1, [])

    FakeAPI.set_handler(api, fn _ ->
      :counters.add(counter, 1, 1)

      if :counters.get(counter, 1) <= n do
        if clock, do: :atomics.add(clock, 1, took)
        code = if status == 429, do: "busy", else: "unavailable"
        headers = if retry_after, do: [{"Retry-After", retry_after}], else: []
        {:reply, status, %{"error" => code, "code" => code}, headers: headers}
      else
        {:reply, 200, FakeAPI.result()}
      end
    end)
  end

  # The waits `client` sleeps, on a clock that moves only when it sleeps (or a test says
  # the server took its time): the limits are exact.
  defp recording(client, clock \\ :atomics.new(1, [])) do
    me = self()

    %{
      client
      | sleep: fn ms ->
          send(me, {:slept, ms})
          :atomics.add(clock, 1, ms)
        end,
        clock: fn -> :atomics.get(clock, 1) end
    }
  end

  defp slept do
    receive do
      {:slept, ms} -> [ms | slept()]
    after
      0 -> []
    end
  end

  test "unavailable is not resent by default", %{api: api} do
    refusing(api, 1, 503)
    assert {:error, %Zygo.Error{kind: :unavailable}} = Zygo.call(recording(Zygo.connect(api.url)), "f")
    assert length(FakeAPI.requests(api)) == 1
    assert slept() == []
  end

  test "busy is resent by default after its Retry-After", %{api: api} do
    refusing(api, 2, 429, "2")
    assert Zygo.call!(recording(Zygo.connect(api.url)), "f").result == %{"ok" => true}
    assert length(FakeAPI.requests(api)) == 3
    assert slept() == [2000, 2000]
  end

  test "a busy wait is 1 s without Retry-After, at most 5 s, at least 100 ms", %{api: api} do
    for ra <- [nil, "60", "0"] do
      refusing(api, 1, 429, ra)
      Zygo.call!(recording(Zygo.connect(api.url)), "f")
    end

    assert slept() == [1000, 5000, 100]
    assert length(FakeAPI.requests(api)) == 6
  end

  test "retry_busy: false returns busy as it comes", %{api: api} do
    refusing(api, 1, 429, "1")
    c = recording(Zygo.connect(api.url, retry_busy: false))
    assert {:error, %Zygo.Error{kind: :busy, retry_after: 1000}} = Zygo.call(c, "f")
    assert length(FakeAPI.requests(api)) == 1
    assert slept() == []
    assert_raise ArgumentError, ~r/retry_busy is true or false/, fn -> Zygo.connect(retry_busy: 1) end
  end

  test "busy is resent for at most 30 s, and never past the call's timeout", %{api: api} do
    refusing(api, 100, 429, "2")
    assert {:error, %Zygo.Error{kind: :busy}} = Zygo.call(recording(Zygo.connect(api.url)), "f")
    # Sent at 0, 2, …, 30 s: the next would go out past 30 s after the first.
    assert slept() == List.duplicate(2000, 15)
    assert length(FakeAPI.requests(api)) == 16

    refusing(api, 100, 429, "2")
    c = recording(Zygo.connect(api.url))
    assert {:error, %Zygo.Error{kind: :busy}} = Zygo.call(c, "f", nil, timeout: 5_000)
    assert slept() == [2000, 2000]

    refusing(api, 100, 429, "2")
    c = recording(Zygo.connect(api.url, timeout: 3_000))
    assert {:error, %Zygo.Error{kind: :busy}} = Zygo.call(c, "f")
    assert slept() == [2000]
  end

  test "a busy that came after the whole wait is not resent", %{api: api} do
    # The API held the request in its queue for 30 s before it said busy.
    clock = :atomics.new(1, [])
    refusing(api, 1, 429, "1", 30_000, clock)
    assert {:error, %Zygo.Error{kind: :busy}} = Zygo.call(recording(Zygo.connect(api.url), clock), "f")
    assert length(FakeAPI.requests(api)) == 1
    assert slept() == []
  end

  test "retries come first, then busy is resent", %{api: api} do
    refusing(api, 3, 429, "0")
    Zygo.call!(recording(Zygo.connect(api.url, retries: 1, backoff: 500)), "f")
    assert slept() == [500, 100, 100]
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
    refusing(api, 1)
    c = Zygo.for_tenant(Zygo.connect(api.url, retry_busy: false), "acme")
    assert {:error, %Zygo.Error{kind: :busy}} = Zygo.call(c, "f")
  end
end
