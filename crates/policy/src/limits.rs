//! Resource limits: parsing sizes, CPUs, pids and durations, and the narrowing rule.
//!
//! `io_bps` and `io_iops` cap a sandbox's reads and its writes (each) on the host's
//! disks, per second: bytes and operations.
//!
//! Numbers are parsed by hand as exact decimals (no `f64::from_str`, which would accept
//! `NaN`, `inf` and `1e9`), and all arithmetic is checked.

use std::fmt;
use std::time::Duration;

use crate::PolicyError;

/// Where a value came from. Some values are accepted only from sandbox.toml,
/// which only the host's operator writes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Source {
    Cli,
    File,
    Http,
}

/// A byte count (binary units: 1K = 1024).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Bytes(pub u64);

/// CPUs, stored as thousandths of a CPU. Always in `0.01..=1024`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Cpus(u32);

/// A memory limit. `Unlimited` is the largest value and comes only from sandbox.toml.
/// (Declaration order matters: the derived `Ord` puts `Unlimited` above every size.)
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Mem {
    Limited(Bytes),
    Unlimited,
}

/// Limits as one layer sets them; a field left `None` is decided by another layer.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Limits {
    pub mem: Option<Mem>,
    pub cpu: Option<Cpus>,
    pub pids: Option<u32>,
    pub timeout: Option<Duration>,
    pub scratch: Option<Bytes>,
    /// Bytes a second read from, and written to, each of the host's disks.
    pub io_bps: Option<Bytes>,
    /// Operations a second on each of the host's disks, reads and writes each.
    pub io_iops: Option<u32>,
}

/// Limits with every field decided.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ResolvedLimits {
    pub mem: Mem,
    pub cpu: Cpus,
    pub pids: u32,
    pub timeout: Duration,
    pub scratch: Bytes,
    pub io_bps: Bytes,
    pub io_iops: u32,
}

/// Longest duration accepted anywhere (timeouts, idle_timeout). The same as
/// `proto::front::MAX_DURATION`, which the channel's side uses (policy imports nothing of
/// ours; the monitor's tests check the two agree).
pub const MAX_DURATION: Duration = Duration::from_secs(24 * 3600);
pub const MIN_PIDS: u32 = 1;
pub const MAX_PIDS: u32 = 65_536;
pub const MIN_IOPS: u32 = 10;
pub const MAX_IOPS: u32 = 10_000_000;
/// The least `io_bps` accepted: below this a program could hardly load from the image.
pub const MIN_IO_BPS: u64 = 1 << 20;
const MIN_MILLICPUS: u32 = 10;
const MAX_MILLICPUS: u32 = 1_024_000;
/// Digits beyond this are refused before any arithmetic, so nothing can overflow `u128`.
const MAX_DIGITS: usize = 24;

const K: u64 = 1 << 10;
const M: u64 = 1 << 20;
const G: u64 = 1 << 30;
const T: u64 = 1 << 40;

impl ResolvedLimits {
    /// The built-in defaults: mem 256M, cpu 1, pids 64, timeout 30s, scratch 64M, io_bps
    /// 128M, io_iops 4000.
    pub const DEFAULT: ResolvedLimits = ResolvedLimits {
        mem: Mem::Limited(Bytes(256 * M)),
        cpu: Cpus(1000),
        pids: 64,
        timeout: Duration::from_secs(30),
        scratch: Bytes(64 * M),
        io_bps: Bytes(128 * M),
        io_iops: 4000,
    };

    /// The same limits as a layer with every field set (e.g. to use as a ceiling).
    pub fn as_limits(&self) -> Limits {
        Limits {
            mem: Some(self.mem),
            cpu: Some(self.cpu),
            pids: Some(self.pids),
            timeout: Some(self.timeout),
            scratch: Some(self.scratch),
            io_bps: Some(self.io_bps),
            io_iops: Some(self.io_iops),
        }
    }
}

impl Default for ResolvedLimits {
    fn default() -> Self {
        Self::DEFAULT
    }
}

