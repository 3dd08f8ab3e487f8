# The function the SDKs' live suites call (served as `echo` by sdk/live.sh).
import sys
import time


def handler(event):
    print("hello from echo")
    if isinstance(event, dict):
        if event.get("fail"):
            raise ValueError("asked to fail")
        if event.get("exit"):
            sys.exit(int(event["exit"]))
        if event.get("progress"):
            event.progress("half way")
        if event.get("sleep"):
            time.sleep(float(event["sleep"]))
    return event
