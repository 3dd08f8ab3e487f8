//! systemd's service notification protocol, spoken directly: when systemd starts the
//! supervisor as a `Type=notify` unit, it names a datagram socket in `$NOTIFY_SOCKET` (a
//! path, or an abstract name written with a leading `@`), and the supervisor sends it
//! newline-separated `KEY=VALUE` lines: `READY=1` once it serves, `STOPPING=1` when it
//! begins to drain, and `STATUS=...` for `systemctl status`. Without `$NOTIFY_SOCKET`
//! nothing is sent. The variable is removed from the environment once read, so no process
//! Zygo starts can speak for the service.

use std::os::linux::net::SocketAddrExt;
use std::os::unix::net::{SocketAddr, UnixDatagram};

pub struct Notifier {
    target: Option<(UnixDatagram, SocketAddr)>,
}

impl Notifier {
    /// The socket `$NOTIFY_SOCKET` names, if any. A name that cannot be used is logged once
    /// and ignored: the service then runs, and systemd reports that it never became ready.
    pub fn from_env() -> Notifier {
        let Some(name) = std::env::var_os("NOTIFY_SOCKET") else {
            return Notifier { target: None };
        };
        std::env::remove_var("NOTIFY_SOCKET");
        let name = name.to_string_lossy().into_owned();
        match Notifier::open(&name) {
            Ok(target) => Notifier {
                target: Some(target),
            },
            Err(e) => {
                log::warn!("NOTIFY_SOCKET={name:?} cannot be used ({e}); systemd will not hear that the supervisor is ready");
                Notifier { target: None }
            }
        }
    }

    fn open(name: &str) -> std::io::Result<(UnixDatagram, SocketAddr)> {
        let addr = match name.strip_prefix('@') {
            Some(abs) => SocketAddr::from_abstract_name(abs.as_bytes())?,
            None if name.starts_with('/') => SocketAddr::from_pathname(name)?,
            None => {
                return Err(std::io::Error::new(
                    std::io::ErrorKind::InvalidInput,
                    "neither an absolute path nor an abstract name (@...)",
                ))
            }
        };
        Ok((UnixDatagram::unbound()?, addr))
    }

    /// Whether systemd is listening.
    pub fn active(&self) -> bool {
        self.target.is_some()
    }

    /// Send one message (lines of `KEY=VALUE`). A failure is logged, never fatal.
    pub fn send(&self, msg: &str) {
        let Some((sock, addr)) = &self.target else {
            return;
        };
        if let Err(e) = sock.send_to_addr(msg.as_bytes(), addr) {
            log::warn!("tell systemd {:?}: {e}", msg.lines().next().unwrap_or(""));
        }
    }

    /// `STATUS=` with a one-line text.
    pub fn status(&self, text: &str) {
        self.send(&format!("STATUS={}", text.replace('\n', " ")));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn receive(sock: &UnixDatagram) -> String {
        let mut buf = [0u8; 512];
        let n = sock.recv(&mut buf).expect("a datagram");
        String::from_utf8_lossy(&buf[..n]).into_owned()
    }

    #[test]
    fn speaks_to_a_path_socket() {
        let dir = std::env::temp_dir().join(format!("zygo-notify-{}", std::process::id()));
        std::fs::create_dir_all(&dir).expect("a temp dir");
        let path = dir.join("notify");
        let server = UnixDatagram::bind(&path).expect("bind");
        let n = Notifier {
            target: Some(Notifier::open(path.to_str().expect("utf-8")).expect("open")),
        };
        n.send("READY=1\nSTATUS=serving");
        assert_eq!(receive(&server), "READY=1\nSTATUS=serving");
        n.status("two\nlines");
        assert_eq!(receive(&server), "STATUS=two lines");
        let _ = std::fs::remove_dir_all(&dir);
    }

    #[test]
    fn speaks_to_an_abstract_socket() {
        let name = format!("zygo-notify-test-{}", std::process::id());
        let addr = SocketAddr::from_abstract_name(name.as_bytes()).expect("addr");
        let server = UnixDatagram::bind_addr(&addr).expect("bind");
        let n = Notifier {
            target: Some(Notifier::open(&format!("@{name}")).expect("open")),
        };
        n.send("STOPPING=1");
        assert_eq!(receive(&server), "STOPPING=1");
    }

    #[test]
    fn refuses_a_relative_name() {
        assert!(Notifier::open("relative/socket").is_err());
    }
}