impl Limits {
    /// Each limit is the smallest of the two layers that set it (`Unlimited` is the largest).
    pub fn narrow(&self, other: &Limits) -> Limits {
        fn min<T: Ord + Copy>(a: Option<T>, b: Option<T>) -> Option<T> {
            match (a, b) {
                (Some(a), Some(b)) => Some(a.min(b)),
                (a, b) => a.or(b),
            }
        }
        Limits {
            mem: min(self.mem, other.mem),
            cpu: min(self.cpu, other.cpu),
            pids: min(self.pids, other.pids),
            timeout: min(self.timeout, other.timeout),
            scratch: min(self.scratch, other.scratch),
            io_bps: min(self.io_bps, other.io_bps),
            io_iops: min(self.io_iops, other.io_iops),
        }
    }

    /// This layer's values where set, else `base`'s (a later layer replaces an earlier one).
    pub fn or(&self, base: &Limits) -> Limits {
        Limits {
            mem: self.mem.or(base.mem),
            cpu: self.cpu.or(base.cpu),
            pids: self.pids.or(base.pids),
            timeout: self.timeout.or(base.timeout),
            scratch: self.scratch.or(base.scratch),
            io_bps: self.io_bps.or(base.io_bps),
            io_iops: self.io_iops.or(base.io_iops),
        }
    }

    /// Fill every unset field from `defaults`.
    pub fn resolve(&self, defaults: &ResolvedLimits) -> ResolvedLimits {
        ResolvedLimits {
            mem: self.mem.unwrap_or(defaults.mem),
            cpu: self.cpu.unwrap_or(defaults.cpu),
            pids: self.pids.unwrap_or(defaults.pids),
            timeout: self.timeout.unwrap_or(defaults.timeout),
            scratch: self.scratch.unwrap_or(defaults.scratch),
            io_bps: self.io_bps.unwrap_or(defaults.io_bps),
            io_iops: self.io_iops.unwrap_or(defaults.io_iops),
        }
    }
}

/// Check `request` against `ceiling`: any field above the ceiling is an `AboveCeiling`
/// error; otherwise the result is the request with unset fields taken from the ceiling.
pub fn narrow_to_ceiling(request: &Limits, ceiling: &Limits) -> Result<Limits, PolicyError> {
    fn check<T: Ord + fmt::Display>(
        key: &'static str,
        req: Option<T>,
        ceil: Option<T>,
    ) -> Result<(), PolicyError> {
        match (req, ceil) {
            (Some(r), Some(c)) if r > c => Err(PolicyError::AboveCeiling {
                key,
                value: r.to_string(),
                ceiling: c.to_string(),
            }),
            _ => Ok(()),
        }
    }
    check("mem", request.mem, ceiling.mem)?;
    check("cpu", request.cpu, ceiling.cpu)?;
    check("pids", request.pids, ceiling.pids)?;
    check(
        "timeout",
        request.timeout.map(Dur),
        ceiling.timeout.map(Dur),
    )?;
    check("scratch", request.scratch, ceiling.scratch)?;
    check("io_bps", request.io_bps, ceiling.io_bps)?;
    check("io_iops", request.io_iops, ceiling.io_iops)?;
    Ok(request.narrow(ceiling))
}

/// Parse a size: `512`, `64K`, `256M`, `1.5G`, `2T`, with an optional `B` or `iB`
/// (`256MB` and `256MiB` both mean 256 × 2^20). Zero is refused: a zero-sized limit
/// means "no limit" to tmpfs and nothing useful anywhere else.
pub fn parse_size(field: &str, s: &str) -> Result<Bytes, PolicyError> {
    const HOWTO: &str = "use a number with an optional K, M, G or T suffix, e.g. 256M or 1.5G";
    let bad = |reason: &str| PolicyError::invalid(field, s, reason);
    let (digits, unit) = split_number(s);
    let mult = match unit.to_ascii_lowercase().as_str() {
        "" | "b" => 1,
        "k" | "kb" | "kib" => K,
        "m" | "mb" | "mib" => M,
        "g" | "gb" | "gib" => G,
        "t" | "tb" | "tib" => T,
        _ if digits.is_empty() => return Err(bad(&not_a_number("size", s, HOWTO))),
        _ => return Err(bad(&format!("has an unknown unit; {HOWTO}"))),
    };
    let (mantissa, scale) = decimal(digits).map_err(|e| bad(&e.reason("size", s, HOWTO)))?;
    let bytes = mantissa * u128::from(mult) / 10u128.pow(scale);
    if bytes == 0 {
        return Err(bad("must be greater than zero"));
    }
    u64::try_from(bytes)
        .map(Bytes)
        .map_err(|_| bad("is too large"))
}

