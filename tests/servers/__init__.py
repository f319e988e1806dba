"""Test-server infrastructure: hypercorn runner + instrumented ASGI app, a scripted
raw-socket server for protocol faults, and trustme-based TLS material.

Everything binds to 127.0.0.1 on an ephemeral port and shuts down cleanly.
"""

from .asgi import Gate, HypercornServer, RequestRecord, TestApp
from .raw import (
    RawConn,
    RawServer,
    ServerEvent,
    chunked_garbage,
    close_after_response,
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
    "HypercornServer",
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
    "garbage_status_line",
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
