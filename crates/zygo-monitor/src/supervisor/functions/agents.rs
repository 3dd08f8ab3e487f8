//! Which agent a zygote runs and the command line that starts it: every zygote's agent is
//! the Python agent (Node functions and pools too: their parked children exec a Node
//! spare). The launcher carries the agents' files and writes the ones named here into the
//! sandbox at /run/zygo.

use std::path::Path;

use policy::file::{Agent, FnKind, FnSpec};
use proto::launch::{AgentFile, BindMount, RequestIds};

/// Where the Python agent is in a zygote's sandbox.
const AGENT_SCRIPT: &str = AgentFile::PythonAgent.path();

/// How a function's agent is started: its argv, the mount of its entry's folder, and
/// the agent's files into the sandbox.
pub(super) type AgentLaunch = (Vec<String>, Option<BindMount>, Vec<AgentFile>);

/// The folder holding an entry file (bound at /fn) and the file's name in it.
fn entry_parts(file: &Path) -> Result<(String, String), String> {
    let dir = file
        .parent()
        .and_then(|d| d.to_str())
        .ok_or_else(|| format!("entry {} has no usable folder", file.display()))?;
    let name = file
        .file_name()
        .and_then(|n| n.to_str())
        .ok_or_else(|| format!("entry {} has no usable file name", file.display()))?;
    Ok((dir.to_string(), name.to_string()))
}

/// The Python agent and its bootstrap, written into every zygote's sandbox.
fn python_agent_files() -> Vec<AgentFile> {
    vec![AgentFile::PythonAgent, AgentFile::PythonBoot]
}

/// The Node spare, written next to it for Node functions and pools.
fn node_agent_file() -> AgentFile {
    AgentFile::NodeSpare
}

/// `python3 -I /run/zygo/python_boot.py /run/zygo/python_agent.py ARGS...`: every zygote's
/// agent, compiled in a throwaway fork so that the agent (and so every request's fork of
/// it) does not carry the compiler's leftover memory (python_boot.py says more).
fn agent_cmd<S: AsRef<str>>(args: &[S]) -> Vec<String> {
    let mut argv: Vec<String> = [
        "/usr/bin/python3",
        "-I",
        AgentFile::PythonBoot.path(),
        AGENT_SCRIPT,
    ]
    .iter()
    .map(|s| s.to_string())
    .collect();
    argv.extend(args.iter().map(|a| a.as_ref().to_string()));
    argv
}

/// The function's entry folder, mounted read-only at /fn.
fn entry_mount(dir: String) -> Option<BindMount> {
    Some(BindMount {
        src: dir,
        dst: "/fn".into(),
        rw: false,
        handed: false,
        fresh: false,
        owner: None,
    })
}

/// The agent's command line, the extra mounts for a function's entry and the files
/// injected. Where the sandbox maps a range of ids for requests (`request_ids`), each
/// request runs as a uid of its own (the launcher leaves the agent CAP_SETUID/CAP_SETGID
/// for that, see zygo_launcher::harden::Keep), never one the image's users have, never
/// twice: the agent is told the range.
pub(super) fn agent_argv(
    spec: &FnSpec,
    request_ids: Option<RequestIds>,
) -> Result<AgentLaunch, String> {
    let (mut argv, fn_mount, files) = agent_for(spec)?;
    if let Some(r) = request_ids {
        // The agent's first arguments, right after its own path.
        let at = argv
            .iter()
            .position(|a| a == AGENT_SCRIPT)
            .map_or(argv.len(), |i| i + 1);
        argv.insert(at, "--per-request-uids".into());
        argv.insert(at + 1, format!("{}:{}", r.first, r.count));
    }
    Ok((argv, fn_mount, files))
}

