//! Egress (`--net egress --allow ADDR:PORT`, `network = "egress"`): a sandbox reaches what
//! a rule names and nothing else.
//!
//! Every test talks only to a test host in a network namespace the test creates itself (a
//! veth pair with private addresses of its own), never to anything else: the rules name
//! that address explicitly, which is how an operator opens a private address. Other
//! destinations the sandbox tries are on that veth's own subnet or in the documentation
//! range 192.0.2.0/24, which is never routed.

use std::io::{BufRead, BufReader};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use serde_json::Value;
use zygo_tests::netns::{self, Layout, TestHost};
use zygo_tests::*;

/// The test host: serves TCP on [`ALLOWED`] and [`OTHER`] (each connection answered with
/// `port:what it read`) and listens for UDP on 53 and [`UDP`]; writes one line per event
/// to stdout, which the test reads back. Its DNS server answers names under `zygo.test`
/// with its own address, or with the address given after it.
const SERVER: &str = r#"
import socket, sys, threading
ANSWER = sys.argv[2] if len(sys.argv) > 2 else sys.argv[1]
def tcp(port):
    s = socket.socket(); s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    s.bind((sys.argv[1], port)); s.listen(16)
    while True:
        c, peer = s.accept()
        print("tcp", port, flush=True)
        try:
            c.settimeout(5)
            data = c.recv(100)
            # To a ClientHello, the start of a ServerHello first, as a TLS server would.
            hello = b"\x16\x03\x03\x00\x04\x02\x00\x00\x00" if data[:1] == b"\x16" else b""
            c.sendall(hello + b"%d:" % port + data)
        except OSError:
            pass
        c.close()
def dns_answer(q):
    i, labels = 12, []
    while q[i]:
        labels.append(q[i + 1:i + 1 + q[i]].decode()); i += 1 + q[i]
    end = i + 5
    name = ".".join(labels).lower()
    if name.endswith(".zygo.test") and q[end - 4:end - 2] == b"\x00\x01":
        ip = bytes(int(x) for x in ANSWER.split("."))
        return (q[:2] + b"\x81\x80\x00\x01\x00\x01\x00\x00\x00\x00" + q[12:end]
                + b"\xc0\x0c\x00\x01\x00\x01\x00\x00\x00\x3c\x00\x04" + ip)
    return q[:2] + b"\x81\x83\x00\x01\x00\x00\x00\x00\x00\x00" + q[12:end]
def udp(port):
    s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    s.bind((sys.argv[1], port))
    while True:
        data, peer = s.recvfrom(2000)
        print("udp", port, flush=True)
        s.sendto(dns_answer(data) if port == 53 else b"answer", peer)
def bulk(c):
    # "down N": N bytes of a pattern; "up N": read N bytes, answer their SHA-256.
    import hashlib
    f = c.makefile("rb")
    word, n = f.readline().split()
    n = int(n)
    if word == b"down":
        block = bytes(range(256)) * 4096
        while n > 0:
            c.sendall(block[:min(n, len(block))]); n -= min(n, len(block))
    else:
        h = hashlib.sha256()
        while n > 0:
            d = f.read(min(n, 1 << 20))
            if not d:
                break
            h.update(d); n -= len(d)
        c.sendall(h.hexdigest().encode())
    c.close()
def bulk_server():
    s = socket.socket(); s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    s.bind((sys.argv[1], 8082)); s.listen(16)
    while True:
        c, _ = s.accept()
        print("tcp 8082", flush=True)
        threading.Thread(target=bulk, args=(c,), daemon=True).start()
threading.Thread(target=bulk_server, daemon=True).start()
def silent_server():
    # Accepts and holds every connection: never reads, answers or closes.
    s = socket.socket(); s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    s.bind((sys.argv[1], 8083)); s.listen(128)
    held = []
    while True:
        held.append(s.accept()[0])
threading.Thread(target=silent_server, daemon=True).start()
def flood_server():
    # Sends as fast as it can on every connection; never reads.
    s = socket.socket(); s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    s.bind((sys.argv[1], 8084)); s.listen(128)
    block = b"z" * (1 << 20)
    def flood(c):
        try:
            while True:
                c.sendall(block)
        except OSError:
            pass
    while True:
        c, _ = s.accept()
        threading.Thread(target=flood, args=(c,), daemon=True).start()
threading.Thread(target=flood_server, daemon=True).start()
def lenient(c):
    # Goes on after an unreadable first line: answers it 400, then reads on for a
    # request, and answers with the Host it names.
    try:
        c.settimeout(5)
        data, answered = b"", False
        while True:
            d = c.recv(65536)
            if not d:
                break
            data += d
            if not answered:
                c.sendall(b"HTTP/1.1 400 Bad Request\r\nContent-Length: 0\r\n\r\n")
                answered = True
            i = data.find(b"GET /")
            if i >= 0 and b"\r\n\r\n" in data[i:]:
                for line in data[i:].split(b"\r\n\r\n")[0].split(b"\r\n"):
                    if line.lower().startswith(b"host:"):
                        host = line[5:].strip()
                        print("lenient host", host.decode(), flush=True)
                        c.sendall(b"host:" + host)
                break
    except OSError:
        pass
    c.close()
def lenient_server():
    s = socket.socket(); s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    s.bind((sys.argv[1], 8085)); s.listen(16)
    while True:
        c, _ = s.accept()
        threading.Thread(target=lenient, args=(c,), daemon=True).start()
threading.Thread(target=lenient_server, daemon=True).start()
for p in (8080, 8081):
    threading.Thread(target=tcp, args=(p,), daemon=True).start()
for p in (53, 9053):
    threading.Thread(target=udp, args=(p,), daemon=True).start()
print("ready", flush=True)
sys.stdin.read()
"#;

const ALLOWED: u16 = 8080;
const OTHER: u16 = 8081;
const UDP: u16 = 9053;

/// The test hosts of this suite: `zygo-eg-…`, in 10.213.0.0/16, serving [`SERVER`].
const LAYOUT: Layout = Layout {
    tag: "eg",
    subnet: 213,
};

fn test_host() -> TestHost {
    TestHost::start(&LAYOUT, SERVER, &[])
}

fn ip(args: &[&str]) {
    netns::ip(args).unwrap_or_else(|e| panic!("{e}"));
}

/// The probe every test host test runs: each attempt's errno name (or "OK" and what came
/// back), the refusals' times in milliseconds.
const PROBE: &str = r#"
import socket, subprocess, time
HOST, NOBODY, ALLOWED, OTHER, UDP = HOST_ARGS
def tcp(addr, port, family=socket.AF_INET):
    s = socket.socket(family)
    s.settimeout(0.1)  # a refusal must come within 100 ms
    try:
        s.connect((addr, port))
        s.settimeout(5)
        s.sendall(b"hi")
        got = s.recv(100)
        return "OK " + got.decode() if got else "EOF"
    except socket.timeout:
        return "TIMEOUT"
    except OSError as e:
        return ename(e.errno)
    finally:
        s.close()
def udp(addr, port):
    s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    s.settimeout(0.5)
    try:
        s.connect((addr, port))
        # A DNS query for example.com (type A).
        s.send(bytes.fromhex("abcd01000001000000000000076578616d706c6503636f6d0000010001"))
        return "OK " + repr(s.recv(512))
    except socket.timeout:
        return "TIMEOUT"
    except OSError as e:
        return ename(e.errno)
    finally:
        s.close()
def ip(*args):
    r = subprocess.run(["ip"] + list(args), capture_output=True)
    return "OK" if r.returncode == 0 else "FAILED " + r.stderr.decode().strip()
