//! `zygo api`: bind the listener, open the channels to the running supervisor and say
//! hello on each as the API role with the flags, confine the process
//! ([`zygo_front::confine`]), then serve HTTP ([`zygo_front::http`]). Everything after the
//! confinement runs with no filesystem, no new sockets and no exec.

use std::ffi::OsString;
use std::net::{SocketAddr, TcpListener};
use std::os::fd::AsRawFd;
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::{Path, PathBuf};

use policy::file::ApiSettings;

use plumbing::client;
use proto::api::FrontFlags;
use zygo_front::confine::{confine, FrontRole};
use zygo_front::delivery::{self, Endpoint};
use zygo_front::http;

use crate::{usage, usage_error};

/// Where `zygo api` listens when not told.
pub const DEFAULT_LISTEN: &str = "127.0.0.1:7700";

enum Listen {
    Tcp(SocketAddr),
    Unix(PathBuf),
}

struct Opts {
    listen: Listen,
    flags: FrontFlags,
    openapi: bool,
    webhook: Option<Endpoint>,
    otlp: Option<Endpoint>,
}

/// Parse an address to listen on; `what` names where it was given (`--listen`, or the
/// file's `[api] listen`).
fn parse_listen(what: &str, s: &str) -> Result<Listen, String> {
    if let Some(path) = s.strip_prefix("unix://") {
        if !path.starts_with('/') {
            return Err(format!(
                "{what} {s}: a unix socket is unix:///absolute/path"
            ));
        }
        return Ok(Listen::Unix(PathBuf::from(path)));
    }
    // Parsed, never resolved: an address, not a host name.
    s.parse::<SocketAddr>().map(Listen::Tcp).map_err(|_| {
        format!("{what} {s}: give IP:PORT (e.g. 127.0.0.1:7700 or [::1]:7700) or unix:///path")
    })
}

/// `[api]` of the `-f` sandbox.toml, else of `./sandbox.toml` if there is one, and the
/// file's path (for messages).
fn file_settings(flag: Option<&Path>) -> Result<Option<(PathBuf, ApiSettings)>, String> {
    let given = match flag {
        Some(f) => f.to_path_buf(),
        None if Path::new("sandbox.toml").exists() => PathBuf::from("sandbox.toml"),
        None => return Ok(None),
    };
    let (path, parsed) = crate::sandbox_file::read(&given)?;
    Ok(Some((path, parsed.api)))
}

