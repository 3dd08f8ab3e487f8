//! Tenants' secrets, end to end through a real supervisor: `zygo secrets` on the control
//! socket (CLI role) and the API role's envelopes (what `zygo api` sends for
//! `PUT`/`DELETE /tenants/{id}/secrets/{name}` and `GET /tenants/{id}/secrets`).
//!
//! - `keygen` makes keys; `set` (value on stdin), `ls` (names), `rm`; the gate (PUT/DELETE
//!   need deploy rights, GET is the operator's; a tenant token gets none of them);
//! - a passphrase as `ZYGO_SECRETS_KEY` refuses the start, saying why and how to make a key,
//!   without repeating it; the key is gone from the supervisor's environment;
//! - a sealed record copied to another tenant or name does not open;
//! - no answer, CLI output, log line or stored file carries a value;
//! - a call with secrets has its zygote to itself until what it left running has gone.

use std::fs;
use std::io::Write;
use std::time::Duration;

use proto::api::{FrontFlags, SecretValue, ServeKind};
use proto::front::{ErrorCode, ExecRequest, Outcome, Reply, Request, ScriptRef};
// One API-role connection: what `zygo api` sends, minus HTTP.
use zygo_tests::api::ApiConn as Api;
use zygo_tests::*;

static SUITE: Suite = Suite {
    prefix: "sec-",
    handlers: LOOK,
    defaults: "timeout = \"20s\"\nmem = \"64M\"\nidle_timeout = \"60s\"\n",
    agents: false,
};

const BOOT: &str = "bootstrap-token-of-the-secrets-tests";

/// What a request sees of its secrets: for each name asked, the SHA-256 of the file (never
/// the value itself), its mode and owner, the request's own uid, the folder's mode and
/// listing, and how `/run/secrets` is mounted; then it holds for `hold` seconds.
const LOOK: &str = r#"import hashlib, os, time


def _look(name):
    p = "/run/secrets/" + name
    st = os.stat(p)
    mount = []
    try:
        for line in open("/proc/self/mountinfo"):
            f = line.split()
            if f[4] == "/run/secrets":
                mount.append(f[5] + " " + line.split(" - ")[1].split()[0])
    except OSError as e:
        mount.append("unreadable: " + str(e))
    return {"sha": hashlib.sha256(open(p, "rb").read()).hexdigest(),
            "mode": st.st_mode & 0o7777, "uid": st.st_uid, "me": os.getuid(),
            "dir_mode": os.stat("/run/secrets").st_mode & 0o7777,
            "names": sorted(os.listdir("/run/secrets")), "mount": mount}


def read(event):
    out = {n: _look(n) for n in event["names"]}
    time.sleep(event.get("hold", 0))
    return out


def handler(event):
    return read(event)
"#;

fn sha(v: &str) -> String {
    use sha2::{Digest, Sha256};
    Sha256::digest(v.as_bytes())
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect()
}

/// Host processes of a function (by its cgroup) with a `/run/secrets` mount.
fn with_secrets_mounted(name: &str) -> Vec<i32> {
    host_processes()
        .into_iter()
        .map(|(pid, _)| pid)
        .filter(|pid| memory_cgroup(*pid).contains(&format!("/{name}/")))
        .filter(|pid| {
            fs::read_to_string(format!("/proc/{pid}/mountinfo")).is_ok_and(|m| {
                m.lines()
                    .any(|l| l.split(' ').nth(4) == Some("/run/secrets"))
            })
        })
        .collect()
}

/// Check what a request saw of one secret: its value (by hash), 0400 and its own uid, in a
/// 0500 folder of its own holding `names`, on a read-only tmpfs.
#[track_caller]
fn check_seen(seen: &serde_json::Value, value: &str, names: &[&str]) {
    assert_eq!(seen["sha"], sha(value), "the value read: {seen}");
    assert_eq!(seen["mode"], 0o400, "{seen}");
    assert_eq!(
        seen["uid"], seen["me"],
        "owned by the request's uid: {seen}"
    );
    assert_eq!(seen["dir_mode"], 0o500, "{seen}");
    let listed: Vec<&str> = seen["names"]
        .as_array()
        .expect("names")
        .iter()
        .map(|n| n.as_str().expect("name"))
        .collect();
    assert_eq!(listed, names, "{seen}");
    let mount = seen["mount"].to_string();
    assert!(mount.contains("ro") && mount.contains("tmpfs"), "{seen}");
}

fn code(r: &Reply) -> Option<ErrorCode> {
    match r {
        Reply::Error { code, .. } => Some(*code),
        _ => None,
    }
}

#[track_caller]
fn expect_code(r: &Reply, want: ErrorCode, what: &str) {
    assert_eq!(code(r), Some(want), "{what}: {r:?}");
}

fn keygen(s: &Sup) -> String {
    let f = s.run(&["secrets", "keygen"]);
    assert_eq!(f.code, 0, "keygen: {}", f.stderr_text());
    let k = f.stdout_text().trim().to_string();
    assert!(is_hex(&k, 64), "a key is 64 hex digits: {k:?}");
    k
}

/// Start the test's supervisor (no functions) with the bootstrap token and this key.
fn start(s: &mut Sup, key: Option<&str>) {
    s.env("ZYGO_API_TOKEN", BOOT);
    if let Some(k) = key {
        s.env("ZYGO_SECRETS_KEY", k);
    }
    let mut c = s.cmd(&["up"]);
    c.current_dir(&s.dir.path);
    let f = finish(c);
    assert_eq!(f.code, 0, "zygo up: {}\n{}", f.stderr_text(), s.log());
    s.find_supervisor();
}