r = {}
r["allowed"] = tcp(HOST, ALLOWED)
r["other_port"] = tcp(HOST, OTHER)
r["other_address"] = tcp(NOBODY, ALLOWED)
r["documentation_range"] = tcp("192.0.2.1", ALLOWED)
r["udp"] = udp(HOST, UDP)
r["dns"] = udp(HOST, 53)
r["raw"] = attempt(socket.socket, socket.AF_INET, socket.SOCK_RAW, socket.IPPROTO_ICMP)
r["ping"] = attempt(socket.socket, socket.AF_INET, socket.SOCK_DGRAM, socket.IPPROTO_ICMP)
r["packet"] = attempt(socket.socket, socket.AF_PACKET, socket.SOCK_RAW, 0)
r["ipv6"] = tcp("2001:db8::1", ALLOWED, socket.AF_INET6)
r["ipv6_mapped_other"] = tcp("::ffff:" + NOBODY, ALLOWED, socket.AF_INET6)
r["route_del"] = ip("route", "del", "local", "0.0.0.0/0", "dev", "lo", "table", "local")
r["addr_add"] = ip("addr", "add", NOBODY + "/32", "dev", "lo")
r["link_add"] = ip("link", "add", "zx0", "type", "dummy")
r["after_other_address"] = tcp(NOBODY, ALLOWED)
r["allowed_again"] = tcp(HOST, ALLOWED)
done(**r)
"#;

fn probe_code(h: &TestHost) -> String {
    PROBE.replace(
        "HOST_ARGS",
        &format!("{:?}, {:?}, {ALLOWED}, {OTHER}, {UDP}", h.host, h.nobody),
    )
}

/// With one rule naming the test host's address and port: that connects; another port,
/// another address on the same subnet, UDP (DNS included), raw and ICMP sockets, IPv6
/// are refused at once, and the sandbox cannot change its network to get around it.
fn allowed_connects_and_the_rest_is_refused(who: Who) {
    if !root_only() {
        return;
    }
    let h = test_host();
    let rule = format!("{}:{ALLOWED}", h.host);
    let r = probe(who, &["--net", "egress", "--allow", &rule], &probe_code(&h));
    assert_result(who, &r, "allowed", &["OK 8080:hi"]);
    assert_result(who, &r, "allowed_again", &["OK 8080:hi"]);
    for key in [
        "other_port",
        "other_address",
        "documentation_range",
        "after_other_address",
        "ipv6_mapped_other",
    ] {
        assert_result(who, &r, key, &["ECONNREFUSED"]);
    }
    assert_result(who, &r, "udp", &["ECONNREFUSED"]);
    assert_result(who, &r, "dns", &["ECONNREFUSED"]);
    assert_result(who, &r, "raw", &["EPERM"]);
    assert_result(who, &r, "ping", &["EACCES", "EPERM"]);
    assert_result(who, &r, "packet", &["EPERM", "EAFNOSUPPORT"]);
    assert_result(who, &r, "ipv6", &["ENETUNREACH"]);
    for key in ["route_del", "addr_add", "link_add"] {
        let got = r[key].as_str().unwrap_or("");
        assert!(
            got.starts_with("FAILED"),
            "[{}] {key}: the sandbox changed its network: {r}",
            who.name()
        );
    }
    // The test host saw the two allowed connections and nothing else.
    let events = h.events();
    assert_eq!(
        events,
        vec!["tcp 8080".to_string(), "tcp 8080".to_string()],
        "[{}] what reached the test host",
        who.name()
    );
}

/// A program's connections that it has finished sending on, towards a server that never
/// answers or closes, do not keep the filter from relaying new ones: with all 64 places
/// taken by such connections, the oldest is ended to make room. (In a zygote, an earlier
/// request's connections would otherwise hold a later caller's places.)
fn half_closed_connections_make_room(who: Who) {
    if !root_only() {
        return;
    }
    let h = test_host();
    let silent = format!("{}:8083", h.host);
    let allowed = format!("{}:{ALLOWED}", h.host);
    let code = r#"
import socket, sys, time
host = sys.argv[1]
held = []
for i in range(64):
    s = socket.create_connection((host, 8083), timeout=5)
    s.shutdown(socket.SHUT_WR)
    held.append(s)
time.sleep(1)
s = socket.socket(); s.settimeout(5)
try:
    s.connect((host, 8080)); s.sendall(b"hi"); print("OK", s.recv(100).decode())
except OSError as e:
    print("FAILED", type(e).__name__)
"#;
    let out = zygo(who)
        .args([
            "run",
            "--net",
            "egress",
            "--allow",
            &silent,
            "--allow",
            &allowed,
            "--timeout",
            "30s",
            "--",
            "python3",
            "-c",
            code,
            &h.host,
        ])
        .output()
        .expect("run zygo");
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert_eq!(
        stdout.trim(),
        "OK 8080:hi",
        "[{}] the 65th connection: {}",
        who.name(),
        String::from_utf8_lossy(&out.stderr)
    );
}

/// A rule for a wide block (`0.0.0.0/0`) does not open a private address inside it: the
/// connection is reset, and the refusal is logged with the sandbox, within the filter's
/// budget of log lines.
fn private_addresses_open_only_when_named(who: Who) {
    if !root_only() {
        return;
    }
    let h = test_host();
    let rule = format!("0.0.0.0/0:{ALLOWED}");
    // Two hundred tries: each is refused, and the log holds at most the filter's budget of
    // refusal lines (a sandbox refused in a loop cannot flood the log).
    let code = format!(
        r#"
import socket
rs = []
for i in range(200):
    s = socket.socket()
    s.settimeout(2)
    try:
        s.connect(({:?}, {ALLOWED}))
        s.sendall(b"hi")
        got = s.recv(100)
        rs.append("OK " + got.decode() if got else "EOF")
    except OSError as e:
        rs.append(ename(e.errno))
    s.close()
done(wide=rs[0], others=sorted(set(rs)))
"#,
        h.host
    );
    let g = guard_flags();
    let mut flags: Vec<&str> = g.iter().map(String::as_str).collect();
    flags.extend(["--net", "egress", "--allow", &rule]);
    let (v, f) = run_json_full(who, &flags, &["python3", "-c", &probe_script(&code)]);
    assert_not_refused(who, &v, f.code);
    assert_ok(who, &v, f.code);
    let last = s(&v, "stdout").lines().last().unwrap_or("").to_string();
    let r: Value = serde_json::from_str(&last).expect("the probe's JSON line");
    assert_result(who, &r, "wide", &["ECONNRESET", "EOF"]);
    for o in r["others"].as_array().expect("others") {
        let o = o.as_str().unwrap_or("");
        assert!(o == "ECONNRESET" || o == "EOF", "[{}] {r}", who.name());
    }
    let log = f.stderr_text();
    assert!(
        log.contains(&format!("refused {}:{ALLOWED}", h.host)) && log.contains("private"),
        "[{}] the refusal is logged: {log}",
        who.name()
    );
    let lines = log.lines().filter(|l| l.contains("refused ")).count();
    assert!(
        (1..=20).contains(&lines),
        "[{}] {lines} refusal lines for 200 refusals: {log}",
        who.name()
    );
    assert!(h.events().is_empty(), "nothing reached the test host");
}