/// Parse a duration: `500ms`, `30s`, `1.5s`, `5m`, `24h`. A unit is required.
/// Must be greater than zero and at most 24h.
pub fn parse_duration(field: &str, s: &str) -> Result<Duration, PolicyError> {
    const HOWTO: &str = "use a number with a unit ms, s, m or h, e.g. 500ms, 30s or 5m";
    let bad = |reason: &str| PolicyError::invalid(field, s, reason);
    let (digits, unit) = split_number(s);
    let nanos_per_unit: u128 = match unit.to_ascii_lowercase().as_str() {
        "ms" => 1_000_000,
        "s" => 1_000_000_000,
        "m" => 60 * 1_000_000_000,
        "h" => 3600 * 1_000_000_000,
        _ if digits.is_empty() => return Err(bad(&not_a_number("duration", s, HOWTO))),
        "" => return Err(bad(&format!("needs a unit; {HOWTO}"))),
        _ => return Err(bad(&format!("has an unknown unit; {HOWTO}"))),
    };
    let (mantissa, scale) = decimal(digits).map_err(|e| bad(&e.reason("duration", s, HOWTO)))?;
    let nanos = mantissa * nanos_per_unit / 10u128.pow(scale);
    if nanos == 0 {
        return Err(bad("must be greater than zero"));
    }
    if nanos > MAX_DURATION.as_nanos() {
        return Err(bad("is longer than the maximum of 24h"));
    }
    let secs = u64::try_from(nanos / 1_000_000_000).map_err(|_| bad("is too large"))?;
    // Below 10^9, so the cast is exact.
    let sub = (nanos % 1_000_000_000) as u32;
    Ok(Duration::new(secs, sub))
}

/// Parse a process count in `1..=65536`.
pub fn parse_pids(field: &str, s: &str) -> Result<u32, PolicyError> {
    let bad = |reason: &str| PolicyError::invalid(field, s, reason);
    const RANGE: &str = "must be a whole number from 1 to 65536";
    if s.is_empty() || !s.bytes().all(|b| b.is_ascii_digit()) {
        return Err(bad(RANGE));
    }
    match s.parse::<u32>() {
        Ok(n) if (MIN_PIDS..=MAX_PIDS).contains(&n) => Ok(n),
        _ => Err(bad(RANGE)),
    }
}

/// Parse `io_bps`: a size a second (`64M`), at least [`MIN_IO_BPS`].
pub fn parse_io_bps(field: &str, s: &str) -> Result<Bytes, PolicyError> {
    let b = parse_size(field, s)?;
    if b.0 < MIN_IO_BPS {
        return Err(PolicyError::invalid(
            field,
            s,
            "is below the least allowed, 1M a second",
        ));
    }
    Ok(b)
}

/// Parse `io_iops`: a whole number of operations a second.
pub fn parse_iops(field: &str, s: &str) -> Result<u32, PolicyError> {
    let bad = || {
        PolicyError::invalid(
            field,
            s,
            format!("must be a whole number from {MIN_IOPS} to {MAX_IOPS}"),
        )
    };
    if s.is_empty() || s.len() > 10 || !s.bytes().all(|b| b.is_ascii_digit()) {
        return Err(bad());
    }
    match s.parse::<u32>() {
        Ok(n) if (MIN_IOPS..=MAX_IOPS).contains(&n) => Ok(n),
        _ => Err(bad()),
    }
}

