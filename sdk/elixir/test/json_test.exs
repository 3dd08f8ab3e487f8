defmodule Zygo.JSONTest do
  use ExUnit.Case, async: true

  alias Zygo.JSON

  test "the codec of its own round-trips what the API sends" do
    v = %{"a" => [1, -2.5, 1.0e3, true, false, nil, "é\n\"\\\u0001"], "b" => %{"c" => ""}}
    assert {:ok, ^v} = JSON.decode_own(IO.iodata_to_binary(JSON.encode!(v)))
    assert {:ok, "😀"} = JSON.decode_own(~S("\ud83d\ude00"))
    assert {:ok, %{"x" => 1}} = JSON.decode_own(" {\"x\" : 1 } \n")
    assert {:ok, 0} = JSON.decode_own("0")
  end

  test "the codec of its own is strict" do
    for bad <- [
          ~S({"a":1,"a":2}),
          ~S({"a":1} x),
          ~S([1,]),
          ~S({"a":1,}),
          "\"raw\ncontrol\"",
          ~S("\x"),
          ~S("\ud83d"),
          "01",
          "1.",
          "NaN",
          "",
          ~S('single'),
          "\"\xff\"",
          String.duplicate("[", 600) <> String.duplicate("]", 600)
        ] do
      assert {:error, reason} = JSON.decode_own(bad), inspect(bad)
      assert is_binary(reason)
    end
  end

  test "the codec in use is the standard library's where there is one" do
    assert JSON.stdlib?() == (Version.compare(System.version(), "1.18.0") != :lt)
  end
end