/// The egress filter runs outside the sandbox, confined: seccomp, no_new_privs, not
/// dumpable; as root, as nobody.
fn the_filter_is_confined(who: Who) {
    if !root_only() {
        return;
    }
    let h = test_host();
    let rule = format!("{}:{ALLOWED}", h.host);
    let mut c = zygo(who);
    c.args([
        "run", "--net", "egress", "--allow", &rule, "--", "sleep", "5",
    ]);
    c.stdout(Stdio::null());
    let mut child = c.spawn().expect("start zygo run");
    // Only this run's filter: other tests' runs (the rootless twin of this one, say) have
    // filters of their own at the same time.
    let zygo_pid = child.id() as i32;
    let ours = |p: &i32| descends_from(*p, zygo_pid);
    let mut pids = Vec::new();
    let t0 = Instant::now();
    while pids.is_empty() && t0.elapsed() < Duration::from_secs(20) {
        std::thread::sleep(Duration::from_millis(50));
        pids = host_pids_starting_with(b"zygo\0__egress-filter");
        if pids.is_empty() {
            pids = host_pids_with(b"__egress-filter");
        }
        pids.retain(ours);
    }
    // Found as soon as it is started, a filter may not have confined itself yet (it does
    // so once it has its start message): give it until then, and look at it after.
    let read = || -> Vec<String> {
        pids.iter()
            .filter_map(|p| std::fs::read_to_string(format!("/proc/{p}/status")).ok())
            .collect()
    };
    let confined = |st: &String| st.lines().any(|l| l == "Seccomp:\t2");
    let t0 = Instant::now();
    let mut status = read();
    while !status.iter().all(confined) && t0.elapsed() < Duration::from_secs(10) {
        std::thread::sleep(Duration::from_millis(20));
        status = read();
    }
    let _ = child.kill();
    let _ = child.wait();
    assert!(
        !status.is_empty(),
        "[{}] no egress filter was found",
        who.name()
    );
    for st in status {
        let field = |k: &str| {
            st.lines()
                .find_map(|l| l.strip_prefix(k))
                .unwrap_or("")
                .trim()
                .to_string()
        };
        assert_eq!(field("Seccomp:"), "2", "{st}");
        assert_eq!(field("NoNewPrivs:"), "1", "{st}");
        assert_eq!(field("CapEff:"), "0000000000000000", "{st}");
        if who == Who::Root {
            // Real uid the sandbox's own (see fair_share.rs), effective nobody: never root.
            for k in ["Uid:", "Gid:"] {
                let v = field(k);
                let ids: Vec<&str> = v.split_whitespace().collect();
                assert!(
                    ids.len() == 4 && ids[0] != "0" && ids[1..] == ["65534", "65534", "65534"],
                    "{k} {st}"
                );
            }
        }
    }
}

/// The functions of [`a_function_reaches_its_allowed_host`].
static SUITE: Suite = Suite {
    prefix: "eg",
    handlers: r#"
import socket
def net(event):
    out = {}
    for name, port in (("allowed", event["allowed"]), ("other", event["other"])):
        s = socket.socket(); s.settimeout(2)
        try:
            s.connect((event["host"], port)); s.sendall(b"fn"); out[name] = s.recv(100).decode()
        except OSError as e:
            out[name] = type(e).__name__
        s.close()
    return out
"#,
    defaults: "timeout = \"5s\"\nmem = \"64M\"\nidle_timeout = \"30s\"\n",
    agents: true,
};

/// A function with `network = "egress"` in sandbox.toml reaches what its `allow` names,
/// and nothing else.
fn a_function_reaches_its_allowed_host(who: Who) {
    if !root_only() {
        return;
    }
    let h = test_host();
    let mut s = SUITE.sup(who, "fn");
    let extra = format!("network = \"egress\"\nallow = [\"{}:{ALLOWED}\"]\n", h.host);
    let n = s.up(&[("net", "net", extra.as_str())]);
    let event = format!(
        r#"{{"host": {:?}, "allowed": {ALLOWED}, "other": {OTHER}}}"#,
        h.host
    );
    let out = s.call_ok(&n[0], &event);
    assert_eq!(out["allowed"], "8080:fn", "[{}] {out}", who.name());
    assert_eq!(
        out["other"],
        "ConnectionRefusedError",
        "[{}] {out}",
        who.name()
    );
    s.shutdown();
}

/// What the probes of name rules share: DNS through Zygo's resolver, a TLS ClientHello and
/// an HTTP request naming a host, a connection that sends bytes and reads the answer.
const NAME_HELPERS: &str = r#"
import socket, struct, time
HOST, ALLOWED, OTHER = HOST_ARGS
def dns(name, qtype=1):
    q = b"\x12\x34\x01\x00\x00\x01\x00\x00\x00\x00\x00\x00"
    for label in name.split("."):
        q += bytes([len(label)]) + label.encode()
    q += b"\x00" + struct.pack(">HH", qtype, 1)
    s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    s.settimeout(3)
    try:
        s.sendto(q, ("192.0.2.53", 53))
        a = s.recv(1500)
    except socket.timeout:
        return "TIMEOUT"
    except OSError as e:
        return ename(e.errno)
    rcode, count = a[3] & 15, struct.unpack(">H", a[6:8])[0]
    addrs = [".".join(str(b) for b in a[i - 4:i]) for i in range(len(a), len(a) - 16 * count, -16)]
    return "rcode %d %s" % (rcode, sorted(addrs))
def hello(host):
    name = host.encode()
    sni = struct.pack(">HBH", len(name) + 3, 0, len(name)) + name
    ext = struct.pack(">HH", 0, len(sni)) + sni
    body = b"\x03\x03" + b"\x07" * 32 + b"\x00" + b"\x00\x02\x13\x01" + b"\x01\x00"
    body += struct.pack(">H", len(ext)) + ext
    hs = b"\x01" + struct.pack(">I", len(body))[1:] + body
    return b"\x16\x03\x01" + struct.pack(">H", len(hs)) + hs
def tcp(port, first):
    s = socket.socket()
    s.settimeout(3)
    try:
        s.connect((HOST, port))
        s.sendall(first)
        got = s.recv(100)
        return ("OK " + got[:24].decode(errors="replace")) if got else "EOF"
    except socket.timeout:
        return "TIMEOUT"
    except OSError as e:
        return ename(e.errno)
    finally:
        s.close()
def http(host):
    return ("GET / HTTP/1.1\r\nHost: %s\r\n\r\n" % host).encode()
"#;

/// The probe of [`name_rules_are_exact_by_name`] (after [`NAME_HELPERS`]): connections that
/// name a host by HTTP `Host` or TLS SNI.
const NAME_PROBE: &str = r#"
r = {}
r["dns_allowed"] = dns("allowed.zygo.test")
r["dns_other"] = dns("other.zygo.test")
r["dns_aaaa"] = dns("allowed.zygo.test", 28)
r["http_allowed"] = tcp(ALLOWED, http("allowed.zygo.test"))
r["http_other"] = tcp(ALLOWED, http("other.zygo.test"))
r["tls_allowed"] = tcp(ALLOWED, hello("allowed.zygo.test"))
r["tls_other"] = tcp(ALLOWED, hello("other.zygo.test"))
r["no_name"] = tcp(ALLOWED, b"hi")
r["other_port"] = tcp(OTHER, http("allowed.zygo.test"))
r["pipelined_same"] = tcp(ALLOWED, http("allowed.zygo.test") + http("allowed.zygo.test"))
r["pipelined_other"] = tcp(ALLOWED, http("allowed.zygo.test") + http("other.zygo.test"))
r["absolute_other"] = tcp(ALLOWED, b"GET http://other.zygo.test/ HTTP/1.1\r\nHost: allowed.zygo.test\r\n\r\n")
done(**r)
"#;

