defmodule Zygo.Error do
  @moduledoc """
  Every failure the client reports. `kind` says which:

    * `:bad_request` (400), `:auth` (401, 403), `:not_found` (404), `:busy` (429),
      `:cancelled` (499), `:handler` (500 `handler`), `:unavailable` (503),
      `:timeout` (504 `timeout`, 408 `api_timeout`), `:stuck` (504 `stuck`),
    * `:transport`: the connection failed (could not connect, or broke after the first
      byte of the answer); never retried,
    * `:error`: anything else, a 409, 413, 422 (a limit above every ceiling) or a 500
      `internal` among them.

  The other fields are filled where the answer had them; `retry_after` is in milliseconds.
  """

  @type kind ::
          :bad_request
          | :auth
          | :not_found
          | :busy
          | :unavailable
          | :handler
          | :timeout
          | :cancelled
          | :stuck
          | :transport
          | :error

  @type t :: %__MODULE__{
          kind: kind,
          message: String.t(),
          status: non_neg_integer | nil,
          code: String.t() | nil,
          request_id: String.t() | nil,
          retry_after: non_neg_integer | nil,
          stdout: String.t(),
          stderr: String.t(),
          exit_code: integer | nil,
          traceback: String.t() | nil,
          oom_killed: boolean,
          started: boolean | nil,
          body: map
        }

  defexception kind: :error,
               message: "",
               status: nil,
               code: nil,
               request_id: nil,
               retry_after: nil,
               stdout: "",
               stderr: "",
               exit_code: nil,
               traceback: nil,
               oom_killed: false,
               started: nil,
               body: %{}

  @doc false
  def transport(message), do: %__MODULE__{kind: :transport, message: message}

  @doc "The error a non-2xx answer stands for. `retry_after` in milliseconds."
  @spec from_answer(non_neg_integer, term, non_neg_integer | nil, String.t() | nil) :: t
  def from_answer(status, body, retry_after \\ nil, request_id \\ nil) do
    b = if is_map(body), do: body, else: %{}
    code = str_or_nil(b["code"])

    message =
      case b["error"] do
        m when is_binary(m) and m != "" ->
          m

        _ ->
          cond do
            status == 503 and b["status"] == "stopping" ->
              "the API is stopping (draining); nothing new is taken"

            is_binary(body) and String.trim(body) != "" ->
              "HTTP #{status}: #{String.slice(String.trim(body), 0, 500)}"

            true ->
              "HTTP #{status}"
          end
      end

    kind =
      case {status, code} do
        {400, _} -> :bad_request
        {401, _} -> :auth
        {403, _} -> :auth
        {404, _} -> :not_found
        {408, _} -> :timeout
        {429, _} -> :busy
        {499, _} -> :cancelled
        {500, "handler"} -> :handler
        {503, _} -> :unavailable
        {504, "stuck"} -> :stuck
        {504, _} -> :timeout
        _ -> :error
      end

    retry_after =
      retry_after ||
        case b["retry_after"] do
          n when is_number(n) and n >= 0 -> round(n * 1000)
          _ -> nil
        end

    %__MODULE__{
      kind: kind,
      message: message,
      status: status,
      code: code,
      request_id: str_or_nil(b["request_id"]) || request_id,
      retry_after: retry_after,
      stdout: str_or(b["stdout"], ""),
      stderr: str_or(b["stderr"], ""),
      exit_code: if(is_integer(b["exit_code"]), do: b["exit_code"]),
      traceback: str_or_nil(b["traceback"]),
      oom_killed: b["oom_killed"] == true,
      started:
        cond do
          is_boolean(b["started"]) -> b["started"]
          kind in [:handler, :timeout, :cancelled, :stuck] -> true
          true -> nil
        end,
      body: b
    }
  end

  defp str_or_nil(v) when is_binary(v), do: v
  defp str_or_nil(_), do: nil
  defp str_or(v, _) when is_binary(v), do: v
  defp str_or(_, d), do: d
end
