//! A test host: a network namespace of the test's own, joined to this one by a veth pair
//! on a private /29, with a server of the test's running inside it. Network tests talk
//! only to such a host (or to loopback), never to anything beyond this machine.
//!
//! Names and addresses come from this process's pid and [`crate::unique`], so tests
//! running at the same time (in this process or another) never share one. Everything a
//! host made (its server, the veth pair, the namespace) is removed when it is dropped,
//! and also when its construction fails half-way: a failed `ip` command or a server that
//! never says `ready` removes what was already made before the test panics.

use std::io::{BufRead, BufReader};
use std::process::{Child, Command, Stdio};
use std::sync::mpsc::Receiver;
use std::time::Duration;

/// How a suite's test hosts are named and numbered.
pub struct Layout {
    /// Two letters in the namespace's name (`zygo-<tag>-<pid>-<n>`) and the interfaces'
    /// (`z<tag>a…` here, `z<tag>b…` in the namespace).
    pub tag: &'static str,
    /// The hosts take /29s of `10.<subnet>.0.0/16`: a /16 of the suite's own, so suites
    /// running at the same time cannot pick the same /29.
    pub subnet: u8,
}

/// The test host. Its server is `python3 -c SERVER HOST ARGS...`, run in the namespace:
/// it prints `ready` once it serves, then one line per event, which [`TestHost::events`]
/// hands back.
pub struct TestHost {
    /// The namespace's name (under /run/netns).
    pub ns: String,
    /// This side's end of the veth pair, and its address.
    pub near_if: String,
    pub near: String,
    /// The host's address, in the namespace.
    pub host: String,
    /// An address on the same /29 that no one has.
    pub nobody: String,
    made_ns: bool,
    made_link: bool,
    server: Option<Child>,
    events: Option<Receiver<String>>,
}

/// Run `ip ARGS`: an error names the command and what it said.
pub fn ip(args: &[&str]) -> Result<(), String> {
    let out = Command::new("ip")
        .args(args)
        .output()
        .map_err(|e| format!("run ip (iproute2): {e}"))?;
    if out.status.success() {
        Ok(())
    } else {
        Err(format!(
            "ip {args:?}: {}",
            String::from_utf8_lossy(&out.stderr).trim()
        ))
    }
}

impl TestHost {
    /// Make the namespace and veth pair and start `server` in it (given the host's address
    /// and then `args`); panics, having removed what it made, if any step fails.
    pub fn start(layout: &Layout, server: &str, args: &[&str]) -> TestHost {
        TestHost::try_start(layout, server, args)
            .unwrap_or_else(|e| panic!("set up a test host: {e}"))
    }

    /// [`TestHost::start`], the failure returned (after what was made is removed).
    pub fn try_start(layout: &Layout, server: &str, args: &[&str]) -> Result<TestHost, String> {
        let n = crate::unique();
        let pid = std::process::id();
        let tag = layout.tag;
        let far_if = format!("z{tag}b{:05x}{:04x}", pid & 0xfffff, n & 0xffff);
        // A /29 of its own, by pid and counter: .1 here, .2 the host, .3 nobody.
        let k = (u64::from(pid) * 7 + n) % (256 * 31);
        let (third, fourth) = (k / 31, (k % 31) * 8);
        let at = |i: u64| format!("10.{}.{third}.{}", layout.subnet, fourth + i);
        // Dropped (removing what it made so far) on any early return below.
        let mut h = TestHost {
            ns: format!("zygo-{tag}-{pid}-{n}"),
            near_if: format!("z{tag}a{:05x}{:04x}", pid & 0xfffff, n & 0xffff),
            near: at(1),
            host: at(2),
            nobody: at(3),
            made_ns: false,
            made_link: false,
            server: None,
            events: None,
        };
        let (ns, near_if) = (h.ns.clone(), h.near_if.clone());
        ip(&["netns", "add", &ns])?;
        h.made_ns = true;
        ip(&[
            "link", "add", &near_if, "type", "veth", "peer", "name", &far_if, "netns", &ns,
        ])?;
        h.made_link = true;
        ip(&["addr", "add", &format!("{}/29", h.near), "dev", &near_if])?;
        ip(&["link", "set", &near_if, "up"])?;
        let host_net = format!("{}/29", h.host);
        ip(&["-n", &ns, "addr", "add", &host_net, "dev", &far_if])?;
        ip(&["-n", &ns, "link", "set", &far_if, "up"])?;
        ip(&["-n", &ns, "link", "set", "lo", "up"])?;
        let server = h.server.insert(
            Command::new("ip")
                .args(["netns", "exec", &ns, "python3", "-c", server, &h.host])
                .args(args)
                .stdin(Stdio::piped())
                .stdout(Stdio::piped())
                .stderr(Stdio::inherit())
                .spawn()
                .map_err(|e| format!("start the test host's server: {e}"))?,
        );
        let out = server.stdout.take().ok_or("the server's stdout")?;
        let (tx, events) = std::sync::mpsc::channel();
        // The server writes a line per event: keep reading them, or it blocks writing one.
        std::thread::spawn(move || {
            for line in BufReader::new(out).lines() {
                let Ok(line) = line else { break };
                if tx.send(line).is_err() {
                    break;
                }
            }
        });
        let events = h.events.insert(events);
        match events.recv_timeout(Duration::from_secs(20)) {
            Ok(first) if first == "ready" => Ok(h),
            Ok(first) => Err(format!("the server said {first:?}, not \"ready\"")),
            Err(e) => Err(format!("the server did not start within 20 s: {e}")),
        }
    }

    /// Every event the server has logged since the last call (after a short wait for
    /// the last ones to arrive).
    pub fn events(&self) -> Vec<String> {
        std::thread::sleep(Duration::from_millis(200));
        self.events
            .as_ref()
            .map_or_else(Vec::new, |e| e.try_iter().collect())
    }
}

impl Drop for TestHost {
    fn drop(&mut self) {
        if let Some(mut server) = self.server.take() {
            drop(server.stdin.take());
            let _ = server.kill();
            let _ = server.wait();
        }
        if self.made_link {
            let _ = ip(&["link", "del", &self.near_if]);
        }
        if self.made_ns {
            let _ = ip(&["netns", "del", &self.ns]);
        }
    }
}
