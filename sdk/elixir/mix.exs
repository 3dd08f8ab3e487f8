defmodule Zygo.MixProject do
  use Mix.Project

  # No dependencies: the standard library's JSON where Elixir has one (1.18+), else the
  # small strict codec in lib/zygo/json.ex; :gen_tcp and :ssl for the transport.
  def project do
    [
      app: :zygo_sdk,
      version: "0.1.5",
      elixir: "~> 1.14",
      start_permanent: Mix.env() == :prod,
      deps: [],
      description: "Client for the Zygo sandbox runtime's HTTP API",
      package: [licenses: ["Apache-2.0"], links: %{}],
      test_coverage: [summary: false]
    ]
  end

  def application do
    [extra_applications: [:logger, :ssl, :public_key, :crypto]]
  end
end
