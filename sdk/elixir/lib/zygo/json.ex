defmodule Zygo.JSON do
  @moduledoc """
  JSON for the client: the standard library's `JSON` module where Elixir has one (1.18 and
  newer), else a small strict codec of this package's own (RFC 8259: one value, no trailing
  bytes, no duplicate keys, no control characters in strings, nesting capped).

  Objects decode to maps with string keys; `null` to `nil`.
  """

  @max_depth 512

  @doc "Decodes one JSON value; `{:ok, term}` or `{:error, reason}`."
  @spec decode(binary) :: {:ok, term} | {:error, String.t()}
  def decode(bin) when is_binary(bin) do
    if stdlib?() do
      case apply(JSON, :decode, [bin]) do
        {:ok, v} -> {:ok, v}
        {:error, e} -> {:error, inspect(e)}
      end
    else
      decode_own(bin)
    end
  end

  @doc "Encodes a term: maps (string or atom keys), lists, strings, numbers, booleans, nil."
  @spec encode!(term) :: binary
  def encode!(term) do
    if stdlib?(), do: apply(JSON, :encode!, [term]), else: IO.iodata_to_binary(enc(term))
  end

  @doc false
  def stdlib?, do: Code.ensure_loaded?(JSON) and function_exported?(JSON, :decode, 1)

  # ---- the codec of its own ----------------------------------------------------------

  @doc false
  def decode_own(bin) do
    try do
      {v, rest} = value(skip(bin), 0)

      case skip(rest) do
        "" ->
          {:ok, v}

        more ->
          {:error,
           "unexpected bytes after the JSON value: #{inspect(binary_part(more, 0, min(20, byte_size(more))))}"}
      end
    catch
      {:json, reason} -> {:error, reason}
    end
  end

  defp fail(reason), do: throw({:json, reason})

  defp skip(<<c, rest::binary>>) when c in [?\s, ?\t, ?\n, ?\r], do: skip(rest)
  defp skip(bin), do: bin

  defp value(_, depth) when depth > @max_depth, do: fail("JSON nested deeper than #{@max_depth}")
  defp value(<<?{, rest::binary>>, d), do: object(skip(rest), %{}, d + 1, true)
  defp value(<<?[, rest::binary>>, d), do: array(skip(rest), [], d + 1, true)
  defp value(<<?", rest::binary>>, _), do: string(rest, [])
  defp value(<<"true", rest::binary>>, _), do: {true, rest}
  defp value(<<"false", rest::binary>>, _), do: {false, rest}
  defp value(<<"null", rest::binary>>, _), do: {nil, rest}
  defp value(<<c, _::binary>> = bin, _) when c == ?- or c in ?0..?9, do: number(bin)
  defp value("", _), do: fail("unexpected end of JSON")
  defp value(<<c, _::binary>>, _), do: fail("unexpected character #{inspect(<<c>>)} in JSON")

  defp object(<<?}, rest::binary>>, acc, _d, true), do: {acc, rest}

  defp object(<<?", rest::binary>>, acc, d, _first) do
    {k, rest} = string(rest, [])

    if Map.has_key?(acc, k), do: fail("duplicate key #{inspect(k)} in a JSON object")

    case skip(rest) do
      <<?:, rest::binary>> ->
        {v, rest} = value(skip(rest), d)
        acc = Map.put(acc, k, v)

        case skip(rest) do
          <<?,, rest::binary>> -> object(skip(rest), acc, d, false)
          <<?}, rest::binary>> -> {acc, rest}
          _ -> fail("expected , or } in a JSON object")
        end

      _ ->
        fail("expected : after a key in a JSON object")
    end
  end

  defp object(_, _, _, _), do: fail("expected a string key in a JSON object")

  defp array(<<?], rest::binary>>, acc, _d, true), do: {Enum.reverse(acc), rest}

  defp array(bin, acc, d, _first) do
    {v, rest} = value(bin, d)

    case skip(rest) do
      <<?,, rest::binary>> -> array(skip(rest), [v | acc], d, false)
      <<?], rest::binary>> -> {Enum.reverse([v | acc]), rest}
      _ -> fail("expected , or ] in a JSON array")
    end
  end

  defp string(<<?", rest::binary>>, acc), do: {IO.iodata_to_binary(Enum.reverse(acc)), rest}

  defp string(<<?\\, e, rest::binary>>, acc) do
    case e do
      ?" -> string(rest, [?" | acc])
      ?\\ -> string(rest, [?\\ | acc])
      ?/ -> string(rest, [?/ | acc])
      ?b -> string(rest, [?\b | acc])
      ?f -> string(rest, [?\f | acc])
      ?n -> string(rest, [?\n | acc])
      ?r -> string(rest, [?\r | acc])
      ?t -> string(rest, [?\t | acc])
      ?u -> unicode(rest, acc)
      _ -> fail("bad escape \\#{<<e>>} in a JSON string")
    end
  end

  defp string(<<c, _::binary>>, _) when c < 0x20, do: fail("control character in a JSON string")

  defp string(bin, acc) do
    # copy the run of plain bytes up to the next quote, backslash or control character
    n = plain(bin, 0)

    if n == 0 do
      fail("unterminated JSON string")
    else
      <<run::binary-size(n), rest::binary>> = bin
      unless String.valid?(run), do: fail("a JSON string is not UTF-8")
      string(rest, [run | acc])
    end
  end

  defp plain(bin, n) do
    case bin do
      <<_::binary-size(n), c, _::binary>> when c != ?" and c != ?\\ and c >= 0x20 -> plain(bin, n + 1)
      _ -> n
    end
  end

  defp unicode(<<h::binary-size(4), rest::binary>>, acc) do
    cp = hex4(h)

    cond do
      cp in 0xD800..0xDBFF ->
        case rest do
          <<?\\, ?u, l::binary-size(4), rest2::binary>> ->
            lo = hex4(l)
            unless lo in 0xDC00..0xDFFF, do: fail("unpaired surrogate in a JSON string")
            string(rest2, [<<0x10000 + (cp - 0xD800) * 0x400 + (lo - 0xDC00)::utf8>> | acc])

          _ ->
            fail("unpaired surrogate in a JSON string")
        end

      cp in 0xDC00..0xDFFF ->
        fail("unpaired surrogate in a JSON string")

      true ->
        string(rest, [<<cp::utf8>> | acc])
    end
  end

  defp unicode(_, _), do: fail("bad \\u escape in a JSON string")

  defp hex4(h) do
    case Integer.parse(h, 16) do
      {n, ""} -> n
      _ -> fail("bad \\u escape in a JSON string")
    end
  end

  defp number(bin) do
    case Regex.run(~r/\A-?(?:0|[1-9][0-9]*)(\.[0-9]+)?([eE][+-]?[0-9]+)?/, bin) do
      [text | groups] ->
        rest = binary_part(bin, byte_size(text), byte_size(bin) - byte_size(text))

        v =
          if Enum.any?(groups, &(&1 != "")) do
            {f, ""} = Float.parse(text)
            f
          else
            String.to_integer(text)
          end

        {v, rest}

      nil ->
        fail("bad number in JSON")
    end
  rescue
    ArgumentError -> fail("bad number in JSON")
  end

  defp enc(nil), do: "null"
  defp enc(true), do: "true"
  defp enc(false), do: "false"
  defp enc(n) when is_integer(n), do: Integer.to_string(n)
  defp enc(f) when is_float(f), do: :erlang.float_to_binary(f, [:short])
  defp enc(a) when is_atom(a), do: enc_string(Atom.to_string(a))
  defp enc(s) when is_binary(s), do: enc_string(s)
  defp enc(l) when is_list(l), do: [?[, Enum.intersperse(Enum.map(l, &enc/1), ?,), ?]]

  defp enc(%{} = m) when not is_struct(m) do
    pairs =
      Enum.map(m, fn {k, v} ->
        key =
          cond do
            is_binary(k) -> k
            is_atom(k) -> Atom.to_string(k)
            true -> raise ArgumentError, "JSON object keys are strings or atoms, got #{inspect(k)}"
          end

        [enc_string(key), ?:, enc(v)]
      end)

    [?{, Enum.intersperse(pairs, ?,), ?}]
  end

  defp enc(other), do: raise(ArgumentError, "cannot encode #{inspect(other)} as JSON")

  defp enc_string(s) do
    unless String.valid?(s), do: raise(ArgumentError, "a JSON string must be UTF-8: #{inspect(s)}")
    [?", escape(s, []), ?"]
  end

  defp escape(<<>>, acc), do: Enum.reverse(acc)
  defp escape(<<?", r::binary>>, acc), do: escape(r, ["\\\"" | acc])
  defp escape(<<?\\, r::binary>>, acc), do: escape(r, ["\\\\" | acc])
  defp escape(<<?\n, r::binary>>, acc), do: escape(r, ["\\n" | acc])
  defp escape(<<?\r, r::binary>>, acc), do: escape(r, ["\\r" | acc])
  defp escape(<<?\t, r::binary>>, acc), do: escape(r, ["\\t" | acc])

  defp escape(<<c, r::binary>>, acc) when c < 0x20,
    do: escape(r, ["\\u" <> String.pad_leading(Integer.to_string(c, 16), 4, "0") | acc])

  defp escape(<<c::utf8, r::binary>>, acc), do: escape(r, [<<c::utf8>> | acc])
end
