//! Files in and out over HTTP: `zygo api` in front of a real supervisor.
//!
//! - `PUT /blobs` stores a tar once (idempotent), owned by the tenant that sent it; a
//!   function call names it with `?workspace=sha256:…&out=1` and gets its directory back
//!   as base64 in the answer's `workspace`;
//! - a pool call carries an inline base64 tar (or a blob) in its body, with `"out": true`;
//! - another tenant naming the first one's blob gets 404, the same as an unknown digest;
//! - a hostile archive (a symlink, `..`) is 400 naming the entry and the rule, inline or
//!   by blob; broken base64 is 400;
//! - `DELETE /blobs/{digest}` is gated (a tenant token gets 403); deleting a tenant removes
//!   the blobs only it stored.

// A test that fails on an unexpected error says where; that is all an unwrap does here.
#![allow(clippy::unwrap_used)]

use std::collections::HashMap;
use std::io::Read;

use serde_json::{json, Value};
use zygo_tests::*;

static SUITE: Suite = Suite {
    prefix: "apifiles-",
    handlers: "import os\n\n\ndef convert(event):\n    data = open(\"in.txt\").read()\n    os.makedirs(\"result\", exist_ok=True)\n    with open(\"result/out.txt\", \"w\") as f:\n        f.write(data.upper())\n    return {\"listing\": sorted(os.listdir(\".\"))}\n",
    defaults: "timeout = \"20s\"\nmem = \"128M\"\nidle_timeout = \"60s\"\n",
    agents: false,
};

const BOOT: &str = "bootstrap-secret-for-api-files-tests";

use zygo_tests::api::start_http_front as start_api;

use zygo_tests::api::mint;
use zygo_tests::http::{req_within, Resp};

/// An answer of `status`, its body as JSON.
trait AssertStatus {
    fn assert(&self, status: u16, what: &str) -> Value;
}

impl AssertStatus for Resp {
    fn assert(&self, status: u16, what: &str) -> Value {
        assert_eq!(self.status, status, "{what}: {}", self.text());
        self.json()
    }
}

/// One request on its own connection, with no header but the token's.
fn req(addr: &str, method: &str, path: &str, token: Option<&str>, body: &[u8]) -> Resp {
    req_within(addr, method, path, token, &[], body, 60)
}

const B64: &[u8; 64] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";

fn b64(bytes: &[u8]) -> String {
    let mut out = String::new();
    for c in bytes.chunks(3) {
        let n = (c[0] as u32) << 16
            | (*c.get(1).unwrap_or(&0) as u32) << 8
            | *c.get(2).unwrap_or(&0) as u32;
        for i in 0..4 {
            out.push(if i <= c.len() {
                B64[(n >> (18 - 6 * i) & 63) as usize] as char
            } else {
                '='
            });
        }
    }
    out
}

fn unb64(text: &str) -> Vec<u8> {
    let mut bits = 0u32;
    let mut n = 0;
    let mut out = Vec::new();
    for c in text.bytes().filter(|&c| c != b'=') {
        let v = B64.iter().position(|&x| x == c).expect("base64") as u32;
        bits = bits << 6 | v;
        n += 6;
        if n >= 8 {
            n -= 8;
            out.push((bits >> n) as u8);
        }
    }
    out
}

/// A tar of these files, as `tar` writes one.
fn tar_of(files: &[(&str, &[u8])]) -> Vec<u8> {
    let mut b = tar::Builder::new(Vec::new());
    for (path, data) in files {
        let mut h = tar::Header::new_ustar();
        h.set_size(data.len() as u64);
        h.set_mode(0o644);
        h.set_entry_type(tar::EntryType::Regular);
        h.set_cksum();
        b.append_data(&mut h, path, *data).unwrap();
    }
    b.into_inner().unwrap()
}

/// A tar whose second entry is a symbolic link to /etc/passwd.
fn tar_with_symlink() -> Vec<u8> {
    let mut b = tar::Builder::new(Vec::new());
    let mut h = tar::Header::new_ustar();
    h.set_size(2);
    h.set_mode(0o644);
    h.set_cksum();
    b.append_data(&mut h, "in.txt", &b"ok"[..]).unwrap();
    let mut h = tar::Header::new_ustar();
    h.set_entry_type(tar::EntryType::Symlink);
    h.set_size(0);
    b.append_link(&mut h, "evil", "/etc/passwd").unwrap();
    b.into_inner().unwrap()
}

/// (path, bytes) of each regular file of a tar.
fn files_of(tar_bytes: &[u8]) -> HashMap<String, Vec<u8>> {
    let mut out = HashMap::new();
    for e in tar::Archive::new(tar_bytes).entries().unwrap() {
        let mut e = e.unwrap();
        if e.header().entry_type() != tar::EntryType::Regular {
            continue;
        }
        let path = String::from_utf8_lossy(&e.path_bytes()).into_owned();
        let mut data = Vec::new();
        e.read_to_end(&mut data).unwrap();
        out.insert(path, data);
    }
    out
}