/// `zygo secrets set TENANT NAME` with the value on stdin (a file outside the state
/// folders).
fn set(s: &Sup, tenant: &str, name: &str, value: &str) -> Finished {
    let path = s.dir.path.join(format!("value-{}", unique()));
    fs::write(&path, format!("{value}\n")).expect("write the value");
    let mut c = s.cmd(&["secrets", "set", tenant, name, "--json"]);
    c.stdin(fs::File::open(&path).expect("open the value"));
    let f = finish(c);
    let _ = fs::remove_file(&path);
    f
}

fn ls(s: &Sup, tenant: &str) -> Vec<String> {
    let f = s.run(&["secrets", "ls", tenant, "--json"]);
    assert_eq!(f.code, 0, "secrets ls: {}\n{}", f.stdout_text(), s.log());
    let v = f.last_json();
    v["secrets"]
        .as_array()
        .expect("secrets")
        .iter()
        .map(|n| n.as_str().expect("a name").to_string())
        .collect()
}

fn create_tenant(api: &mut Api, t: &str) {
    let r = api.ask(BOOT, None, Request::CreateTenant { id: t.into() });
    assert!(matches!(r, Reply::Tenant { .. }), "create {t}: {r:?}");
}

/// Every file under `dir`, recursively (bytes), for searching.
fn all_files(dir: &std::path::Path, out: &mut Vec<(std::path::PathBuf, Vec<u8>)>) {
    let Ok(rd) = fs::read_dir(dir) else { return };
    for e in rd.flatten() {
        let p = e.path();
        let Ok(m) = fs::symlink_metadata(&p) else {
            continue;
        };
        if m.is_dir() {
            all_files(&p, out);
        } else if m.is_file() {
            out.push((p.clone(), fs::read(&p).unwrap_or_default()));
        }
    }
}

fn hex_of(s: &str) -> String {
    s.bytes().map(|b| format!("{b:02x}")).collect()
}

/// No value is anywhere: not in what was said (answers, CLI output), not in the state
/// folder (supervisor.log, usage.log, the store), plain or in hex.
#[track_caller]
fn assert_nowhere(s: &Sup, values: &[&str], said: &[String]) {
    let mut files = Vec::new();
    all_files(&s.st, &mut files);
    all_files(&s.rt, &mut files);
    assert!(
        files.iter().any(|(p, _)| p.ends_with("supervisor.log")),
        "the log was searched"
    );
    for v in values {
        for form in [v.to_string(), hex_of(v)] {
            for (p, bytes) in &files {
                assert!(
                    !contains(bytes, form.as_bytes()),
                    "{} holds a secret's value",
                    p.display()
                );
            }
            for x in said {
                assert!(!x.contains(&form), "an answer holds a secret's value: {x}");
            }
        }
    }
}

