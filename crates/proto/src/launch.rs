//! monitor ⇄ launcher: the finished plan goes down, what the kernel said comes back.
//!
//! The launcher never decides policy: everything in [`LaunchPlan`] has already been checked
//! and narrowed by the monitor. The launcher only builds what it is told.

use serde::{Deserialize, Serialize};

/// Cap for frames on a launcher channel: a zygote's channel carries events and results.
pub const MAX_LAUNCH_FRAME: usize = crate::frame::MAX_FRAME;

/// What the sandbox's root is made of.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub enum Image {
    /// The host's `/usr`, `/bin`, `/lib*`, `/sbin` and a subset of `/etc`, read-only.
    Host,
    /// Every top-level entry of this host directory, read-only.
    Dir(String),
}

/// A host path bound into the sandbox.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct BindMount {
    pub src: String,
    pub dst: String,
    pub rw: bool,
    /// The monitor opened `src` itself and hands it over as a detached mount tree (already
    /// read-only unless `rw`, nosuid, nodev) in `ToLauncher::Mounts`, one descriptor per
    /// handed mount in the plan's order: the launcher places it and never resolves `src`.
    /// `false` (rootless): the launcher binds `src` from inside, with the user's rights.
    pub handed: bool,
    /// A filesystem the monitor made for this sandbox alone (a dependency build's output,
    /// a size-capped tmpfs), handed over like the others (`handed` is set; `src` only
    /// names it): placed as it is, never idmapped, since no other sandbox ever mounts it.
    /// Such mounts come after every other mount of the plan.
    pub fresh: bool,
    /// Who the sandbox's id 0 is on disk in this handed tree (set by the monitor for every
    /// handed mount but a fresh one): the launcher mounts it idmapped so that this owner's
    /// files are id 0's inside and what id 0 writes there is this owner's on disk. For a
    /// writable folder it is the folder's own owner; see [`DiskOwner`]. `None`: placed as
    /// it is.
    pub owner: Option<DiskOwner>,
}

/// Ids on disk that a sandbox's id 0 (uid and gid) stands for in a host folder handed to
/// it. A writable folder is written as its owner: the files the sandbox makes there belong
/// to whoever owned the folder when the monitor opened it (root's folder, root's files), and
/// that owner's files are the sandbox's to change. A read-only folder gets the subordinate
/// range's base ids, as every sandbox's root was on disk before each had a host uid of its
/// own (so the sandbox reads the owner's files only as their mode lets anyone).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct DiskOwner {
    pub uid: u32,
    pub gid: u32,
}

/// How the sandbox's ids map onto the host's.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum IdMap {
    /// Zygo runs as root: ids 0..count inside map onto a subordinate host range that
    /// nothing else uses. Never host id 0.
    ///
    /// The `owners` host ids right after the mapped ones (`base + count ..`) are for the
    /// sandboxes' owners: the launcher creates the user namespace as host id
    /// `base + count + (its own pid % owners)`, which no other live sandbox has when
    /// `owners` covers every pid. The kernel charges what it counts per user (inotify
    /// instances and watches, queued signals, locked memory, ...) to a namespace's owner,
    /// so no sandbox uses another's allowance. With `owners` 0 the owner is `base`.
    ///
    /// Id 0 inside maps onto that owner id too (ids 1..count onto `base + 1 ..`): the
    /// kernel also counts pipe buffers, descriptors in flight and epoll watches per host
    /// uid of the process, so every sandbox's root is a host uid of its own. Host folders
    /// handed in are mounted idmapped, so that id 0 is one owner on disk there whichever
    /// sandbox wrote them: a writable folder's own owner, the base ids in a read-only one
    /// (see [`DiskOwner`]). A read-only folder on a filesystem that cannot be idmapped is
    /// mounted as it is; a writable one is refused. Gids are mapped `0..count` onto
    /// `gid_base ..`.
    Range {
        uid_base: u32,
        gid_base: u32,
        count: u32,
        owners: u32,
    },
    /// Zygo runs as an ordinary user: id 0 inside is that user, and nothing else is mapped.
    Single { uid: u32, gid: u32 },
}

