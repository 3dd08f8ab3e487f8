"""Handlers for tests/tests/cli_output.rs: text with terminal escapes and other control
characters, on every way a handler's text reaches the operator (stdout, stderr, progress,
the result, an error and its traceback)."""

import sys

# A window title set (OSC ... BEL), the screen cleared (CSI 2J), a C1 CSI (U+009B), DEL,
# a carriage return that would overwrite the line, a backspace and a bare BEL.
NASTY = ("title\x1b]0;owned\x07 clear\x1b[2J c1\u009b31m del\x7f "
         "cr\rfake bs\x08 bell\x07 end")


def noisy(event):
    print("out " + NASTY, flush=True)
    print("err " + NASTY, file=sys.stderr, flush=True)
    event.progress("progress " + NASTY)
    return {"value": NASTY}


def raising(event):
    print("out " + NASTY)
    print("err " + NASTY, file=sys.stderr)
    raise ValueError("error " + NASTY)
