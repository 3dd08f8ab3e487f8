//! The one seccomp table type, and the one compiler from a table to a classic BPF program.
//!
//! Every seccomp filter Zygo installs is a [`Table`] compiled by [`compile`]: the sandbox's
//! (the launcher holds that policy) and each front's (`zygo-front` holds those). Only the
//! shape and the compiler are shared here; which syscalls a role may make, and why, stays
//! with the role. One compiler means one piece of BPF code generation to review, test and
//! measure, instead of one per role.
//!
//! # A table
//!
//! A table names syscalls, each once, with the reason its role needs it:
//!
//! - [`Allowed`]: allowed always, or only for some argument values ([`When`]);
//! - [`Enosys`]: answered `ENOSYS`, as if the kernel were too old to have it, so that libc
//!   and runtimes take a fallback the table can see into (`clone3` → `clone`);
//! - every other number of this architecture: `EPERM`; or, above
//!   [`Table::reviewed_up_to`] when the table sets it, `ENOSYS` (syscalls newer than the
//!   table's review, and on x86_64 the x32 ABI, whose numbers have bit 30 set);
//! - another architecture (i386 through `int 0x80`, arm32 compat): the process is killed.
//!
//! [`Allowed::reason`] and [`Enosys::reason`] say why the role needs the answer — what it
//! uses the call for, or which fallback the `ENOSYS` buys — not what the call is.
//!
//! # The program
//!
//! After the architecture check, a balanced binary search on the syscall number over runs
//! of numbers with the same answer, described at [`compile`]. It reads an argument only for
//! the numbers whose entry checks one, so the kernel (since Linux 5.11) caches the verdict
//! of every other allowed call and never runs the program for it again.
//!
//! # What this defends against, and what it trusts
//!
//! A table that names a syscall twice, an argument check the code cannot express, or a
//! program over the kernel's limit fails [`build`] (and so the build of a table compiled in
//! a `const`). It trusts the tables: what a role may do is its author's review, not this
//! module's. [`evaluate`] and [`Table::verdict`] let a role's tests check the program
//! against the table it was compiled from.

use std::fmt;
use std::io;

pub use libc::sock_filter;

/// One allowed syscall: its number, when it is allowed, and why the role needs it.
#[derive(Debug, Clone, Copy)]
pub struct Allowed {
    sym: &'static str,
    /// The syscall number on this architecture.
    pub nr: i64,
    /// Unconditionally, or only for some argument values.
    pub when: When,
    /// Why the role needs it: what it uses the call for, not what the call is.
    pub reason: &'static str,
}

impl Allowed {
    /// An entry; [`crate::allow!`] fills in `sym` and `nr` from the syscall's constant.
    ///
    /// # Panics
    ///
    /// On an empty reason (a compile error in a `const` or `static` table).
    pub const fn new(sym: &'static str, nr: i64, when: When, reason: &'static str) -> Allowed {
        assert!(!reason.is_empty(), "a seccomp table entry needs a reason");
        Allowed {
            sym,
            nr,
            when,
            reason,
        }
    }

    /// The syscall's name, e.g. `openat`.
    pub fn name(&self) -> &'static str {
        self.sym.trim_start_matches("SYS_")
    }
}

/// The argument condition of an allowed syscall. Every condition but [`When::Equals`]
/// compares the argument's low 32 bits, which is all the kernel reads of the arguments
/// these tables check (an `int`, `unsigned int`, or for `clone` `lower_32_bits(flags)`), so
/// setting high bits cannot slip past a check.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum When {
    /// Whatever the arguments.
    Always,
    /// When `arg & mask == 0`: none of the bits in `mask` set.
    MaskClear { arg: u8, mask: u32 },
    /// When `arg & mask == mask`: every bit in `mask` set.
    MaskSet { arg: u8, mask: u32 },
    /// When `arg` is one of `values`.
    OneOf { arg: u8, values: &'static [u32] },
    /// When `arg` is none of `values`.
    NoneOf { arg: u8, values: &'static [u32] },
    /// When all 64 bits of `arg` equal `value` (a value known only at run time, such as the
    /// caller's own pid; the high half must be what `value` says too).
    Equals { arg: u8, value: u64 },
    /// When `lo <= arg <= hi` (a range known only at run time, such as a sandbox's ids).
    Between { arg: u8, lo: u32, hi: u32 },
}

/// A syscall answered with `ENOSYS`, as if the kernel were too old to have it.
#[derive(Debug, Clone, Copy)]
pub struct Enosys {
    sym: &'static str,
    /// The syscall number on this architecture.
    pub nr: i64,
    /// Why `ENOSYS` rather than `EPERM`: the fallback it makes callers take.
    pub reason: &'static str,
}

impl Enosys {
    /// An entry; [`crate::enosys!`] fills in `sym` and `nr` from the syscall's constant.
    ///
    /// # Panics
    ///
    /// On an empty reason (a compile error in a `const` or `static` table).
    pub const fn new(sym: &'static str, nr: i64, reason: &'static str) -> Enosys {
        assert!(!reason.is_empty(), "a seccomp table entry needs a reason");
        Enosys { sym, nr, reason }
    }

    /// The syscall's name, e.g. `clone3`.
    pub fn name(&self) -> &'static str {
        self.sym.trim_start_matches("SYS_")
    }
}

/// An [`Allowed`] entry from a syscall's constant (`SYS_read`, in scope where it is used),
/// an optional [`When`], and the reason, which cannot be left out.
///
/// ```
/// use libc::SYS_clone;
/// use plumbing::seccomp::{Allowed, When};
/// const THREADS: Allowed = plumbing::allow!(
///     SYS_clone,
///     When::MaskSet { arg: 0, mask: libc::CLONE_THREAD as u32 },
///     "the front's own threads; never a new process"
/// );
/// assert_eq!(THREADS.name(), "clone");
/// ```
#[macro_export]
macro_rules! allow {
    ($sys:ident, $why:literal) => {
        $crate::allow!($sys, $crate::seccomp::When::Always, $why)
    };
    ($sys:ident, $when:expr, $why:literal) => {
        $crate::seccomp::Allowed::new(stringify!($sys), $sys as i64, $when, $why)
    };
}

/// An [`Enosys`] entry from a syscall's constant (in scope where it is used) and the reason.
#[macro_export]
macro_rules! enosys {
    ($sys:ident, $why:literal) => {
        $crate::seccomp::Enosys::new(stringify!($sys), $sys as i64, $why)
    };
}