/// A file the launcher writes into the sandbox's root before it is made read-only
/// (the agent, scripts, code sent with a call). `path` is absolute inside the sandbox,
/// under `/run` or `/zygo`; each of those is a read-only tmpfs holding only these files.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct InjectedFile {
    pub path: String,
    pub contents: Vec<u8>,
}

/// A file of a zygote's agent. The launcher carries each in its binary and writes the ones
/// the plan names into the sandbox, read-only, at [`AgentFile::path`]; the monitor decides
/// which, and the command line that runs them.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum AgentFile {
    /// The Python agent, which every zygote runs.
    PythonAgent,
    /// Its bootstrap: compiles the agent in a throwaway process, then runs it.
    PythonBoot,
    /// The Node spare that a Node function's or pool's parked child execs.
    NodeSpare,
}

impl AgentFile {
    /// Where the file is in the sandbox.
    pub const fn path(self) -> &'static str {
        match self {
            AgentFile::PythonAgent => "/run/zygo/python_agent.py",
            AgentFile::PythonBoot => "/run/zygo/python_boot.py",
            AgentFile::NodeSpare => "/run/zygo/node_agent.mjs",
        }
    }
}

/// What runs in the sandbox once it is built.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum Mode {
    /// One program; the sandbox ends with it.
    OneShot,
    /// A warm agent speaking the agent protocol on fds 3 and 4; the sandbox lives until
    /// the monitor ends it. `/work` is mode 0311 and the deadline is per request.
    Zygote,
}

/// Everything the launcher needs to build one sandbox and run its program.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct LaunchPlan {
    pub mode: Mode,
    pub argv: Vec<String>,
    pub env: Vec<(String, String)>,
    pub cwd: String,
    pub image: Image,
    pub mounts: Vec<BindMount>,
    /// Size cap of `/tmp` and of `/work`, in bytes.
    pub scratch_bytes: u64,
    /// The launcher kills the whole sandbox this long after the program started.
    pub timeout_ms: u64,
    pub ids: IdMap,
    pub hostname: String,
    pub files: Vec<InjectedFile>,
    /// A host directory bound writable at `/work` instead of a fresh tmpfs (a workspace that
    /// persists across sandboxes).
    pub work: Option<String>,
    /// A runtime pool: `/run/script` is a tmpfs the launcher writes scripts into from
    /// outside; nothing inside may list or change it.
    pub scripts: bool,
    /// The host image's `/etc`, prepared ahead by the monitor; `None` (or a prepared copy
    /// that has gone) and the launcher assembles it from the host's `/etc` itself.
    pub etc: Option<PreparedEtc>,
    /// A zygote whose requests each run as a uid of their own: those uids (inside the
    /// sandbox, mapped by `ids`). `None`: every process of the sandbox is uid 0 inside.
    pub request_ids: Option<RequestIds>,
    /// Whether programs may use inotify. Off unless asked for: a watch on a file of the
    /// read-only image (shared with the host and other sandboxes) sees when anyone opens it.
    pub inotify: bool,
    /// A `dir:` image the monitor opened itself: the first descriptor of `ToLauncher::Mounts`
    /// is that folder as a detached read-only mount tree, whose entries the launcher binds
    /// (see `BindMount::handed`).
    pub image_handed: bool,
    /// `work` opened by the monitor itself: the last descriptor of `ToLauncher::Mounts` is
    /// that folder as a detached writable tree, placed at `/work`.
    pub work_handed: bool,
    /// Who the sandbox's id 0 is on disk in the handed `work` folder (see
    /// [`BindMount::owner`]).
    pub work_owner: Option<DiskOwner>,
    /// `/proc` is mounted `hidepid=invisible`: each process sees only those of its own uid
    /// that it may ptrace (a zygote's requests, each its own uid or Landlock domain).
    pub hide_pids: bool,
    /// Mode of the sandbox's own `/work` tmpfs when no `work` folder is given: a one-shot
    /// program's home (`0o755`), or a zygote agent's, which nothing else may list (`0o311`).
    pub work_mode: u32,
    /// The agent's files, written under `/run` beside `files` (a zygote's; none for a
    /// one-shot sandbox).
    pub agents: Vec<AgentFile>,
    /// `Some`: the sandbox has egress (the monitor's policy has checked these rules; empty
    /// means nothing is reachable). Every IPv4 address is local in the sandbox's network
    /// namespace; the launcher's egress filter listens on each rule's address and port
    /// there and relays what the rules allow. `None`: loopback only.
    pub egress: Option<Egress>,
    /// The function or pool names secrets: `/run/secrets` is made, empty, for each
    /// request's own tmpfs of them to be mounted on (see `ToLauncher::Call::secrets`).
    pub secrets: bool,
}