impl Cpus {
    /// Parse `0.5`, `1`, `2.25` (at most three decimals), in `0.01..=1024`.
    pub fn parse(field: &str, s: &str) -> Result<Cpus, PolicyError> {
        const HOWTO: &str = "use a number of CPUs from 0.01 to 1024, e.g. 0.5 or 2";
        let bad = |reason: &str| PolicyError::invalid(field, s, reason);
        let (mantissa, scale) = decimal(s).map_err(|e| bad(&e.reason("number", s, HOWTO)))?;
        if scale > 3 {
            return Err(bad("has more than three decimals"));
        }
        let millis = mantissa * 10u128.pow(3 - scale);
        match u32::try_from(millis) {
            Ok(m) if (MIN_MILLICPUS..=MAX_MILLICPUS).contains(&m) => Ok(Cpus(m)),
            _ => Err(bad("is out of range; CPUs must be from 0.01 to 1024")),
        }
    }

    /// Thousandths of a CPU.
    pub fn millis(self) -> u32 {
        self.0
    }
}

impl Mem {
    /// Parse a memory limit: a size, or `unlimited` (only with `Source::File`).
    pub fn parse(field: &str, s: &str, source: Source) -> Result<Mem, PolicyError> {
        if s.eq_ignore_ascii_case("unlimited") {
            return match source {
                Source::File => Ok(Mem::Unlimited),
                Source::Cli | Source::Http => Err(PolicyError::not_allowed(
                    field,
                    s,
                    "is accepted only in sandbox.toml; give a size such as 256M",
                )),
            };
        }
        parse_size(field, s).map(Mem::Limited)
    }
}

/// Split `1.5G` into `("1.5", "G")`: the leading digits and dots, then the rest.
fn split_number(s: &str) -> (&str, &str) {
    let end = s
        .find(|c: char| !(c.is_ascii_digit() || c == '.'))
        .unwrap_or(s.len());
    s.split_at(end)
}

enum DecimalError {
    Malformed,
    Negative,
    TooManyDigits,
}

impl DecimalError {
    fn reason(&self, what: &str, s: &str, howto: &str) -> String {
        match self {
            DecimalError::Malformed => not_a_number(what, s, howto),
            DecimalError::Negative => "must not be negative".to_owned(),
            DecimalError::TooManyDigits => "is too large (too many digits)".to_owned(),
        }
    }
}

fn not_a_number(what: &str, s: &str, howto: &str) -> String {
    if s.starts_with('-') {
        "must not be negative".to_owned()
    } else {
        format!("is not a {what}; {howto}")
    }
}

/// An exact decimal `123` or `1.25` as (digits as an integer, digits after the point).
fn decimal(s: &str) -> Result<(u128, u32), DecimalError> {
    if s.starts_with('-') {
        return Err(DecimalError::Negative);
    }
    let (int, frac) = s.split_once('.').unwrap_or((s, ""));
    let all_digits = |p: &str| p.bytes().all(|b| b.is_ascii_digit());
    if int.is_empty()
        || !all_digits(int)
        || !all_digits(frac)
        || (s.contains('.') && frac.is_empty())
    {
        return Err(DecimalError::Malformed);
    }
    if int.len() + frac.len() > MAX_DIGITS {
        return Err(DecimalError::TooManyDigits);
    }
    let mut n: u128 = 0;
    for b in int.bytes().chain(frac.bytes()) {
        n = n * 10 + u128::from(b - b'0');
    }
    // frac.len() <= MAX_DIGITS, so this fits.
    Ok((n, frac.len() as u32))
}

/// `n` counted in `unit`s, times 10^places, if that is at least one unit and exact:
/// (1536, 1024, 2) → Some(150), i.e. 1.50.
fn in_units(n: u128, unit: u128, places: u32) -> Option<u128> {
    let scaled = n * 10u128.pow(places);
    (n >= unit && scaled / unit * unit == scaled).then_some(scaled / unit)
}