#[test]
fn blobs_and_inline_workspaces_go_in_and_come_back_over_http() {
    if !root_only() {
        return;
    }
    let mut s = SUITE.sup(Who::Root, "files");
    s.env("ZYGO_API_TOKEN", BOOT);
    let n = s.up(&[("conv", "convert", "")]);
    let conv = &n[0];
    let f = start_api(&s, &["--allow-deploy"]);
    let a = &f.addr;
    let (ta, tb) = (s.name("ta"), s.name("tb"));
    for t in [&ta, &tb] {
        let r = req(
            a,
            "POST",
            "/tenants",
            Some(BOOT),
            json!({"id": t}).to_string().as_bytes(),
        );
        r.assert(200, "create a tenant");
    }
    let (ka, kb) = (mint(&s, Some(&ta)).1, mint(&s, Some(&tb)).1);

    // A blob, stored once by tenant A: the same bytes again say so.
    let tar = tar_of(&[("in.txt", b"hello blob\n")]);
    let v = req(a, "PUT", "/blobs", Some(&ka), &tar).assert(200, "PUT /blobs");
    let digest = v["sha256"].as_str().unwrap().to_string();
    assert!(digest.starts_with("sha256:") && digest.len() == 71, "{v}");
    assert_eq!(v["size"], tar.len());
    assert_eq!(v["existed"], false);
    let v = req(a, "PUT", "/blobs", Some(&ka), &tar).assert(200, "PUT /blobs again");
    assert_eq!(
        (v["sha256"].as_str(), v["existed"].as_bool()),
        (Some(digest.as_str()), Some(true))
    );

    // A function call names it; the directory comes back with out=1.
    let path = format!("/fn/{conv}?workspace={digest}&out=1");
    let v = req(a, "POST", &path, Some(&ka), b"{}").assert(200, "a call with a blob");
    assert_eq!(v["result"]["listing"], json!(["in.txt", "result"]), "{v}");
    assert_eq!(v["workspace_truncated"], false);
    let back = files_of(&unb64(v["workspace"].as_str().unwrap()));
    assert_eq!(
        back.get("result/out.txt").map(Vec::as_slice),
        Some(&b"HELLO BLOB\n"[..]),
        "{back:?}"
    );
    assert_eq!(
        back.get("in.txt").map(Vec::as_slice),
        Some(&b"hello blob\n"[..])
    );
    // Without out: nothing comes back.
    let path = format!("/fn/{conv}?workspace={digest}");
    let v = req(a, "POST", &path, Some(&ka), b"{}").assert(200, "a call without out");
    assert!(v.get("workspace").is_none(), "{v}");

    // Tenant B cannot name A's blob: the same 404 as a digest nobody stored.
    let mine = req(
        a,
        "POST",
        &format!("/fn/{conv}?workspace={digest}"),
        Some(&kb),
        b"{}",
    );
    let v = mine.assert(404, "another tenant's blob");
    assert_eq!(v["code"], "not_found");
    let unknown = format!("sha256:{}", "0".repeat(64));
    let other = req(
        a,
        "POST",
        &format!("/fn/{conv}?workspace={unknown}"),
        Some(&kb),
        b"{}",
    );
    let w = other.assert(404, "an unknown blob");
    assert_eq!(
        v["error"].as_str().unwrap().replace(&digest[7..], "D"),
        w["error"].as_str().unwrap().replace(&"0".repeat(64), "D"),
        "the two refusals say the same"
    );
    // An inline tar in a function's query is refused: a blob digest only.
    let r = req(
        a,
        "POST",
        &format!("/fn/{conv}?workspace={}", b64(&tar)),
        Some(&ka),
        b"{}",
    );
    let v = r.assert(400, "an inline tar in the query");
    assert!(v["error"].as_str().unwrap().contains("blob digest"), "{v}");

    // A pool: an inline tar in the body, and the directory back.
    let pool = s.name("pool");
    let base = s.dir.path.display().to_string();
    let body = json!({"name": pool, "layer": {"agent": "python"}, "base_dir": base});
    req(
        a,
        "POST",
        "/runtimes",
        Some(BOOT),
        body.to_string().as_bytes(),
    )
    .assert(200, "a pool");
    let script = "import os\ndef handler(event):\n    d = open('in.txt').read()\n    open('back.txt', 'w').write(d[::-1])\n    return sorted(os.listdir('.'))\n";
    let inline = tar_of(&[("in.txt", b"abc")]);
    let call = format!("/runtimes/{pool}/call");
    let body = json!({"source": script, "event": null, "workspace": {"inline": b64(&inline)}, "out": true});
    let v = req(a, "POST", &call, Some(&ka), body.to_string().as_bytes())
        .assert(200, "an inline workspace");
    assert_eq!(
        v["result"],
        json!(["back.txt", "in.txt"]),
        "{}",
        v["result"]
    );
    let back = files_of(&unb64(v["workspace"].as_str().unwrap()));
    assert_eq!(
        back.get("back.txt").map(Vec::as_slice),
        Some(&b"cba"[..]),
        "{back:?}"
    );
    // The same pool with A's blob; B's attempt at it is 404.
    let body = json!({"source": script, "workspace": {"blob": digest}, "out": true});
    let v = req(a, "POST", &call, Some(&ka), body.to_string().as_bytes())
        .assert(200, "a pool call with a blob");
    let back = files_of(&unb64(v["workspace"].as_str().unwrap()));
    assert_eq!(
        back.get("back.txt").map(Vec::as_slice),
        Some(&b"\nbolb olleh"[..])
    );
    req(a, "POST", &call, Some(&kb), body.to_string().as_bytes())
        .assert(404, "B names A's blob in a pool call");

    // Hostile archives: refused before anything runs, naming the entry and the rule.
    let evil = tar_with_symlink();
    let body = json!({"source": script, "workspace": {"inline": b64(&evil)}});
    let v = req(a, "POST", &call, Some(&ka), body.to_string().as_bytes())
        .assert(400, "a symlink inline");
    let e = v["error"].as_str().unwrap();
    assert!(e.contains("evil") && e.contains("symbolic link"), "{v}");
    let dotdot = {
        let mut t = tar_of(&[("xx/escape", b"x")]);
        t[..9].copy_from_slice(b"../escape");
        t[148..156].copy_from_slice(b"        ");
        let sum: u32 = t[..512].iter().map(|&b| b as u32).sum();
        t[148..155].copy_from_slice(format!("{sum:06o}\0").as_bytes());
        t
    };
    let v = req(a, "PUT", "/blobs", Some(&ka), &dotdot).assert(200, "a hostile blob is only bytes");
    let bad = v["sha256"].as_str().unwrap().to_string();
    let r = req(
        a,
        "POST",
        &format!("/fn/{conv}?workspace={bad}"),
        Some(&ka),
        b"{}",
    );
    let v = r.assert(400, "a `..` entry by blob");
    assert!(v["error"].as_str().unwrap().contains(".."), "{v}");
    // Broken base64 and a workspace of the wrong shape.
    for (ws, what) in [
        (json!({"inline": "Zm9v\n"}), "whitespace"),
        (json!({"inline": "Zm9"}), "unpadded"),
        (json!({"inline": "Zm-v"}), "url-safe alphabet"),
        (json!("sha256:aa"), "a bare string"),
        (json!({"inline": "Zm9v", "blob": digest}), "both"),
    ] {
        let body = json!({"source": script, "workspace": ws});
        req(a, "POST", &call, Some(&ka), body.to_string().as_bytes()).assert(400, what);
    }

    // DELETE is gated: a tenant token may not; the operator may, and then it is gone.
    let path = format!("/blobs/{digest}");
    let v = req(a, "DELETE", &path, Some(&ka), b"").assert(403, "a tenant deletes a blob");
    assert_eq!(v["code"], "forbidden");
    let v = req(a, "DELETE", &path, Some(BOOT), b"").assert(200, "the operator deletes it");
    assert_eq!(v["deleted"], digest);
    req(a, "DELETE", &path, Some(BOOT), b"").assert(404, "deleted twice");
    req(
        a,
        "POST",
        &format!("/fn/{conv}?workspace={digest}"),
        Some(&ka),
        b"{}",
    )
    .assert(404, "a deleted blob");

    // Deleting a tenant removes the blobs only it stored; one another tenant also stored stays.
    let only_a = tar_of(&[("in.txt", b"only a")]);
    let shared = tar_of(&[("in.txt", b"shared")]);
    let da = req(a, "PUT", "/blobs", Some(&ka), &only_a).assert(200, "A's own")["sha256"].clone();
    let ds =
        req(a, "PUT", "/blobs", Some(&ka), &shared).assert(200, "shared by A")["sha256"].clone();
    // The same bytes from B are new to B, whoever else holds them.
    let v = req(a, "PUT", "/blobs", Some(&kb), &shared).assert(200, "shared by B");
    assert_eq!(v["existed"], false, "{v}");
    req(a, "DELETE", &format!("/tenants/{ta}"), Some(BOOT), b"").assert(200, "delete tenant A");
    let call_with = |d: &Value, key: &str| {
        req(
            a,
            "POST",
            &format!("/fn/{conv}?workspace={}", d.as_str().unwrap()),
            Some(key),
            b"{}",
        )
    };
    call_with(&da, BOOT).assert(404, "A's own blob went with it");
    let v = call_with(&ds, &kb).assert(200, "the shared blob stays B's");
    assert!(v["result"]["listing"].as_array().is_some(), "{v}");
    let st = s.st.join("blobs");
    assert!(
        !st.join(&da.as_str().unwrap()[7..]).exists()
            && st.join(&ds.as_str().unwrap()[7..]).exists()
    );
    drop(f);
    s.shutdown();
}
