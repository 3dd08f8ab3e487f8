defmodule Zygo.Types do
  @moduledoc false

  def str(v, d \\ "")
  def str(v, _) when is_binary(v), do: v
  def str(_, d), do: d
  def ostr(v) when is_binary(v), do: v
  def ostr(_), do: nil
  def num(v) when is_number(v), do: v
  def num(_), do: nil
  def int(v) when is_integer(v), do: v
  def int(_), do: nil
  def bool(v, _) when is_boolean(v), do: v
  def bool(_, d), do: d
  def map(v) when is_map(v), do: v
  def map(_), do: %{}

  def workspace(d) do
    v =
      case d["workspace"] do
        %{"inline" => s} -> s
        s -> s
      end

    case v do
      s when is_binary(s) ->
        case Base.decode64(s) do
          {:ok, bytes} -> bytes
          :error -> throw({:zygo_error, %Zygo.Error{message: "the answer's workspace is not valid base64"}})
        end

      _ ->
        nil
    end
  end
end

defmodule Zygo.Metrics do
  @moduledoc "A request's timings: `wall_ms`, `cpu_ms`, `peak_rss_kb`."
  import Zygo.Types
  defstruct wall_ms: nil, cpu_ms: nil, peak_rss_kb: nil
  @type t :: %__MODULE__{wall_ms: number | nil, cpu_ms: number | nil, peak_rss_kb: integer | nil}
  @doc false
  def from_json(v) do
    d = map(v)
    %__MODULE__{wall_ms: num(d["wall_ms"]), cpu_ms: num(d["cpu_ms"]), peak_rss_kb: int(d["peak_rss_kb"])}
  end
end

defmodule Zygo.Result do
  @moduledoc """
  A call's answer: `result` is what the handler returned; `workspace` is the returned tar,
  already decoded, when the call asked for `out: true`. `started` is true unless Zygo could
  not start the request; an older API that does not send it counts as true.
  `stream_truncated` (a stream's result only) is true when the stream was read too slowly,
  so output events were dropped from some point on; `stdout` and `stderr` are still whole
  up to their caps.
  """
  import Zygo.Types

  defstruct result: nil,
            request_id: nil,
            stdout: "",
            stderr: "",
            stdout_truncated: false,
            stderr_truncated: false,
            started: true,
            metrics: %Zygo.Metrics{},
            workspace: nil,
            stream_truncated: false,
            raw: %{}

  @type t :: %__MODULE__{}

  @doc false
  def from_json(v) do
    d = map(v)

    %__MODULE__{
      result: d["result"],
      request_id: ostr(d["request_id"]),
      stdout: str(d["stdout"]),
      stderr: str(d["stderr"]),
      stdout_truncated: bool(d["stdout_truncated"], false),
      stderr_truncated: bool(d["stderr_truncated"], false),
      started: bool(d["started"], true),
      metrics: Zygo.Metrics.from_json(d["metrics"]),
      workspace: workspace(d),
      stream_truncated: bool(d["stream_truncated"], false),
      raw: d
    }
  end
end

defmodule Zygo.RunResult do
  @moduledoc """
  A one-shot run's answer. `ok` is true only when the program ran and exited 0; `started:
  false` (with `phase` and `error`) means Zygo could not build the sandbox.
  """
  import Zygo.Types

  defstruct exit_code: nil,
            signal: nil,
            timed_out: false,
            oom_killed: false,
            peak_rss_kb: nil,
            wall_ms: nil,
            cpu_ms: nil,
            stdout: "",
            stderr: "",
            stdout_truncated: false,
            stderr_truncated: false,
            started: true,
            phase: nil,
            error: nil,
            request_id: nil,
            ok: false,
            raw: %{}

  @type t :: %__MODULE__{}

  @doc false
  def from_json(v) do
    d = map(v)

    r = %__MODULE__{
      exit_code: int(d["exit_code"]),
      signal: int(d["signal"]),
      timed_out: bool(d["timed_out"], false),
      oom_killed: bool(d["oom_killed"], false),
      peak_rss_kb: int(d["peak_rss_kb"]),
      wall_ms: num(d["wall_ms"]),
      cpu_ms: num(d["cpu_ms"]),
      stdout: str(d["stdout"]),
      stderr: str(d["stderr"]),
      stdout_truncated: bool(d["stdout_truncated"], false),
      stderr_truncated: bool(d["stderr_truncated"], false),
      started: bool(d["started"], true),
      phase: ostr(d["phase"]),
      error: ostr(d["error"]),
      request_id: ostr(d["request_id"]),
      raw: d
    }

    %{r | ok: r.started and r.exit_code == 0 and not r.timed_out and not r.oom_killed}
  end