/// Writes `n / 10^places` with trailing zeros trimmed: (150, 2) → "1.5".
fn write_decimal(f: &mut fmt::Formatter<'_>, n: u128, places: u32) -> fmt::Result {
    let div = 10u128.pow(places);
    let (int, frac) = (n / div, n % div);
    if frac == 0 {
        return write!(f, "{int}");
    }
    let frac = format!("{frac:0width$}", width = places as usize);
    write!(f, "{int}.{}", frac.trim_end_matches('0'))
}

impl fmt::Display for Bytes {
    /// Compact: the largest unit that shows the value exactly with at most two decimals.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let b = u128::from(self.0);
        for (unit, name) in [(T, "T"), (G, "G"), (M, "M"), (K, "K")] {
            if let Some(n) = in_units(b, u128::from(unit), 2) {
                write_decimal(f, n, 2)?;
                return f.write_str(name);
            }
        }
        write!(f, "{b}")
    }
}

impl fmt::Display for Cpus {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write_decimal(f, u128::from(self.0), 3)
    }
}

impl fmt::Display for Mem {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Mem::Limited(b) => b.fmt(f),
            Mem::Unlimited => f.write_str("unlimited"),
        }
    }
}

/// A `Duration` shown the way `parse_duration` reads it: `30s`, `5m`, `1.5s`, `250ms`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub struct Dur(pub Duration);

impl fmt::Display for Dur {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let ns = self.0.as_nanos();
        const MS: u128 = 1_000_000;
        for (unit, name) in [(3_600_000 * MS, "h"), (60_000 * MS, "m"), (1000 * MS, "s")] {
            if let Some(n) = in_units(ns, unit, 3) {
                write_decimal(f, n, 3)?;
                return f.write_str(name);
            }
        }
        write_decimal(f, ns, 6)?;
        f.write_str("ms")
    }
}

#[allow(clippy::unwrap_used)]
#[cfg(test)]
mod tests {
    use super::*;

    fn size(s: &str) -> Result<u64, String> {
        parse_size("--mem", s)
            .map(|b| b.0)
            .map_err(|e| e.to_string())
    }

    fn dur(s: &str) -> Result<Duration, String> {
        parse_duration("--timeout", s).map_err(|e| e.to_string())
    }

    #[test]
    fn sizes_good() {
        assert_eq!(size("512"), Ok(512));
        assert_eq!(size("512B"), Ok(512));
        assert_eq!(size("64K"), Ok(64 * K));
        assert_eq!(size("64k"), Ok(64 * K));
        assert_eq!(size("256M"), Ok(256 * M));
        assert_eq!(size("256MB"), Ok(256 * M));
        assert_eq!(size("256MiB"), Ok(256 * M));
        assert_eq!(size("256mib"), Ok(256 * M));
        assert_eq!(size("1.5G"), Ok(3 * G / 2));
        assert_eq!(size("2T"), Ok(2 * T));
        assert_eq!(size("0.5K"), Ok(512));
    }

    #[test]
    fn sizes_bad() {
        for (s, why) in [
            ("12X", "unknown unit"),
            ("-1M", "must not be negative"),
            ("1.5.5G", "is not a size"),
            ("0", "greater than zero"),
            ("0M", "greater than zero"),
            ("0.0001K", "greater than zero"),
            ("", "is not a size"),
            ("M", "is not a size"),
            ("NaN", "is not a size"),
            ("inf", "is not a size"),
            ("1e9", "unknown unit"),
            (".5M", "is not a size"),
            ("5.M", "is not a size"),
            (" 5M", "is not a size"),
            ("5 M", "unknown unit"),
            ("+5M", "is not a size"),
            ("16777216T", "too large"),
            ("99999999999999999999999999999999", "too many digits"),
            ("18446744073709551616", "too large"),
        ] {
            let err = size(s).unwrap_err();
            assert!(err.contains(why), "{s:?}: {err}");
            assert!(err.starts_with("--mem: "), "{err}");
        }
        assert_eq!(size("18446744073709551615"), Ok(u64::MAX));
    }

