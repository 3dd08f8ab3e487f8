//! The one way Zygo's own processes start a program: a child that shares the parent's
//! memory until it execs (`CLONE_VM | CLONE_VFORK`, as glibc's `posix_spawn` makes it).
//! Nothing of the parent's memory is copied, and the parent waits only until the exec is
//! done or has failed. The monitor starts its launchers this way, and a sandbox's init its
//! program; each brings its own child function, which may make only system calls. The
//! child starts on the parent's CPU (see [`crate::cpu`]) with the parent's affinity.

use std::ffi::{CStr, CString};
use std::io;

use crate::cpu::{pin_here, Pinned};

/// The child's stack: a few system calls, no frames of Rust's own.
const STACK: usize = 64 * 1024;

/// What the child runs first: the affinity given back, then the caller's function.
struct Start<'a> {
    pinned: Option<&'a Pinned>,
    child: extern "C" fn(*mut libc::c_void) -> !,
    arg: *mut libc::c_void,
}

extern "C" fn start(start: *mut libc::c_void) -> libc::c_int {
    // SAFETY: `start` is spawn's Start, alive until spawn returns, which is after this
    // child has exec'd or exited.
    let s = unsafe { &*start.cast::<Start>() };
    if let Some(p) = s.pinned {
        p.restore();
    }
    (s.child)(s.arg)
}

/// Run `child(arg)` in a `CLONE_VM | CLONE_VFORK` child on a stack of its own; return its
/// pid once it has exec'd or exited.
///
/// The child starts on this thread's CPU and restores the affinity before `child` runs;
/// this thread restores its own when the clone returns. Every signal is blocked in this
/// thread from before the clone until then, so that no handler of the parent's runs in
/// the child while it shares this memory (`child` ends in [`Program::exec`], which empties
/// the mask).
///
/// # Safety
/// `child` may only make system calls (no allocation, locks or unwinding) with what `arg`
/// points to, which must stay valid until this returns; it never returns, ending in
/// [`Program::exec`] or [`Program::fail`] (its type says so: a child that returned would
/// pass for one that had exec'd).
pub unsafe fn spawn(
    child: extern "C" fn(*mut libc::c_void) -> !,
    arg: *mut libc::c_void,
) -> io::Result<libc::pid_t> {
    // 16-byte aligned (u128), as the ABI wants a stack; it grows down from the end. Left
    // uninitialised: the child writes before it reads, and only the pages it uses are ever
    // touched (zeroing would fault in all 16).
    let mut stack: Vec<u128> = Vec::with_capacity(STACK / 16);
    // SAFETY: one past the end of the allocation, which the child's stack grows down from.
    let top = unsafe { stack.as_mut_ptr().add(stack.capacity()) }.cast::<libc::c_void>();
    // SAFETY: sigset_t is plain data, initialised by sigfillset before use.
    let mut all: libc::sigset_t = unsafe { std::mem::zeroed() };
    // SAFETY: as above.
    let mut old: libc::sigset_t = unsafe { std::mem::zeroed() };
    // SAFETY: valid sigset_t pointers.
    unsafe {
        libc::sigfillset(&mut all);
        libc::pthread_sigmask(libc::SIG_SETMASK, &all, &mut old);
    }
    let pinned = pin_here();
    let s = Start {
        pinned: pinned.as_ref(),
        child,
        arg,
    };
    // SAFETY: the caller vouches for `child` and `arg`; `start` only restores the affinity
    // (system calls) before calling it; `s` and the stack stay alive until clone returns
    // (CLONE_VFORK: after the child's exec or exit), and nothing else uses the stack.
    let pid = unsafe {
        libc::clone(
            start,
            top,
            libc::CLONE_VM | libc::CLONE_VFORK | libc::SIGCHLD,
            std::ptr::from_ref(&s).cast_mut().cast(),
        )
    };
    // Taken before anything else can overwrite errno.
    let clone_err = io::Error::last_os_error();
    if let Some(p) = &pinned {
        p.restore();
    }
    // SAFETY: restoring the mask saved above.
    unsafe { libc::pthread_sigmask(libc::SIG_SETMASK, &old, std::ptr::null_mut()) };
    drop(stack);
    if pid < 0 {
        return Err(clone_err);
    }
    Ok(pid)
}