fn keygen_set_ls_rm(who: Who) {
    let mut s = SUITE.sup(who, "basic");
    let key = keygen(&s);
    assert_ne!(key, keygen(&s), "two keys differ");
    start(&mut s, Some(&key));
    // The key left the supervisor's environment, the block /proc shows included.
    if let Some(pid) = s.supervisor {
        let env = fs::read(format!("/proc/{pid}/environ")).unwrap_or_default();
        assert!(
            !contains(&env, key.as_bytes()),
            "the key is in the supervisor's environ"
        );
    }
    let mut said: Vec<String> = Vec::new();
    let mut api = Api::open(&s, FrontFlags::default());
    let (a, b) = (api::tenant_id("a"), api::tenant_id("b"));
    create_tenant(&mut api, &a);
    create_tenant(&mut api, &b);
    let v1 = format!("sk_live_{}", unique());
    let v2 = format!("sk_test_{}", unique());
    let v3 = format!("api-put-{}", unique());

    // The CLI: set, replace, list, remove.
    let f = set(&s, &a, "STRIPE_KEY", &v1);
    assert_eq!(
        f.code,
        0,
        "set: {}{}\n{}",
        f.stdout_text(),
        f.stderr_text(),
        s.log()
    );
    assert_eq!(f.last_json()["replaced"], false);
    said.push(f.stdout_text() + &f.stderr_text());
    let f = set(&s, &a, "STRIPE_KEY", &v2);
    assert_eq!(f.last_json()["replaced"], true, "{}", f.stdout_text());
    said.push(f.stdout_text() + &f.stderr_text());
    let f = set(&s, &a, "OTHER", &v1);
    assert_eq!(f.code, 0);
    said.push(f.stdout_text() + &f.stderr_text());
    assert_eq!(ls(&s, &a), ["OTHER", "STRIPE_KEY"]);
    assert!(ls(&s, &b).is_empty());
    let f = s.run(&["secrets", "ls", &a]);
    said.push(f.stdout_text() + &f.stderr_text());
    assert_eq!(f.stdout_text(), "OTHER\nSTRIPE_KEY\n");
    // A sealed record per secret, 0600 in a 0700 folder, without the value.
    let rec = s.st.join(format!("api/secrets/{a}.STRIPE_KEY.json"));
    let text_of = fs::read_to_string(&rec).expect("the sealed record");
    assert!(
        text_of.contains("\"sealed\"") && text_of.contains("\"nonce\""),
        "{text_of}"
    );
    use std::os::unix::fs::PermissionsExt;
    assert_eq!(
        fs::metadata(&rec).expect("stat").permissions().mode() & 0o777,
        0o600
    );
    let f = s.run(&["secrets", "rm", &a, "OTHER", "--json"]);
    assert_eq!(f.code, 0, "rm: {}", f.stdout_text());
    assert_eq!(ls(&s, &a), ["STRIPE_KEY"]);
    assert!(!s.st.join(format!("api/secrets/{a}.OTHER.json")).exists());
    let f = s.run(&["secrets", "rm", &a, "OTHER", "--json"]);
    assert_eq!(f.code, 1);
    assert_eq!(text(&f.last_json(), "code"), "not_found");
    // Bad names never reach the supervisor; a tenant that does not exist is not_found.
    for bad in ["1X", "A-B", "../x", ""] {
        let f = set(&s, &a, bad, &v1);
        assert_eq!(f.code, 2, "name {bad:?}: {}", f.stdout_text());
    }
    let f = set(&s, "nobody-here", "K", &v1);
    assert_eq!(
        text(&f.last_json(), "code"),
        "not_found",
        "{}",
        f.stdout_text()
    );
    said.push(f.stdout_text());

    // The API role: the gate's rows, and the answers.
    let op = api::mint(&s, None).1;
    let tt = api::mint(&s, Some(&a)).1;
    let put = |name: &str, v: &str, t: &str| Request::PutSecret {
        tenant: t.into(),
        name: name.into(),
        value: SecretValue(v.as_bytes().to_vec()),
    };
    let r = api.ask(&op, None, put("API_KEY", &v3, &b));
    assert!(
        matches!(
            &r,
            Reply::SecretStored {
                replaced: false,
                ..
            }
        ),
        "{r:?}"
    );
    said.push(format!("{r:?}"));
    // The bootstrap token without --allow-deploy, and a tenant token (even for itself).
    let r = api.ask(BOOT, None, put("API_KEY", &v3, &b));
    expect_code(&r, ErrorCode::Forbidden, "bootstrap without --allow-deploy");
    said.push(format!("{r:?}"));
    let r = api.ask(&tt, None, put("API_KEY", &v3, &a));
    expect_code(&r, ErrorCode::Forbidden, "a tenant setting its own secret");
    said.push(format!("{r:?}"));
    let r = api.ask(&tt, None, Request::ListSecrets { tenant: a.clone() });
    expect_code(&r, ErrorCode::Forbidden, "a tenant listing");
    let r = api.ask(
        &tt,
        None,
        Request::DeleteSecret {
            tenant: a.clone(),
            name: "STRIPE_KEY".into(),
        },
    );
    expect_code(&r, ErrorCode::Forbidden, "a tenant deleting");
    let r = api.ask(BOOT, None, Request::ListSecrets { tenant: b.clone() });
    assert!(
        matches!(&r, Reply::Secrets { names, .. } if names == &["API_KEY".to_string()]),
        "the bootstrap operator lists names: {r:?}"
    );
    said.push(format!("{r:?}"));
    let deploy = FrontFlags {
        allow_deploy: true,
        ..Default::default()
    };
    let mut api_deploy = Api::open(&s, deploy);
    let r = api_deploy.ask(BOOT, None, put("BIG", &"x".repeat(64 * 1024 + 1), &b));
    expect_code(&r, ErrorCode::TooLarge, "a value over 64 KiB");
    let r = api_deploy.ask(BOOT, None, put("bad-name", &v3, &b));
    expect_code(&r, ErrorCode::BadRequest, "a bad name");
    let r = api_deploy.ask(
        BOOT,
        None,
        Request::DeleteSecret {
            tenant: b.clone(),
            name: "API_KEY".into(),
        },
    );
    assert!(matches!(r, Reply::SecretDeleted { .. }), "{r:?}");
    // Deleting a tenant takes its secrets.
    let r = api_deploy.ask(BOOT, None, Request::DeleteTenant { id: a.clone() });
    assert!(matches!(r, Reply::TenantDeleted(_)), "{r:?}");
    assert!(!rec.exists(), "the deleted tenant's secret is gone");
    drop(api);
    drop(api_deploy);
    assert_nowhere(&s, &[&v1, &v2, &v3], &said);
    s.shutdown();
}

root_and_rootless!(keygen_set_ls_rm);

/// A passphrase, or anything but 64 hex digits, refuses the start, saying why and how to
/// make a key, never repeating what it was given.
#[test]
fn a_passphrase_refuses_the_start() {
    let Some(mut s) = SUITE.root("pass") else {
        return;
    };
    let phrase = "correct horse battery staple";
    s.env("ZYGO_SECRETS_KEY", phrase);
    let mut c = s.cmd(&["up"]);
    c.current_dir(&s.dir.path);
    let f = finish(c);
    let said = format!("{}{}{}", f.stdout_text(), f.stderr_text(), s.log());
    assert!(f.code != 0, "zygo up started with a passphrase: {said}");
    assert!(
        said.contains("zygo secrets keygen"),
        "how to make a key: {said}"
    );
    assert!(said.contains("passphrase"), "why: {said}");
    assert!(
        !said.contains("horse"),
        "the passphrase is repeated: {said}"
    );
    assert!(!s.socket().exists());
    s.never_started();
}

/// Without a key nothing can be stored (503 unavailable, saying how to start with one).
#[test]
fn no_key_no_store() {
    let Some(mut s) = SUITE.root("nokey") else {
        return;
    };
    start(&mut s, None);
    let mut api = Api::open(&s, FrontFlags::default());
    let t = api::tenant_id("n");
    create_tenant(&mut api, &t);
    let f = set(&s, &t, "K", "value-without-a-key");
    assert_eq!(f.code, 1);
    let v = f.last_json();
    assert_eq!(text(&v, "code"), "unavailable");
    assert!(text(&v, "error").contains("ZYGO_SECRETS_KEY"), "{v}");
    drop(api);
    s.shutdown();
}

