defmodule Zygo.RoutesTest do
  @moduledoc """
  Every route of the API but GET /metrics and POST /mcp (MCP's transport, for MCP clients)
  has a function: the route list comes from the
  OpenAPI document the repository commits (spec/openapi.json) when it exists, else from
  sdk/routes.json; each route's function is called against the stand-in API and must send
  that route.
  """
  use ExUnit.Case, async: true

  @openapi Path.expand("../../../spec/openapi.json", __DIR__)
  @fallback Path.expand("../../routes.json", __DIR__)

  def api_routes do
    if File.exists?(@openapi) do
      {:ok, doc} = Zygo.JSON.decode(File.read!(@openapi))

      routes =
        for {path, ops} <- doc["paths"],
            {m, _} <- ops,
            m in ~w(get put post delete patch),
            do: {String.upcase(m), path}

      {@openapi, routes -- [{"GET", "/metrics"}, {"POST", "/mcp"}]}
    else
      {:ok, doc} = Zygo.JSON.decode(File.read!(@fallback))
      {@fallback, Enum.map(doc["routes"], fn [m, p] -> {m, p} end) -- [{"GET", "/metrics"}, {"POST", "/mcp"}]}
    end
  end

  @d "sha256:" <> String.duplicate("ab", 32)

  def calls do
    %{
      {"GET", "/healthz"} => {:health, &Zygo.health/1},
      {"GET", "/version"} => {:version, &Zygo.version/1},
      {"GET", "/fn"} => {:functions, &Zygo.functions/1},
      {"PUT", "/fn/{name}"} => {:serve, &Zygo.serve(&1, "f", %{"agent" => "python"}, base_dir: "/srv")},
      {"DELETE", "/fn/{name}"} => {:stop, &Zygo.stop(&1, "f")},
      {"POST", "/fn/{name}"} => {:call, &Zygo.call(&1, "f", %{"a" => 1})},
      {"POST", "/fn/{name}/batch"} => {:batch, &Zygo.batch(&1, "f", [1, 2])},
      {"GET", "/fn/{name}/logs"} => {:logs, &Zygo.logs(&1, "f", limit: 5)},
      {"GET", "/fn/{name}/stats"} => {:stats, &Zygo.stats(&1, "f")},
      {"POST", "/fn/{name}/warm"} => {:warm, &Zygo.warm(&1, "f", 2)},
      {"POST", "/run"} => {:run, &Zygo.run(&1, ["echo", "hi"], mem: "64M", timeout: 5_000)},
      {"GET", "/runtimes"} => {:runtimes, &Zygo.runtimes/1},
      {"POST", "/runtimes"} =>
        {:serve_runtime,
         &Zygo.serve_runtime(&1, "py312", %{"image" => "host", "agent" => "python"}, secrets: ["K"])},
      {"DELETE", "/runtimes/{name}"} => {:stop_runtime, &Zygo.stop_runtime(&1, "py312")},
      {"POST", "/runtimes/{name}/call"} => {:run_script, &Zygo.run_script(&1, "py312", @d, %{"n" => 1})},
      {"PUT", "/scripts"} => {:put_script, &Zygo.put_script(&1, "print(1)")},
      {"GET", "/scripts/{digest}"} => {:script, &Zygo.script(&1, @d)},
      {"DELETE", "/scripts/{digest}"} => {:delete_script, &Zygo.delete_script(&1, @d)},
      {"PUT", "/blobs"} => {:put_blob, &Zygo.put_blob(&1, "tar")},
      {"DELETE", "/blobs/{digest}"} => {:delete_blob, &Zygo.delete_blob(&1, @d)},
      {"POST", "/deps"} =>
        {:put_deps, &Zygo.put_deps(&1, "python:3.12-slim", %{"requirements.txt" => "requests==2.32.3\n"})},
      {"GET", "/deps"} => {:deps, &Zygo.deps(&1)},
      {"GET", "/deps/{id}"} => {:deps, &Zygo.deps(&1, "deps_1")},
      {"DELETE", "/deps/{id}"} => {:delete_deps, &Zygo.delete_deps(&1, "deps_1")},
      {"DELETE", "/requests/{key}"} => {:cancel, &Zygo.cancel(&1, "job-1")},
      {"POST", "/tenants"} => {:create_tenant, &Zygo.create_tenant(&1, "acme")},
      {"GET", "/tenants"} => {:tenants, &Zygo.tenants/1},
      {"GET", "/tenants/{id}"} => {:tenant, &Zygo.tenant(&1, "acme")},
      {"DELETE", "/tenants/{id}"} => {:delete_tenant, &Zygo.delete_tenant(&1, "acme")},
      {"PATCH", "/tenants/{id}/limits"} =>
        {:set_limits, &Zygo.set_limits(&1, "acme", mem: "256M", cpu: 0.5, timeout: 30_000)},
      {"GET", "/tenants/{id}/secrets"} => {:secrets, &Zygo.secrets(&1, "acme")},
      {"PUT", "/tenants/{id}/secrets/{name}"} => {:put_secret, &Zygo.put_secret(&1, "acme", "K", "v")},
      {"DELETE", "/tenants/{id}/secrets/{name}"} => {:delete_secret, &Zygo.delete_secret(&1, "acme", "K")},
      {"POST", "/tokens"} => {:mint_token, &Zygo.mint_token(&1)},
      {"POST", "/tenants/{id}/tokens"} => {:mint_token, &Zygo.mint_token(&1, "acme")},
      {"GET", "/tokens"} => {:tokens, &Zygo.tokens/1},
      {"DELETE", "/tokens/{id}"} => {:revoke_token, &Zygo.revoke_token(&1, "tok_1")},
      {"POST", "/drain"} => {:drain, &Zygo.drain(&1, grace: 5_000)}
    }
  end

  defp template(t),
    do: Regex.compile!("^" <> Regex.replace(~r/\\\{[^}]+\\\}/, Regex.escape(t), "[^/]+") <> "$")

  test "every route but GET /metrics and POST /mcp has a function, and its ! twin" do
    {source, routes} = api_routes()
    IO.puts("\n  routes read from #{source}")
    assert length(routes) > 20
    missing = for {m, p} = r <- routes, not Map.has_key?(calls(), r), do: "#{m} #{p}"
    assert missing == [], "routes with no function in the Elixir client: #{inspect(missing)}"

    api = FakeAPI.start()
    c = Zygo.connect(api.url, token: "t")

    for {m, p} = r <- routes do
      {name, invoke} = calls()[r]

      assert function_exported?(Zygo, name, 1) or Enum.any?(2..5, &function_exported?(Zygo, name, &1)),
             "#{name}"

      assert Enum.any?(1..5, &function_exported?(Zygo, :"#{name}!", &1)), "#{name}!"
      before = length(FakeAPI.requests(api))
      assert {:ok, _} = invoke.(c), "#{name}"
      sent = Enum.drop(FakeAPI.requests(api), before)
      assert length(sent) == 1, "#{name} sent #{length(sent)} requests"
      assert hd(sent).method == m, "#{name}"
      assert hd(sent).path =~ template(p), "#{name}: #{hd(sent).path} is not #{p}"
    end

    FakeAPI.stop(api)
  end

  test "set_limits sends only what was given; nil clears" do
    api = FakeAPI.start()
    Zygo.set_limits!(Zygo.connect(api.url), "acme", mem: "256M", pids: nil, timeout: 1_500)

    assert FakeAPI.json(List.last(FakeAPI.requests(api))) == %{
             "mem" => "256M",
             "pids" => nil,
             "timeout" => "1500ms"
           }

    assert_raise ArgumentError, ~r/unknown limit/, fn ->
      Zygo.set_limits(Zygo.connect(api.url), "acme", memory: "1G")
    end

    FakeAPI.stop(api)
  end
end
