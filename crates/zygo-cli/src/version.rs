//! `zygo version`: the build, and which layers of the boundary this host provides.

use std::ffi::OsString;

use plumbing::kernel::{self, Provided};

use crate::output::clean;
use crate::{usage, usage_refusal};

pub fn main(args: Vec<OsString>) -> i32 {
    let asked = crate::asks_json(&args, &[], false);
    let mut json = false;
    let mut p = lexopt::Parser::from_args(args);
    loop {
        match p.next() {
            Ok(Some(lexopt::Arg::Long("json"))) => json = true,
            Ok(Some(lexopt::Arg::Long("help") | lexopt::Arg::Short('h'))) => {
                say_raw!("{}", usage::VERSION);
                return 0;
            }
            Ok(Some(other)) => return usage_refusal(asked, "version", other.unexpected()),
            Ok(None) => break,
            Err(e) => return usage_refusal(asked, "version", e),
        }
    }
    let (cgroup, cgroup_root, cgroup_error) = match zygo_monitor::cgroup::Backend::detect() {
        Ok(b) => {
            b.release_root();
            (Some(b.name()), Some(b.root()), None)
        }
        Err(e) => (None, None, Some(e.to_string())),
    };
    let abi = zygo_launcher::harden::landlock_abi();
    // Whether a zygote's requests get uids of their own (root, with a subordinate range).
    let own_uids = zygo_monitor::identity::identity().is_ok_and(|i| i.request_ids.is_some());
    let protections = kernel::protections(u32::try_from(abi).unwrap_or(0), own_uids);
    if json {
        let list: Vec<serde_json::Value> = protections
            .iter()
            .map(|p| {
                let (by, note) = match &p.provided {
                    Provided::Landlock => ("landlock", None),
                    Provided::Fallback(how) => ("fallback", Some(how.to_string())),
                    Provided::Refused(why) => ("refused", Some(why.clone())),
                };
                serde_json::json!({
                    "key": p.key,
                    "what": p.what,
                    "landlock_abi_needed": p.abi,
                    "linux_needed": kernel::linux_for_abi(p.abi),
                    "provided_by": by,
                    "note": note,
                })
            })
            .collect();
        let v = serde_json::json!({
            "version": env!("CARGO_PKG_VERSION"),
            "api": 1,
            "backend": "ns",
            "cgroup": cgroup,
            "cgroup_root": cgroup_root,
            "cgroup_error": cgroup_error,
            "landlock_abi": abi,
            "protections": list,
            "seccomp": true,
            "egress": "relay",
            "egress_rules": "ipv4-address-and-name",
            "egress_filter_landlock_net": abi >= 4,
        });
        say!("{}", crate::output::json(&v));
    } else {
        say!("zygo {}", env!("CARGO_PKG_VERSION"));
        say!("backend:  namespaces (user, mount, pid, net, ipc, uts, cgroup)");
        match (cgroup, cgroup_root) {
            (Some(c), Some(root)) => say!("cgroup:   {c} ({})", clean(&root)),
            _ => say!(
                "cgroup:   unavailable — sandboxes will be refused: {}",
                clean(&cgroup_error.unwrap_or_default())
            ),
        }
        if abi > 0 {
            say!("landlock: ABI {abi}");
        } else {
            say!("landlock: not available on this kernel — sandboxes run without it (the mount namespace and read-only root still hold)");
        }
        for p in &protections {
            let how = match &p.provided {
                Provided::Landlock => format!("Landlock (ABI {})", p.abi),
                Provided::Fallback(how) => {
                    if (abi as u64) < u64::from(p.abi) {
                        format!(
                            "{how} (Landlock would need ABI {}, Linux {})",
                            p.abi,
                            kernel::linux_for_abi(p.abi)
                        )
                    } else {
                        how.to_string()
                    }
                }
                Provided::Refused(why) => why.clone(),
            };
            say!("  {}: {}", p.what, clean(&how));
        }
        say!("seccomp:  allowlist, installed last before exec");
        // Egress needs no /dev/net/tun, packet filter or user-mode stack: the same relay
        // runs as root and rootless (see zygo_egress).
        say!(
            "egress:   relay (IPv4 TCP to allow-listed addresses through a confined filter \
             outside the sandbox; root and rootless; rules by address, or by name with Zygo's \
             own resolver and TLS SNI / HTTP Host checked{})",
            if abi >= 4 {
                ""
            } else {
                "; the filter's Landlock port rules need ABI 4"
            }
        );
    }
    0
}