/// What an egress sandbox may reach, as the monitor's policy has checked it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Egress {
    pub rules: Vec<EgressRule>,
    pub names: Vec<EgressName>,
    /// The host's DNS servers (IPv4, port 53) the egress filter asks for `names`.
    pub resolvers: Vec<[u8; 4]>,
    /// The sandbox's memory limit in bytes (`None`: unlimited). The egress filter is not in
    /// the sandbox's cgroup: it keeps the buffers of the sandbox's connections within a
    /// share of this limit itself.
    pub mem_bytes: Option<u64>,
}

/// What a launcher tells the egress filter it starts, in one message on their private
/// socket (the listening sockets travel beside it, one per rule at most, then the DNS one).
/// The filter checks every rule again (see `policy::egress`): it takes nothing on trust.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct EgressStart {
    /// Host ids the filter switches to when started as root (`None`: it stays who it is).
    pub ids: Option<(u32, u32)>,
    /// How the filter's log lines name the sandbox.
    pub label: String,
    pub egress: Egress,
}

/// The largest [`EgressStart`] a filter reads: the most rules a plan may carry, each name
/// at its longest, with room to spare.
pub const MAX_EGRESS_START: usize = 32 * 1024;

/// One name rule: TCP to `port` at an address the filter resolved for `name`, with that
/// name in TLS SNI or the HTTP `Host` header.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct EgressName {
    pub name: String,
    pub port: u16,
    /// The name may resolve to a private or other special address.
    pub private_ok: bool,
}

/// The most egress rules a plan may carry.
pub const MAX_EGRESS_RULES: usize = 64;

/// One egress rule: TCP to `port` on an address inside `addr/prefix`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct EgressRule {
    pub addr: [u8; 4],
    pub prefix: u8,
    pub port: u16,
}

/// The uids a zygote gives its requests, one each, never twice: `first .. first + count`
/// inside the sandbox. The monitor replaces the zygote before they run out.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct RequestIds {
    pub first: u32,
    pub count: u32,
}

/// A directory holding the host image's `/etc` as [`HOST_ETC`] and [`HOST_ETC_GENERATED`]
/// describe it: the copied files, the recreated symlinks and the generated files, plus an
/// empty mount point for each entry in `binds`, which the launcher binds from the host's
/// `/etc` (directories, and files not copied). The launcher binds `dir` read-only as the
/// sandbox's `/etc`: one mount instead of a copy per file.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct PreparedEtc {
    pub dir: String,
    pub binds: Vec<String>,
}

/// The part of the host's `/etc` in the host image: what a program needs to start and to
/// find libraries, certificates, time zones and locale names. A world-readable regular
/// file of at most [`ETC_COPY_MAX`] bytes is copied, a symlink recreated as it is, anything
/// else bound read-only. What only administration tools read (`ld.so.conf`,
/// `ca-certificates.conf` and their folders: ldconfig and update-ca-certificates cannot
/// work on a read-only `/etc` anyway) is left out.
pub const HOST_ETC: &[&str] = &[
    "alternatives",
    "ld.so.cache",
    "localtime",
    "timezone",
    "locale.alias",
    "nsswitch.conf",
    "ssl",
    "mime.types",
    "protocols",
    "services",
    "gai.conf",
    "host.conf",
    "os-release",
    "debian_version",
    "python3",
    "python3.11",
    "python3.12",
    "xdg",
    "profile",
];