/// The program a child made by [`spawn`] execs, ready before the clone (the child may not
/// allocate): its path and the null-terminated argument and environment arrays, pointing
/// into strings that outlive the spawn.
pub struct Program<'a> {
    path: &'a CStr,
    argv: Vec<*const libc::c_char>,
    envp: Vec<*const libc::c_char>,
    /// Set by the child when a step before the exec, or the exec, failed (0: it exec'd).
    pub errno: libc::c_int,
}

impl<'a> Program<'a> {
    pub fn new(path: &'a CStr, argv: &'a [CString], env: &'a [CString]) -> Program<'a> {
        let array = |v: &'a [CString]| {
            v.iter()
                .map(|s| s.as_ptr())
                .chain(std::iter::once(std::ptr::null()))
                .collect()
        };
        Program {
            path,
            argv: array(argv),
            envp: array(env),
            errno: 0,
        }
    }

    /// The child's last step: no signal blocked, then `execve`; if that fails, [`fail`].
    /// Only system calls.
    ///
    /// # Safety
    /// To be called only in a child made by [`spawn`].
    ///
    /// [`fail`]: Program::fail
    pub unsafe fn exec(&mut self) -> ! {
        // SAFETY: system calls on values made ready by `new`; sigset_t is plain data,
        // initialised by sigemptyset before use.
        unsafe {
            let mut none: libc::sigset_t = std::mem::zeroed();
            libc::sigemptyset(&mut none);
            libc::sigprocmask(libc::SIG_SETMASK, &none, std::ptr::null_mut());
            libc::execve(self.path.as_ptr(), self.argv.as_ptr(), self.envp.as_ptr());
            self.fail()
        }
    }

    /// The child's end when a step before the exec (or the exec) failed: the error in
    /// `errno` for the parent, which shares this memory (EIO should the C library not have
    /// set one), and exit 127.
    ///
    /// # Safety
    /// To be called only in a child made by [`spawn`], right after the failed system call.
    pub unsafe fn fail(&mut self) -> ! {
        // SAFETY: reading this thread's errno and exiting: system calls only.
        unsafe {
            self.errno = *libc::__errno_location();
            if self.errno == 0 {
                self.errno = libc::EIO;
            }
            libc::_exit(127)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    extern "C" fn child(arg: *mut libc::c_void) -> ! {
        // SAFETY: `arg` is the test's Program, alive until spawn returns.
        let program = unsafe { &mut *arg.cast::<Program>() };
        // SAFETY: in a child made by spawn.
        unsafe { program.exec() }
    }

    fn run(path: &CStr) -> (libc::c_int, libc::c_int) {
        let argv = [path.to_owned()];
        let mut program = Program::new(path, &argv, &[]);
        // SAFETY: `child` only makes system calls with the program, which outlives the call.
        let pid = unsafe { spawn(child, (&mut program as *mut Program).cast()) }.expect("clone");
        let mut status = 0;
        // SAFETY: waiting for our own child.
        assert_eq!(unsafe { libc::waitpid(pid, &mut status, 0) }, pid);
        (status, program.errno)
    }

    #[test]
    fn the_child_execs_and_the_parent_sees_its_status() {
        let (status, errno) = run(c"/bin/true");
        assert_eq!((status, errno), (0, 0));
    }

    #[test]
    fn a_failed_exec_is_reported_through_the_shared_plan() {
        let (status, errno) = run(c"/nonexistent/zygo-test");
        assert!(libc::WIFEXITED(status) && libc::WEXITSTATUS(status) == 127);
        assert_eq!(errno, libc::ENOENT);
    }
}