fn parse(raw: Vec<OsString>) -> Result<Option<Opts>, String> {
    use lexopt::prelude::*;
    let mut listen: Option<String> = None;
    let mut file: Option<PathBuf> = None;
    let mut flags = FrontFlags::default();
    let mut openapi = false;
    let (mut webhook, mut otlp) = (None, None);
    let mut p = lexopt::Parser::from_args(raw);
    while let Some(arg) = p.next().map_err(|e| e.to_string())? {
        match arg {
            Long("help") | Short('h') => return Ok(None),
            Long("listen") => {
                if listen.is_some() {
                    return Err("--listen given twice".into());
                }
                let v = p.value().map_err(|e| e.to_string())?;
                listen = Some(
                    v.into_string()
                        .map_err(|_| "--listen is not UTF-8".to_string())?,
                );
            }
            Short('f') | Long("file") => {
                if file.is_some() {
                    return Err("-f given twice".into());
                }
                file = Some(PathBuf::from(p.value().map_err(|e| e.to_string())?));
            }
            Long("allow-deploy") => flags.allow_deploy = true,
            Long("allow-private-net") => flags.allow_private_net = true,
            Long("no-auth") => flags.no_auth = true,
            Long("openapi") => openapi = true,
            Long(name @ ("otlp-endpoint" | "usage-webhook")) => {
                let f = name.to_string();
                let v = p.value().map_err(|e| e.to_string())?;
                let v = v.into_string().map_err(|_| format!("--{f} is not UTF-8"))?;
                let slot = if f == "otlp-endpoint" {
                    &mut otlp
                } else {
                    &mut webhook
                };
                if slot.is_some() {
                    return Err(format!("--{f} given twice"));
                }
                *slot = Some(delivery::parse_endpoint(&f, &v)?);
            }
            other => return Err(other.unexpected().to_string()),
        }
    }
    // The file's [api] where no flag says otherwise (not needed for --openapi).
    let settings = if openapi {
        None
    } else {
        file_settings(file.as_deref())?
    };
    let mut no_auth_from = "--no-auth".to_string();
    let listen = match (listen, &settings) {
        (Some(l), _) => parse_listen("--listen", &l)?,
        (
            None,
            Some((
                path,
                ApiSettings {
                    listen: Some(l), ..
                },
            )),
        ) => parse_listen(&format!("{}: [api] listen", path.display()), l)?,
        (None, _) => parse_listen("--listen", DEFAULT_LISTEN)?,
    };
    if let Some((path, s)) = &settings {
        if s.no_auth && !flags.no_auth {
            flags.no_auth = true;
            no_auth_from = format!("[api] auth = \"none\" in {}", path.display());
        }
    }
    if flags.allow_private_net && !flags.allow_deploy {
        // As the user's document says: it does nothing then, since only a deploy call
        // declares a sandbox. Said, not refused.
        eprintln!(
            "zygo api: --allow-private-net does nothing without --allow-deploy (only deploy \
             callers declare sandboxes); it is ignored"
        );
        flags.allow_private_net = false;
    }
    if flags.no_auth {
        if let Listen::Tcp(a) = &listen {
            if !a.ip().is_loopback() {
                return Err(format!(
                    "{no_auth_from} is refused on {a}: only on a unix socket or a loopback address (127.0.0.1, ::1)"
                ));
            }
        }
    }
    Ok(Some(Opts {
        listen,
        flags,
        openapi,
        webhook,
        otlp,
    }))
}

fn refuse(msg: impl std::fmt::Display) -> i32 {
    eprintln!("zygo api: {}", crate::output::clean(&msg.to_string()));
    1
}

/// How many channels the front keeps to the supervisor: enough for a batch (16 in flight)
/// and the machine's other callers.
fn channel_count() -> usize {
    let cpus = std::thread::available_parallelism().map_or(2, |n| n.get());
    (cpus * 4).clamp(16, 32)
}

/// A unix socket listening under a temporary name beside the path it is for, created
/// 0600. [`PendingUnix::publish`] renames it into place once the front can serve, so the
/// path never names a socket that nothing listens on: a connect to it is accepted (held in
/// the backlog until the front takes it) from the moment it exists. Dropped unpublished (the
/// front could not start), the temporary name is removed.
struct PendingUnix {
    tmp: PathBuf,
    path: PathBuf,
    published: bool,
}

impl PendingUnix {
    /// Move the listening socket to its path, replacing a stale socket file there.
    fn publish(&mut self) -> Result<(), String> {
        std::fs::rename(&self.tmp, &self.path).map_err(|e| {
            format!(
                "move the listening socket {} to {}: {e}",
                self.tmp.display(),
                self.path.display()
            )
        })?;
        self.published = true;
        Ok(())
    }
}

impl Drop for PendingUnix {
    fn drop(&mut self) {
        if !self.published {
            let _ = std::fs::remove_file(&self.tmp);
        }
    }
}

/// The longest path a unix socket's address holds (`sun_path`, less its NUL).
const SUN_PATH_MAX: usize = 107;