/// A role's whole seccomp policy.
#[derive(Debug, Clone, Copy)]
pub struct Table<'a> {
    /// The allowed syscalls.
    pub allowed: &'a [Allowed],
    /// The syscalls answered with `ENOSYS`.
    pub enosys: &'a [Enosys],
    /// The highest syscall number the table was reviewed against: every number above it is
    /// answered `ENOSYS`, so that libc falls back as it would on an older kernel. `None`: a
    /// number the table does not name is refused with `EPERM` however new it is (a table
    /// that allows little needs no review of the syscalls added after it).
    pub reviewed_up_to: Option<i64>,
}

/// Syscall numbers a table may name are below this (the highest today is about 470).
pub const NR_LIMIT: i64 = 1024;

/// `SECCOMP_RET_ALLOW`.
pub const RET_ALLOW: u32 = libc::SECCOMP_RET_ALLOW;
/// The answer for a number a table does not name: fail with `EPERM`.
pub const RET_EPERM: u32 = libc::SECCOMP_RET_ERRNO | libc::EPERM as u32;
/// The answer for [`Enosys`] entries and numbers above [`Table::reviewed_up_to`].
pub const RET_ENOSYS: u32 = libc::SECCOMP_RET_ERRNO | libc::ENOSYS as u32;
/// The answer for another architecture's syscalls.
pub const RET_KILL: u32 = libc::SECCOMP_RET_KILL_PROCESS;

/// This architecture's `AUDIT_ARCH_*` value (include/uapi/linux/audit.h).
#[cfg(target_arch = "x86_64")]
pub const AUDIT_ARCH: u32 = 0xC000_003E;
/// This architecture's `AUDIT_ARCH_*` value (include/uapi/linux/audit.h).
#[cfg(target_arch = "aarch64")]
pub const AUDIT_ARCH: u32 = 0xC000_00B7;

impl Table<'_> {
    /// What the table says for syscall `nr` with `args` on this architecture: one of the
    /// `RET_*` values. The program [`compile`] makes must answer the same ([`evaluate`]).
    pub fn verdict(&self, nr: u32, args: [u64; 6]) -> u32 {
        let nr = i64::from(nr);
        if self.enosys.iter().any(|e| e.nr == nr) {
            return RET_ENOSYS;
        }
        if let Some(entry) = self.allowed.iter().find(|e| e.nr == nr) {
            let whole = |arg: u8| args[usize::from(arg)];
            let low = |arg: u8| whole(arg) as u32;
            let allowed = match entry.when {
                When::Always => true,
                When::MaskClear { arg, mask } => low(arg) & mask == 0,
                When::MaskSet { arg, mask } => low(arg) & mask == mask,
                When::OneOf { arg, values } => values.contains(&low(arg)),
                When::NoneOf { arg, values } => !values.contains(&low(arg)),
                When::Equals { arg, value } => whole(arg) == value,
                When::Between { arg, lo, hi } => (lo..=hi).contains(&low(arg)),
            };
            return if allowed { RET_ALLOW } else { RET_EPERM };
        }
        match self.reviewed_up_to {
            Some(newest) if nr > newest => RET_ENOSYS,
            _ => RET_EPERM,
        }
    }

    /// The first case where `prog` and the table disagree, if any: every number up to ten
    /// past the highest the table names (or reviewed), a few x32 and out-of-range numbers,
    /// each with argument values drawn from the table's checks (every value, its
    /// neighbours, every mask bit, each again with high bits set), and other architectures.
    /// Also checks that `prog` reads an argument exactly for the entries that check one, so
    /// the kernel can cache every other verdict.
    pub fn disagreement(&self, prog: &[sock_filter]) -> Option<String> {
        let highest = self
            .allowed
            .iter()
            .map(|e| e.nr)
            .chain(self.enosys.iter().map(|e| e.nr))
            .chain(self.reviewed_up_to)
            .max()
            .unwrap_or(0);
        let mut numbers: Vec<u32> = (0..=highest as u32 + 10).collect();
        // x32 read and getpid, the largest number, and -1 (what `syscall(-1)` passes).
        numbers.extend([0x4000_0000, 0x4000_0027, 0x7fff_ffff, u32::MAX]);
        let samples = self.sample_args();
        for &nr in &numbers {
            let checks = self
                .allowed
                .iter()
                .any(|e| i64::from(nr) == e.nr && e.when != When::Always);
            for &v in &samples {
                let mut cases = vec![[v; 6]];
                cases.extend((0..6).map(|i| {
                    let mut args = [0; 6];
                    args[i] = v;
                    args
                }));
                for args in cases {
                    let run = evaluate(prog, AUDIT_ARCH, nr, args);
                    let want = self.verdict(nr, args);
                    if run.ret != want {
                        return Some(format!(
                            "syscall {nr} with arguments {args:#x?}: the program answers \
                             {:#x}, the table {want:#x}",
                            run.ret
                        ));
                    }
                    if run.read_args != checks {
                        return Some(format!(
                            "syscall {nr}: the program {} an argument, the table checks {}",
                            if run.read_args {
                                "reads"
                            } else {
                                "does not read"
                            },
                            if checks { "one" } else { "none" },
                        ));
                    }
                }
            }
            for foreign in [0x4000_0003, 0x4000_0028, 0xC000_00B7, 0xC000_003E, 0] {
                if foreign != AUDIT_ARCH && evaluate(prog, foreign, nr, [0; 6]).ret != RET_KILL {
                    return Some(format!(
                        "syscall {nr} of architecture {foreign:#x} is not killed"
                    ));
                }
            }
        }
        None
    }

    /// Argument values worth trying against this table (see [`Table::disagreement`]).
    fn sample_args(&self) -> Vec<u64> {
        let mut low: Vec<u32> = vec![0, 1, 2, 4, 0xff, 0x8000_0000, u32::MAX];
        let mut whole: Vec<u64> = Vec::new();
        for e in self.allowed {
            match e.when {
                When::Always => {}
                When::MaskClear { mask, .. } | When::MaskSet { mask, .. } => {
                    low.extend((0..32).map(|b| 1 << b).filter(|bit| mask & bit != 0));
                    low.extend([mask, !mask, mask | 1, mask & !1]);
                }
                When::OneOf { values, .. } | When::NoneOf { values, .. } => {
                    for &v in values {
                        low.extend([v, v.wrapping_add(1), v.wrapping_sub(1)]);
                    }
                }
                When::Equals { value, .. } => {
                    whole.extend([value, value ^ 1, value ^ 1 << 32, value ^ 1 << 63]);
                    low.extend([value as u32, (value >> 32) as u32]);
                }
                When::Between { lo, hi, .. } => {
                    low.extend([lo, lo.wrapping_sub(1), hi, hi.wrapping_add(1)]);
                }
            }
        }
        low.sort_unstable();
        low.dedup();
        whole.extend(
            low.iter()
                .flat_map(|&v| [u64::from(v), u64::from(v) | 0xdead_beef << 32]),
        );
        whole.sort_unstable();
        whole.dedup();
        whole
    }
}

