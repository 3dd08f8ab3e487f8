//! What a caller without deploy rights may send as a dependency set's inputs.
//!
//! A resolver does what its input says: a `requirements.txt` line `-r /etc/passwd` makes
//! pip read that file (and quote it in its error), `--index-url file:///…` makes it read a
//! folder, and a lock file's `file:` or `link:` dependency makes npm copy a local path into
//! the set. The build runs in a sandbox that sees only its image and its own inputs, but
//! the image is the operator's to choose: so a caller without deploy rights builds only on
//! `host` (whose `/etc` is Zygo's own), and only from inputs that name packages on a
//! registry and nothing else. These checks are that rule; they read only the text they
//! are given.

/// Why an input is refused: the file, the line (1-based; 0 for the whole file) and what to
/// do instead.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Refused {
    pub file: &'static str,
    pub line: usize,
    pub why: String,
}

impl std::fmt::Display for Refused {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        if self.line > 0 {
            write!(f, "{} line {}: {}", self.file, self.line, self.why)
        } else {
            write!(f, "{}: {}", self.file, self.why)
        }
    }
}

/// The images a caller may build a set on: `host` always; a `dir:` image only with deploy
/// rights (its files are the host's, and a build reads what it names).
pub fn image_allowed(image: &str, deploy: bool) -> Result<(), String> {
    if image == "host" || deploy {
        return Ok(());
    }
    Err(format!(
        "a dependency set on the image {} needs deploy rights; without them a set is built \
         on \"host\"",
        crate::Shown::new(image)
    ))
}

/// A `requirements.txt` that names registry packages only: each requirement a name with
/// optional extras, version specifiers and environment markers, and `--hash` options; no
/// other option (`-r`, `-c`, `-e`, `--index-url`, ...), no URL, no path, no direct
/// reference (`name @ url`). Comments and blank lines are fine; a line may continue on
/// the next with a trailing backslash.
///
/// The text is read the way pip reads it, so that what is checked is what pip acts on:
/// lines end only at `\n` (or `\r\n`), since every other character Python counts as a
/// line break (`\r`, form feed, `\x1c`..., `\u2028`) is refused, as is any other control
/// or non-ASCII character; a trailing backslash joins a line to the next with nothing
/// between; a comment starts at a `#` at the start or after whitespace; and a line's
/// options start at its first space-separated word that begins with `-`, everything from
/// there on being read by a shell-like splitter, so quotes and backslashes are refused
/// there.
pub fn check_requirements(text: &str) -> Result<(), Refused> {
    const FILE: &str = "requirements.txt";
    let refuse = |line: usize, why: String| Refused {
        file: FILE,
        line,
        why,
    };
    let mut logical = String::new();
    let mut first = 0;
    for (i, raw) in text.split('\n').enumerate() {
        let raw = raw.strip_suffix('\r').unwrap_or(raw);
        if let Some(bad) = raw
            .chars()
            .find(|&c| !(c == '\t' || (' '..='~').contains(&c)))
        {
            return Err(refuse(
                i + 1,
                format!(
                    "has the character {bad:?}; a requirements file is printable ASCII, \
                     tabs and line ends"
                ),
            ));
        }
        if logical.is_empty() {
            first = i + 1;
        }
        if raw.ends_with('\\') && !is_comment_line(raw) {
            logical.push_str(raw.trim_matches('\\'));
            continue;
        }
        logical.push_str(raw);
        check_requirement(strip_comment(&logical)).map_err(|why| refuse(first, why))?;
        logical.clear();
    }
    if !logical.is_empty() {
        check_requirement(strip_comment(&logical)).map_err(|why| refuse(first, why))?;
    }
    Ok(())
}

/// Whether pip reads a line as a comment before joining continued lines (a `#` at its
/// start, after optional whitespace).
fn is_comment_line(line: &str) -> bool {
    line.trim_start_matches([' ', '\t']).starts_with('#')
}

