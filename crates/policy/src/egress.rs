//! Egress rules: which `allow` entries a sandbox may have, and whether one outbound
//! connection is allowed.
//!
//! A rule is an IPv4 address or CIDR block and one port ([`Rule`]), or a DNS name and one
//! port ([`NameRule`]). A name rule is exact by name: Zygo's resolver answers the sandbox
//! only for names a rule has, and a connection to an address one of them resolved to is
//! relayed only if its TLS SNI or HTTP `Host` names that name ([`decide_name`]). IPv6 rules
//! are refused: a sandbox with egress has no IPv6 route at all.
//!
//! Private, loopback, link-local and other special-purpose addresses ([`SPECIAL`]) open
//! only when a rule names them itself: a rule whose whole block lies inside one special
//! range (`10.1.2.3:80`, `10.0.0.0/8:80`). A rule for a wider block (`0.0.0.0/0:443`) never
//! opens the special addresses inside it. Rules that name a special range are accepted only
//! where [`PrivateNet::Allowed`] (sandbox.toml, the operator's own command line, or an API
//! started with its private-network flag).

use std::fmt;
use std::net::{Ipv4Addr, SocketAddrV4};

use crate::file::AllowRule;
use crate::PolicyError;

/// The most rules one sandbox may have.
pub const MAX_RULES: usize = 64;

/// The special-purpose IPv4 ranges (RFC 6890 and its successors), with what they are.
pub const SPECIAL: [(Ipv4Addr, u8, &str); 16] = [
    (Ipv4Addr::new(0, 0, 0, 0), 8, "\"this network\""),
    (Ipv4Addr::new(10, 0, 0, 0), 8, "private"),
    (
        Ipv4Addr::new(100, 64, 0, 0),
        10,
        "shared address space (carrier NAT)",
    ),
    (Ipv4Addr::new(127, 0, 0, 0), 8, "loopback"),
    (Ipv4Addr::new(169, 254, 0, 0), 16, "link-local"),
    (Ipv4Addr::new(172, 16, 0, 0), 12, "private"),
    (Ipv4Addr::new(192, 0, 0, 0), 24, "IETF protocol assignments"),
    (Ipv4Addr::new(192, 0, 2, 0), 24, "documentation"),
    (Ipv4Addr::new(192, 88, 99, 0), 24, "6to4 relay anycast"),
    (Ipv4Addr::new(192, 168, 0, 0), 16, "private"),
    (Ipv4Addr::new(198, 18, 0, 0), 15, "benchmarking"),
    (Ipv4Addr::new(198, 51, 100, 0), 24, "documentation"),
    (Ipv4Addr::new(203, 0, 113, 0), 24, "documentation"),
    (Ipv4Addr::new(224, 0, 0, 0), 4, "multicast"),
    (Ipv4Addr::new(240, 0, 0, 0), 4, "reserved or broadcast"),
    // Not special by RFC, but a cloud host's own: Azure's platform endpoint (the VM's
    // configuration and extensions), reachable from every Azure VM.
    (
        Ipv4Addr::new(168, 63, 129, 16),
        32,
        "cloud platform endpoint",
    ),
];

/// Whether a rule names exactly this address and port (a `/32`), which is how the
/// operator opens an address Zygo would otherwise keep closed.
pub fn named_exactly(rules: &[Rule], dst: SocketAddrV4) -> bool {
    rules
        .iter()
        .any(|r| r.prefix == 32 && r.net == *dst.ip() && r.port == dst.port())
}

/// Whether rules may name private and other special ranges.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PrivateNet {
    /// The rules come from the operator (sandbox.toml, the CLI, `zygo mcp`'s flags, or an
    /// API started with `--allow-private-net`).
    Allowed,
    /// The rules come from a caller who may not open the host's own networks.
    Refused,
}

/// A sandbox's checked rules: by address and by name.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Rules {
    pub addrs: Vec<Rule>,
    pub names: Vec<NameRule>,
}