/// Why a table cannot be compiled.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TableError {
    /// A syscall number is negative, at or above [`NR_LIMIT`], or above the table's
    /// [`Table::reviewed_up_to`].
    OutOfRange { nr: i64 },
    /// The table names a syscall twice (in one list or across both).
    Twice { nr: i64 },
    /// An argument index above 5.
    NoSuchArgument { nr: i64 },
    /// A [`When::OneOf`] or [`When::NoneOf`] lists no values, or more than a jump can skip.
    ValueCount { nr: i64 },
    /// A [`When::Between`] whose `lo` is above its `hi`.
    EmptyRange { nr: i64 },
    /// The program would be longer than the kernel's `BPF_MAXINSNS` instructions.
    TooLong,
}

impl TableError {
    /// What went wrong, as a constant message (for a `const` table's compile error).
    pub const fn message(&self) -> &'static str {
        match self {
            Self::OutOfRange { .. } => {
                "a seccomp table names a syscall number out of range (negative, at or above \
                 NR_LIMIT, or above the table's reviewed_up_to)"
            }
            Self::Twice { .. } => "a seccomp table names a syscall twice",
            Self::NoSuchArgument { .. } => "a seccomp table checks an argument above 5",
            Self::ValueCount { .. } => "a seccomp argument check lists no values, or more than 255",
            Self::EmptyRange { .. } => "a seccomp argument range is empty (lo above hi)",
            Self::TooLong => "the seccomp program is longer than BPF_MAXINSNS",
        }
    }
}

impl fmt::Display for TableError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::OutOfRange { nr }
            | Self::Twice { nr }
            | Self::NoSuchArgument { nr }
            | Self::EmptyRange { nr }
            | Self::ValueCount { nr } => write!(f, "{} (syscall {nr})", self.message()),
            Self::TooLong => f.write_str(self.message()),
        }
    }
}

impl std::error::Error for TableError {}

// Classic BPF opcodes (include/uapi/linux/bpf_common.h). Only these; all but `AND` are ones
// the kernel can also evaluate itself when it builds its always-allow cache at install
// time (and `AND` only follows an argument load, which makes a number uncacheable anyway).
const LD_ABS: u16 = (libc::BPF_LD | libc::BPF_W | libc::BPF_ABS) as u16;
const AND: u16 = (libc::BPF_ALU | libc::BPF_AND | libc::BPF_K) as u16;
const JEQ: u16 = (libc::BPF_JMP | libc::BPF_JEQ | libc::BPF_K) as u16;
const JGE: u16 = (libc::BPF_JMP | libc::BPF_JGE | libc::BPF_K) as u16;
const JGT: u16 = (libc::BPF_JMP | libc::BPF_JGT | libc::BPF_K) as u16;
const JSET: u16 = (libc::BPF_JMP | libc::BPF_JSET | libc::BPF_K) as u16;
const JA: u16 = (libc::BPF_JMP | libc::BPF_JA) as u16;
const RET: u16 = (libc::BPF_RET | libc::BPF_K) as u16;

// Offsets in `struct seccomp_data` (include/uapi/linux/seccomp.h): `int nr; __u32 arch;
// __u64 instruction_pointer; __u64 args[6];`.
const NR: u32 = 0;
const ARCH: u32 = 4;
/// The offset of the low 32 bits of argument `arg`.
const fn arg_low(arg: u8) -> u32 {
    16 + 8 * arg as u32
}
/// The offset of the high 32 bits of argument `arg`.
const fn arg_high(arg: u8) -> u32 {
    arg_low(arg) + 4
}
const _: () = assert!(
    cfg!(target_endian = "little"),
    "arg_low and arg_high assume little-endian"
);

const fn ins(code: u16, jt: u8, jf: u8, k: u32) -> sock_filter {
    sock_filter { code, jt, jf, k }
}

const fn ret(k: u32) -> sock_filter {
    ins(RET, 0, 0, k)
}

/// What the program answers for one syscall number.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Answer {
    /// Return this `SECCOMP_RET_*` value.
    Ret(u32),
    /// Allow when the argument condition holds, `EPERM` otherwise (never `When::Always`).
    Check(When),
}

/// `a == b`, for constant evaluation (where `PartialEq` cannot be called).
const fn same(a: Answer, b: Answer) -> bool {
    const fn same_values(a: &[u32], b: &[u32]) -> bool {
        if a.len() != b.len() {
            return false;
        }
        let mut i = 0;
        while i < a.len() {
            if a[i] != b[i] {
                return false;
            }
            i += 1;
        }
        true
    }
    match (a, b) {
        (Answer::Ret(x), Answer::Ret(y)) => x == y,
        (Answer::Check(When::Always), Answer::Check(When::Always)) => true,
        (
            Answer::Check(When::MaskClear { arg: a1, mask: m1 }),
            Answer::Check(When::MaskClear { arg: a2, mask: m2 }),
        )
        | (
            Answer::Check(When::MaskSet { arg: a1, mask: m1 }),
            Answer::Check(When::MaskSet { arg: a2, mask: m2 }),
        ) => a1 == a2 && m1 == m2,
        (
            Answer::Check(When::OneOf {
                arg: a1,
                values: v1,
            }),
            Answer::Check(When::OneOf {
                arg: a2,
                values: v2,
            }),
        )
        | (
            Answer::Check(When::NoneOf {
                arg: a1,
                values: v1,
            }),
            Answer::Check(When::NoneOf {
                arg: a2,
                values: v2,
            }),
        ) => a1 == a2 && same_values(v1, v2),
        (
            Answer::Check(When::Equals { arg: a1, value: v1 }),
            Answer::Check(When::Equals { arg: a2, value: v2 }),
        ) => a1 == a2 && v1 == v2,
        (
            Answer::Check(When::Between {
                arg: a1,
                lo: l1,
                hi: h1,
            }),
            Answer::Check(When::Between {
                arg: a2,
                lo: l2,
                hi: h2,
            }),
        ) => a1 == a2 && l1 == l2 && h1 == h2,
        _ => false,
    }
}

