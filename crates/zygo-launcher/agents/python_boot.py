"""Run a Python program as __main__ without compiling it in this process.

    /usr/bin/python3 -I /run/zygo/python_boot.py PROGRAM ARGS...

runs PROGRAM with sys.argv = [PROGRAM, ARGS...], like `python3 -I PROGRAM ARGS...`, except
that PROGRAM is compiled in a short-lived fork and only its code object comes back
(marshalled, over a pipe). Python's compiler leaves megabytes of freed scratch memory in
the process that ran it, fragmented so that it is never returned to the kernel; in a
zygote, every page of it would be copied into each request's fork and torn down again when
that fork exits. Compiled elsewhere, the agent process holds only the code itself.

If the fork or the compile fails, PROGRAM is compiled here instead (the error, if any, is
then raised the usual way). The program can compile other sources the same way: this module
stays importable as `python_boot` (the agent loads its handler's module with it).
"""

import marshal
import os
import sys


def compile_in_fork(source, path):
    """`compile(source, path, "exec")`, done in a fork."""
    try:
        r, w = os.pipe()
        pid = os.fork()
    except OSError:
        return compile(source, path, "exec")
    if pid == 0:
        code = 1
        try:
            os.close(r)
            data = memoryview(marshal.dumps(compile(source, path, "exec")))
            while data:
                data = data[os.write(w, data):]
            code = 0
        finally:
            os._exit(code)
    os.close(w)
    chunks = []
    while chunk := os.read(r, 1 << 16):
        chunks.append(chunk)
    os.close(r)
    _, status = os.waitpid(pid, 0)
    if status != 0:
        return compile(source, path, "exec")
    return marshal.loads(b"".join(chunks))


def compiled(path):
    with open(path, "rb") as f:
        return compile_in_fork(f.read(), path)


def main():
    if len(sys.argv) < 2:
        sys.stderr.write("usage: python_boot.py PROGRAM ARGS...\n")
        sys.exit(2)
    path = sys.argv[1]
    code = compiled(path)
    sys.argv = sys.argv[1:]
    module = type(sys)("__main__")
    module.__file__ = path
    module.__builtins__ = __builtins__
    sys.modules["python_boot"] = sys.modules[__name__]
    sys.modules["__main__"] = module
    exec(code, module.__dict__)


if __name__ == "__main__":
    main()