    #[test]
    fn size_display_round_trips() {
        for (s, shown) in [
            ("256M", "256M"),
            ("1.5G", "1.5G"),
            ("1536M", "1.5G"),
            ("64K", "64K"),
            ("1.25K", "1.25K"),
            ("1000", "1000"),
            ("2T", "2T"),
            ("1025", "1025"),
        ] {
            let b = parse_size("x", s).unwrap();
            assert_eq!(b.to_string(), shown);
            assert_eq!(parse_size("x", shown).unwrap(), b);
        }
    }

    #[test]
    fn cpus() {
        let c = |s| {
            Cpus::parse("--cpu", s)
                .map(|c| c.millis())
                .map_err(|e| e.to_string())
        };
        assert_eq!(c("0.5"), Ok(500));
        assert_eq!(c("1"), Ok(1000));
        assert_eq!(c("2.25"), Ok(2250));
        assert_eq!(c("0.01"), Ok(10));
        assert_eq!(c("1024"), Ok(1_024_000));
        for bad in [
            "0",
            "0.001",
            "1025",
            "-1",
            "",
            "1.2345",
            "NaN",
            "1,5",
            "1e2",
            "99999999999999",
        ] {
            let err = c(bad).unwrap_err();
            assert!(err.starts_with("--cpu: "), "{bad}: {err}");
        }
        assert!(c("0").unwrap_err().contains("0.01 to 1024"));
        assert_eq!(Cpus::parse("x", "2.250").unwrap().to_string(), "2.25");
        assert_eq!(Cpus::parse("x", "1").unwrap().to_string(), "1");
    }

    #[test]
    fn durations() {
        assert_eq!(dur("500ms"), Ok(Duration::from_millis(500)));
        assert_eq!(dur("30s"), Ok(Duration::from_secs(30)));
        assert_eq!(dur("1.5s"), Ok(Duration::from_millis(1500)));
        assert_eq!(dur("5m"), Ok(Duration::from_secs(300)));
        assert_eq!(dur("24h"), Ok(MAX_DURATION));
        assert_eq!(dur("30S"), Ok(Duration::from_secs(30)));
        for (s, why) in [
            ("25h", "maximum of 24h"),
            ("24.001h", "maximum of 24h"),
            ("0s", "greater than zero"),
            ("30", "needs a unit"),
            ("30x", "unknown unit"),
            ("-1s", "negative"),
            ("1.5.5s", "not a duration"),
            ("s", "not a duration"),
            ("", "not a duration"),
            ("99999999999999999999999999h", "too many digits"),
            ("9999999999999999999h", "maximum of 24h"),
        ] {
            let err = dur(s).unwrap_err();
            assert!(err.contains(why), "{s:?}: {err}");
        }
        assert_eq!(Dur(Duration::from_secs(30)).to_string(), "30s");
        assert_eq!(Dur(Duration::from_millis(1500)).to_string(), "1.5s");
        assert_eq!(Dur(Duration::from_secs(300)).to_string(), "5m");
        assert_eq!(Dur(MAX_DURATION).to_string(), "24h");
        assert_eq!(Dur(Duration::from_millis(250)).to_string(), "250ms");
    }

    #[test]
    fn pids() {
        assert_eq!(parse_pids("--pids", "64"), Ok(64));
        assert_eq!(parse_pids("--pids", "65536"), Ok(65536));
        for bad in ["0", "65537", "-1", "", "1.5", "99999999999999999999", "+3"] {
            let err = parse_pids("--pids", bad).unwrap_err().to_string();
            assert!(err.contains("1 to 65536"), "{bad}: {err}");
        }
    }