impl Rules {
    pub fn len(&self) -> usize {
        self.addrs.len() + self.names.len()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// The first of these rules that `outer` does not cover, if any. An address rule is
    /// covered by one of `outer`'s on the same port whose block holds its whole block;
    /// a rule naming a special range (private, loopback, …) only by one of `outer`'s that
    /// names a special range itself, as [`decide`] opens them. A name rule is covered by
    /// the same name on the same port.
    pub fn not_within(&self, outer: &Rules) -> Option<String> {
        for r in &self.addrs {
            let covered = outer.addrs.iter().any(|o| {
                o.port == r.port
                    && o.prefix <= r.prefix
                    && inside(r.net, o.net, o.prefix)
                    && (r.names_special().is_none() || o.names_special().is_some())
            });
            if !covered {
                return Some(r.to_string());
            }
        }
        for n in &self.names {
            if !outer
                .names
                .iter()
                .any(|o| o.name == n.name && o.port == n.port)
            {
                return Some(format!("{}:{}", n.name, n.port));
            }
        }
        None
    }
}

/// One checked name rule: connections to `port` whose TLS SNI or HTTP `Host` is `name`, at
/// an address Zygo's resolver gave the sandbox for `name`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NameRule {
    /// Lower case, no trailing dot.
    pub name: String,
    pub port: u16,
    /// Whether the name may resolve to a private or other special address (the rule is the
    /// operator's, see [`PrivateNet`]); otherwise such addresses are left out of answers.
    pub private_ok: bool,
}

impl NameRule {
    /// A name rule as a launcher hands it on, checked again: a name in normal form (see
    /// [`normal_name`]) and a port other than 0; `None` otherwise.
    pub fn checked(name: &str, port: u16, private_ok: bool) -> Option<NameRule> {
        (port > 0 && crate::file::is_dns_name(name) && name == normal_name(name)).then(|| {
            NameRule {
                name: name.to_string(),
                port,
                private_ok,
            }
        })
    }
}

/// A host name as rules hold it: lower case, without a trailing dot.
pub fn normal_name(s: &str) -> String {
    s.strip_suffix('.').unwrap_or(s).to_ascii_lowercase()
}

/// One checked rule: connections to `port` on an address inside `net/prefix`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Rule {
    pub net: Ipv4Addr,
    pub prefix: u8,
    pub port: u16,
}

fn mask(prefix: u8) -> u32 {
    if prefix == 0 {
        0
    } else {
        u32::MAX << (32 - u32::from(prefix.min(32)))
    }
}

fn inside(addr: Ipv4Addr, net: Ipv4Addr, prefix: u8) -> bool {
    u32::from(addr) & mask(prefix) == u32::from(net) & mask(prefix)
}

/// The special range `addr` is in, by what it is, if any.
pub fn special(addr: Ipv4Addr) -> Option<&'static str> {
    SPECIAL
        .iter()
        .find(|(net, prefix, _)| inside(addr, *net, *prefix))
        .map(|(_, _, what)| *what)
}

impl Rule {
    /// Whether `dst` is inside the rule's block, on its port.
    pub fn covers(&self, dst: SocketAddrV4) -> bool {
        dst.port() == self.port && inside(*dst.ip(), self.net, self.prefix)
    }

    /// The special range the rule's whole block lies in, if it names one.
    pub fn names_special(&self) -> Option<&'static str> {
        SPECIAL
            .iter()
            .find(|(net, prefix, _)| self.prefix >= *prefix && inside(self.net, *net, *prefix))
            .map(|(_, _, what)| *what)
    }

    /// A rule as a launcher hands it on, checked again: a prefix of at most 32 with no host
    /// bits set in `net`, and a port other than 0; `None` otherwise.
    pub fn checked(net: Ipv4Addr, prefix: u8, port: u16) -> Option<Rule> {
        (prefix <= 32 && port > 0 && u32::from(net) & !mask(prefix) == 0).then_some(Rule {
            net,
            prefix,
            port,
        })
    }
}

impl fmt::Display for Rule {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}/{}:{}", self.net, self.prefix, self.port)
    }
}