/// A rule by name: Zygo's resolver answers only for that name (asking the test host's DNS
/// server, which the test names in `ZYGO_RESOLV_CONF`), and a connection to its address is
/// relayed only when its HTTP `Host` or TLS SNI is that name: another name on the same
/// address, or none, is refused.
fn name_rules_are_exact_by_name(who: Who) {
    if !root_only() {
        return;
    }
    let h = test_host();
    let dir = TempDir::new(0o755);
    let conf = dir.file("resolv.conf", format!("nameserver {}\n", h.host).as_bytes());
    let rule = format!("allowed.zygo.test:{ALLOWED}");
    let code = format!("{NAME_HELPERS}{NAME_PROBE}")
        .replace("HOST_ARGS", &format!("{:?}, {ALLOWED}, {OTHER}", h.host));
    let g = guard_flags();
    let mut c = zygo(who);
    c.env("ZYGO_RESOLV_CONF", &conf)
        .args(["run", "--json"])
        .args(&g)
        .args(["--net", "egress", "--allow", &rule, "--", "python3", "-c"])
        .arg(probe_script(&code));
    let f = finish(c);
    let v = f.last_json();
    assert_not_refused(who, &v, f.code);
    assert_ok(who, &v, f.code);
    let last = s(&v, "stdout").lines().last().unwrap_or("").to_string();
    let r: Value = serde_json::from_str(&last).expect("the probe's JSON line");
    let want = format!("rcode 0 ['{}']", h.host);
    assert_result(who, &r, "dns_allowed", &[want.as_str()]);
    assert_result(who, &r, "dns_other", &["rcode 5 []"]);
    assert_result(who, &r, "dns_aaaa", &["rcode 0 []"]);
    assert_result(who, &r, "http_allowed", &["OK 8080:GET / HTTP/1.1\r\nHos"]);
    // The test host answers a ClientHello with the start of a ServerHello.
    let tls = r["tls_allowed"].as_str().unwrap_or("");
    assert!(
        tls.starts_with("OK \u{16}\u{3}\u{3}\u{0}\u{4}\u{2}\u{0}\u{0}\u{0}8080:"),
        "[{}] {r}",
        who.name()
    );
    // A later request on an allowed connection naming another host ends it; so does the
    // absolute form, whose URL names the host servers must prefer to Host.
    for key in [
        "http_other",
        "tls_other",
        "no_name",
        "pipelined_other",
        "absolute_other",
    ] {
        assert_result(who, &r, key, &["ECONNRESET", "EOF"]);
    }
    assert_result(
        who,
        &r,
        "pipelined_same",
        &["OK 8080:GET / HTTP/1.1\r\nHos"],
    );
    assert_result(who, &r, "other_port", &["ECONNREFUSED"]);
    let log = f.stderr_text();
    assert!(
        log.contains("refused a DNS query for \"other.zygo.test\""),
        "[{}] {log}",
        who.name()
    );
    // The test host saw one upstream query and the four connections that were let through
    // (the one whose later request named another host was opened before that request,
    // and ended before it was sent).
    let mut events = h.events();
    events.sort();
    assert_eq!(
        events,
        vec!["tcp 8080", "tcp 8080", "tcp 8080", "tcp 8080", "udp 53"],
        "[{}] what reached the test host",
        who.name()
    );
}

/// The probe of [`a_client_hello_opens_nothing_for_a_cleartext_server`] (after
/// [`NAME_HELPERS`]): a ClientHello naming the allowed host followed, at once or a moment
/// later, by a cleartext request naming another host, to a server that answers the hello
/// 400 and goes on reading.
const HELLO_THEN_CLEARTEXT_PROBE: &str = r#"
def hello_then(later):
    s = socket.socket()
    s.settimeout(3)
    got = b""
    try:
        s.connect((HOST, 8085))
        if later:
            s.sendall(hello("allowed.zygo.test"))
            time.sleep(0.5)
            s.sendall(http("other.zygo.test"))
        else:
            s.sendall(hello("allowed.zygo.test") + http("other.zygo.test"))
        while True:
            d = s.recv(4096)
            if not d:
                end = "EOF"
                break
            got += d
    except socket.timeout:
        end = "TIMEOUT"
    except OSError as e:
        end = ename(e.errno)
    finally:
        s.close()
    return ("other" if b"host:other" in got else "nothing") + " " + end
done(dns=dns("allowed.zygo.test"), at_once=hello_then(False), later=hello_then(True))
"#;

/// A connection a name rule opened by the server name of its TLS ClientHello goes on only
/// once the server has answered as a TLS server does: a cleartext server that answers the
/// hello as a bad request and goes on reading (a virtual host other than the allowed name
/// behind it) is never sent the program's next bytes, sent with the hello or later.
fn a_client_hello_opens_nothing_for_a_cleartext_server(who: Who) {
    if !root_only() {
        return;
    }
    let h = test_host();
    let dir = TempDir::new(0o755);
    let conf = dir.file("resolv.conf", format!("nameserver {}\n", h.host).as_bytes());
    let code = format!("{NAME_HELPERS}{HELLO_THEN_CLEARTEXT_PROBE}")
        .replace("HOST_ARGS", &format!("{:?}, {ALLOWED}, {OTHER}", h.host));
    let g = guard_flags();
    let mut c = zygo(who);
    c.env("ZYGO_RESOLV_CONF", &conf)
        .args(["run", "--json"])
        .args(&g)
        .args(["--net", "egress", "--allow", "allowed.zygo.test:8085"])
        .args(["--", "python3", "-c"])
        .arg(probe_script(&code));
    let f = finish(c);
    let v = f.last_json();
    assert_not_refused(who, &v, f.code);
    assert_ok(who, &v, f.code);
    let last = s(&v, "stdout").lines().last().unwrap_or("").to_string();
    let r: Value = serde_json::from_str(&last).expect("the probe's JSON line");
    let want = format!("rcode 0 ['{}']", h.host);
    assert_result(who, &r, "dns", &[want.as_str()]);
    for key in ["at_once", "later"] {
        // Ended by the filter: seen when reading, or (later) when sending the request.
        assert_result(
            who,
            &r,
            key,
            &["nothing ECONNRESET", "nothing EOF", "nothing EPIPE"],
        );
    }
    let log = f.stderr_text();
    assert!(
        log.contains("did not answer its TLS ClientHello as a TLS server does"),
        "[{}] {log}",
        who.name()
    );
    let events = h.events();
    assert!(
        !events.iter().any(|e| e.starts_with("lenient host")),
        "[{}] the server read a request after the hello: {events:?}",
        who.name()
    );
}

/// `zygo mcp --net egress --allow ADDR:PORT`: a `run_code` sandbox reaches that address and
/// port, and nothing else.
#[test]
fn mcp_run_code_reaches_its_allowed_host() {
    if !root_only() {
        return;
    }
    let h = test_host();
    let (rt, st) = (TempDir::new(0o700), TempDir::new(0o700));
    let rule = format!("{}:{ALLOWED}", h.host);
    let code = format!(
        r#"
import socket
for port in ({ALLOWED}, {OTHER}):
    s = socket.socket(); s.settimeout(2)
    try:
        s.connect(({:?}, port)); s.sendall(b"mcp"); print("port", port, s.recv(100).decode())
    except OSError as e:
        print("port", port, type(e).__name__)
"#,
        h.host
    );
    let call = serde_json::json!({"jsonrpc": "2.0", "id": 2, "method": "tools/call",
        "params": {"name": "run_code", "arguments": {"language": "python", "code": code}}});
    let mut c = Command::new(zygo_bin());
    c.env_clear()
        .env("PATH", "/usr/local/bin:/usr/bin:/bin")
        .env("ZYGO_RUNTIME_DIR", rt.str())
        .env("ZYGO_STATE_DIR", st.str())
        .args(["mcp", "--net", "egress", "--allow", &rule])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    let mut child = c.spawn().expect("start zygo mcp");
    {
        let mut stdin = child.stdin.take().expect("stdin");
        use std::io::Write as _;
        let init = r#"{"jsonrpc":"2.0","id":1,"method":"initialize","params":{"protocolVersion":"2025-06-18"}}"#;
        writeln!(stdin, "{init}\n{call}").expect("write to zygo mcp");
    }
    let out = child
        .wait_with_output()
        .expect("zygo mcp ends when stdin closes");
    let text = String::from_utf8_lossy(&out.stdout);
    let answer = text
        .lines()
        .filter_map(|l| serde_json::from_str::<Value>(l).ok())
        .find(|v| v["id"] == 2)
        .unwrap_or_else(|| {
            panic!(
                "no answer to run_code: {text}\n{}",
                String::from_utf8_lossy(&out.stderr)
            )
        });
    let printed = answer["result"]["structuredContent"]["stdout"]
        .as_str()
        .unwrap_or("")
        .to_string();
    assert!(printed.contains("port 8080 8080:mcp"), "{answer}");
    assert!(
        printed.contains("port 8081 ConnectionRefusedError"),
        "{answer}"
    );
}

