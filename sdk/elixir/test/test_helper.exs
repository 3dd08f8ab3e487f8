Code.require_file("support/fake_api.exs", __DIR__)

# The live suite runs only when asked: ZYGO_LIVE=1 mix test --only live
if System.get_env("ZYGO_LIVE") == "1" do
  ExUnit.start(include: [:live])
else
  ExUnit.start(exclude: [:live])
end