/// Check a sandbox's `allow` entries (from `field`) and turn them into rules.
pub fn compile(
    field: &str,
    allow: &[AllowRule],
    private: PrivateNet,
) -> Result<Rules, PolicyError> {
    if allow.len() > MAX_RULES {
        return Err(PolicyError::TooLarge {
            what: format!("{field} ({} rules)", allow.len()),
            limit: format!("{MAX_RULES} rules"),
        });
    }
    let mut rules = Rules::default();
    for a in allow {
        let shown = a.to_string();
        let (net, prefix) = match a.host.split_once('/') {
            Some((net, prefix)) => (net, Some(prefix)),
            None => (a.host.as_str(), None),
        };
        let net: Ipv4Addr = match net.parse() {
            Ok(n) => n,
            Err(_) if net.contains(':') => {
                return Err(PolicyError::not_allowed(
                    field,
                    &shown,
                    "is an IPv6 rule; egress in this version of Zygo is IPv4 only (a sandbox \
                     has no IPv6 route); write an IPv4 address or a name",
                ))
            }
            Err(_) if prefix.is_none() && crate::file::is_dns_name(net) => {
                let rule = NameRule {
                    name: normal_name(net),
                    port: a.port,
                    private_ok: private == PrivateNet::Allowed,
                };
                if !rules.names.contains(&rule) {
                    rules.names.push(rule);
                }
                continue;
            }
            Err(_) => {
                return Err(PolicyError::invalid(
                    field,
                    &shown,
                    "is neither an IPv4 address or block nor a DNS name",
                ))
            }
        };
        let prefix = match prefix {
            None => 32,
            Some(p) => match p.parse::<u8>() {
                Ok(p) if p <= 32 && p.to_string().len() <= 2 => p,
                _ => {
                    return Err(PolicyError::invalid(
                        field,
                        &shown,
                        "has a bad prefix length; use /0 to /32",
                    ))
                }
            },
        };
        if u32::from(net) & !mask(prefix) != 0 {
            return Err(PolicyError::invalid(
                field,
                &shown,
                format!(
                    "has address bits set beyond its /{prefix}; write {}/{prefix}",
                    Ipv4Addr::from(u32::from(net) & mask(prefix))
                ),
            ));
        }
        let rule = Rule {
            net,
            prefix,
            port: a.port,
        };
        if let Some(what) = rule.names_special() {
            if private == PrivateNet::Refused {
                return Err(PolicyError::not_allowed(
                    field,
                    &shown,
                    format!(
                        "names a {what} address, which only the operator may open (in \
                         sandbox.toml, or an API started with --allow-private-net)"
                    ),
                ));
            }
        }
        if !rules.addrs.contains(&rule) {
            rules.addrs.push(rule);
        }
    }
    Ok(rules)
}

/// Whether Zygo's resolver answers the sandbox for `qname` (any port).
pub fn answers_for<'r>(names: &'r [NameRule], qname: &str) -> Option<&'r NameRule> {
    let q = normal_name(qname);
    names.iter().find(|r| r.name == q)
}

/// Whether an address the upstream resolver gave for `rule`'s name may be handed to the
/// sandbox: special addresses only when the rule is the operator's.
pub fn resolved_ok(rule: &NameRule, addr: Ipv4Addr) -> bool {
    rule.private_ok || special(addr).is_none()
}

/// Whether a connection to `dst` that says (TLS SNI or HTTP `Host`) it is for `host` is
/// allowed by a name rule. `resolved` is whether Zygo's resolver gave the sandbox `dst`'s
/// address for `host`.
pub fn decide_name<'r>(
    names: &'r [NameRule],
    host: Option<&str>,
    dst: SocketAddrV4,
    resolved: impl Fn(&str) -> bool,
) -> Result<&'r NameRule, NameRefusal> {
    let Some(host) = host else {
        return Err(NameRefusal::NoName);
    };
    let host = normal_name(host);
    let Some(rule) = names
        .iter()
        .find(|r| r.name == host && r.port == dst.port())
    else {
        return Err(NameRefusal::NotAllowed(host));
    };
    if !resolved(&host) {
        return Err(NameRefusal::NotResolvedThere(host));
    }
    if !resolved_ok(rule, *dst.ip()) {
        return Err(NameRefusal::NotAllowed(host));
    }
    Ok(rule)
}

/// Why a connection was refused by the name rules.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum NameRefusal {
    /// Neither TLS SNI nor an HTTP `Host` header came first.
    NoName,
    /// The name it gave has no rule for this port.
    NotAllowed(String),
    /// The name has a rule, but Zygo's resolver never gave the sandbox this address for it.
    NotResolvedThere(String),
}