/// Many megabytes each way through the filter arrive intact and complete, and each side's
/// end reaches the other.
fn large_transfers_arrive_intact(who: Who) {
    if !root_only() {
        return;
    }
    let h = test_host();
    let rule = format!("{}:8082", h.host);
    let code = format!(
        r#"
import hashlib, socket
N = 24 << 20
s = socket.create_connection(({host:?}, 8082), timeout=30)
s.sendall(b"down %d\n" % N)
h, got = hashlib.sha256(), 0
while True:
    d = s.recv(1 << 20)
    if not d:
        break
    h.update(d); got += len(d)
block = bytes(range(256)) * 4096
want = hashlib.sha256()
left = N
while left > 0:
    want.update(block[:min(left, len(block))]); left -= min(left, len(block))
s = socket.create_connection(({host:?}, 8082), timeout=30)
s.sendall(b"up %d\n" % N)
data = bytes(range(251)) * (N // 251 + 1)
data = data[:N]
s.sendall(data)
s.shutdown(socket.SHUT_WR)
answer = s.recv(100).decode()
done(down_bytes=got, down_ok=h.hexdigest() == want.hexdigest(),
     up_ok=answer == hashlib.sha256(data).hexdigest())
"#,
        host = h.host
    );
    let r = probe(
        who,
        &["--net", "egress", "--allow", &rule, "--mem", "512M"],
        &code,
    );
    assert_eq!(r["down_bytes"], 24 << 20, "[{}] {r}", who.name());
    assert_eq!(r["down_ok"], true, "[{}] {r}", who.name());
    assert_eq!(r["up_ok"], true, "[{}] {r}", who.name());
}

/// `POST /run` with `network: "egress"` (what `zygo api` sends as `Request::Run`): the run
/// reaches what its `allow` names and nothing else; the test host's private address is
/// refused unless the API was started with `--allow-deploy --allow-private-net`; a tenant
/// held to `network = "none"` may not ask for egress at all.
fn a_run_over_the_api_reaches_its_allowed_host(who: Who) {
    use proto::api::{FrontFlags, RunAnswer};
    use proto::front::{ErrorCode, Reply, Request};
    use zygo_tests::api::ApiConn;
    if !root_only() {
        return;
    }
    const BOOT: &str = "bootstrap-token-of-the-egress-tests";
    let h = test_host();
    let mut s = SUITE.sup(who, "run");
    s.env("ZYGO_API_TOKEN", BOOT);
    let mut c = s.cmd(&["up"]);
    c.current_dir(&s.dir.path);
    let f = finish(c);
    assert_eq!(
        f.code,
        0,
        "[{}] zygo up: {}\n{}",
        who.name(),
        f.stderr_text(),
        s.log()
    );
    s.find_supervisor();
    let code = format!(
        "import socket\n\
         def tcp(port):\n\
         \x20   s = socket.socket(); s.settimeout(3)\n\
         \x20   try:\n\
         \x20       s.connect(({host:?}, port)); s.sendall(b'run'); return s.recv(100).decode()\n\
         \x20   except OSError as e:\n\
         \x20       return type(e).__name__\n\
         print(tcp({ALLOWED}), tcp({OTHER}))\n",
        host = h.host
    );
    let spec = serde_json::json!({
        "cmd": ["python3", "-c", code],
        "network": "egress",
        "allow": [format!("{}:{ALLOWED}", h.host)],
        "timeout": "30s",
    });
    let spec = zygo_tests::api::run_body(&spec);
    let run = |flags: FrontFlags, tenant: Option<&str>| {
        ApiConn::open(&s, flags).ask(BOOT, tenant, Request::Run { spec: spec.clone() })
    };
    let deploy = FrontFlags {
        allow_deploy: true,
        ..FrontFlags::default()
    };
    // Without --allow-private-net the test host's address may not be named.
    match run(deploy, None) {
        Reply::Error {
            code: ErrorCode::BadSpec,
            message,
            ..
        } => assert!(message.contains("--allow-private-net"), "{message}"),
        other => panic!("[{}] expected bad_spec, got {other:?}", who.name()),
    }
    let private = FrontFlags {
        allow_private_net: true,
        ..deploy
    };
    match run(private, None) {
        Reply::RunAnswer(RunAnswer {
            exit_code,
            stdout,
            stderr,
            ..
        }) => {
            assert_eq!(
                exit_code,
                Some(0),
                "[{}] {stdout} {stderr}\n{}",
                who.name(),
                s.log()
            );
            assert_eq!(
                stdout.trim(),
                "8080:run ConnectionRefusedError",
                "[{}] {stderr}",
                who.name()
            );
        }
        other => panic!(
            "[{}] expected a run's answer, got {other:?}\n{}",
            who.name(),
            s.log()
        ),
    }
    // A tenant held to no network: refused before anything starts.
    let mut api = ApiConn::open(&s, private);
    let t = format!("eg{}", unique());
    assert!(matches!(
        api.ask(BOOT, None, Request::CreateTenant { id: t.clone() }),
        Reply::Tenant { .. }
    ));
    let limits = Request::SetLimits {
        id: t.clone(),
        limits: proto::api::LimitsPatch {
            network: Some(Some("none".into())),
            ..proto::api::LimitsPatch::default()
        },
    };
    let r = api.ask(BOOT, None, limits);
    assert!(matches!(r, Reply::Tenant { .. }), "patch limits: {r:?}");
    match run(private, Some(&t)) {
        Reply::Error {
            code: ErrorCode::BadSpec,
            message,
            ..
        } => assert!(message.contains("limits say network \"none\""), "{message}"),
        other => panic!("[{}] expected bad_spec, got {other:?}", who.name()),
    }
    let events = h.events();
    assert_eq!(
        events.iter().filter(|e| e.as_str() == "tcp 8080").count(),
        1,
        "one connection reached the test host: {events:?}"
    );
    s.shutdown();
}

/// The egress filter of this zygo run (a descendant of `zygo_pid`), once it has started.
fn filter_of(zygo_pid: i32) -> Option<i32> {
    let mut pids = host_pids_starting_with(b"zygo\0__egress-filter");
    pids.retain(|p| descends_from(*p, zygo_pid));
    pids.first().copied()
}

/// The kernel's memory for the TCP sockets `owner` holds in the network namespace of
/// `netns_of` (a process in it; `None`: this one), as `ss` shows it: the bytes queued to
/// receive and to send and those reserved ahead (`skmem`'s r, w and f), and how many
/// sockets.
fn tcp_memory(owner: i32, netns_of: Option<i32>) -> (u64, usize) {
    let mut c = match netns_of {
        Some(pid) => {
            let mut c = Command::new("nsenter");
            c.arg(format!("--net=/proc/{pid}/ns/net"))
                .arg("--")
                .arg("ss");
            c
        }
        None => Command::new("ss"),
    };
    let out = c.args(["-tmnpH"]).output().expect("run ss (iproute2)");
    assert!(
        out.status.success(),
        "ss: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    // Each socket is a line, its skmem on a continuation line that starts with a tab.
    let text = String::from_utf8_lossy(&out.stdout).replace("\n\t", " ");
    let mine = format!("pid={owner},");
    let (mut bytes, mut sockets) = (0, 0);
    for line in text.lines().filter(|l| l.contains(&mine)) {
        let Some(mem) = line
            .split("skmem:(")
            .nth(1)
            .and_then(|m| m.split(')').next())
        else {
            continue;
        };
        sockets += 1;
        for field in mem.split(',') {
            let digits = field.trim_start_matches(|c: char| c.is_ascii_alphabetic());
            let key = &field[..field.len() - digits.len()];
            if matches!(key, "r" | "w" | "f") {
                bytes += digits.parse::<u64>().unwrap_or(0);
            }
        }
    }
    (bytes, sockets)
}

/// The program of [`the_filters_buffers_stay_within_a_share_of_the_sandboxs_memory`]:
/// downloads it never reads from a server that sends as fast as it can, and uploads to a
/// server that never reads, as many of each as it can open, each pushed for as long as
/// the run lasts.
const HOARDER: &str = r#"
import socket, sys, time
host = sys.argv[1]
downs, ups, failed = [], [], 0
for i in range(12):
    for port, held in ((8084, downs), (8083, ups)):
        try:
            held.append(socket.create_connection((host, port), timeout=5))
        except OSError:
            failed += 1
for s in ups:
    s.setblocking(False)
print("opened", len(downs), len(ups), failed, flush=True)
block = b"u" * 65536
while True:
    for s in list(ups):
        try:
            while True:
                s.send(block)
        except BlockingIOError:
            pass
        except OSError:
            ups.remove(s)
    time.sleep(0.05)
"#;

/// The egress filter's socket buffers count against the sandbox: whatever its program
/// leaves unread (downloads from a server that sends as fast as it can) or unsent (uploads
/// to a server that never reads), the kernel memory of the filter's sockets, inside the
/// sandbox's network namespace and outside it, stays within a quarter of the sandbox's
/// `--mem`. Without the bound, each unread download held tens of MiB.
fn the_filters_buffers_stay_within_a_share_of_the_sandboxs_memory(who: Who) {
    if !root_only() {
        return;
    }
    const MEM_MIB: u64 = 64;
    // docs/egress.md: the filter holds at most a quarter of the sandbox's --mem.
    let bound = (MEM_MIB << 20) / 4;
    let h = test_host();
    let mut c = zygo(who);
    c.args(["run", "--mem", &format!("{MEM_MIB}M"), "--timeout", "300s"])
        .args(["--net", "egress"])
        .args(["--allow", &format!("{}:8084", h.host)])
        .args(["--allow", &format!("{}:8083", h.host)])
        .args(["--", "python3", "-c", HOARDER, &h.host])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    let mut child = c.spawn().expect("start zygo run");
    let zygo_pid = child.id() as i32;
    // Ended (and its sandbox with it) however the test ends.
    struct Kill(Child);
    impl Drop for Kill {
        fn drop(&mut self) {
            let _ = self.0.kill();
            let _ = self.0.wait();
        }
    }
    let stdout = child.stdout.take().expect("its stdout");
    let mut run = Kill(child);
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        for line in BufReader::new(stdout).lines() {
            let Ok(line) = line else { break };
            if tx.send(line).is_err() {
                break;
            }
        }
    });
    let opened = rx.recv_timeout(slow(Duration::from_secs(60)));
    let opened = match opened {
        Ok(l) if l.starts_with("opened ") => l,
        other => {
            let _ = run.0.kill();
            let mut err = String::new();
            if let Some(mut e) = run.0.stderr.take() {
                let _ = std::io::Read::read_to_string(&mut e, &mut err);
            }
            panic!(
                "[{}] the program did not start: {other:?}\n{err}",
                who.name()
            );
        }
    };
    let filter = filter_of(zygo_pid).expect("the run's egress filter");
    // The sandbox's program (`zygo run`'s own command line names the code too).
    let program = host_processes()
        .into_iter()
        .find(|(p, cmd)| {
            cmd.starts_with(b"python3\0")
                && contains(cmd, b"downs, ups, failed")
                && descends_from(*p, zygo_pid)
        })
        .map(|(p, _)| p)
        .expect("the sandbox's program");
    // Sample until the sum has not moved for 3 s (the queues are full), within a deadline
    // far beyond what filling them takes; every sample must be within the bound.
    let deadline = Instant::now() + slow(Duration::from_secs(90));
    let mut samples: Vec<(u64, usize)> = Vec::new();
    loop {
        std::thread::sleep(Duration::from_millis(500));
        let (outside, n_out) = tcp_memory(filter, None);
        let (inside, n_in) = tcp_memory(filter, Some(program));
        let total = outside + inside;
        assert!(
            total <= bound,
            "[{}] the filter's sockets hold {} KiB, past a quarter of --mem {MEM_MIB}M ({} \
             KiB): {n_out} outside ({} KiB), {n_in} inside ({} KiB); the program {opened}",
            who.name(),
            total >> 10,
            bound >> 10,
            outside >> 10,
            inside >> 10
        );
        samples.push((total, n_out));
        let last = &samples[samples.len().saturating_sub(6)..];
        let (lo, hi) = last
            .iter()
            .fold((u64::MAX, 0), |(lo, hi), (t, _)| (lo.min(*t), hi.max(*t)));
        if last.len() == 6 && hi - lo <= hi / 50 {
            break;
        }
        if Instant::now() > deadline {
            break;
        }
    }
    let (total, relays) = samples.last().copied().unwrap_or((0, 0));
    // Not vacuous: the relays were running, and their queues had filled.
    assert!(
        relays >= 8 && total >= 1 << 20,
        "[{}] {relays} relays holding {} KiB; the program {opened}",
        who.name(),
        total >> 10
    );
}