/// The largest host `/etc` file the host image copies rather than binds.
pub const ETC_COPY_MAX: u64 = 256 * 1024;

/// Files of the host image's `/etc` that Zygo writes itself, so nothing about the host's
/// users or network leaks in.
pub const HOST_ETC_GENERATED: &[(&str, &str)] = &[
    (
        "passwd",
        "root:x:0:0:sandbox:/work:/bin/sh\nnobody:x:65534:65534:nobody:/nonexistent:/usr/sbin/nologin\n",
    ),
    ("group", "root:x:0:\nnogroup:x:65534:\n"),
    (
        "hosts",
        "127.0.0.1\tlocalhost zygo\n::1\tlocalhost ip6-localhost ip6-loopback\n",
    ),
    ("hostname", "zygo\n"),
    ("resolv.conf", ""),
];

/// The phase a sandbox was in when something went wrong.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum Phase {
    /// Deciding what to build (policy, limits, images): nothing was started.
    Plan,
    /// Building the sandbox or starting the program in it.
    Start,
    /// The program was running.
    Run,
}

impl Phase {
    pub fn as_str(self) -> &'static str {
        match self {
            Phase::Plan => "plan",
            Phase::Start => "start",
            Phase::Run => "run",
        }
    }
}

/// The most cgroup attach files a launcher accepts (one per cgroup hierarchy).
pub const MAX_ATTACH_FILES: u8 = 8;

/// The most mounts the monitor hands over to one sandbox.
pub const MAX_HANDED_MOUNTS: u8 = 64;

/// monitor → launcher.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub enum ToLauncher {
    /// The sandbox's cgroup attach files: this frame carries `files` descriptors (at most
    /// [`MAX_ATTACH_FILES`]) as `SCM_RIGHTS` on its first byte. The sandbox's init joins
    /// its cgroups by writing "0" to each before it does anything else. Sent once, just
    /// before or just after `Start` (the launcher creates the sandbox's namespaces as soon
    /// as it has the plan, and hands these to its init when they come).
    Cgroup { files: u8 },
    /// Build this sandbox and run its program. Sent once, first or right after `Cgroup`
    /// (and `Mounts`).
    Start(Box<LaunchPlan>),
    /// The sandbox's first process is in its cgroups: let it go on.
    Proceed,
    /// Kill the sandbox now (cancel, or the monitor's own deadline).
    Kill,
    /// Zygote: have the agent fork one child for this slot.
    Park { slot: String },
    /// Zygote: hand this request to the slot's parked child. `event` is JSON text the
    /// monitor has already parsed and re-serialised.
    Call {
        slot: String,
        request_id: String,
        event: String,
        /// A pool's script for this call: written (if not there yet) at
        /// `/run/script/<digest>`, read-only, before the request reaches the child.
        script: Option<Script>,
        /// A tar the launcher unpacks into the child's own directory before the request
        /// reaches it (at most `front::MAX_WORKSPACE` bytes).
        workspace: Option<crate::bytes::Bytes>,
        /// Pack the child's directory once its handler answered ([`FromLauncher::WorkspaceOut`]
        /// before the terminal message).
        out: bool,
        /// The caller takes progress as it comes: each `progress` line goes up. Otherwise a
        /// progress line only says the handler is alive, and goes up as a heartbeat does.
        progress: bool,
        /// A smaller size for the child's `/tmp` and `/work` than the plan's (a tenant's
        /// scratch limit): they are shrunk to it before the request reaches the child.
        scratch_bytes: Option<u64>,
        /// Files for the request's own `/run/secrets/` (a tmpfs in the request's mount
        /// namespace, written by the launcher from outside before the request reaches the
        /// child: mode 0400, owned by the request's uid; gone with the request).
        secrets: Vec<SecretFile>,
    },
    /// Zygote: drop the slot's child unused (its channel closes, so it exits). A child
    /// that served its request is dropped by the launcher itself once its channel closes.
    Reap { slot: String },
    /// The plan's handed-over mounts (see `BindMount::handed`): this frame carries `count`
    /// descriptors (at most [`MAX_HANDED_MOUNTS`]) as `SCM_RIGHTS` on its first byte, one
    /// detached mount tree each: the image's first if `LaunchPlan::image_handed`, then one
    /// per handed mount, in the plan's order, then `/work`'s if `LaunchPlan::work_handed`.
    /// Sent once, before `Start`.
    Mounts { count: u8 },
}

