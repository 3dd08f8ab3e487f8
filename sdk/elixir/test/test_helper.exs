Code.require_file("support/fake_api.exs", __DIR__)

# The live tests run only when asked: ZYGO_LIVE=1 mix test --only live (read only, against
# any API), and with ZYGO_LIVE_OWN=1 --only live_own too (against an API of the suite's own,
# as sdk/live.sh starts).
live = if System.get_env("ZYGO_LIVE") == "1", do: [:live], else: []

own =
  if System.get_env("ZYGO_LIVE") == "1" and System.get_env("ZYGO_LIVE_OWN") == "1", do: [:live_own], else: []

ExUnit.start(exclude: [:live, :live_own] -- (live ++ own))