/// A sealed record copied to another tenant or name (with the record's own fields made to
/// match, as anything that can write files could) does not open: its tenant and name are
/// bound into the seal. The copies are named in the log as records that cannot be opened;
/// the original is not.
#[test]
fn a_sealed_record_copied_to_another_tenant_or_name_does_not_open() {
    let Some(mut s) = SUITE.root("copy") else {
        return;
    };
    let key = keygen(&s);
    start(&mut s, Some(&key));
    let mut api = Api::open(&s, FrontFlags::default());
    let (a, b) = (api::tenant_id("a"), api::tenant_id("b"));
    create_tenant(&mut api, &a);
    create_tenant(&mut api, &b);
    drop(api);
    let value = format!("moved-{}", unique());
    assert_eq!(set(&s, &a, "STRIPE_KEY", &value).code, 0, "{}", s.log());
    let f = s.run(&["drain", "--grace", "1s"]);
    assert_eq!(f.code, 0, "{}", f.stderr_text());
    s.wait_gone();
    let dir = s.st.join("api/secrets");
    let orig = fs::read_to_string(dir.join(format!("{a}.STRIPE_KEY.json"))).expect("record");
    let to_b = orig.replace(&format!("\"{a}\""), &format!("\"{b}\""));
    assert_ne!(to_b, orig);
    fs::write(dir.join(format!("{b}.STRIPE_KEY.json")), &to_b).expect("copy to b");
    let renamed = orig.replace("\"STRIPE_KEY\"", "\"OTHER_KEY\"");
    fs::write(dir.join(format!("{a}.OTHER_KEY.json")), &renamed).expect("copy to a name");
    s.supervisor = None;
    start(&mut s, Some(&key));
    let log = fs::read_to_string(s.log_path()).unwrap_or_default();
    assert!(
        log.contains(&format!("secret STRIPE_KEY of tenant {b} cannot be opened")),
        "{log}"
    );
    assert!(
        log.contains(&format!("secret OTHER_KEY of tenant {a} cannot be opened")),
        "{log}"
    );
    assert!(
        !log.contains(&format!("secret STRIPE_KEY of tenant {a} cannot be opened")),
        "the original opens: {log}"
    );
    // Under another key, the original does not open either.
    let f = s.run(&["drain", "--grace", "1s"]);
    assert_eq!(f.code, 0, "{}", f.stderr_text());
    s.wait_gone();
    s.supervisor = None;
    let other = keygen(&s);
    start(&mut s, Some(&other));
    let log = fs::read_to_string(s.log_path()).unwrap_or_default();
    assert!(
        log.contains(&format!("secret STRIPE_KEY of tenant {a} cannot be opened")),
        "{log}"
    );
    assert_nowhere(&s, &[&value], &[]);
    s.shutdown();
}