/// One secret for a request: its name (`[A-Za-z_][A-Za-z0-9_]{0,63}`) and value. Its
/// `Debug` shows the name only.
#[derive(Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct SecretFile {
    pub name: String,
    pub value: Vec<u8>,
}

impl std::fmt::Debug for SecretFile {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SecretFile")
            .field("name", &self.name)
            .field("value", &"<redacted>")
            .finish()
    }
}

/// At most this many secrets per request, and this many bytes of values together (they go
/// to the launcher's mounter in one message).
pub const MAX_REQUEST_SECRETS: usize = 32;
pub const MAX_REQUEST_SECRET_BYTES: usize = 128 * 1024;

/// A script from the monitor's store.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Script {
    /// Lowercase hex SHA-256 of `source`.
    pub digest: String,
    pub source: Vec<u8>,
}

/// Which output stream.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum Stream {
    Stdout,
    Stderr,
}

/// launcher → monitor.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub enum FromLauncher {
    /// The sandbox's first process exists (host pid) and waits to be placed in its
    /// cgroups; the launcher waits for [`ToLauncher::Proceed`].
    Cloned { pid: i32 },
    /// The program was exec'd inside the finished sandbox.
    Started,
    /// The program ended. `signal` is set when it was killed by one.
    Exited {
        code: Option<i32>,
        signal: Option<i32>,
        timed_out: bool,
        wall_us: u64,
    },
    /// The sandbox could not be built, or the program could not be started.
    Failed { phase: Phase, reason: String },
    /// Zygote: the agent imported the handler.
    Ready,
    /// Zygote: the handler could not be imported; the zygote is ending.
    ImportError { message: String, traceback: String },
    /// Zygote: the agent is alive.
    Heartbeat,
    /// Zygote: a child for this slot exists (host pid) and waits, parked.
    Parked { slot: String, pid: i32 },
    /// Zygote: the agent could not fork for this slot.
    ParkFailed { slot: String, message: String },
    /// Zygote: output of the slot's request.
    Output {
        slot: String,
        stream: Stream,
        data: String,
    },
    /// Zygote: `event.progress(text)`.
    Progress { slot: String, text: String },
    /// Zygote: the slot's child is alive.
    ChildHeartbeat { slot: String },
    /// Zygote: the handler returned this JSON value (text).
    Returned { slot: String, value: String },
    /// Zygote: the handler raised, or its value could not be serialised; `exit_code` when
    /// its process ended by exiting with that code (`sys.exit(3)`, a warm-exec command).
    Raised {
        slot: String,
        message: String,
        traceback: String,
        exit_code: Option<i32>,
    },
    /// Zygote: the slot's channel closed. `violation` says why when the child broke the
    /// protocol (it has been disowned; the monitor kills its cgroup).
    SlotClosed {
        slot: String,
        violation: Option<String>,
    },
    /// Zygote (a runtime pool): the call given to the slot was not delivered, because its
    /// script could not be placed in the sandbox's script space: larger than that space
    /// (`too_large`), or the space is full of scripts of calls in flight. Nothing ran; the
    /// slot's child is dropped (`SlotClosed` follows).
    ScriptRefused {
        slot: String,
        too_large: bool,
        message: String,
    },
    /// Zygote: the call given to the slot was not delivered, because its workspace could
    /// not be unpacked: an entry that is not a regular file or a directory, a path that
    /// leaves the directory, an archive that lies or is cut, or a cap reached (`too_large`).
    /// Nothing ran; the slot's child is dropped (`SlotClosed` follows).
    WorkspaceRefused {
        slot: String,
        too_large: bool,
        message: String,
    },
    /// Zygote: the slot's directory, packed after its handler answered (a call with
    /// `out`), sent just before `Returned` or `Raised`. `tar` is None when the directory was
    /// no longer a directory; `truncated` when a cap left entries out.
    WorkspaceOut {
        slot: String,
        tar: Option<crate::bytes::Bytes>,
        truncated: bool,
    },
}

