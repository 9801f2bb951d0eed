"""The client side of Lethe: everything that knows only the public API.

Importable without the server: no module here imports ``server``,
``shredder`` or ``index`` (nor LMDB, PyNaCl, FAISS, bm25s or WordLlama at
import time); ``tests/lethe/test_lethe_imports.py`` checks it in a clean
interpreter. Modules import only grpc, protobuf, grpc-status
(googleapis-common-protos), the ``grpc.health.v1`` stubs, the standard
library and this package, except ``lethe.langgraph`` (``langgraph-checkpoint``,
the optional extra), ``lethe.mcp`` (the ``mcp`` SDK and what it brings:
starlette, uvicorn, anyio, jsonschema; the ``mcp`` extra. Nothing else here
imports it, and ``lethe mcp`` imports it only when it runs) and
``lethe.receipts``, whose offline check of a receipt's signature imports
PyNaCl when called (the ``verify`` extra). The demo alone
reaches further, inside the functions that need it: ``tqdm`` for its progress
bars, and ``numpy``, ``faiss`` and ``wordllama`` for its latency floors.
``clients/python/`` in the repository builds this package alone as the light
client distribution ``lethe-store-client``.

=====================  =====================================================
module                 what it holds (public names)
=====================  =====================================================
``lethe.v1``           the generated protobuf and gRPC code of ``proto/lethe/v1``
                       (``scripts/gen_protos.py``; never edited by hand)
``lethe.errors.v1``    the generated ``ErrorReason`` enum of
                       ``proto/lethe/errors/v1/errors.proto`` (likewise)
``lethe.names``        the grammar of resource names: ``parse_*``, ``check_id``,
                       ``ID_RE``, the ``*Name`` value types, ``InvalidName``
``lethe.client``       the typed client: ``Client``, ``AsyncClient``, the typed
                       errors (``LetheError`` and a class per code and reason),
                       ``TLSConfig``, ``RetryPolicy``; the way the project's
                       own tools, benchmarks and tests call the API
``lethe.langgraph``    ``LetheStore``, LangGraph's ``BaseStore`` on Lethe
                       memories (needs the ``langgraph`` extra:
                       ``langgraph-checkpoint``)
``lethe.mcp``          ``lethe mcp``, the MCP server over the typed client:
                       ``build_server``, ``serve_stdio``, ``serve_http``,
                       ``run_mcp``, the tools (``TOOLS``, ``HANDLERS``); needs
                       the ``mcp`` extra
``lethe._rpc``         the wire under ``lethe.client``: ``Stubs`` (channel,
                       bearer metadata, a stub per service), ``reason_of``,
                       ``error_info``, ``bad_fields``, ``DOMAIN``, ``Metadata``
``lethe._status``      the one decoder of a failed call's ``google.rpc.Status``
                       details (``status_details``) and the ``ErrorInfo``
                       domain ``DOMAIN`` (the server imports it from here)
``lethe.locomo``       the LoCoMo loader: ``Conversation``, ``load_locomo``,
                       ``find_locomo``, ``sample_conversation``,
                       ``normalise_evidence``, ``session_of``
``lethe.probe``        ``lethe probe``: ``probe``, ``run_probe``,
                       ``add_probe_arguments``, ``STAGES``, ``DEFAULT_OWNER``,
                       ``summarise``
``lethe.demo``         ``lethe demo``: ``run_demo``; it runs ``lethe serve``,
                       ``token create``, ``backup`` and ``restore`` as child
                       processes
``lethe.receipts``     signed deletion receipts: ``signed_bytes`` (what a store
                       signs), ``verify_receipt``, ``read_receipts``,
                       ``read_public_keys``, ``key_id``, ``InvalidReceipt``
``lethe.remote``       the work of the command line run against a server
                       (``lethe forget``, ``export``, ``audit --target``,
                       ``receipt``): ``connect``, ``forget``, ``audit``,
                       ``verify_files``, the ``--json`` documents
=====================  =====================================================

The package itself exports no names: import the module you need.
"""

__all__: list[str] = []