    #[test]
    fn unlimited_only_from_file() {
        assert_eq!(
            Mem::parse("mem", "unlimited", Source::File),
            Ok(Mem::Unlimited)
        );
        for src in [Source::Cli, Source::Http] {
            let err = Mem::parse("--mem", "unlimited", src).unwrap_err();
            assert!(matches!(err, PolicyError::NotAllowed { .. }));
            assert!(err.to_string().contains("only in sandbox.toml"), "{err}");
        }
        assert_eq!(
            Mem::parse("--mem", "1G", Source::Cli),
            Ok(Mem::Limited(Bytes(G)))
        );
        assert!(Mem::Unlimited > Mem::Limited(Bytes(u64::MAX)));
    }

    fn mem(s: &str) -> Option<Mem> {
        Some(Mem::parse("mem", s, Source::File).unwrap())
    }

    #[test]
    fn narrowing_takes_the_minimum_of_every_layer_that_sets_it() {
        let a = Limits {
            mem: mem("1G"),
            cpu: Some(Cpus(2000)),
            pids: None,
            timeout: Some(Duration::from_secs(10)),
            scratch: None,
            io_bps: None,
            io_iops: Some(100),
        };
        let b = Limits {
            mem: mem("unlimited"),
            cpu: Some(Cpus(500)),
            pids: Some(10),
            timeout: Some(Duration::from_secs(60)),
            scratch: None,
            io_bps: Some(Bytes(8 * M)),
            io_iops: None,
        };
        let n = a.narrow(&b);
        assert_eq!(n, b.narrow(&a));
        assert_eq!(n.mem, mem("1G"));
        assert_eq!(n.cpu, Some(Cpus(500)));
        assert_eq!(n.pids, Some(10));
        assert_eq!(n.timeout, Some(Duration::from_secs(10)));
        assert_eq!(n.scratch, None);
        assert_eq!(n.io_bps, Some(Bytes(8 * M)));
        assert_eq!(n.io_iops, Some(100));
        let r = n.resolve(&ResolvedLimits::DEFAULT);
        assert_eq!(r.scratch, Bytes(64 * M));
        assert_eq!(r.pids, 10);
        assert_eq!(
            Limits::default().resolve(&ResolvedLimits::default()),
            ResolvedLimits::DEFAULT
        );
    }

    #[test]
    fn io_limits_parse_strictly() {
        assert_eq!(parse_io_bps("--io-bps", "64M"), Ok(Bytes(64 * M)));
        assert!(parse_io_bps("--io-bps", "512K").is_err());
        assert!(parse_io_bps("--io-bps", "-1M").is_err());
        assert_eq!(parse_iops("--io-iops", "4000"), Ok(4000));
        for bad in [
            "",
            "+5",
            "9",
            "1e3",
            "10000001",
            "99999999999999",
            " 100",
            "0x10",
        ] {
            assert!(parse_iops("--io-iops", bad).is_err(), "{bad:?}");
        }
    }

    #[test]
    fn ceilings() {
        let ceiling = ResolvedLimits::DEFAULT.as_limits();
        let ok = Limits {
            mem: mem("128M"),
            ..Limits::default()
        };
        let got = narrow_to_ceiling(&ok, &ceiling).unwrap();
        assert_eq!(got.mem, mem("128M"));
        assert_eq!(got.cpu, Some(Cpus(1000)));

        let too_big = Limits {
            timeout: Some(Duration::from_secs(31)),
            ..Limits::default()
        };
        let err = narrow_to_ceiling(&too_big, &ceiling).unwrap_err();
        assert_eq!(
            err,
            PolicyError::AboveCeiling {
                key: "timeout",
                value: "31s".into(),
                ceiling: "30s".into()
            }
        );
        assert_eq!(err.code(), "above_ceiling");

        let err = narrow_to_ceiling(
            &Limits {
                mem: mem("unlimited"),
                ..Limits::default()
            },
            &ceiling,
        )
        .unwrap_err();
        assert!(err
            .to_string()
            .starts_with("mem = unlimited is above the ceiling of 256M"));

        // No ceiling on a field: the request stands.
        let free = narrow_to_ceiling(&too_big, &Limits::default()).unwrap();
        assert_eq!(free, too_big);
    }
}