end

defmodule Zygo.Script do
  @moduledoc "A script in the host's store, named by the SHA-256 of its bytes."
  import Zygo.Types
  defstruct sha256: "", size: nil, existed: false, held: true, raw: %{}
  @type t :: %__MODULE__{}
  @doc false
  def from_json(v) do
    d = map(v)

    %__MODULE__{
      sha256: str(d["sha256"]),
      size: int(d["size"]),
      existed: bool(d["existed"], false),
      held: bool(d["held"], true),
      raw: d
    }
  end
end

defmodule Zygo.Blob do
  @moduledoc "A stored workspace tar, named by its SHA-256."
  import Zygo.Types
  defstruct sha256: "", size: nil, existed: false, raw: %{}
  @type t :: %__MODULE__{}
  @doc false
  def from_json(v) do
    d = map(v)
    %__MODULE__{sha256: str(d["sha256"]), size: int(d["size"]), existed: bool(d["existed"], false), raw: d}
  end
end

defmodule Zygo.Deps do
  @moduledoc "A dependency set: `state` is \"building\", \"ready\" or \"failed\" (with `log`)."
  import Zygo.Types
  defstruct id: "", state: "", image: nil, log: nil, building: false, ready: false, failed: false, raw: %{}
  @type t :: %__MODULE__{}
  @doc false
  def from_json(v) do
    d = map(v)
    s = str(d["state"])

    %__MODULE__{
      id: str(d["id"]),
      state: s,
      image: ostr(d["image"]),
      log: ostr(d["log"]),
      building: s == "building",
      ready: s == "ready",
      failed: s == "failed",
      raw: d
    }
  end
end

defmodule Zygo.FunctionInfo do
  @moduledoc "A function or runtime pool the caller can see."
  import Zygo.Types

  defstruct name: "",
            kind: "function",
            state: "",
            error: nil,
            zygotes: %{},
            in_flight: 0,
            min_warm: nil,
            max_warm: nil,
            raw: %{}

  @type t :: %__MODULE__{}
  @doc false
  def from_json(v) do
    d = map(v)

    %__MODULE__{
      name: str(d["name"]),
      kind: str(d["kind"], "function"),
      state: str(d["state"]),
      error: ostr(d["error"]),
      zygotes: map(d["zygotes"]),
      in_flight: int(d["in_flight"]) || 0,
      min_warm: int(d["min_warm"]),
      max_warm: int(d["max_warm"]),
      raw: d
    }
  end
end

defmodule Zygo.Tenant do
  @moduledoc "One customer's record."
  import Zygo.Types

  defstruct id: "",
            created_ms: nil,
            limits: %{},
            functions: [],
            scripts: [],
            tokens: 0,
            created: nil,
            raw: %{}

  @type t :: %__MODULE__{}
  @doc false
  def from_json(v, created \\ nil) do
    d = map(v)
    strings = fn l -> if is_list(l), do: Enum.filter(l, &is_binary/1), else: [] end

    %__MODULE__{
      id: str(d["id"]),
      created_ms: int(d["created_ms"]),
      limits: map(d["limits"]),
      functions: strings.(d["functions"]),
      scripts: strings.(d["scripts"]),
      tokens: int(d["tokens"]) || 0,
      created: created,
      raw: d
    }
  end
end

defmodule Zygo.Token do
  @moduledoc "A token's record; `secret` is set only in the answer that minted it."
  import Zygo.Types
  @derive {Inspect, except: [:secret]}
  defstruct id: "", tenant: nil, created_ms: nil, revoked_ms: nil, secret: nil, raw: %{}
  @type t :: %__MODULE__{}
  @doc false
  def from_json(v) do
    d = map(v)

    %__MODULE__{
      id: str(d["id"]),
      tenant: ostr(d["tenant"]),
      created_ms: int(d["created_ms"]),
      revoked_ms: int(d["revoked_ms"]),
      secret: ostr(d["secret"]),
      raw: d
    }
  end
end