impl fmt::Display for NameRefusal {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            NameRefusal::NoName => f.write_str(
                "no rule names the address, and the connection named no host (TLS SNI or \
                 an HTTP Host header) a name rule could match",
            ),
            // The name is the sandbox's own text: shown escaped.
            NameRefusal::NotAllowed(h) => {
                write!(
                    f,
                    "no allow rule names {} on this port",
                    crate::Shown::new(h)
                )
            }
            NameRefusal::NotResolvedThere(h) => write!(
                f,
                "{} is allowed, but Zygo's resolver did not give the sandbox this address for it",
                crate::Shown::new(h)
            ),
        }
    }
}

/// Why a connection was refused.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Refusal {
    /// No rule covers the address and port.
    NoRule,
    /// A rule covers it, but the address is special and no rule names that range.
    Special(&'static str),
}

impl fmt::Display for Refusal {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Refusal::NoRule => f.write_str("no allow rule names it"),
            Refusal::Special(what) => write!(
                f,
                "it is a {what} address and no allow rule names that address itself"
            ),
        }
    }
}

/// Whether a connection to `dst` is allowed by `rules`: the rule that allows it, or why not.
pub fn decide(rules: &[Rule], dst: SocketAddrV4) -> Result<Rule, Refusal> {
    let dst_special = special(*dst.ip());
    let mut refusal = Refusal::NoRule;
    for r in rules.iter().filter(|r| r.covers(dst)) {
        match dst_special {
            None => return Ok(*r),
            Some(_) if r.names_special().is_some() => return Ok(*r),
            Some(what) => refusal = Refusal::Special(what),
        }
    }
    Err(refusal)
}

#[allow(clippy::unwrap_used)]
#[cfg(test)]
mod tests {
    use super::*;

    fn rules(list: &[&str], private: PrivateNet) -> Result<Vec<Rule>, PolicyError> {
        let allow: Vec<AllowRule> = list
            .iter()
            .map(|s| AllowRule::parse("allow", s).unwrap())
            .collect();
        compile("allow", &allow, private).map(|r| r.addrs)
    }

    fn dst(s: &str) -> SocketAddrV4 {
        s.parse().unwrap()
    }

    #[test]
    fn names_are_rules_of_their_own() {
        let allow = [AllowRule::parse("allow", "API.Example.com:443").unwrap()];
        let r = compile("allow", &allow, PrivateNet::Refused).unwrap();
        assert!(r.addrs.is_empty());
        assert_eq!(r.names[0].name, "api.example.com");
        assert!(!r.names[0].private_ok);
        let n = &r.names[0];
        assert_eq!(
            NameRule::checked(&n.name, n.port, n.private_ok),
            Some(n.clone())
        );
        assert_eq!(NameRule::checked("a.com", 0, true), None);
        assert_eq!(NameRule::checked("A.com", 1, true), None);
        assert_eq!(NameRule::checked("a.com.", 1, true), None);
        assert_eq!(NameRule::checked("a com", 1, true), None);
        assert!(answers_for(&r.names, "api.example.COM.").is_some());
        assert!(answers_for(&r.names, "example.com").is_none());
        let dst: SocketAddrV4 = "93.184.216.34:443".parse().unwrap();
        let yes = |_: &str| true;
        assert!(decide_name(&r.names, Some("api.example.com"), dst, yes).is_ok());
        assert_eq!(
            decide_name(&r.names, Some("other.example.com"), dst, yes),
            Err(NameRefusal::NotAllowed("other.example.com".into()))
        );
        assert_eq!(
            decide_name(&r.names, None, dst, yes),
            Err(NameRefusal::NoName)
        );
        assert!(matches!(
            decide_name(&r.names, Some("api.example.com"), dst, |_| false),
            Err(NameRefusal::NotResolvedThere(_))
        ));
        let other_port: SocketAddrV4 = "93.184.216.34:80".parse().unwrap();
        assert!(decide_name(&r.names, Some("api.example.com"), other_port, yes).is_err());
        // A tenant's name that resolves to a private address is refused; the operator's is not.
        let private: SocketAddrV4 = "10.0.0.5:443".parse().unwrap();
        assert!(decide_name(&r.names, Some("api.example.com"), private, yes).is_err());
        let op = compile("allow", &allow, PrivateNet::Allowed).unwrap();
        assert!(decide_name(&op.names, Some("api.example.com"), private, yes).is_ok());
    }