/// One more than the most runs a table can make: one per number below [`NR_LIMIT`], and the
/// last one above it.
const MAX_RUNS: usize = NR_LIMIT as usize + 1;

/// A table as runs of syscall numbers with the same answer: `(first number, answer)`,
/// ascending from 0, each run ending where the next begins and the last at `u32::MAX`.
/// Neighbouring syscalls tend to share an answer, so there are far fewer runs than numbers.
struct Runs {
    runs: [(u32, Answer); MAX_RUNS],
    len: usize,
}

impl Runs {
    const fn build(table: &Table) -> Result<Runs, TableError> {
        // Below this every number is named or refused; from it on, one answer.
        let end = match table.reviewed_up_to {
            Some(newest) if newest < 0 || newest >= NR_LIMIT => {
                return Err(TableError::OutOfRange { nr: newest })
            }
            Some(newest) => newest as usize + 1,
            None => NR_LIMIT as usize,
        };
        let beyond = match table.reviewed_up_to {
            Some(_) => RET_ENOSYS,
            None => RET_EPERM,
        };
        // The answer for every number below `end`, each table entry placed once: allowed
        // (perhaps for some arguments only), ENOSYS, or EPERM where neither list names it.
        let mut answers: [Option<Answer>; NR_LIMIT as usize] = [None; NR_LIMIT as usize];
        let mut i = 0;
        while i < table.allowed.len() {
            let e = &table.allowed[i];
            let answer = match e.when {
                When::Always => Answer::Ret(RET_ALLOW),
                when => match check_when(e.nr, when) {
                    Ok(()) => Answer::Check(when),
                    Err(err) => return Err(err),
                },
            };
            if let Err(err) = place(&mut answers, end, e.nr, answer) {
                return Err(err);
            }
            i += 1;
        }
        let mut i = 0;
        while i < table.enosys.len() {
            let nr = table.enosys[i].nr;
            if let Err(err) = place(&mut answers, end, nr, Answer::Ret(RET_ENOSYS)) {
                return Err(err);
            }
            i += 1;
        }
        let mut r = Runs {
            runs: [(0, Answer::Ret(0)); MAX_RUNS],
            len: 0,
        };
        let mut nr = 0;
        while nr <= end {
            let answer = if nr == end {
                Answer::Ret(beyond)
            } else {
                match answers[nr] {
                    Some(answer) => answer,
                    None => Answer::Ret(RET_EPERM),
                }
            };
            if r.len == 0 || !same(r.runs[r.len - 1].1, answer) {
                r.runs[r.len] = (nr as u32, answer);
                r.len += 1;
            }
            nr += 1;
        }
        Ok(r)
    }

    const fn as_slice(&self) -> &[(u32, Answer)] {
        self.runs.split_at(self.len).0
    }
}

/// Whether the program can express `when`.
const fn check_when(nr: i64, when: When) -> Result<(), TableError> {
    let (arg, values) = match when {
        When::Always => return Ok(()),
        When::MaskClear { arg, .. } | When::MaskSet { arg, .. } | When::Equals { arg, .. } => {
            (arg, None)
        }
        When::Between { arg, lo, hi } => {
            if lo > hi {
                return Err(TableError::EmptyRange { nr });
            }
            (arg, None)
        }
        When::OneOf { arg, values } | When::NoneOf { arg, values } => (arg, Some(values)),
    };
    if arg > 5 {
        return Err(TableError::NoSuchArgument { nr });
    }
    match values {
        Some(v) if v.is_empty() || v.len() > u8::MAX as usize => Err(TableError::ValueCount { nr }),
        _ => Ok(()),
    }
}

/// Put `answer` for syscall `nr` in `answers`, refusing a number out of range (at or above
/// `end`) or named twice.
const fn place(
    answers: &mut [Option<Answer>; NR_LIMIT as usize],
    end: usize,
    nr: i64,
    answer: Answer,
) -> Result<(), TableError> {
    if nr < 0 || nr as usize >= end {
        return Err(TableError::OutOfRange { nr });
    }
    if answers[nr as usize].is_some() {
        return Err(TableError::Twice { nr });
    }
    answers[nr as usize] = Some(answer);
    Ok(())
}

/// The kernel's limit on a program's length.
const MAX_INS: usize = libc::BPF_MAXINSNS as usize;

/// An instruction with every field zero, to fill arrays with.
const NO_INS: sock_filter = ins(0, 0, 0, 0);

/// A compiled program: at most `BPF_MAXINSNS` instructions.
pub struct Program {
    ins: [sock_filter; MAX_INS],
    len: usize,
}

impl Program {
    const fn new() -> Program {
        Program {
            ins: [NO_INS; MAX_INS],
            len: 0,
        }
    }

    /// The caller has checked the length ([`build`] measures the program first).
    const fn push(&mut self, i: sock_filter) {
        assert!(self.len < MAX_INS, "the program was measured first");
        self.ins[self.len] = i;
        self.len += 1;
    }

    /// How many instructions.
    pub const fn len(&self) -> usize {
        self.len
    }

    /// Never: a program has at least the architecture check.
    pub const fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// The instructions.
    pub fn as_slice(&self) -> &[sock_filter] {
        self.ins.split_at(self.len).0
    }

    /// The instructions as an array of their own length, to keep in a `static` built while
    /// compiling (`static F: [sock_filter; P.len()] = P.to_array();`).
    ///
    /// # Panics
    ///
    /// If `N` is not the program's length.
    pub const fn to_array<const N: usize>(&self) -> [sock_filter; N] {
        assert!(N == self.len, "to_array takes the program's own length");
        let mut out = [NO_INS; N];
        let mut i = 0;
        while i < N {
            let x = &self.ins[i];
            out[i] = ins(x.code, x.jt, x.jf, x.k);
            i += 1;
        }
        out
    }
}

/// The architecture check every program starts with, then the syscall number in A.
const PREFIX_LEN: usize = 4;