/// A listener of the test's own on a loopback address of this host (in this network
/// namespace): answers every connection with `loopback:` and what it read, and counts
/// them.
fn loopback_listener(ip: &str) -> (u16, std::sync::Arc<std::sync::atomic::AtomicUsize>) {
    use std::sync::atomic::{AtomicUsize, Ordering};
    let l = std::net::TcpListener::bind((ip, 0)).expect("listen on a loopback address");
    let port = l.local_addr().expect("its port").port();
    let seen = std::sync::Arc::new(AtomicUsize::new(0));
    let count = std::sync::Arc::clone(&seen);
    std::thread::spawn(move || {
        for c in l.incoming() {
            let Ok(mut c) = c else { continue };
            count.fetch_add(1, Ordering::SeqCst);
            use std::io::{Read, Write};
            let _ = c.set_read_timeout(Some(Duration::from_secs(5)));
            let mut buf = [0u8; 100];
            let n = c.read(&mut buf).unwrap_or(0);
            let _ = c.write_all(b"loopback:");
            let _ = c.write_all(&buf[..n]);
        }
    });
    (port, seen)
}

/// The probe of [`loopback_beyond_127_0_0_1_opens_only_when_named`]: a connection to
/// 127.0.0.2 on the port of a rule for all of 127/8, Zygo's resolver's answer for a name
/// the test host's DNS says is 127.0.0.2, and a connection there naming that name.
const LOOPBACK_PROBE: &str = r#"
import socket, struct
WIDE, NAMED = PORTS
def dns(name):
    q = b"\x12\x34\x01\x00\x00\x01\x00\x00\x00\x00\x00\x00"
    for label in name.split("."):
        q += bytes([len(label)]) + label.encode()
    q += b"\x00" + struct.pack(">HH", 1, 1)
    s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    s.settimeout(3)
    try:
        s.sendto(q, ("192.0.2.53", 53))
        a = s.recv(1500)
    except OSError as e:
        return ename(e.errno) if e.errno else "TIMEOUT"
    count = struct.unpack(">H", a[6:8])[0]
    return " ".join(".".join(str(b) for b in a[i - 4:i]) for i in range(len(a), len(a) - 16 * count, -16))
