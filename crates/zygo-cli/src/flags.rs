//! What `zygo run` and `zygo mcp` parse alike: the one-shot sandbox flags.

use std::ffi::OsString;

use policy::plan::OneShotArgs;

/// A flag's value as UTF-8, or an error naming the flag.
pub fn text(v: OsString, flag: &str) -> Result<String, String> {
    v.into_string()
        .map_err(|v| format!("--{flag}: {v:?} is not valid UTF-8"))
}

/// Store the value of `--mem`, `--cpu`, `--pids`, `--timeout`, `--scratch`, `--io-bps`,
/// `--io-iops`, `--net` or
/// `--image` (each at most once), or add one of `--mount` or `--env` (any number).
pub fn set(args: &mut OneShotArgs, flag: &str, v: String) -> Result<(), String> {
    let slot = match flag {
        "mem" => &mut args.mem,
        "cpu" => &mut args.cpu,
        "pids" => &mut args.pids,
        "timeout" => &mut args.timeout,
        "scratch" => &mut args.scratch,
        "io-bps" => &mut args.io_bps,
        "io-iops" => &mut args.io_iops,
        "net" => &mut args.net,
        "image" => &mut args.image,
        "mount" => {
            args.mounts.push(v);
            return Ok(());
        }
        "env" => {
            args.env.push(v);
            return Ok(());
        }
        other => return Err(format!("--{other} is not a sandbox flag")),
    };
    if slot.is_some() {
        return Err(format!("--{flag} given twice"));
    }
    *slot = Some(v);
    Ok(())
}
