"""Test-server infrastructure: hypercorn runner + instrumented ASGI app, a scripted
raw-socket server for protocol faults, a scripted HTTP/2 server (``h2script``), a Node.js
``http2`` server (``NodeH2Server``), and trustme-based TLS material.

Everything binds to 127.0.0.1 on an ephemeral port and shuts down cleanly.
"""

from . import h2script
from .asgi import Gate, HypercornServer, RequestRecord, TestApp
from .h2script import H2ConnStats, H2Reset, H2ScriptServer, H2Stream
from .node import NodeH2Server, NodeStats
from .raw import (
    RawConn,
    RawServer,
    ServerEvent,
    chunked_garbage,
    close_after_response,
    extra_response_in_next_record,
    extra_response_while_idle,
    garbage_status_line,
    huge_headers,
    keepalive_header,
    keepalive_ok,
    late_response,
    never_answer,
    no_length_keep_alive,
    request_path,
    reset_after_headers,
    reset_mid_body,
    response_bytes,
    run_blocking,
    slowloris,
    truncated_body,
)
from .tls import (
    PemFiles,
    ServerTLS,
    default_server_tls,
    session_ca,
    untrusted_server_tls,
    wrong_host_server_tls,
)

__all__ = [
    "Gate",
    "H2ConnStats",
    "H2Reset",
    "H2ScriptServer",
    "H2Stream",
    "HypercornServer",
    "NodeH2Server",
    "NodeStats",
    "PemFiles",
    "RawConn",
    "RawServer",
    "RequestRecord",
    "ServerEvent",
    "ServerTLS",
    "TestApp",
    "chunked_garbage",
    "close_after_response",
    "default_server_tls",
    "extra_response_in_next_record",
    "extra_response_while_idle",
    "garbage_status_line",
    "h2script",
    "huge_headers",
    "keepalive_header",
    "keepalive_ok",
    "late_response",
    "never_answer",
    "no_length_keep_alive",
    "request_path",
    "reset_after_headers",
    "reset_mid_body",
    "response_bytes",
    "run_blocking",
    "session_ca",
    "slowloris",
    "truncated_body",
    "untrusted_server_tls",
    "wrong_host_server_tls",
]
