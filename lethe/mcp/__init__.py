"""``lethe mcp``: Lethe's memory as Model Context Protocol tools (docs/mcp.md).

An MCP server on the official ``mcp`` SDK, over stdio (a desktop agent starts
it as a command) or streamable HTTP (every request with ``Authorization:
Bearer <Lethe token>``; without a good one, ``401`` before any MCP
processing). It is a client of a running Lethe server, calling it with the
caller's token through :class:`lethe.client.AsyncClient`: it stores nothing
itself, so every guarantee (pending until committed, lineage, forgetting
that reaches descendants and backups, repairs) stays in the one server.

Install the extra: ``pip install 'lethe-store[mcp]'`` (or
``lethe-store-client[mcp]``). Nothing else of ``lethe`` imports this package:
the ``lethe`` command line imports it only when ``lethe mcp`` runs.

=====================  =====================================================
module                 holds
=====================  =====================================================
``_schemas``           :data:`TOOLS`: each tool's name, description (the rules
                       in plain words) and strict JSON Schema; :data:`RULES`
``_tools``             what each tool does with the typed client
                       (:data:`HANDLERS`), :class:`Session`, :class:`Refusal`
``_convert``           Lethe's messages as the tools' JSON answers
``_server``            :func:`build_server` (the SDK's low-level server: the
                       list, argument checks, dispatch, tool errors),
                       :func:`serve_stdio`
``_http``              :func:`serve_http`, :class:`BearerGate` (the 401
                       gate), :class:`Principals` (a client per token)
``_run``               :func:`run_mcp`, ``lethe mcp`` from its flags
=====================  =====================================================

May import: ``mcp`` and what it brings (starlette, uvicorn, anyio,
jsonschema), ``lethe.client``, ``lethe.names``, ``lethe.v1``, the standard
library.
"""

from lethe.mcp._http import BearerGate, Principals, serve_http
from lethe.mcp._run import run_mcp, tls_config
from lethe.mcp._schemas import RULES, TOOLS, ToolSpec
from lethe.mcp._server import build_server, serve_stdio, tool_error
from lethe.mcp._tools import HANDLERS, Refusal, Session

__all__ = [
    "HANDLERS",
    "RULES",
    "TOOLS",
    "BearerGate",
    "Principals",
    "Refusal",
    "Session",
    "ToolSpec",
    "build_server",
    "run_mcp",
    "serve_http",
    "serve_stdio",
    "tls_config",
    "tool_error",
]