/// A line without its comment: pip's comments start at a `#` that begins the line or
/// follows whitespace.
fn strip_comment(line: &str) -> &str {
    let b = line.as_bytes();
    for (i, &c) in b.iter().enumerate() {
        if c == b'#' && (i == 0 || b[i - 1].is_ascii_whitespace()) {
            return &line[..i];
        }
    }
    line
}

/// What pip takes for an archive to install from a file (`pip._internal.utils.filetypes`).
const ARCHIVE_ENDINGS: [&str; 12] = [
    ".zip",
    ".whl",
    ".tar.gz",
    ".tgz",
    ".tar",
    ".tar.bz2",
    ".tbz",
    ".tar.xz",
    ".txz",
    ".tlz",
    ".tar.lz",
    ".tar.lzma",
];

const ONLY_NAMES: &str = "a set built without deploy rights may name only packages on the \
    registries (name, extras, versions, markers and --hash)";

fn check_requirement(line: &str) -> Result<(), String> {
    let line = line.trim_matches([' ', '\t']);
    // pip's split: the words before the first space-separated word starting with '-' are
    // the requirement; the rest are options, split like a shell command line.
    let words: Vec<&str> = line.split(' ').collect();
    let options_at = words
        .iter()
        .position(|w| w.starts_with('-'))
        .unwrap_or(words.len());
    let options = words[options_at..].join(" ");
    if let Some(bad) = options.chars().find(|c| matches!(c, '"' | '\'' | '\\')) {
        return Err(format!(
            "the options {} have {bad:?}; {ONLY_NAMES}",
            crate::Shown::new(&options)
        ));
    }
    for word in options.split_whitespace() {
        check_hash_option(word)?;
    }
    let mut spec = String::new();
    for word in words[..options_at].join(" ").split_whitespace() {
        if word.starts_with('-') {
            return Err(format!(
                "the option {} is refused; {ONLY_NAMES}",
                crate::Shown::new(word)
            ));
        }
        spec.push_str(word);
        spec.push(' ');
    }
    let spec = spec.trim();
    if spec.is_empty() {
        if options_at < words.len() {
            return Err(format!("a line of options only is refused; {ONLY_NAMES}"));
        }
        return Ok(());
    }
    let name_end = spec
        .find(|c: char| !(c.is_ascii_alphanumeric() || matches!(c, '.' | '_' | '-')))
        .unwrap_or(spec.len());
    let name = &spec[..name_end];
    if name.is_empty() || !name.as_bytes()[0].is_ascii_alphanumeric() {
        return Err(format!(
            "{} does not start with a package name; {ONLY_NAMES}",
            crate::Shown::new(spec)
        ));
    }
    // pip reads a name that ends like an archive as a file in the folder it runs in, if
    // there is one of that name.
    let lower = name.to_ascii_lowercase();
    if let Some(ext) = ARCHIVE_ENDINGS.iter().find(|e| lower.ends_with(*e)) {
        return Err(format!(
            "{} ends in {ext}, which pip reads as a file to install; {ONLY_NAMES}",
            crate::Shown::new(name)
        ));
    }
    let allowed = |c: char| {
        c.is_ascii_alphanumeric()
            || matches!(
                c,
                ' ' | '.'
                    | '_'
                    | '-'
                    | '['
                    | ']'
                    | ','
                    | '<'
                    | '>'
                    | '='
                    | '!'
                    | '~'
                    | '*'
                    | '+'
                    | ';'
                    | '('
                    | ')'
                    | '"'
                    | '\''
            )
    };
    if let Some(bad) = spec.chars().find(|&c| !allowed(c)) {
        return Err(format!(
            "{} has {bad:?}, which a package name, version or marker never needs (a URL, a \
             path or a direct reference); {ONLY_NAMES}",
            crate::Shown::new(spec)
        ));
    }
    Ok(())
}

