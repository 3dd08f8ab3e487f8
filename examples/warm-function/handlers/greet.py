"""A warm Python function: imported once, then forked for each request."""

import os
import time

# Work done here (imports, loading a model) is done once, before the first request.
STARTED = time.time()
GREETING = os.environ.get("GREETING", "hello")


def handler(event):
    name = event.get("name", "world") if isinstance(event, dict) else "world"
    event.progress(f"greeting {name}")
    print(f"greeting {name}")  # the handler's output comes back beside its value
    return {"message": f"{GREETING}, {name}", "warm_for_s": round(time.time() - STARTED, 3)}
