"""The API's routes, for the coverage test: from the OpenAPI document the repository
commits (spec/openapi.json) when it exists, else from sdk/routes.json."""

from __future__ import annotations

import json
import os
from typing import List, Tuple

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", "..", ".."))
OPENAPI = os.path.join(ROOT, "spec", "openapi.json")
FALLBACK = os.path.join(ROOT, "sdk", "routes.json")
METHODS = ("get", "put", "post", "delete", "patch")


def api_routes() -> Tuple[str, List[Tuple[str, str]]]:
    """(where the list came from, [(METHOD, template)]) without GET /metrics (read by a
    metrics scraper) and POST /mcp (MCP's transport, spoken by MCP clients)."""
    if os.path.exists(OPENAPI):
        with open(OPENAPI) as f:
            doc = json.load(f)
        routes = [(m.upper(), p) for p, ops in doc["paths"].items() for m in ops if m in METHODS]
        source = OPENAPI
    else:
        with open(FALLBACK) as f:
            routes = [(m, p) for m, p in json.load(f)["routes"]]
        source = FALLBACK
    return source, [r for r in routes if r not in (("GET", "/metrics"), ("POST", "/mcp"))]
