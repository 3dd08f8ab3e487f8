"""Drive `zygo api`'s /mcp with the official Python SDK's Streamable HTTP client.

Usage: py_http_client.py URL TOKEN FUNCTION
Prints one JSON object: the negotiated revision, the tool names, list_functions' names,
and call_function's structured result for FUNCTION with the event {"via": "http"}.
"""

import asyncio
import json
import sys

from mcp import ClientSession
from mcp.client.streamable_http import streamablehttp_client


async def main(url, token, function):
    headers = {"Authorization": f"Bearer {token}"}
    async with streamablehttp_client(url, headers=headers) as (read, write, _):
        async with ClientSession(read, write) as session:
            init = await session.initialize()
            tools = await session.list_tools()
            listed = await session.call_tool("list_functions", {})
            called = await session.call_tool(
                "call_function", {"name": function, "event": {"via": "http"}}
            )
            print(
                json.dumps(
                    {
                        "revision": init.protocolVersion,
                        "tools": [t.name for t in tools.tools],
                        "functions": [
                            f["name"] for f in listed.structuredContent["functions"]
                        ],
                        "called": called.structuredContent,
                        "called_is_error": called.isError,
                    }
                )
            )


asyncio.run(main(*sys.argv[1:4]))