/// Compile `table` (see [`compile`]).
pub const fn build(table: &Table) -> Result<Program, TableError> {
    let runs = match Runs::build(table) {
        Ok(r) => r,
        Err(e) => return Err(e),
    };
    let runs = runs.as_slice();
    if PREFIX_LEN + search_len(runs) > MAX_INS {
        return Err(TableError::TooLong);
    }
    let mut code = Program::new();
    code.push(ins(LD_ABS, 0, 0, ARCH));
    code.push(ins(JEQ, 1, 0, AUDIT_ARCH));
    code.push(ret(RET_KILL));
    code.push(ins(LD_ABS, 0, 0, NR));
    search(runs, &mut code);
    Ok(code)
}

/// The BPF program for `table` on this architecture:
///
/// ```text
///   ld  [arch]
///   jeq AUDIT_ARCH, +1       ; our architecture: go on
///   ret KILL_PROCESS
///   ld  [nr]
///   <binary search over the runs of numbers with the same answer>
/// ```
///
/// Every syscall number runs these 4 and about log2(runs) comparisons before its `ret` or
/// argument check: for the sandbox's table (about 85 runs on x86_64) at most 12
/// instructions, or 17 through an argument check, where the linear scan `seccompiler`
/// generated ran up to 581. The kernel also walks the program once per syscall number at
/// install, to find the calls it may allow without running it, so a shorter walk is also a
/// cheaper install.
///
/// A `const fn`: a table known while compiling is compiled with the binary, sparing each
/// process that installs it the work.
///
/// # Panics
///
/// If [`build`] fails: a compile error for a table compiled in a `const`.
pub const fn compile(table: &Table) -> Program {
    match build(table) {
        Ok(p) => p,
        Err(e) => panic!("{}", e.message()),
    }
}

/// How many instructions [`search`] emits for `runs`.
const fn search_len(runs: &[(u32, Answer)]) -> usize {
    if runs.len() == 1 {
        return leaf_len(runs[0].1);
    }
    let (left, right) = runs.split_at(runs.len() / 2);
    let left_len = search_len(left);
    let jump = if left_len <= u8::MAX as usize { 1 } else { 2 };
    jump + left_len + search_len(right)
}

/// A binary search over `runs`, entered with the syscall number in A. Each node splits the
/// runs in half with `jge <first number of the right half>`: true jumps over the left half,
/// false falls into it. Should the left half be longer than a conditional jump's 8-bit offset
/// can skip, true goes to a `ja` (32-bit offset) over it instead. Nothing else jumps far: a
/// leaf is a `ret` or an argument check that ends in its own `ret`s.
const fn search(runs: &[(u32, Answer)], code: &mut Program) {
    assert!(!runs.is_empty(), "the runs cover every number");
    if runs.len() == 1 {
        leaf(runs[0].1, code);
        return;
    }
    let (left, right) = runs.split_at(runs.len() / 2);
    let (left_len, split) = (search_len(left), right[0].0);
    if left_len <= u8::MAX as usize {
        code.push(ins(JGE, left_len as u8, 0, split));
    } else {
        code.push(ins(JGE, 0, 1, split));
        code.push(ins(JA, 0, 0, left_len as u32));
    }
    search(left, code);
    search(right, code);
}

/// How many instructions [`leaf`] emits for `answer`.
const fn leaf_len(answer: Answer) -> usize {
    match answer {
        Answer::Ret(_) | Answer::Check(When::Always) => 1,
        Answer::Check(When::MaskClear { .. }) => 4,
        Answer::Check(When::MaskSet { .. }) => 5,
        Answer::Check(When::OneOf { values, .. }) | Answer::Check(When::NoneOf { values, .. }) => {
            values.len() + 3
        }
        Answer::Check(When::Equals { .. }) => 6,
        Answer::Check(When::Between { .. }) => 5,
    }
}

/// The code for one run's answer.
const fn leaf(answer: Answer, code: &mut Program) {
    match answer {
        Answer::Ret(k) => code.push(ret(k)),
        Answer::Check(When::Always) => code.push(ret(RET_ALLOW)), // Runs never holds this
        Answer::Check(When::MaskClear { arg, mask }) => {
            code.push(ins(LD_ABS, 0, 0, arg_low(arg)));
            code.push(ins(JSET, 1, 0, mask)); // any bit of `mask` set: EPERM
            code.push(ret(RET_ALLOW));
            code.push(ret(RET_EPERM));
        }
        Answer::Check(When::MaskSet { arg, mask }) => {
            code.push(ins(LD_ABS, 0, 0, arg_low(arg)));
            code.push(ins(AND, 0, 0, mask));
            code.push(ins(JEQ, 1, 0, mask)); // every bit of `mask` set: ALLOW
            code.push(ret(RET_EPERM));
            code.push(ret(RET_ALLOW));
        }
        Answer::Check(When::OneOf { arg, values }) => {
            any_of(arg, values, RET_ALLOW, RET_EPERM, code)
        }
        Answer::Check(When::NoneOf { arg, values }) => {
            any_of(arg, values, RET_EPERM, RET_ALLOW, code)
        }
        Answer::Check(When::Equals { arg, value }) => {
            code.push(ins(LD_ABS, 0, 0, arg_low(arg)));
            code.push(ins(JEQ, 0, 2, value as u32)); // low half differs: EPERM
            code.push(ins(LD_ABS, 0, 0, arg_high(arg)));
            code.push(ins(JEQ, 1, 0, (value >> 32) as u32)); // both halves equal: ALLOW
            code.push(ret(RET_EPERM));
            code.push(ret(RET_ALLOW));
        }
        Answer::Check(When::Between { arg, lo, hi }) => {
            code.push(ins(LD_ABS, 0, 0, arg_low(arg)));
            code.push(ins(JGE, 0, 2, lo)); // below `lo`: EPERM
            code.push(ins(JGT, 1, 0, hi)); // above `hi`: EPERM
            code.push(ret(RET_ALLOW));
            code.push(ret(RET_EPERM));
        }
    }
}

/// `hit` when argument `arg` is one of `values`, else `miss`:
///
/// ```text
///   ld  [arg, low half]
///   jeq values[0], →H
///   ...
///   jeq values[n-1], →H
///   ret miss
/// H: ret hit
/// ```
const fn any_of(arg: u8, values: &[u32], hit: u32, miss: u32, code: &mut Program) {
    let n = values.len();
    code.push(ins(LD_ABS, 0, 0, arg_low(arg)));
    let mut i = 0;
    while i < n {
        // From the i-th test, H is past the n - 1 - i tests after it and `ret miss`.
        code.push(ins(JEQ, (n - i) as u8, 0, values[i]));
        i += 1;
    }
    code.push(ret(miss));
    code.push(ret(hit));
}