/// `--hash=ALGO:HEX`, the one option a requirement may carry.
fn check_hash_option(word: &str) -> Result<(), String> {
    let Some(hash) = word.strip_prefix("--hash=") else {
        return Err(format!(
            "the option {} is refused; {ONLY_NAMES}",
            crate::Shown::new(word)
        ));
    };
    let ok = hash.split_once(':').is_some_and(|(algo, hex)| {
        matches!(algo, "sha256" | "sha384" | "sha512")
            && !hex.is_empty()
            && hex.bytes().all(|b| b.is_ascii_hexdigit())
    });
    if ok {
        Ok(())
    } else {
        Err(format!(
            "{} is not a --hash=ALGO:HEX option",
            crate::Shown::new(word)
        ))
    }
}

/// A `package.json` and `package-lock.json` that name registry packages only: in the
/// manifest, every dependency a version range (no `file:`, `link:`, git, URL or
/// `user/repo` source) and no `workspaces`; in the lock, every package under
/// `node_modules/`, none a link, each `resolved` an `http(s)://` address and no version a
/// local or git source.
pub fn check_node(manifest: &str, lock: &str) -> Result<(), Refused> {
    use serde_json::Value;
    let whole = |file: &'static str, why: String| Refused { file, line: 0, why };
    let m: Value = serde_json::from_str(manifest)
        .map_err(|e| whole("package.json", format!("is not JSON: {e}")))?;
    let Value::Object(m) = m else {
        return Err(whole("package.json", "is not a JSON object".into()));
    };
    if m.contains_key("workspaces") {
        return Err(whole(
            "package.json",
            format!("\"workspaces\" names local packages; {NODE_ONLY}"),
        ));
    }
    for key in [
        "dependencies",
        "devDependencies",
        "optionalDependencies",
        "peerDependencies",
        "overrides",
    ] {
        let Some(deps) = m.get(key) else { continue };
        let Value::Object(deps) = deps else {
            return Err(whole("package.json", format!("{key:?} is not an object")));
        };
        for (name, range) in deps {
            let Value::String(range) = range else {
                return Err(whole(
                    "package.json",
                    format!(
                        "{key}.{} is not a version range; {NODE_ONLY}",
                        crate::Shown::new(name)
                    ),
                ));
            };
            if !is_range(range) {
                return Err(whole(
                    "package.json",
                    format!(
                        "{key}.{} is {}, not a version range; {NODE_ONLY}",
                        crate::Shown::new(name),
                        crate::Shown::new(range)
                    ),
                ));
            }
        }
    }
    let l: Value = serde_json::from_str(lock)
        .map_err(|e| whole("package-lock.json", format!("is not JSON: {e}")))?;
    let Value::Object(l) = l else {
        return Err(whole("package-lock.json", "is not a JSON object".into()));
    };
    if let Some(packages) = l.get("packages") {
        let Value::Object(packages) = packages else {
            return Err(whole(
                "package-lock.json",
                "\"packages\" is not an object".into(),
            ));
        };
        for (path, p) in packages {
            if !path.is_empty()
                && (!path.starts_with("node_modules/")
                    || path
                        .split('/')
                        .any(|seg| seg.is_empty() || seg == "." || seg == ".."))
            {
                return Err(whole(
                    "package-lock.json",
                    format!(
                        "the package {} is not under node_modules/; {NODE_ONLY}",
                        crate::Shown::new(path)
                    ),
                ));
            }
            check_lock_entry(path, p)?;
        }
    }
    // A lock of version 1 lists its packages under "dependencies", nested.
    let mut stack: Vec<&Value> = l.get("dependencies").into_iter().collect();
    while let Some(deps) = stack.pop() {
        let Value::Object(deps) = deps else {
            return Err(whole(
                "package-lock.json",
                "\"dependencies\" is not an object".into(),
            ));
        };
        for (name, p) in deps {
            check_lock_entry(name, p)?;
            if let Some(inner) = p.get("dependencies") {
                stack.push(inner);
            }
        }
    }
    Ok(())
}

const NODE_ONLY: &str = "a set built without deploy rights may name only packages on the \
    registries, by version";