/// What a launcher has said so far in a one-shot conversation, with no I/O: the one place
/// that decides which message may come when, for `zygo run` (the monitor's blocking loop)
/// and for the supervisor's runs (its event loop) alike.
///
/// The launcher says, in this order: `Cloned` (the sandbox's init waits to be checked and
/// let go, answered with [`OneShotTalk::answer_cloned`]), `Started`, then `Exited`; or
/// `Failed` at any point before an end. Anything else, or anything out of that order,
/// ends the conversation.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct OneShotTalk {
    cloned: bool,
    started: bool,
    ended: bool,
}

/// A launcher message [`OneShotTalk::hear`] took.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Said {
    /// The sandbox's init (host pid) waits to be checked in its cgroup.
    Cloned { pid: i32 },
    /// The program was exec'd.
    Started,
    /// The program ended.
    Exited {
        code: Option<i32>,
        signal: Option<i32>,
        timed_out: bool,
        wall_us: u64,
    },
    /// The sandbox could not be built, or the program could not be started.
    Failed { phase: Phase, reason: String },
}

/// Where the sandbox's init is, as its cgroup says when it is `Cloned`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Placement {
    /// In its cgroup (it put itself there, or the monitor moved it).
    Placed,
    /// Gone already: it dies with its launcher, whose end says what happened.
    Gone,
    /// It could not be placed: the run fails with this.
    Failed(String),
}

impl OneShotTalk {
    /// Take the launcher's next message, or say what was out of order.
    pub fn hear(&mut self, m: FromLauncher) -> Result<Said, String> {
        let said = match m {
            FromLauncher::Cloned { pid } if !self.cloned && !self.ended => {
                self.cloned = true;
                Said::Cloned { pid }
            }
            FromLauncher::Started if self.cloned && !self.started && !self.ended => {
                self.started = true;
                Said::Started
            }
            FromLauncher::Exited {
                code,
                signal,
                timed_out,
                wall_us,
            } if self.started && !self.ended => {
                self.ended = true;
                Said::Exited {
                    code,
                    signal,
                    timed_out,
                    wall_us,
                }
            }
            FromLauncher::Failed { phase, reason } if !self.ended => {
                self.ended = true;
                Said::Failed { phase, reason }
            }
            other => return Err(format!("sent {} out of order", other.kind())),
        };
        Ok(said)
    }

    /// Whether the program was started.
    pub fn started(&self) -> bool {
        self.started
    }

    /// Whether the launcher reported the end (`Exited` or `Failed`).
    pub fn ended(&self) -> bool {
        self.ended
    }

    /// The answer to `Cloned`: go on only when init is in its cgroup and nobody ended the
    /// run meanwhile (`killed`); otherwise the launcher kills the sandbox. With the error
    /// the run fails with, if any.
    pub fn answer_cloned(placed: Placement, killed: bool) -> (ToLauncher, Option<String>) {
        match placed {
            Placement::Placed if !killed => (ToLauncher::Proceed, None),
            Placement::Placed | Placement::Gone => (ToLauncher::Kill, None),
            Placement::Failed(why) => (
                ToLauncher::Kill,
                Some(format!("place the sandbox in its cgroup: {why}")),
            ),
        }
    }
}