    #[test]
    fn ipv6_is_refused_with_the_reason() {
        let e = rules(&["[2001:db8::1]:443"], PrivateNet::Allowed).unwrap_err();
        assert!(e.to_string().contains("IPv4 only"), "{e}");
        let e = rules(&["[::ffff:10.0.0.1]:443"], PrivateNet::Allowed).unwrap_err();
        assert!(e.to_string().contains("IPv4 only"), "{e}");
    }

    #[test]
    fn cidr_blocks_parse_and_host_bits_are_refused() {
        let r = rules(&["10.0.0.0/8:80", "8.8.8.8:53"], PrivateNet::Allowed).unwrap();
        assert_eq!(r[0].prefix, 8);
        assert_eq!(r[1].prefix, 32);
        let e = rules(&["10.0.0.1/8:80"], PrivateNet::Allowed).unwrap_err();
        assert!(e.to_string().contains("write 10.0.0.0/8"), "{e}");
        assert!(AllowRule::parse("allow", "10.0.0.0/33:80").is_ok());
        assert!(rules(&["10.0.0.0/33:80"], PrivateNet::Allowed).is_err());
        assert!(AllowRule::parse("allow", "10.0.0.0/008:80").is_err());
    }

    #[test]
    fn private_rules_need_the_operator() {
        for r in [
            "10.1.2.3:80",
            "127.0.0.1:22",
            "169.254.169.254:80",
            "192.168.0.0/16:80",
            "0.0.0.0:80",
            "255.255.255.255:80",
            "100.64.0.1:80",
        ] {
            let e = rules(&[r], PrivateNet::Refused).unwrap_err();
            assert!(e.to_string().contains("only the operator"), "{r}: {e}");
            assert!(rules(&[r], PrivateNet::Allowed).is_ok(), "{r}");
        }
        // A wide block is not a private rule, and does not open the private ones in it.
        let wide = rules(&["0.0.0.0/0:443"], PrivateNet::Refused).unwrap();
        assert!(decide(&wide, dst("93.184.216.34:443")).is_ok());
        for d in [
            "10.0.0.1:443",
            "127.0.0.1:443",
            "169.254.169.254:443",
            "172.16.5.5:443",
            "192.168.1.1:443",
            "100.100.0.1:443",
            "224.0.0.1:443",
            "255.255.255.255:443",
            "0.0.0.0:443",
        ] {
            assert!(
                matches!(decide(&wide, dst(d)), Err(Refusal::Special(_))),
                "{d}"
            );
        }
        assert_eq!(decide(&wide, dst("93.184.216.34:80")), Err(Refusal::NoRule));
    }

    #[test]
    fn a_named_private_address_opens_only_that_address_and_port() {
        let r = rules(&["10.9.0.2:8080"], PrivateNet::Allowed).unwrap();
        assert!(decide(&r, dst("10.9.0.2:8080")).is_ok());
        assert!(decide(&r, dst("10.9.0.2:8081")).is_err());
        assert!(decide(&r, dst("10.9.0.3:8080")).is_err());
        let r = rules(&["10.9.0.0/24:8080"], PrivateNet::Allowed).unwrap();
        assert!(decide(&r, dst("10.9.0.77:8080")).is_ok());
        assert!(decide(&r, dst("10.9.1.77:8080")).is_err());
    }

    #[test]
    fn rules_are_checked_again_as_handed_on() {
        let r = rules(&["10.9.0.0/24:8080", "1.2.3.4:5"], PrivateNet::Allowed).unwrap();
        for rule in r {
            assert_eq!(Rule::checked(rule.net, rule.prefix, rule.port), Some(rule));
        }
        let net = Ipv4Addr::new(10, 9, 0, 1);
        assert_eq!(Rule::checked(net, 24, 80), None);
        assert_eq!(Rule::checked(Ipv4Addr::new(10, 9, 0, 0), 24, 0), None);
        assert_eq!(Rule::checked(net, 33, 80), None);
        assert!(Rule::checked(net, 32, 80).is_some());
    }

    #[test]
    fn too_many_rules_are_refused() {
        let many: Vec<String> = (0..=MAX_RULES)
            .map(|i| format!("1.1.1.1:{}", i + 1))
            .collect();
        let refs: Vec<&str> = many.iter().map(String::as_str).collect();
        assert!(rules(&refs, PrivateNet::Allowed).is_err());
    }
}