/// What running a program on one syscall told.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Evaluation {
    /// The `SECCOMP_RET_*` value it returned.
    pub ret: u32,
    /// Whether it read an argument (if not, the kernel caches an `ALLOW`).
    pub read_args: bool,
    /// How many instructions ran.
    pub steps: usize,
}

/// Run `prog` on a syscall in user space, as the kernel would: a classic BPF interpreter
/// for the opcodes [`compile`] emits (and `jgt`). For tests and measurements.
///
/// # Panics
///
/// On any other opcode, a jump out of the program, or a load the kernel would refuse.
pub fn evaluate(prog: &[sock_filter], arch: u32, nr: u32, args: [u64; 6]) -> Evaluation {
    let mut data = [0u8; 64]; // struct seccomp_data, instruction_pointer 0
    data[0..4].copy_from_slice(&nr.to_ne_bytes());
    data[4..8].copy_from_slice(&arch.to_ne_bytes());
    for (i, arg) in args.iter().enumerate() {
        data[16 + 8 * i..24 + 8 * i].copy_from_slice(&arg.to_ne_bytes());
    }
    let (mut a, mut pc, mut read_args) = (0u32, 0usize, false);
    for steps in 1.. {
        let i = &prog[pc];
        pc += 1;
        let jump = |taken: bool| usize::from(if taken { i.jt } else { i.jf });
        match i.code {
            LD_ABS => {
                let k = i.k as usize;
                assert!(k.is_multiple_of(4) && k < data.len(), "load at {k}");
                a = u32::from_ne_bytes([data[k], data[k + 1], data[k + 2], data[k + 3]]);
                read_args |= k >= 16;
            }
            AND => a &= i.k,
            JA => pc += i.k as usize,
            JEQ => pc += jump(a == i.k),
            JGT => pc += jump(a > i.k),
            JGE => pc += jump(a >= i.k),
            JSET => pc += jump(a & i.k != 0),
            RET => {
                return Evaluation {
                    ret: i.k,
                    read_args,
                    steps,
                }
            }
            code => panic!("opcode {code:#x} at {}", pc - 1),
        }
    }
    unreachable!("a program ends in a ret")
}

/// Which threads a filter is installed on.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Threads {
    /// The calling thread (and what it starts afterwards).
    Caller,
    /// Every thread of the process (`SECCOMP_FILTER_FLAG_TSYNC`), for a process that may
    /// already run threads.
    All,
}

/// Why a filter could not be installed.
#[derive(Debug)]
pub enum InstallError {
    /// An empty program, or one longer than `BPF_MAXINSNS`.
    Length(usize),
    /// The kernel refused the filter (`EACCES`: no_new_privs is not set).
    Seccomp(io::Error),
    /// With [`Threads::All`]: this thread could not be synchronised (it runs another filter
    /// or another seccomp mode).
    ThreadSync(libc::c_long),
}

impl fmt::Display for InstallError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Length(n) => write!(f, "a seccomp program of {n} instructions"),
            Self::Seccomp(e) => write!(f, "seccomp(SET_MODE_FILTER): {e}"),
            Self::ThreadSync(tid) => {
                write!(f, "thread {tid} could not take the seccomp filter (TSYNC)")
            }
        }
    }
}

impl std::error::Error for InstallError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match self {
            Self::Seccomp(e) => Some(e),
            _ => None,
        }
    }
}

/// Install `prog` on `threads`. It stays for the life of each thread, and every process
/// they start inherits it; filters only narrow (the strictest verdict of all wins).
///
/// Set no_new_privs first (or hold CAP_SYS_ADMIN), or the kernel refuses with `EACCES`.
/// Makes only the one system call: safe in a forked child of a multithreaded process.
pub fn install(prog: &[sock_filter], threads: Threads) -> Result<(), InstallError> {
    if prog.is_empty() || prog.len() > MAX_INS {
        return Err(InstallError::Length(prog.len()));
    }
    let fprog = libc::sock_fprog {
        len: prog.len() as libc::c_ushort,
        filter: prog.as_ptr().cast_mut(),
    };
    let flags = match threads {
        Threads::Caller => 0,
        Threads::All => libc::SECCOMP_FILTER_FLAG_TSYNC,
    };
    // SAFETY: `fprog` points at `prog`, valid for the call; the kernel copies the program
    // and writes nothing back.
    let r = unsafe {
        libc::syscall(
            libc::SYS_seccomp,
            libc::SECCOMP_SET_MODE_FILTER,
            flags,
            &fprog as *const libc::sock_fprog,
        )
    };
    match r {
        0 => Ok(()),
        r if r < 0 => Err(InstallError::Seccomp(io::Error::last_os_error())),
        // TSYNC's failure: the id of the thread that could not be synchronised.
        tid => Err(InstallError::ThreadSync(tid)),
    }
}

#[allow(clippy::unwrap_used)]
#[cfg(test)]
mod tests {
    use super::*;
    use libc::{
        SYS_clone, SYS_clone3, SYS_exit_group, SYS_getpid, SYS_gettid, SYS_ioctl, SYS_mmap,
    };
    use libc::{SYS_personality, SYS_setfsuid, SYS_socket, SYS_tgkill, SYS_unshare};

    const FAMILIES: &[u32] = &[libc::AF_UNIX as u32, libc::AF_INET as u32];
    const TIOCSTI: &[u32] = &[libc::TIOCSTI as u32];

    /// One entry of every kind.
    #[rustfmt::skip]
    static EVERY_KIND: &[Allowed] = &[
        allow!(SYS_getpid, "the test's own pid"),
        allow!(SYS_unshare, When::MaskClear { arg: 0, mask: libc::CLONE_NEWUSER as u32 },
               "any unshare but a user namespace"),
        allow!(SYS_clone, When::MaskSet { arg: 0, mask: libc::CLONE_THREAD as u32 | 0x3 },
               "threads with the two lowest signal bits set, to test a mask of several bits"),
        allow!(SYS_socket, When::OneOf { arg: 0, values: FAMILIES }, "unix and inet sockets"),
        allow!(SYS_ioctl, When::NoneOf { arg: 1, values: TIOCSTI }, "any ioctl but TIOCSTI"),
        allow!(SYS_personality, When::Equals { arg: 0, value: 0x1_0000_0008 },
               "one value with both halves set"),
        allow!(SYS_setfsuid, When::Between { arg: 0, lo: 1000, hi: 1999 },
               "a range of ids"),
    ];
    static CLONE3: &[Enosys] = &[enosys!(SYS_clone3, "callers fall back to clone")];