/// Bind and listen on a unix socket under a temporary name in `path`'s folder (see
/// [`PendingUnix`]). A socket file left at `path` by an earlier `zygo api` that nothing
/// listens on any more is replaced when the socket is published; anything else there is an
/// error.
fn bind_unix(path: &PathBuf) -> Result<(UnixListener, PendingUnix), String> {
    use std::os::unix::ffi::OsStrExt;
    use std::os::unix::fs::FileTypeExt;
    if let Ok(meta) = std::fs::symlink_metadata(path) {
        if !meta.file_type().is_socket() {
            return Err(format!("{} exists and is not a socket", path.display()));
        }
        if UnixStream::connect(path).is_ok() {
            return Err(format!(
                "{} is in use: another server listens there",
                path.display()
            ));
        }
    }
    let (Some(dir), Some(name)) = (path.parent(), path.file_name()) else {
        return Err(format!("{} does not name a file", path.display()));
    };
    if path.as_os_str().len() > SUN_PATH_MAX {
        return Err(format!(
            "{} is longer than a unix socket's address holds ({SUN_PATH_MAX} bytes)",
            path.display()
        ));
    }
    let suffix = plumbing::random_hex(4).map_err(|e| format!("random bytes: {e}"))?;
    // `.NAME.XXXXXXXX`, or `.XXXXXXXX` where that would not fit in an address.
    let mut tmp = dir.join(format!(
        ".{}.{suffix}",
        String::from_utf8_lossy(name.as_bytes())
    ));
    if tmp.as_os_str().len() > SUN_PATH_MAX {
        tmp = dir.join(format!(".{suffix}"));
    }
    if tmp.as_os_str().len() > SUN_PATH_MAX {
        return Err(format!(
            "{}: its folder leaves no room in a unix socket's address ({SUN_PATH_MAX} bytes) for the temporary name the socket is bound to first; use a shorter path",
            path.display()
        ));
    }
    // SAFETY: umask only changes this process's file-creation mask; restored below.
    let old = unsafe { libc::umask(0o177) };
    // Bind and listen (std does both) before the socket has its name.
    let r = UnixListener::bind(&tmp);
    // SAFETY: as above.
    unsafe { libc::umask(old) };
    let l = r.map_err(|e| format!("listen on {}: {e}", tmp.display()))?;
    Ok((
        l,
        PendingUnix {
            tmp,
            path: path.clone(),
            published: false,
        },
    ))
}

/// Fork `zygo-delivery` with the read end of a pipe; keep the write end, non-blocking,
/// as the process's [`delivery::Feed`]. The child holds nothing else of the front's: every
/// other descriptor but stderr is closed before it confines itself.
fn start_delivery(webhook: Option<Endpoint>, otlp: Option<Endpoint>) -> Result<(), String> {
    let mut fds = [0i32; 2];
    // SAFETY: pipe2 fills the two-int array.
    if unsafe { libc::pipe2(fds.as_mut_ptr(), libc::O_CLOEXEC) } != 0 {
        return Err(format!(
            "create a pipe: {}",
            std::io::Error::last_os_error()
        ));
    }
    let (r, w) = (fds[0], fds[1]);
    // Room for a burst (1 MiB, where the system allows it), then non-blocking: a full
    // pipe drops an event rather than holding up an answer.
    // SAFETY: fcntl on a descriptor this process just made.
    unsafe {
        libc::fcntl(w, libc::F_SETPIPE_SZ, 1 << 20);
        libc::fcntl(w, libc::F_SETFL, libc::O_NONBLOCK);
    }
    // SAFETY: fork in a process with one thread (no thread has been started yet).
    match unsafe { libc::fork() } {
        -1 => Err(format!("fork: {}", std::io::Error::last_os_error())),
        0 => {
            // SAFETY: in the child: the read end moves to fd 3, everything above is closed
            // (the listener, the channels, the write end), stdin and stdout go to /dev/null
            // semantics by being closed too; then the child never returns.
            unsafe {
                if r != 3 {
                    libc::dup2(r, 3);
                }
                libc::syscall(libc::SYS_close_range, 4u32, u32::MAX, 0u32);
                libc::close(0);
                libc::close(1);
                libc::prctl(libc::PR_SET_NAME, c"zygo-delivery".as_ptr(), 0, 0, 0);
                // When the front ends, its pipe closes: this process delivers what it
                // holds (for a bounded time) and exits.
                let code = delivery::run(3, webhook, otlp);
                libc::_exit(code)
            }
        }
        _child => {
            // SAFETY: closing the read end, which only the child uses now; the write end
            // becomes the feed.
            unsafe {
                libc::close(r);
                delivery::Feed::install(std::os::fd::FromRawFd::from_raw_fd(w));
            }
            Ok(())
        }
    }
}