fn check_lock_entry(path: &str, p: &serde_json::Value) -> Result<(), Refused> {
    use serde_json::Value;
    let refuse = |why: String| Refused {
        file: "package-lock.json",
        line: 0,
        why: format!("{}: {why}; {NODE_ONLY}", crate::Shown::new(path)),
    };
    let Value::Object(p) = p else {
        return Err(refuse("is not an object".into()));
    };
    if p.get("link").is_some_and(|v| v != &Value::Bool(false)) {
        return Err(refuse("is a link to a local folder".into()));
    }
    if let Some(r) = p.get("resolved") {
        let ok = r
            .as_str()
            .is_some_and(|r| r.starts_with("https://") || r.starts_with("http://"));
        if !ok {
            return Err(refuse(format!(
                "is resolved from {r}, not a registry address"
            )));
        }
    }
    if let Some(v) = p.get("version") {
        let ok = v
            .as_str()
            .is_some_and(|v| !v.contains(':') && !v.contains('/'));
        if !ok {
            return Err(refuse(format!("has the version {v}, not a version number")));
        }
    }
    for key in [
        "dependencies",
        "requires",
        "optionalDependencies",
        "peerDependencies",
    ] {
        // Version 1 nests whole entries under "dependencies"; "requires" maps names to
        // ranges. Ranges are checked; nested entries are checked by the caller.
        if let Some(Value::Object(m)) = p.get(key) {
            for (name, v) in m {
                if let Value::String(range) = v {
                    if !is_range(range) {
                        return Err(refuse(format!(
                            "{key}.{} is {}, not a version range",
                            crate::Shown::new(name),
                            crate::Shown::new(range)
                        )));
                    }
                }
            }
        }
    }
    Ok(())
}