/// A function's secret from the shell: refused to serve without a value, then read by each
/// request as `/run/secrets/<name>` (0400, its own uid, a read-only tmpfs of its own), and
/// gone when the request ends. No value reaches any log or answer.
fn a_function_reads_its_secret_in_its_request_only(who: Who) {
    let mut s = SUITE.sup(who, "fn");
    let key = keygen(&s);
    s.env("ZYGO_API_TOKEN", BOOT);
    s.env("ZYGO_SECRETS_KEY", &key);
    let (file, names) = s.write_toml(&[(
        "reader",
        "read",
        "secrets = [\"API_KEY\", \"OTHER\"]\nmax_warm = 2\n",
    )]);
    let name = names[0].clone();
    let file = file.to_str().expect("UTF-8").to_string();
    // `zygo up` serves nothing with a value missing? A host function's values may come
    // from the calling tenant, so it serves; a call without them is refused before
    // anything runs, naming the secret.
    let f = s.run(&["up", "-f", &file]);
    s.find_supervisor();
    assert_eq!(f.code, 0, "up: {}\n{}", f.stderr_text(), s.log());
    let (v, f) = s.exec(&name, Some(r#"{"names": ["API_KEY"]}"#), &["--json"]);
    s.assert_refused(&v, &f, "missing_secret");
    assert!(text(&v, "error").contains("API_KEY"), "{v}");
    // A --secret the function does not list, or a bad one, is refused, without its value.
    let f = s.run(&[
        "serve",
        &name,
        "-f",
        &file,
        "--secret",
        "NOPE=zz-not-listed",
        "--json",
    ]);
    assert_ne!(f.code, 0);
    assert!(f.stdout_text().contains("NOPE") && !f.stdout_text().contains("zz-not-listed"));
    let value = format!("shell-value-{}", unique());
    let other = format!("from-env-{}", unique());
    let arg = format!("API_KEY={value}");
    let mut c = s.cmd(&[
        "serve", &name, "-f", &file, "--secret", &arg, "--secret", "OTHER", "--json",
    ]);
    c.env("OTHER", &other);
    let f = finish(c);
    assert_eq!(
        f.code,
        0,
        "serve --secret: {}{}\n{}",
        f.stdout_text(),
        f.stderr_text(),
        s.log()
    );
    let mut said = vec![f.stdout_text() + &f.stderr_text()];
    for _ in 0..2 {
        let (v, f) = s.exec(
            &name,
            Some(r#"{"names": ["API_KEY", "OTHER"]}"#),
            &["--json"],
        );
        s.assert_ok(&v, &f, "read the secrets");
        check_seen(&v["result"]["API_KEY"], &value, &["API_KEY", "OTHER"]);
        check_seen(&v["result"]["OTHER"], &other, &["API_KEY", "OTHER"]);
        said.push(f.stdout_text() + &f.stderr_text());
    }
    // While a request holds, its process has the mount; once it is over, nothing has.
    let bg = s.exec_bg(&name, r#"{"names": ["API_KEY"], "hold": 3}"#, &["--json"]);
    s.wait_in_flight(&name, 1);
    wait_for(
        Duration::from_secs(10),
        "the request's /run/secrets",
        || !with_secrets_mounted(&name).is_empty(),
    );
    let f = bg.join().expect("the held call");
    assert_eq!(f.code, 0, "{}", f.stdout_text());
    wait_for(
        Duration::from_secs(10),
        "/run/secrets gone with the request",
        || with_secrets_mounted(&name).is_empty(),
    );
    assert_nowhere(&s, &[&value, &other], &said);
    // Nothing the supervisor started (its launchers) has the key in its environment, and
    // neither has the supervisor any more.
    let holders = pids_holding(&s.log_path());
    assert!(
        holders.len() >= 2,
        "the supervisor and a launcher: {holders:?}"
    );
    for (pid, cmd) in holders {
        let env = fs::read(format!("/proc/{pid}/environ")).unwrap_or_default();
        assert!(
            !contains(&env, key.as_bytes()),
            "{} has the key in its environment",
            String::from_utf8_lossy(&cmd)
        );
    }
    s.shutdown();
}

root_and_rootless!(a_function_reads_its_secret_in_its_request_only);

fn pool_call(tenant_token: &str, pool: &str, hold: u32) -> Request {
    let _ = tenant_token;
    Request::Exec(ExecRequest {
        name: pool.into(),
        event: format!(r#"{{"names": ["API_KEY"], "hold": {hold}}}"#),
        key: None,
        timeout_ms: None,
        stream: false,
        script: Some(ScriptRef::Source(LOOK.as_bytes().to_vec())),
        workspace: None,
        workspace_blob: None,
        out: false,
    })
}

fn exec_answer(r: Reply, what: &str) -> proto::front::ExecAnswer {
    match r {
        Reply::Answer(a) => a,
        other => panic!("{what}: {other:?}"),
    }
}

/// A pool names secrets; two tenants calling it at once each read their own value only,
/// each call in a zygote of its own (the pool grows); at max_warm the second is busy; a
/// tenant without the secret (or a call for no tenant) is refused with missing_secret
/// naming it; a shell value for a pool is refused.
fn two_tenants_share_a_pool_and_read_their_own(who: Who) {
    let mut s = SUITE.sup(who, "pool");
    let key = keygen(&s);
    start(&mut s, Some(&key));
    let op = api::mint(&s, None).1;
    let mut api = Api::open(&s, FrontFlags::default());
    let (a, b, c) = (
        api::tenant_id("a"),
        api::tenant_id("b"),
        api::tenant_id("c"),
    );
    for t in [&a, &b, &c] {
        create_tenant(&mut api, t);
    }
    let (va, vb) = (
        format!("a-value-{}", unique()),
        format!("b-value-{}", unique()),
    );
    assert_eq!(set(&s, &a, "API_KEY", &va).code, 0);
    assert_eq!(set(&s, &b, "API_KEY", &vb).code, 0);
    let pool = format!("sp{:x}", unique() & 0xff_ffff);
    let small = format!("{pool}1");
    for (n, max) in [(&pool, 4), (&small, 1)] {
        let r = api.ask(
            &op,
            None,
            Request::ServeLayer {
                name: n.clone(),
                kind: ServeKind::Pool,
                layer: zygo_tests::api::layer(&format!(
                    r#"{{"agent":"python","mem":"64M","secrets":["API_KEY"],"max_warm":{max},"min_warm":1}}"#
                )),
                base_dir: None,
            },
        );
        assert!(
            matches!(r, Reply::ServedOne { .. }),
            "serve {n}: {r:?}\n{}",
            s.log()
        );
    }
    let ta = api::mint(&s, Some(&a)).1;
    let tb = api::mint(&s, Some(&b)).1;
    let tc = api::mint(&s, Some(&c)).1;
    // At once: each its own value.
    let mut threads = Vec::new();
    for (tok, v) in [(ta.clone(), va.clone()), (tb.clone(), vb.clone())] {
        let sock = s.socket();
        let pool = pool.clone();
        threads.push(std::thread::spawn(move || {
            let mut api = Api::connect(&sock, FrontFlags::default()).expect("an API connection");
            let r = api.ask(&tok, None, pool_call(&tok, &pool, 2));
            (r, v)
        }));
    }
    for t in threads {
        let (r, v) = t.join().expect("a tenant's call");
        let a = exec_answer(r, "a tenant's pool call");
        assert_eq!(a.outcome, Outcome::Ok, "{a:?}");
        let seen: serde_json::Value =
            serde_json::from_str(a.result.as_deref().expect("result")).expect("JSON");
        check_seen(&seen["API_KEY"], &v, &["API_KEY"]);
    }
    // Each had a zygote to itself: the pool grew.
    let r = api.ask(&op, None, Request::List);
    let Reply::Functions(fs_) = r else {
        panic!("{r:?}")
    };
    let info = fs_
        .iter()
        .find(|f| f.name == pool)
        .expect("the pool is listed");
    let z = &info.zygotes;
    assert!(
        z.ready + z.busy + z.frozen + z.starting >= 2,
        "two calls at once with secrets ran in two zygotes: {info:?}"
    );
    // At max_warm, a second call while one with secrets runs is busy.
    let sock = s.socket();
    let (small2, ta2) = (small.clone(), ta.clone());
    let held = std::thread::spawn(move || {
        let mut api = Api::connect(&sock, FrontFlags::default()).expect("an API connection");
        api.ask(&ta2, None, pool_call(&ta2, &small2, 3))
    });
    wait_for(Duration::from_secs(20), "the held call in flight", || {
        let r = api.ask(&op, None, Request::List);
        matches!(&r, Reply::Functions(v) if v.iter().any(|f| f.name == small && f.in_flight == 1))
    });
    let r = api.ask(&tb, None, pool_call(&tb, &small, 0));
    expect_code(
        &r,
        ErrorCode::Busy,
        "max_warm reached, the zygote held by a call with secrets",
    );
    let a_ = exec_answer(held.join().expect("held"), "the held call");
    assert_eq!(a_.outcome, Outcome::Ok, "{a_:?}");
    // A tenant with no value, and a call for no tenant: missing_secret, naming it.
    let r = api.ask(&tc, None, pool_call(&tc, &pool, 0));
    expect_code(&r, ErrorCode::MissingSecret, "a tenant without the secret");
    let Reply::Error { message, .. } = &r else {
        unreachable!()
    };
    assert!(message.contains("API_KEY"), "{message}");
    let r = api.ask(&op, None, pool_call(&op, &pool, 0));
    expect_code(&r, ErrorCode::MissingSecret, "a call for no tenant");
    let said = vec![format!("{r:?}")];
    drop(api);
    assert_nowhere(&s, &[&va, &vb], &said);
    s.shutdown();
}

root_and_rootless!(two_tenants_share_a_pool_and_read_their_own);

/// In a pool naming secrets (max_warm 4, the default), each call has a zygote to itself:
/// tenant a's four calls at once (its token only) run two (its share: half the pool's
/// zygotes) and are busy for the other two, saying it is this tenant's share; tenant b's
/// call, made meanwhile, is served. (a's four calls held every zygote, and b was busy.)
fn one_tenant_holds_at_most_its_share_of_a_pool_with_secrets(who: Who) {
    let mut s = SUITE.sup(who, "share");
    let key = keygen(&s);
    start(&mut s, Some(&key));
    let op = api::mint(&s, None).1;
    let mut api = Api::open(&s, FrontFlags::default());
    let (a, b) = (api::tenant_id("a"), api::tenant_id("b"));
    for t in [&a, &b] {
        create_tenant(&mut api, t);
        assert_eq!(set(&s, t, "API_KEY", &format!("{t}-value")).code, 0);
    }
    let pool = format!("ss{:x}", unique() & 0xff_ffff);
    let r = api.ask(
        &op,
        None,
        Request::ServeLayer {
            name: pool.clone(),
            kind: ServeKind::Pool,
            layer: api::layer(
                r#"{"agent":"python","mem":"64M","secrets":["API_KEY"],"min_warm":1}"#,
            ),
            base_dir: None,
        },
    );
    assert!(
        matches!(r, Reply::ServedOne { .. }),
        "serve {pool}: {r:?}\n{}",
        s.log()
    );
    let (ta, tb) = (api::mint(&s, Some(&a)).1, api::mint(&s, Some(&b)).1);
    let calls: Vec<_> = (0..4)
        .map(|_| {
            let (sock, ta, pool) = (s.socket(), ta.clone(), pool.clone());
            std::thread::spawn(move || {
                let mut api =
                    Api::connect(&sock, FrontFlags::default()).expect("an API connection");
                api.ask(&ta, None, pool_call(&ta, &pool, 6))
            })
        })
        .collect();
    std::thread::sleep(Duration::from_millis(2000));
    let r = api.ask(&tb, None, pool_call(&tb, &pool, 0));
    let b_ = exec_answer(r, "b's call beside a's four");
    assert_eq!(b_.outcome, Outcome::Ok, "{b_:?}");
    let (mut ran, mut busy) = (0, 0);
    for c in calls {
        match c.join().expect("a's call") {
            Reply::Answer(x) if x.outcome == Outcome::Ok => ran += 1,
            Reply::Error {
                code: ErrorCode::Busy,
                message,
                ..
            } => {
                assert!(message.contains("share"), "{message}");
                busy += 1;
            }
            other => panic!("a's call: {other:?}"),
        }
    }
    assert_eq!((ran, busy), (2, 2), "a's four calls with secrets");
    drop(api);
    s.shutdown();
}

root_and_rootless!(one_tenant_holds_at_most_its_share_of_a_pool_with_secrets);

/// A pool script: with `leave`, it listens on a loopback port, leaves a process of its own
/// holding that listener running, and returns; without, it tries to connect to that port.
/// Both say which network namespace they ran in.
const LEAVE_BEHIND: &str = r#"import os, socket, time
def handler(event):
    net = os.readlink("/proc/self/ns/net")
    port = event["port"]
    if event["leave"]:
        s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        s.bind(("127.0.0.1", port))
        s.listen(8)
        if os.fork() == 0:
            time.sleep(60)
            os._exit(0)
        s.close()
        return {"net": net}
    c = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    c.settimeout(2)
    try:
        c.connect(("127.0.0.1", port))
        reached = "connected"
    except OSError as e:
        reached = type(e).__name__
    return {"net": net, "reached": reached}
"#;

/// A call with secrets has its zygote to itself until what it left running has gone, not
/// only until it is answered: in a pool naming secrets (max_warm 1), a call that leaves a
/// loopback listener running and returns is followed at once by another call of the same
/// tenant, which runs in that zygote only once the first one's leftover is gone.
fn a_call_with_secrets_is_alone_until_what_it_left_has_gone(who: Who) {
    let mut s = SUITE.sup(who, "alone");
    let key = keygen(&s);
    start(&mut s, Some(&key));
    let op = api::mint(&s, None).1;
    let mut api = Api::open(&s, FrontFlags::default());
    let a = api::tenant_id("a");
    create_tenant(&mut api, &a);
    assert_eq!(set(&s, &a, "API_KEY", "a-value").code, 0);
    let pool = format!("sl{:x}", unique() & 0xff_ffff);
    let r = api.ask(
        &op,
        None,
        Request::ServeLayer {
            name: pool.clone(),
            kind: ServeKind::Pool,
            layer: zygo_tests::api::layer(
                r#"{"agent":"python","mem":"64M","secrets":["API_KEY"],"max_warm":1,"min_warm":1}"#,
            ),
            base_dir: None,
        },
    );
    assert!(
        matches!(r, Reply::ServedOne { .. }),
        "serve {pool}: {r:?}\n{}",
        s.log()
    );
    let ta = api::mint(&s, Some(&a)).1;
    let port = 20000 + (unique() % 20000) as u16;
    let call = |api: &mut Api, leave: bool| {
        let r = api.ask(
            &ta,
            None,
            Request::Exec(ExecRequest {
                name: pool.clone(),
                event: format!(r#"{{"port": {port}, "leave": {leave}}}"#),
                key: None,
                timeout_ms: None,
                stream: false,
                script: Some(ScriptRef::Source(LEAVE_BEHIND.as_bytes().to_vec())),
                workspace: None,
                workspace_blob: None,
                out: false,
            }),
        );
        let a = exec_answer(r, "a call");
        assert_eq!(a.outcome, Outcome::Ok, "{a:?}");
        serde_json::from_str::<serde_json::Value>(a.result.as_deref().expect("result"))
            .expect("JSON")
    };
    for round in 0..3 {
        let first = call(&mut api, true);
        let second = call(&mut api, false);
        assert_eq!(
            first["net"], second["net"],
            "round {round}: with max_warm 1 both run in the one zygote, or this proves nothing"
        );
        assert_ne!(
            second["reached"], "connected",
            "round {round}: the second call reached what the first left running: {second}"
        );
    }
    drop(api);
    s.shutdown();
}

root_and_rootless!(a_call_with_secrets_is_alone_until_what_it_left_has_gone);

/// A pool naming secrets on a host with no key is refused when it is served.
#[test]
fn a_pool_with_secrets_on_a_keyless_host_is_refused() {
    let Some(mut s) = SUITE.root("keyless") else {
        return;
    };
    start(&mut s, None);
    let op = api::mint(&s, None).1;
    let mut api = Api::open(&s, FrontFlags::default());
    let r = api.ask(
        &op,
        None,
        Request::ServeLayer {
            name: "kp".into(),
            kind: ServeKind::Pool,
            layer: zygo_tests::api::layer(
                r#"{"agent":"python","mem":"64M","secrets":["API_KEY"]}"#,
            ),
            base_dir: None,
        },
    );
    expect_code(&r, ErrorCode::BadSpec, "a pool with secrets, no key");
    let Reply::Error { message, .. } = &r else {
        unreachable!()
    };
    assert!(message.contains("ZYGO_SECRETS_KEY"), "{message}");
    // Without secrets it serves.
    let r = api.ask(
        &op,
        None,
        Request::ServeLayer {
            name: "kp".into(),
            kind: ServeKind::Pool,
            layer: zygo_tests::api::layer(r#"{"agent":"python","mem":"64M"}"#),
            base_dir: None,
        },
    );
    assert!(matches!(r, Reply::ServedOne { .. }), "{r:?}");
    drop(api);
    s.shutdown();
}

/// The shell wins: a host function served with --secret API_KEY=…, called by a tenant that
/// stored its own API_KEY and OTHER, reads the shell's API_KEY and its own OTHER.
#[test]
fn the_shell_wins_over_the_store() {
    let Some(mut s) = SUITE.root("shell") else {
        return;
    };
    let key = keygen(&s);
    start(&mut s, Some(&key));
    let mut api = Api::open(&s, FrontFlags::default());
    let t = api::tenant_id("t");
    create_tenant(&mut api, &t);
    let (shell, stored, other) = (
        format!("shell-{}", unique()),
        format!("stored-{}", unique()),
        format!("other-{}", unique()),
    );
    assert_eq!(set(&s, &t, "API_KEY", &stored).code, 0);
    assert_eq!(set(&s, &t, "OTHER", &other).code, 0);
    let (file, names) = s.write_toml(&[("sh", "read", "secrets = [\"API_KEY\", \"OTHER\"]\n")]);
    let name = names[0].clone();
    let arg = format!("API_KEY={shell}");
    let f = s.run(&[
        "serve",
        &name,
        "-f",
        file.to_str().expect("UTF-8"),
        "--secret",
        &arg,
    ]);
    assert_eq!(f.code, 0, "{}{}", f.stdout_text(), f.stderr_text());
    let tt = api::mint(&s, Some(&t)).1;
    let r = api.ask(
        &tt,
        None,
        Request::Exec(ExecRequest {
            name: name.clone(),
            event: r#"{"names": ["API_KEY", "OTHER"]}"#.into(),
            key: None,
            timeout_ms: None,
            stream: false,
            script: None,
            workspace: None,
            workspace_blob: None,
            out: false,
        }),
    );
    let a = exec_answer(r, "the tenant's call");
    assert_eq!(a.outcome, Outcome::Ok, "{a:?}");
    let seen: serde_json::Value =
        serde_json::from_str(a.result.as_deref().expect("result")).expect("JSON");
    check_seen(&seen["API_KEY"], &shell, &["API_KEY", "OTHER"]);
    check_seen(&seen["OTHER"], &other, &["API_KEY", "OTHER"]);
    // From the CLI (no tenant), OTHER has no value: refused before anything runs.
    let (v, f) = s.exec(&name, Some(r#"{"names": ["API_KEY"]}"#), &["--json"]);
    s.assert_refused(&v, &f, "missing_secret");
    assert!(text(&v, "error").contains("OTHER"), "{v}");
    drop(api);
    assert_nowhere(&s, &[&shell, &stored, &other], &[]);
    s.shutdown();
}

/// A pseudo-terminal pair: (master, the slave's path).
fn open_pty() -> (fs::File, String) {
    use std::os::fd::FromRawFd;
    // SAFETY: posix_openpt returns a new descriptor or -1.
    let fd = unsafe { libc::posix_openpt(libc::O_RDWR | libc::O_NOCTTY | libc::O_CLOEXEC) };
    assert!(fd >= 0, "posix_openpt: {}", std::io::Error::last_os_error());
    // SAFETY: the descriptor was just returned to us and is owned by this File from here.
    let master = unsafe { fs::File::from_raw_fd(fd) };
    let mut name = [0 as libc::c_char; 128];
    // SAFETY: grantpt/unlockpt on our master; ptsname_r into a buffer of the given size.
    unsafe {
        assert_eq!(libc::grantpt(fd), 0, "grantpt");
        assert_eq!(libc::unlockpt(fd), 0, "unlockpt");
        assert_eq!(
            libc::ptsname_r(fd, name.as_mut_ptr(), name.len()),
            0,
            "ptsname_r"
        );
    }
    // SAFETY: ptsname_r wrote a NUL-terminated string into `name`.
    let path = unsafe { std::ffi::CStr::from_ptr(name.as_ptr()) }
        .to_string_lossy()
        .into_owned();
    (master, path)
}

/// Whether the terminal behind `f` echoes what is typed.
fn echoes(f: &fs::File) -> bool {
    use std::os::fd::AsRawFd;
    // SAFETY: termios is plain old data; tcgetattr fills it for a terminal descriptor.
    let mut t: libc::termios = unsafe { std::mem::zeroed() };
    // SAFETY: tcgetattr on a descriptor we own, into a termios we own.
    let r = unsafe { libc::tcgetattr(f.as_raw_fd(), &mut t) };
    assert_eq!(r, 0, "tcgetattr");
    t.c_lflag & libc::ECHO != 0
}

/// `zygo secrets set` at a terminal: it prompts on the terminal, turns echo off while the
/// value is typed (what is typed never comes back on the terminal), puts the terminal's
/// settings back afterwards, and stores the value it read.
#[test]
fn a_value_typed_at_a_terminal_is_not_echoed() {
    use std::io::Read;
    let Some(mut s) = SUITE.root("tty") else {
        return;
    };
    let key = keygen(&s);
    start(&mut s, Some(&key));
    let mut api = Api::open(&s, FrontFlags::default());
    let t = api::tenant_id("tty");
    create_tenant(&mut api, &t);
    drop(api);
    let (mut master, slave_path) = open_pty();
    let slave = fs::OpenOptions::new()
        .read(true)
        .write(true)
        .open(&slave_path)
        .expect("open the terminal's slave");
    assert!(echoes(&slave), "a new terminal echoes");
    let mut c = s.cmd(&["secrets", "set", &t, "TYPED_KEY"]);
    c.stdin(slave.try_clone().expect("dup"))
        .stdout(slave.try_clone().expect("dup"))
        .stderr(slave.try_clone().expect("dup"));
    let mut child = c.spawn().expect("spawn zygo secrets set");
    // Everything the terminal shows, read on a thread (the master must be read for the
    // child's writes to go through) and passed on as it comes.
    let mut reader = master.try_clone().expect("dup the master");
    let (tx, chunks) = std::sync::mpsc::channel::<Vec<u8>>();
    std::thread::spawn(move || {
        let mut buf = [0u8; 4096];
        // Reading the master ends with EIO once every slave descriptor is closed.
        while let Ok(n) = reader.read(&mut buf) {
            if n == 0 || tx.send(buf[..n].to_vec()).is_err() {
                break;
            }
        }
    });
    let mut shown = Vec::new();
    let until = |shown: &mut Vec<u8>, what: &[u8]| {
        while !contains(shown, what) {
            match chunks.recv_timeout(slow(Duration::from_secs(20))) {
                Ok(c) => shown.extend_from_slice(&c),
                Err(_) => panic!(
                    "{:?} never showed on the terminal: {:?}",
                    String::from_utf8_lossy(what),
                    String::from_utf8_lossy(shown)
                ),
            }
        }
    };
    // Type once the prompt is shown: it is written after echo is turned off.
    until(&mut shown, b"value of TYPED_KEY (not echoed): ");
    assert!(!echoes(&slave), "echo is on at the prompt");
    let value = format!("typed-{}", unique());
    master
        .write_all(format!("{value}\n").as_bytes())
        .expect("type the value");
    until(&mut shown, b"stored secret TYPED_KEY");
    let status = child.wait().expect("wait for zygo secrets set");
    assert!(status.success(), "zygo secrets set: {status}");
    assert!(echoes(&slave), "the terminal's echo was not put back");
    drop(c);
    drop(slave);
    let shown_text = String::from_utf8_lossy(&shown).into_owned();
    assert!(
        !shown_text.contains(&value),
        "the value was echoed: {shown_text:?}"
    );
    assert_eq!(ls(&s, &t), ["TYPED_KEY"]);
    assert_nowhere(&s, &[&value], &[shown_text]);
    s.shutdown();
}