pub fn main(raw: Vec<OsString>) -> i32 {
    let opts = match parse(raw) {
        Ok(Some(o)) => o,
        Ok(None) => {
            say_raw!("{}", usage::API);
            return 0;
        }
        Err(e) => return usage_error("api", e),
    };
    if opts.openapi {
        say_raw!("{}", http::openapi::document_text());
        return 0;
    }
    // The listener first: an address in use is reported before anything else happens.
    let mut pending: Option<PendingUnix> = None;
    let (listener, listen_fd, shown): (tiny_http::Listener, i32, String) = match &opts.listen {
        Listen::Tcp(a) => match TcpListener::bind(a) {
            Ok(l) => {
                let fd = l.as_raw_fd();
                // Connections accepted on it inherit TCP_NODELAY: an answer or a streamed
                // line is sent when written, not held back waiting for an ACK.
                let one: libc::c_int = 1;
                // SAFETY: setsockopt on the listener's descriptor with a valid int.
                unsafe {
                    libc::setsockopt(
                        fd,
                        libc::IPPROTO_TCP,
                        libc::TCP_NODELAY,
                        (&one as *const libc::c_int).cast(),
                        std::mem::size_of::<libc::c_int>() as libc::socklen_t,
                    )
                };
                let shown = l.local_addr().map_or(a.to_string(), |a| a.to_string());
                (l.into(), fd, format!("http://{shown}"))
            }
            Err(e) => return refuse(format!("listen on {a}: {e}")),
        },
        Listen::Unix(p) => match bind_unix(p) {
            Ok((l, p2)) => {
                let fd = l.as_raw_fd();
                pending = Some(p2);
                (l.into(), fd, format!("unix://{}", p.display()))
            }
            Err(e) => return refuse(e),
        },
    };
    let n = channel_count();
    let mut chans = Vec::with_capacity(n);
    for _ in 0..n {
        let mut sock = match client::connect() {
            Ok(s) => s,
            Err(e) => return refuse(e),
        };
        if let Err(e) = http::channel::hello(&mut sock, opts.flags) {
            return refuse(e);
        }
        chans.push(sock);
    }
    // Delivery runs in a process of its own, started now (before this one confines itself
    // or starts a thread); it only ever hears from the front through a non-blocking pipe.
    if opts.webhook.is_some() || opts.otlp.is_some() {
        if let Err(e) = start_delivery(opts.webhook.clone(), opts.otlp.clone()) {
            return refuse(format!("start zygo-delivery: {e}"));
        }
    }
    // The socket gets its name now that the front can serve (and before it confines
    // itself, which takes the filesystem away).
    if let Some(p) = pending.as_mut() {
        if let Err(e) = p.publish() {
            return refuse(e);
        }
    }
    if let Err(e) = http::block_stop_signals() {
        return refuse(format!("block SIGTERM and SIGINT: {e}"));
    }
    if let Err(e) = confine(FrontRole::Api) {
        return refuse(format!("cannot confine itself, so it will not serve: {e}"));
    }
    let f = opts.flags;
    eprintln!(
        "zygo api: listening on {shown} ({n} channels to the supervisor; deploy rights for ZYGO_API_TOKEN: {}{}{})",
        if f.allow_deploy { "yes" } else { "no" },
        if f.allow_private_net { "; private addresses allowed to deploy callers" } else { "" },
        if f.no_auth { "; no token needed (--no-auth)" } else { "" },
    );
    if delivery::enabled() {
        // The front's own counts, for the OTLP push: a line every few seconds.
        let ticker = std::thread::Builder::new()
            .name("api-counts".into())
            .spawn(|| loop {
                std::thread::sleep(std::time::Duration::from_secs(2));
                let (r, e) = http::metrics::api_counts();
                delivery::api_counts(r, e);
            });
        if let Err(e) = ticker {
            return refuse(format!("start a thread: {e}"));
        }
    }
    match http::serve(listener, chans, opts.flags, listen_fd) {
        Ok(()) => 0,
        Err(e) => refuse(e),
    }
}