/// The agent's command line and the extra mounts for a function's entry.
fn agent_for(spec: &FnSpec) -> Result<AgentLaunch, String> {
    match &spec.kind {
        FnKind::Agent {
            agent: Agent::Python,
            entry: Some(entry),
        } => {
            let (dir, name) = entry_parts(&entry.file)?;
            let func = entry.func.clone().unwrap_or_else(|| "handler".into());
            Ok((
                agent_cmd(&[format!("/fn/{name}"), func]),
                entry_mount(dir),
                python_agent_files(),
            ))
        }
        FnKind::Agent {
            agent: Agent::Node,
            entry: Some(entry),
        } => {
            // Node cannot fork: the Python agent keeps the zygote, and each parked child
            // execs a Node spare that has imported the handler before its request arrives.
            let (dir, name) = entry_parts(&entry.file)?;
            Ok((
                agent_cmd(&[
                    "--node".into(),
                    format!("/fn/{name}"),
                    entry.func.clone().unwrap_or_default(),
                ]),
                entry_mount(dir),
                [python_agent_files(), vec![node_agent_file()]].concat(),
            ))
        }
        FnKind::Agent {
            agent: Agent::Python,
            entry: None,
        } => Ok((agent_cmd(&["--pool"]), None, python_agent_files())),
        // A Node runtime pool: each parked child execs a Node spare that waits for its
        // request and imports the script it names.
        FnKind::Agent {
            agent: Agent::Node,
            entry: None,
        } => Ok((
            agent_cmd(&["--node-pool"]),
            None,
            [python_agent_files(), vec![node_agent_file()]].concat(),
        )),
        // Warm-exec: the sandbox is held by the agent, and each call starts the command with
        // the script's path as its last argument and the event on stdin.
        FnKind::Cmd(cmd) => {
            let mut args = vec!["--exec".to_string()];
            args.extend(cmd.iter().cloned());
            Ok((agent_cmd(&args), None, python_agent_files()))
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn spec(table: &str) -> FnSpec {
        let text = format!("[fn.f]\n{table}");
        let file = policy::file::parse_sandbox_toml(&text, Path::new("/srv/app/sandbox.toml"))
            .expect("a valid sandbox.toml");
        file.functions.get("f").cloned().expect("[fn.f]")
    }

    #[test]
    fn a_python_function_imports_its_entry_from_its_folder_at_fn() {
        let (argv, mount, files) = agent_argv(
            &spec("agent = \"python\"\nentry = \"h/app.py:run\"\n"),
            None,
        )
        .expect("argv");
        assert_eq!(
            argv,
            [
                "/usr/bin/python3",
                "-I",
                "/run/zygo/python_boot.py",
                AGENT_SCRIPT,
                "/fn/app.py",
                "run"
            ]
        );
        let mount = mount.expect("the entry's folder");
        assert_eq!(
            (mount.src.as_str(), mount.dst.as_str()),
            ("/srv/app/h", "/fn")
        );
        assert!(!mount.rw);
        assert_eq!(files, [AgentFile::PythonAgent, AgentFile::PythonBoot]);
    }

    #[test]
    fn per_request_uids_are_the_agents_first_arguments() {
        let ids = RequestIds {
            first: 1000,
            count: 500,
        };
        let (argv, mount, files) =
            agent_argv(&spec("agent = \"node\"\n"), Some(ids)).expect("argv");
        assert_eq!(
            argv[3..],
            [
                AGENT_SCRIPT,
                "--per-request-uids",
                "1000:500",
                "--node-pool"
            ]
        );
        assert!(mount.is_none());
        assert!(files.contains(&AgentFile::NodeSpare));
    }

    #[test]
    fn a_command_pool_runs_its_command_through_the_agent() {
        let (argv, mount, _) =
            agent_argv(&spec("cmd = [\"/bin/sh\", \"-e\"]\n"), None).expect("argv");
        assert_eq!(argv[3..], [AGENT_SCRIPT, "--exec", "/bin/sh", "-e"]);
        assert!(mount.is_none());
    }
}
