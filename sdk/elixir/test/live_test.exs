defmodule Zygo.LiveTest do
  @moduledoc """
  The client against a real `zygo api`. `ZYGO_LIVE=1 mix test --only live` runs the
  read-only check against the API that ZYGO_API_URL names. The rest (tag `:live_own`)
  serve, call, cancel, create and delete things, and run only against an API of the
  suite's own: sdk/live.sh starts one (a function `echo`, a bootstrap token with deploy
  rights) and runs `ZYGO_LIVE=1 ZYGO_LIVE_OWN=1 mix test --only live --only live_own`.
  """
  use ExUnit.Case, async: false

  setup do
    %{c: Zygo.connect(), uniq: Base.encode16(:crypto.strong_rand_bytes(4), case: :lower)}
  end

  @tag :live
  test "health, version, functions (read only)", %{c: c} do
    assert {:ok, %{"status" => status}} = Zygo.health(c)
    assert status in ["ok", "degraded"]
    assert {:ok, %{"version" => v}} = Zygo.version(c)
    assert is_binary(v)
    assert is_list(Zygo.functions!(c))
  end

  @tag :live_own
  test "deploy rights and the function are there", %{c: c} do
    assert {:ok, %{"private_net" => pn}} = Zygo.version(c)
    assert is_boolean(pn)
    assert Enum.any?(Zygo.functions!(c), &(&1.name == "echo"))
  end

  @tag :live_own
  test "call, stream, batch and the errors", %{c: c, uniq: uniq} do
    assert {:ok, %Zygo.Result{result: %{"n" => 1}} = r} = Zygo.call(c, "echo", %{"n" => 1}, timeout: 20_000)
    assert r.stdout =~ "hello from echo"
    # fractional milliseconds: a fast call's wall time is still more than 0
    assert is_number(r.metrics.wall_ms) and r.metrics.wall_ms > 0

    items = Enum.to_list(Zygo.stream(c, "echo", %{"progress" => true}))
    assert {:result, %Zygo.Result{result: %{"progress" => true}}} = List.last(items)
    assert {:progress, "half way"} in items

    assert [1, 2, 3] == Enum.map(Zygo.batch!(c, "echo", [1, 2, 3]), & &1.result)
    assert {:error, %Zygo.Error{kind: :handler, stdout: out}} = Zygo.call(c, "echo", %{"fail" => true})
    assert out =~ "hello from echo"
    assert {:error, %Zygo.Error{kind: :not_found}} = Zygo.call(c, "no-such-function-" <> uniq)

    assert {:error, %Zygo.Error{kind: :auth}} =
             Zygo.functions(Zygo.connect(token: "zygo_" <> String.duplicate("0", 64)))

    assert [{:stdout, _} | _] = Zygo.stream(c, "echo", %{"fail" => true}) |> Enum.take(1)
    assert_raise Zygo.Error, fn -> Zygo.stream!(c, "echo", %{"fail" => true}) |> Stream.run() end
  end

  @tag :live_own
  test "a key cancels a call from another process", %{c: c, uniq: uniq} do
    key = "live-" <> uniq
    task = Task.async(fn -> Zygo.call(c, "echo", %{"sleep" => 15}, key: key, timeout: 30_000) end)

    assert Enum.any?(1..200, fn _ ->
             case Zygo.cancel(c, key) do
               {:ok, n} when n >= 1 -> true
               {:error, %Zygo.Error{kind: :not_found}} -> Process.sleep(50) && false
             end
           end)

    assert {:error, %Zygo.Error{kind: :cancelled}} = Task.await(task, 40_000)
  end

  @tag :live_own
  test "scripts, a pool, a tenant and its token", %{c: c, uniq: uniq} do
    pool = "sdkex-" <> uniq
    tenant = "e" <> uniq
    Zygo.serve_runtime!(c, pool, %{"agent" => "python", "min_warm" => 1, "max_warm" => 2})

    try do
      %Zygo.Script{sha256: sha} =
        Zygo.put_script!(c, "def handler(event):\n    return {'twice': event * 2}\n")

      assert %{"twice" => 42} == Zygo.run_script!(c, pool, sha, 21).result
      assert %Zygo.Tenant{created: true} = Zygo.create_tenant!(c, tenant)

      try do
        minted = Zygo.mint_token!(c, tenant)
        acme = Zygo.connect(token: minted.secret)
        assert %Zygo.Tenant{id: ^tenant} = Zygo.tenant!(acme, tenant)
        assert {:error, %Zygo.Error{kind: :auth}} = Zygo.tenants(acme)
        assert {:error, %Zygo.Error{kind: :not_found}} = Zygo.script(acme, sha)
        mine = Zygo.put_script!(acme, "def handler(e):\n    return 'mine #{uniq}'\n")
        assert "mine #{uniq}" == Zygo.run_script!(acme, pool, mine).result
        Zygo.revoke_token!(c, minted.id)
        assert {:error, %Zygo.Error{kind: :auth}} = Zygo.tenant(acme, tenant)
      after
        Zygo.delete_tenant(c, tenant)
      end
    after
      Zygo.stop_runtime(c, pool)
    end
  end

  @tag :live_own
  test "a dependency set: built, served to a pool, kept while in use, deleted", %{c: c, uniq: uniq} do
    # A requirements.txt with no requirement: a real build that fetches nothing.
    d = Zygo.put_deps!(c, "host", %{"requirements.txt" => "# elixir #{uniq}\n"})
    assert d.id =~ ~r/^deps_[0-9a-f]{64}$/
    deadline = System.monotonic_time(:millisecond) + 120_000

    wait = fn wait ->
      got = Zygo.deps!(c, d.id)

      if got.building and System.monotonic_time(:millisecond) < deadline do
        Process.sleep(500)
        wait.(wait)
      else
        got
      end
    end

    assert %Zygo.Deps{state: "ready"} = wait.(wait)
    assert Enum.any?(Zygo.deps!(c), &(&1.id == d.id))
    pool = "sdkexdeps-" <> uniq
    Zygo.serve_runtime!(c, pool, %{"agent" => "python"}, deps: d.id)

    try do
      src = "import sys\ndef handler(e):\n    return sys.prefix\n"
      assert "/venv" == Zygo.run_script!(c, pool, nil, nil, source: src).result
      assert {:error, %Zygo.Error{status: 409}} = Zygo.delete_deps(c, d.id)
    after
      Zygo.stop_runtime(c, pool)
    end

    Zygo.delete_deps!(c, d.id)
    assert {:error, %Zygo.Error{kind: :not_found}} = Zygo.deps(c, d.id)
  end
end
