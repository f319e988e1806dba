"""The transport's threads, told apart from those other tests' transports left behind
(an unclosed transport's timer thread lives until its pool is empty)."""

from __future__ import annotations

import threading

__all__ = ["left_behind", "transport_threads"]


def transport_threads() -> set[threading.Thread]:
    return {t for t in threading.enumerate() if t.name.startswith("httpx_bulkhead")}


def left_behind(before: set[threading.Thread]) -> list[threading.Thread]:
    """Threads of the transport started since ``before`` and still alive (call it once
    ``close()`` has returned)."""
    return [t for t in transport_threads() - before if t.is_alive()]