    const EVERY_KIND_TABLE: Table = Table {
        allowed: EVERY_KIND,
        enosys: CLONE3,
        reviewed_up_to: None,
    };
    /// Compiled with the test binary: a bad table would not build.
    const EVERY_KIND_PROGRAM: Program = compile(&EVERY_KIND_TABLE);

    #[test]
    fn every_kind_of_rule_compiles_to_what_the_table_says() {
        let prog = EVERY_KIND_PROGRAM.as_slice();
        assert_eq!(EVERY_KIND_TABLE.disagreement(prog), None);
        let reviewed = Table {
            reviewed_up_to: Some(SYS_clone3 + 1),
            ..EVERY_KIND_TABLE
        };
        assert_eq!(reviewed.disagreement(compile(&reviewed).as_slice()), None);
    }

    #[test]
    fn a_program_kept_in_a_static_is_the_program() {
        static KEPT: [sock_filter; EVERY_KIND_PROGRAM.len()] = EVERY_KIND_PROGRAM.to_array();
        let built = build(&EVERY_KIND_TABLE).unwrap();
        let fields =
            |p: &[sock_filter]| -> Vec<_> { p.iter().map(|i| (i.code, i.jt, i.jf, i.k)).collect() };
        assert_eq!(fields(&KEPT), fields(built.as_slice()));
    }

    #[test]
    fn argument_rules_answer_as_documented() {
        let prog = EVERY_KIND_PROGRAM.as_slice();
        let ask = |nr: i64, args: [u64; 6]| evaluate(prog, AUDIT_ARCH, nr as u32, args).ret;
        let thread = u64::from(libc::CLONE_THREAD as u32 | 0x3);
        assert_eq!(ask(SYS_clone, [thread, 0, 0, 0, 0, 0]), RET_ALLOW);
        assert_eq!(ask(SYS_clone, [thread & !1, 0, 0, 0, 0, 0]), RET_EPERM);
        assert_eq!(ask(SYS_clone, [thread | 1 << 40, 0, 0, 0, 0, 0]), RET_ALLOW);
        let newuser = libc::CLONE_NEWUSER as u64;
        assert_eq!(ask(SYS_unshare, [newuser | 8, 0, 0, 0, 0, 0]), RET_EPERM);
        assert_eq!(ask(SYS_unshare, [newuser << 32, 0, 0, 0, 0, 0]), RET_ALLOW);
        assert_eq!(
            ask(SYS_personality, [0x1_0000_0008, 0, 0, 0, 0, 0]),
            RET_ALLOW
        );
        assert_eq!(ask(SYS_personality, [0x8, 0, 0, 0, 0, 0]), RET_EPERM);
        assert_eq!(
            ask(SYS_personality, [0x1_0000_0009, 0, 0, 0, 0, 0]),
            RET_EPERM
        );
        assert_eq!(ask(SYS_ioctl, [0, libc::TIOCSTI, 0, 0, 0, 0]), RET_EPERM);
        assert_eq!(ask(SYS_ioctl, [0, libc::FIONREAD, 0, 0, 0, 0]), RET_ALLOW);
        for (id, ret) in [
            (999, RET_EPERM),
            (1000, RET_ALLOW),
            (1999, RET_ALLOW),
            (2000, RET_EPERM),
            (0, RET_EPERM),
            (u64::from(u32::MAX), RET_EPERM),
            (1 << 32 | 1500, RET_ALLOW),
        ] {
            assert_eq!(ask(SYS_setfsuid, [id, 0, 0, 0, 0, 0]), ret, "{id}");
        }
        assert_eq!(ask(SYS_clone3, [0; 6]), RET_ENOSYS);
        assert_eq!(ask(SYS_mmap, [0; 6]), RET_EPERM);
        assert_eq!(ask(0x4000_0027, [0; 6]), RET_EPERM);
        assert_eq!(evaluate(prog, 0x4000_0003, 20, [0; 6]).ret, RET_KILL);
    }

    #[test]
    fn numbers_above_the_review_are_enosys_and_the_rest_eperm() {
        let table = Table {
            allowed: &[allow!(SYS_getpid, "the test's own pid")],
            enosys: &[],
            reviewed_up_to: Some(100),
        };
        let prog = compile(&table);
        let ask = |nr: u32| evaluate(prog.as_slice(), AUDIT_ARCH, nr, [0; 6]).ret;
        assert_eq!(ask(SYS_getpid as u32), RET_ALLOW);
        assert_eq!(
            (ask(100), ask(101), ask(u32::MAX)),
            (RET_EPERM, RET_ENOSYS, RET_ENOSYS)
        );
        // Runs: [0, getpid) EPERM, getpid ALLOW, (getpid, 100] EPERM, 101.. ENOSYS.
        assert_eq!(prog.len(), PREFIX_LEN + 3 + 4);
    }