impl FromLauncher {
    /// The message's kind, for logs (never its contents, which may be large).
    pub fn kind(&self) -> &'static str {
        match self {
            FromLauncher::Cloned { .. } => "cloned",
            FromLauncher::Started => "started",
            FromLauncher::Exited { .. } => "exited",
            FromLauncher::Failed { .. } => "failed",
            FromLauncher::Ready => "ready",
            FromLauncher::ImportError { .. } => "import_error",
            FromLauncher::Heartbeat => "heartbeat",
            FromLauncher::Parked { .. } => "parked",
            FromLauncher::ParkFailed { .. } => "park_failed",
            FromLauncher::Output { .. } => "output",
            FromLauncher::Progress { .. } => "progress",
            FromLauncher::ChildHeartbeat { .. } => "child_heartbeat",
            FromLauncher::Returned { .. } => "returned",
            FromLauncher::Raised { .. } => "raised",
            FromLauncher::SlotClosed { .. } => "slot_closed",
            FromLauncher::ScriptRefused { .. } => "script_refused",
            FromLauncher::WorkspaceRefused { .. } => "workspace_refused",
            FromLauncher::WorkspaceOut { .. } => "workspace_out",
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn exited() -> FromLauncher {
        FromLauncher::Exited {
            code: Some(0),
            signal: None,
            timed_out: false,
            wall_us: 1,
        }
    }

    #[test]
    fn a_one_shot_launcher_says_cloned_started_exited_in_that_order() {
        let mut t = OneShotTalk::default();
        assert!(
            t.hear(FromLauncher::Started).is_err(),
            "started before cloned"
        );
        let mut t2 = OneShotTalk::default();
        assert!(t2.hear(exited()).is_err(), "exited before it started");
        assert_eq!(
            t.hear(FromLauncher::Cloned { pid: 7 }),
            Ok(Said::Cloned { pid: 7 })
        );
        assert!(
            t.hear(FromLauncher::Cloned { pid: 7 }).is_err(),
            "cloned twice"
        );
        assert_eq!(t.hear(FromLauncher::Started), Ok(Said::Started));
        assert!(t.started() && !t.ended());
        assert!(t.hear(FromLauncher::Started).is_err(), "started twice");
        assert!(matches!(t.hear(exited()), Ok(Said::Exited { .. })));
        assert!(t.ended());
        let failed = FromLauncher::Failed {
            phase: Phase::Run,
            reason: "x".into(),
        };
        assert!(t.hear(failed).is_err(), "failed after the end");
        assert!(t.hear(FromLauncher::Ready).is_err(), "a zygote's message");
    }

    #[test]
    fn failed_may_come_at_any_point_before_an_end() {
        for before in [0, 1, 2] {
            let mut t = OneShotTalk::default();
            if before > 0 {
                assert!(t.hear(FromLauncher::Cloned { pid: 1 }).is_ok());
            }
            if before > 1 {
                assert!(t.hear(FromLauncher::Started).is_ok());
            }
            let failed = FromLauncher::Failed {
                phase: Phase::Start,
                reason: "no".into(),
            };
            assert!(
                matches!(t.hear(failed), Ok(Said::Failed { .. })),
                "{before}"
            );
            assert!(t.ended());
            assert!(t.hear(exited()).is_err());
        }
    }

    #[test]
    fn init_goes_on_only_when_placed_and_not_killed() {
        let answer = OneShotTalk::answer_cloned;
        assert!(matches!(
            answer(Placement::Placed, false),
            (ToLauncher::Proceed, None)
        ));
        assert!(matches!(
            answer(Placement::Placed, true),
            (ToLauncher::Kill, None)
        ));
        assert!(matches!(
            answer(Placement::Gone, false),
            (ToLauncher::Kill, None)
        ));
        let (reply, error) = answer(Placement::Failed("EACCES".into()), false);
        assert!(matches!(reply, ToLauncher::Kill));
        assert_eq!(
            error.as_deref(),
            Some("place the sandbox in its cgroup: EACCES")
        );
    }
}