def tcp(addr, port, first):
    s = socket.socket()
    s.settimeout(3)
    try:
        s.connect((addr, port))
        s.sendall(first)
        got = s.recv(100)
        return ("OK " + got[:16].decode(errors="replace")) if got else "EOF"
    except socket.timeout:
        return "TIMEOUT"
    except OSError as e:
        return ename(e.errno)
    finally:
        s.close()
done(wide=tcp("127.0.0.2", WIDE, b"hi"), dns=dns("loop.zygo.test"),
     named=tcp("127.0.0.2", NAMED, b"GET / HTTP/1.1\r\nHost: loop.zygo.test\r\n\r\n"))
"#;

/// All of 127.0.0.0/8 is the host's own: a rule for the whole block, or a name whose DNS
/// answer is 127.0.0.2, does not reach a service listening on the host's 127.0.0.2; a rule
/// naming 127.0.0.2 and the port exactly does.
fn loopback_beyond_127_0_0_1_opens_only_when_named(who: Who) {
    use std::sync::atomic::Ordering;
    if !root_only() {
        return;
    }
    let (wide_port, wide_seen) = loopback_listener("127.0.0.2");
    let (named_port, named_seen) = loopback_listener("127.0.0.2");
    // The test host's DNS server answers names under zygo.test with 127.0.0.2.
    let h = TestHost::start(&LAYOUT, SERVER, &["127.0.0.2"]);
    let dir = TempDir::new(0o755);
    let conf = dir.file("resolv.conf", format!("nameserver {}\n", h.host).as_bytes());
    let code = LOOPBACK_PROBE.replace("PORTS", &format!("{wide_port}, {named_port}"));
    let g = guard_flags();
    let mut c = zygo(who);
    c.env("ZYGO_RESOLV_CONF", &conf)
        .args(["run", "--json"])
        .args(&g)
        .args(["--net", "egress"])
        .args(["--allow", &format!("127.0.0.0/8:{wide_port}")])
        .args(["--allow", &format!("loop.zygo.test:{named_port}")])
        .args(["--", "python3", "-c"])
        .arg(probe_script(&code));
    let f = finish(c);
    let v = f.last_json();
    assert_not_refused(who, &v, f.code);
    assert_ok(who, &v, f.code);
    let last = s(&v, "stdout").lines().last().unwrap_or("").to_string();
    let r: Value = serde_json::from_str(&last).expect("the probe's JSON line");
    assert_result(who, &r, "dns", &["127.0.0.2"]);
    assert_result(who, &r, "wide", &["ECONNRESET", "EOF"]);
    assert_result(who, &r, "named", &["ECONNRESET", "EOF"]);
    let log = f.stderr_text();
    assert!(
        log.contains(&format!(
            "refused 127.0.0.2:{wide_port}: an address of this host"
        )) && log.contains(&format!(
            "refused 127.0.0.2:{named_port}: an address of this host"
        )),
        "[{}] {log}",
        who.name()
    );
    assert_eq!(wide_seen.load(Ordering::SeqCst), 0, "[{}] {r}", who.name());
    assert_eq!(named_seen.load(Ordering::SeqCst), 0, "[{}] {r}", who.name());
    // Named exactly, it opens: the listener answers.
    let exact = format!("127.0.0.2:{wide_port}");
    let r = probe(
        who,
        &["--net", "egress", "--allow", &exact],
        &format!(
            "import socket\n\
             s = socket.create_connection(('127.0.0.2', {wide_port}), timeout=3)\n\
             s.sendall(b'hi')\n\
             done(exact=s.recv(100).decode())\n"
        ),
    );
    assert_result(who, &r, "exact", &["loopback:hi"]);
    assert_eq!(wide_seen.load(Ordering::SeqCst), 1, "[{}] {r}", who.name());
}

root_and_rootless!(
    the_filters_buffers_stay_within_a_share_of_the_sandboxs_memory,
    loopback_beyond_127_0_0_1_opens_only_when_named,
    a_client_hello_opens_nothing_for_a_cleartext_server,
    a_run_over_the_api_reaches_its_allowed_host,
    large_transfers_arrive_intact,
    allowed_connects_and_the_rest_is_refused,
    half_closed_connections_make_room,
    name_rules_are_exact_by_name,
    private_addresses_open_only_when_named,
    the_filter_is_confined,
    a_function_reaches_its_allowed_host,
);

both_tests! {
    /// Malformed names, IPv6 rules, and --allow without --net egress are refused before
    /// anything starts, with the reason.
    fn rules_this_version_cannot_enforce_are_refused(who) {
        for (flags, needle) in [
            (&["--net", "egress", "--allow", "exa_mple.com:443"][..], "bad host"),
            (&["--net", "egress", "--allow", "[2001:db8::1]:443"][..], "IPv4 only"),
            (&["--allow", "192.0.2.1:443"][..], "needs --net egress"),
            (&["--net", "host"][..], "only in sandbox.toml"),
        ] {
            let mut c = zygo(who);
            c.arg("run").args(flags).args(["--", "true"]);
            let f = finish(c);
            assert_eq!(f.code, 2, "[{}] {flags:?}: {}", who.name(), f.stderr_text());
            assert!(f.stderr_text().contains(needle), "[{}] {flags:?}: {}", who.name(), f.stderr_text());
        }
    }
}

/// A network namespace standing in for a host with a public address of its own: an
/// interface holding [`OWN`], and the test host's server listening on it. Removed, with
/// its servers, when dropped.
struct OwnAddressHost {
    ns: String,
    servers: Vec<Child>,
}

/// A public address (not in any special range) that the namespace owns.
const OWN: &str = "11.22.33.44";

impl OwnAddressHost {
    fn new() -> OwnAddressHost {
        let ns = format!("zygo-own-{}-{}", std::process::id(), unique());
        ip(&["netns", "add", &ns]);
        // Removed when dropped, from here on, whatever fails below.
        let mut h = OwnAddressHost {
            ns: ns.clone(),
            servers: Vec::new(),
        };
        ip(&["-n", &ns, "link", "set", "lo", "up"]);
        // A veth pair with both ends inside (this kernel has no dummy interfaces).
        ip(&[
            "-n", &ns, "link", "add", "zown0", "type", "veth", "peer", "name", "zown1",
        ]);
        ip(&[
            "-n",
            &ns,
            "addr",
            "add",
            &format!("{OWN}/32"),
            "dev",
            "zown0",
        ]);
        ip(&["-n", &ns, "link", "set", "zown0", "up"]);
        ip(&["-n", &ns, "link", "set", "zown1", "up"]);
        h.serve_on(OWN);
        h
    }

    /// Start the test host's server on `addr`, an address of the namespace.
    fn serve_on(&mut self, addr: &str) {
        let server = Command::new("ip")
            .args(["netns", "exec", &self.ns, "python3", "-c", SERVER, addr])
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .spawn()
            .expect("start the server");
        let server = {
            self.servers.push(server);
            self.servers.last_mut().expect("the server just started")
        };
        let mut out = BufReader::new(server.stdout.take().expect("its stdout"));
        let mut first = String::new();
        out.read_line(&mut first).expect("the server started");
        assert_eq!(first.trim(), "ready");
        // The server logs a line per connection: keep reading them, or it dies writing one.
        std::thread::spawn(move || for _ in out.lines() {});
    }