    #[test]
    fn bad_tables_are_refused() {
        let one = |nr: i64, when: When| Allowed::new("SYS_x", nr, when, "a test");
        let try_build = |allowed: &[Allowed], enosys: &[Enosys], reviewed_up_to| {
            build(&Table {
                allowed,
                enosys,
                reviewed_up_to,
            })
            .err()
        };
        let always = When::Always;
        assert_eq!(
            try_build(&[one(3, always), one(3, always)], &[], None),
            Some(TableError::Twice { nr: 3 })
        );
        let enosys = [Enosys::new("SYS_x", 3, "a test")];
        assert_eq!(
            try_build(&[one(3, always)], &enosys, None),
            Some(TableError::Twice { nr: 3 })
        );
        assert_eq!(
            try_build(&[one(-1, always)], &[], None),
            Some(TableError::OutOfRange { nr: -1 })
        );
        assert_eq!(
            try_build(
                &[one(
                    3,
                    When::Between {
                        arg: 0,
                        lo: 2,
                        hi: 1
                    }
                )],
                &[],
                None
            ),
            Some(TableError::EmptyRange { nr: 3 })
        );
        assert_eq!(
            try_build(&[one(NR_LIMIT, always)], &[], None),
            Some(TableError::OutOfRange { nr: NR_LIMIT })
        );
        assert_eq!(
            try_build(&[one(11, always)], &[], Some(10)),
            Some(TableError::OutOfRange { nr: 11 })
        );
        assert_eq!(
            try_build(&[], &[], Some(NR_LIMIT)),
            Some(TableError::OutOfRange { nr: NR_LIMIT })
        );
        let arg6 = When::MaskClear { arg: 6, mask: 1 };
        assert_eq!(
            try_build(&[one(1, arg6)], &[], None),
            Some(TableError::NoSuchArgument { nr: 1 })
        );
        let none = When::OneOf {
            arg: 0,
            values: &[],
        };
        assert_eq!(
            try_build(&[one(1, none)], &[], None),
            Some(TableError::ValueCount { nr: 1 })
        );
        static MANY: [u32; 256] = [7; 256];
        let many = When::NoneOf {
            arg: 0,
            values: &MANY,
        };
        assert_eq!(
            try_build(&[one(1, many)], &[], None),
            Some(TableError::ValueCount { nr: 1 })
        );
        // 20 checks of 255 values each (258 instructions apiece) are over 4096.
        let long: Vec<Allowed> = (0..20)
            .map(|nr| {
                one(
                    2 * nr,
                    When::OneOf {
                        arg: 0,
                        values: &MANY[..255],
                    },
                )
            })
            .collect();
        assert_eq!(try_build(&long, &[], None), Some(TableError::TooLong));
    }

    /// Far jumps: a tree with more leaves than a conditional jump can skip still evaluates
    /// correctly (the `ja` fallback in `search`).
    #[test]
    fn search_handles_long_jumps() {
        let runs: Vec<(u32, Answer)> = (0..2000)
            .map(|i| (i, Answer::Ret(i)))
            .chain([(2000, Answer::Check(When::MaskClear { arg: 0, mask: 1 }))])
            .collect();
        let mut code = Program::new();
        code.push(ins(LD_ABS, 0, 0, NR));
        search(&runs, &mut code);
        let prog = code.as_slice();
        assert_eq!(prog.len(), 1 + search_len(&runs));
        assert!(prog.iter().any(|i| i.code == JA));
        for nr in 0..2000 {
            assert_eq!(evaluate(prog, 0, nr, [0; 6]).ret, nr);
        }
        assert_eq!(evaluate(prog, 0, 5000, [0; 6]).ret, RET_ALLOW);
        assert_eq!(evaluate(prog, 0, 5000, [1; 6]).ret, RET_EPERM);
    }

    fn errno() -> i32 {
        io::Error::last_os_error().raw_os_error().unwrap_or(0)
    }

    /// In a forked child: the program for a table of the child's own pid (getpid and
    /// exit_group allowed, clone for threads only, tgkill only at the child itself, gettid
    /// refused, clone3 ENOSYS), installed on `threads` after no_new_privs; then
    /// [`checks`]. Returns the wait status.
    fn in_filtered_child(threads: Threads) -> i32 {
        // SAFETY: the child makes only system calls (compiling allocates nothing), then
        // _exits.
        let pid = unsafe { libc::fork() };
        assert!(pid >= 0, "fork: {}", io::Error::last_os_error());
        if pid == 0 {
            // SAFETY: getpid takes nothing.
            let me = unsafe { libc::getpid() };
            let allowed = [
                allow!(SYS_getpid, "the test's own pid"),
                allow!(
                    SYS_tgkill,
                    When::Equals {
                        arg: 0,
                        value: me as u64
                    },
                    "signals to the test's own threads only"
                ),
                allow!(SYS_exit_group, "the child's _exit"),
                allow!(
                    SYS_clone,
                    When::MaskSet {
                        arg: 0,
                        mask: libc::CLONE_THREAD as u32
                    },
                    "threads only, to see the kernel take an AND"
                ),
            ];
            let prog = compile(&Table {
                allowed: &allowed,
                enosys: CLONE3,
                reviewed_up_to: None,
            });
            // SAFETY: plain prctl in our own process.
            let code = if unsafe { libc::prctl(libc::PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) } != 0 {
                201
            } else if install(prog.as_slice(), threads).is_err() {
                202
            } else {
                checks(me)
            };
            // SAFETY: leave the child without running the parent's destructors or atexit.
            unsafe { libc::_exit(code) };
        }
        let mut status = 0;
        // SAFETY: reaping our own child into a local.
        assert_eq!(unsafe { libc::waitpid(pid, &mut status, 0) }, pid);
        status
    }

    /// What `in_filtered_child`'s table allows and refuses: 0 if all is as it says.
    fn checks(me: libc::pid_t) -> i32 {
        let me = libc::c_long::from(me);
        // SAFETY: raw system calls with integer arguments; signal 0 only checks.
        unsafe {
            if libc::syscall(SYS_getpid) != me {
                return 1;
            }
            if libc::syscall(SYS_gettid) != -1 || errno() != libc::EPERM {
                return 2;
            }
            if libc::syscall(SYS_clone3, 0, 0) != -1 || errno() != libc::ENOSYS {
                return 3;
            }
            if libc::syscall(SYS_tgkill, me, me, 0) != 0 {
                return 4;
            }
            if libc::syscall(SYS_tgkill, 1, 1, 0) != -1 || errno() != libc::EPERM {
                return 5;
            }
            // A new process: clone without CLONE_THREAD.
            match libc::syscall(SYS_clone, libc::SIGCHLD, 0, 0, 0, 0) {
                0 => libc::_exit(0),
                r if r != -1 || errno() != libc::EPERM => return 7,
                _ => {}
            }
            let high = me | 1 << 32;
            if libc::syscall(SYS_tgkill, high, me, 0) != -1 || errno() != libc::EPERM {
                return 6;
            }
        }
        0
    }

    #[test]
    fn an_installed_program_answers_as_its_table_says() {
        for threads in [Threads::Caller, Threads::All] {
            let status = in_filtered_child(threads);
            assert!(
                libc::WIFEXITED(status) && libc::WEXITSTATUS(status) == 0,
                "{threads:?}: status {status:#x}"
            );
        }
    }

    #[test]
    fn install_refuses_an_empty_program() {
        assert!(matches!(
            install(&[], Threads::Caller),
            Err(InstallError::Length(0))
        ));
    }
}
