defmodule Zygo.Pool do
  @moduledoc """
  The connections of one client. A caller checks a connection out for one request and
  checks it back in; the socket moves with it (its controlling process is the caller while
  it is out), so a caller that crashes mid-request takes its socket down with it instead of
  leaving a half-read answer in the pool. The pool monitors each caller and frees its slot
  when it goes.

  At most `pool_size` connections exist at once; more callers wait for one to come free. A
  connection idle for more than 20 s is closed instead of handed out (the API hangs up on a
  connection that waited 30 s for its next request).
  """

  use GenServer

  alias Zygo.Conn

  @max_idle_ms 20_000

  @doc false
  def max_idle_ms, do: @max_idle_ms

  def start_link(opts) do
    case Keyword.get(opts, :name) do
      nil -> GenServer.start_link(__MODULE__, opts)
      name -> GenServer.start_link(__MODULE__, opts, name: name)
    end
  end

  @doc """
  Borrows a connection: `{:ok, ref, conn}` with a pooled connection now owned by the
  caller, or `{:ok, ref, nil}`: a free slot, and the caller opens a connection itself.
  """
  def checkout(pool), do: GenServer.call(pool, {:checkout, self()}, :infinity)

  @doc "Gives the slot back, with the connection when it may be used again."
  def checkin(pool, ref, nil), do: GenServer.cast(pool, {:checkin, ref, nil})

  def checkin(pool, ref, %Conn{} = conn) do
    pid = GenServer.whereis(pool)

    if pid && Conn.controlling_process(conn, pid) == :ok do
      GenServer.cast(pool, {:checkin, ref, %{conn | buf: "", got: false}})
    else
      Conn.close(conn)
      GenServer.cast(pool, {:checkin, ref, nil})
    end
  end

  @doc false
  def info(pool), do: GenServer.call(pool, :info)

  @impl true
  def init(opts) do
    Process.flag(:trap_exit, false)
    client = Keyword.fetch!(opts, :client)
    {:ok, %{client: client, size: client.pool_size, idle: [], out: %{}, waiting: :queue.new()}}
  end

  @impl true
  def handle_call(:client, _from, s), do: {:reply, s.client, s}

  def handle_call(:info, _from, s),
    do: {:reply, %{idle: length(s.idle), out: map_size(s.out), waiting: :queue.len(s.waiting)}, s}

  def handle_call({:checkout, pid}, from, s) do
    if map_size(s.out) < s.size do
      {reply, s} = grant(pid, s)
      {:reply, reply, s}
    else
      {:noreply, %{s | waiting: :queue.in({from, pid}, s.waiting)}}
    end
  end

  @impl true
  def handle_cast({:checkin, ref, conn}, s) do
    case Map.pop(s.out, ref) do
      {nil, _} ->
        if conn, do: Conn.close(conn)
        {:noreply, s}

      {{_pid, mon}, out} ->
        Process.demonitor(mon, [:flush])
        s = %{s | out: out}

        s =
          cond do
            conn == nil -> s
            length(s.idle) >= s.size -> Conn.close(conn) && s
            true -> %{s | idle: [%{conn | idle_since: now()} | s.idle]}
          end

        {:noreply, serve_waiting(s)}
    end
  end

  @impl true
  def handle_info({:DOWN, mon, :process, _pid, _reason}, s) do
    # A caller went with its connection: the socket was its own and is closed already.
    out = s.out |> Enum.reject(fn {_ref, {_p, m}} -> m == mon end) |> Map.new()
    waiting = :queue.filter(fn {_from, p} -> Process.alive?(p) end, s.waiting)
    {:noreply, serve_waiting(%{s | out: out, waiting: waiting})}
  end

  def handle_info(_msg, s), do: {:noreply, s}

  @impl true
  def terminate(_reason, s), do: Enum.each(s.idle, &Conn.close/1)

  defp serve_waiting(s) do
    if map_size(s.out) < s.size do
      case :queue.out(s.waiting) do
        {{:value, {from, pid}}, rest} ->
          s = %{s | waiting: rest}

          if Process.alive?(pid) do
            {reply, s} = grant(pid, s)
            GenServer.reply(from, reply)
            serve_waiting(s)
          else
            serve_waiting(s)
          end

        {:empty, _} ->
          s
      end
    else
      s
    end
  end

  defp grant(pid, s) do
    ref = make_ref()
    mon = Process.monitor(pid)
    {conn, idle} = fresh(s.idle, now())

    conn =
      case conn do
        nil ->
          nil

        c ->
          case Conn.controlling_process(c, pid) do
            :ok ->
              %{c | reused: true}

            _ ->
              Conn.close(c)
              nil
          end
      end

    {{:ok, ref, conn}, %{s | idle: idle, out: Map.put(s.out, ref, {pid, mon})}}
  end

  # The most recently used idle connection that has not been idle too long; the stale ones
  # are closed.
  defp fresh([], _now), do: {nil, []}

  defp fresh([c | rest], now) do
    if now - c.idle_since > @max_idle_ms do
      Conn.close(c)
      fresh(rest, now)
    else
      {c, rest}
    end
  end

  defp now, do: System.monotonic_time(:millisecond)
end