    /// `zygo run --json` with `flags` and `cmd`, started inside the namespace (only its
    /// network: the machine's mounts and cgroups stay as they are).
    fn zygo_run(&self, flags: &[&str], cmd: &[&str]) -> Finished {
        let mut c = Command::new("nsenter");
        c.arg(format!("--net=/run/netns/{}", self.ns))
            .arg("--")
            .arg(zygo_bin())
            .args(["run", "--json"])
            .args(flags)
            .arg("--")
            .args(cmd)
            .env_clear()
            .env("PATH", "/usr/bin:/bin")
            .env("HOME", "/root")
            .current_dir("/")
            .stdin(Stdio::null());
        finish(c)
    }
}

impl Drop for OwnAddressHost {
    fn drop(&mut self) {
        for server in &mut self.servers {
            drop(server.stdin.take());
            let _ = server.kill();
            let _ = server.wait();
        }
        let _ = Command::new("ip").args(["netns", "del", &self.ns]).status();
    }
}

/// The host's own addresses are reached over its loopback, past its firewall: a rule for a
/// wide block does not open them, a rule naming one exactly does. Zygo runs in a network
/// namespace the test makes, whose dummy interface holds a public address, so nothing is
/// added to the machine's own network.
#[test]
fn the_hosts_own_addresses_open_only_when_named() {
    if !root_only() {
        return;
    }
    let h = OwnAddressHost::new();
    let code = format!(
        "import socket, json\n\
         s = socket.socket(); s.settimeout(3)\n\
         try:\n\
         \x20   s.connect(({OWN:?}, {ALLOWED})); s.sendall(b'hi'); r = s.recv(100)\n\
         \x20   print(json.dumps('OK ' + r.decode() if r else 'EOF'))\n\
         except OSError as e:\n\
         \x20   print(json.dumps(type(e).__name__))\n"
    );
    let wide = format!("0.0.0.0/0:{ALLOWED}");
    let f = h.zygo_run(
        &["--net", "egress", "--allow", &wide],
        &["python3", "-c", &code],
    );
    let v = f.last_json();
    assert_eq!(v["exit_code"], 0, "{v}\n{}", f.stderr_text());
    let got = s(&v, "stdout").trim().to_string();
    assert!(
        got == "\"ConnectionResetError\"" || got == "\"EOF\"",
        "a wide rule reached the host's own address: {got}\n{}",
        f.stderr_text()
    );
    assert!(
        f.stderr_text().contains("an address of this host"),
        "{}",
        f.stderr_text()
    );
    let exact = format!("{OWN}:{ALLOWED}");
    let f = h.zygo_run(
        &["--net", "egress", "--allow", &exact],
        &["python3", "-c", &code],
    );
    let v = f.last_json();
    assert_eq!(
        s(&v, "stdout").trim(),
        "\"OK 8080:hi\"",
        "{v}\n{}",
        f.stderr_text()
    );
}

/// A range the host's `local` routing table delivers to the host itself is the host's own
/// too, though no interface holds its addresses: an address given to `lo` with a prefix
/// makes its whole block local, and a server on another address of the block is reached
/// over loopback. A wide rule does not open it; a rule naming the address does.
#[test]
fn a_range_routed_to_the_host_itself_opens_only_when_named() {
    if !root_only() {
        return;
    }
    let mut h = OwnAddressHost::new();
    // 11.22.55.0/24 is local in the namespace; nothing holds 11.22.55.7 but the route.
    ip(&["-n", &h.ns, "addr", "add", "11.22.55.1/24", "dev", "lo"]);
    h.serve_on("11.22.55.7");
    let code = format!(
        "import socket, json\n\
         s = socket.socket(); s.settimeout(3)\n\
         try:\n\
         \x20   s.connect(('11.22.55.7', {ALLOWED})); s.sendall(b'hi'); r = s.recv(100)\n\
         \x20   print(json.dumps('OK ' + r.decode() if r else 'EOF'))\n\
         except OSError as e:\n\
         \x20   print(json.dumps(type(e).__name__))\n"
    );
    let wide = format!("0.0.0.0/0:{ALLOWED}");
    let f = h.zygo_run(
        &["--net", "egress", "--allow", &wide],
        &["python3", "-c", &code],
    );
    let v = f.last_json();
    assert_eq!(v["exit_code"], 0, "{v}\n{}", f.stderr_text());
    let got = s(&v, "stdout").trim().to_string();
    assert!(
        got == "\"ConnectionResetError\"" || got == "\"EOF\"",
        "a wide rule reached the host's local range: {got}\n{}",
        f.stderr_text()
    );
    assert!(
        f.stderr_text()
            .contains("refused 11.22.55.7:8080: an address of this host"),
        "{}",
        f.stderr_text()
    );
    let exact = format!("11.22.55.7:{ALLOWED}");
    let f = h.zygo_run(
        &["--net", "egress", "--allow", &exact],
        &["python3", "-c", &code],
    );
    let v = f.last_json();
    assert_eq!(
        s(&v, "stdout").trim(),
        "\"OK 8080:hi\"",
        "{v}\n{}",
        f.stderr_text()
    );
}

/// `zygo version` says which egress this host supports.
#[test]
fn version_reports_the_egress_mode() {
    let mut c = Command::new(zygo_bin());
    c.args(["version", "--json"]);
    let f = finish(c);
    assert_eq!(f.code, 0, "{}", f.stderr_text());
    let v = f.last_json();
    assert_eq!(v["egress"], "relay", "{v}");
    assert_eq!(v["egress_rules"], "ipv4-address-and-name", "{v}");
}

/// A test host whose construction fails half-way leaves nothing behind: an `ip` command
/// that fails after the namespace was made (an interface name too long for the kernel),
/// and a server that exits instead of saying `ready` after the veth pair was made, each
/// remove the namespace and the veth pair before the failure is reported.
#[test]
fn a_test_host_that_fails_half_way_leaves_nothing() {
    if !root_only() {
        return;
    }
    let ours = |tag: &str| {
        let pid = std::process::id();
        let mut left: Vec<String> = std::fs::read_dir("/run/netns")
            .map(|d| {
                d.flatten()
                    .map(|e| e.file_name().to_string_lossy().into_owned())
                    .filter(|n| n.starts_with(&format!("zygo-{tag}-{pid}-")))
                    .collect()
            })
            .unwrap_or_default();
        let links = std::fs::read_dir("/sys/class/net").expect("read /sys/class/net");
        left.extend(
            links
                .flatten()
                .map(|e| e.file_name().to_string_lossy().into_owned())
                .filter(|n| n.starts_with(&format!("z{tag}a"))),
        );
        left
    };
    // "z" + this tag + "a" + 9 hex digits is longer than IFNAMSIZ allows.
    let long = Layout {
        tag: "toolongtag",
        subnet: 215,
    };
    let e = TestHost::try_start(&long, SERVER, &[])
        .err()
        .expect("a failure");
    assert!(e.contains("link") && e.contains("add"), "{e}");
    assert_eq!(
        ours(long.tag),
        Vec::<String>::new(),
        "left behind after: {e}"
    );
    let quits = Layout {
        tag: "qx",
        subnet: 215,
    };
    let e = TestHost::try_start(&quits, "import sys; sys.exit(3)", &[])
        .err()
        .expect("a failure");
    assert!(e.contains("did not start"), "{e}");
    assert_eq!(
        ours(quits.tag),
        Vec::<String>::new(),
        "left behind after: {e}"
    );
}