/// Whether a dependency's value is a version range (or a dist-tag like `latest`): nothing
/// that names a place (`file:`, `link:`, `git+…`, `http…`, `user/repo`).
fn is_range(s: &str) -> bool {
    !s.contains(':')
        && !s.contains('/')
        && !s.contains('\\')
        && s.chars().all(|c| {
            c.is_ascii_alphanumeric()
                || matches!(
                    c,
                    ' ' | '.' | '-' | '+' | '^' | '~' | '<' | '>' | '=' | '|' | '*'
                )
        })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn requirements_name_registry_packages_only() {
        for ok in [
            "",
            "# only a comment\n\n",
            "six==1.16.0\n",
            "requests[socks,security]>=2.0,<3 ; python_version >= \"3.8\"\n",
            "numpy~=1.26  # a comment\n",
            "six==1.16.0 \\\n    --hash=sha256:8abb2f1d86890a2dfb989f9a77cfcfd3e47c2a354b01111771326f8aa26e0254\n",
            "zope.interface\nruamel.yaml==0.17.*\n",
            "six==1.16.0\r\nattrs\r\n",
            "six==1.16.0\t# a comment after a tab\n",
            "  # a comment ending in a backslash \\\nsix\n",
        ] {
            assert_eq!(check_requirements(ok), Ok(()), "{ok:?}");
        }
        for (bad, line) in [
            ("-r /etc/passwd\n", 1),
            ("six\n--requirement=/etc/shadow\n", 2),
            ("-c constraints.txt\n", 1),
            ("-e .\n", 1),
            ("--index-url file:///etc/\n", 1),
            ("-i http://10.0.0.1/simple\n", 1),
            ("six @ https://example.com/six.whl\n", 1),
            ("./local-package\n", 1),
            ("/etc/passwd\n", 1),
            ("file:///etc/passwd\n", 1),
            ("git+https://github.com/a/b\n", 1),
            ("six \\\n  -r /etc/passwd\n", 1),
            ("six --hash=md5:abc\n", 1),
            // Characters Python splits lines at, hiding an option behind a comment.
            ("six # \x0c--index-url https://evil.example/simple\n", 1),
            ("six #\r-r /etc/hostname\n", 1),
            ("six # \u{2028}-r /etc/hostname\n", 1),
            ("six\n# \x1e-r /etc/hostname\n", 2),
            // pip reads the options part with a shell-like splitter: quotes vanish there.
            ("six --hash=sha256:ab \"\"--global-option=x\n", 1),
            ("six --hash=sha256:ab '--config-settings=x'\n", 1),
            ("six --hash=sha256:ab \\--global-option=x\n", 1),
            // A continuation joins with nothing between: the option is still seen.
            ("six==1 \\\n--index-url=file:///etc\n", 1),
            ("--hash=sha256:ab\n", 1),
            // A name pip would take for an archive in its folder.
            ("x.tar.gz\n", 1),
            ("six\nPkg.WHL\n", 2),
            ("a.zip ; python_version > \"3\"\n", 1),
        ] {
            let e = check_requirements(bad).expect_err(bad);
            assert_eq!(e.line, line, "{bad:?}: {e}");
        }
        assert!(check_requirements("-r /etc/passwd\n")
            .expect_err("refused")
            .to_string()
            .contains("requirements.txt line 1: the option \"-r\" is refused"));
    }

    #[test]
    fn node_inputs_name_registry_packages_only() {
        let lock = |entry: &str| {
            format!(
                r#"{{"name":"app","lockfileVersion":3,"packages":{{"":{{"dependencies":{{"a":"^1"}}}},{entry}}}}}"#
            )
        };
        let good_entry = r#""node_modules/a":{"version":"1.0.0","resolved":"https://registry.npmjs.org/a/-/a-1.0.0.tgz","integrity":"sha512-x"}"#;
        let manifest =
            r#"{"name":"app","dependencies":{"a":"^1.0.0","b":"latest","c":">=1 <2 || 3.x"}}"#;
        assert_eq!(check_node(manifest, &lock(good_entry)), Ok(()));
        for bad_manifest in [
            r#"{"dependencies":{"a":"file:../a"}}"#,
            r#"{"dependencies":{"a":"link:/etc"}}"#,
            r#"{"dependencies":{"a":"git+https://x/y.git"}}"#,
            r#"{"dependencies":{"a":"user/repo"}}"#,
            r#"{"devDependencies":{"a":"https://x/a.tgz"}}"#,
            r#"{"workspaces":["packages/*"]}"#,
            r#"{"dependencies":{"a":1}}"#,
            r#"[]"#,
            r#"not json"#,
        ] {
            let e = check_node(bad_manifest, &lock(good_entry)).expect_err(bad_manifest);
            assert_eq!(e.file, "package.json", "{bad_manifest}: {e}");
        }
        for bad_entry in [
            r#""node_modules/a":{"resolved":"file:/etc/passwd"}"#,
            r#""node_modules/a":{"link":true,"resolved":"../../etc"}"#,
            r#""node_modules/a":{"version":"file:../a"}"#,
            r#""packages/local":{"version":"1.0.0"}"#,
            r#""node_modules/../../etc":{"version":"1.0.0"}"#,
            r#""node_modules/a":{"version":"1.0.0","dependencies":{"b":"file:../b"}}"#,
        ] {
            let e = check_node(manifest, &lock(bad_entry)).expect_err(bad_entry);
            assert_eq!(e.file, "package-lock.json", "{bad_entry}: {e}");
        }
        // A version 1 lock, nested.
        let v1 = r#"{"lockfileVersion":1,"dependencies":{"a":{"version":"1.0.0","resolved":"https://r/a.tgz","dependencies":{"b":{"version":"file:../b"}}}}}"#;
        assert!(check_node(manifest, v1).is_err());
    }

    #[test]
    fn only_deploy_rights_build_on_a_folder() {
        assert!(image_allowed("host", false).is_ok());
        assert!(image_allowed("dir:/", true).is_ok());
        assert!(image_allowed("dir:/", false)
            .expect_err("refused")
            .contains("needs deploy rights"));
    }
}
