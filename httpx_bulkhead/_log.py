"""The library's one logger, ``logging.getLogger("httpx_bulkhead")``, and what it says.

Levels:

* DEBUG, one line per event a person tuning the bulkheads wants to see: a transport made
  (which HTTP/1.1 parser it runs, and why: ``_parser_choice.py``), a rejection
  (``BulkheadFull``), an acquire timeout, a compartment evicted, a connection closed (with
  its reason), an HTTP/2 replay, a stale keep-alive retry, the transport handed over
  to another event loop.
* WARNING, only for what a person must act on: a slot held past ``Policy.leak_threshold``
  (and, later, its release), and an HTTP/2 server refusing a stream below the stream cap it
  advertised.
* Nothing at INFO, nor anything at all for a request that simply succeeds.

One child logger, ``httpx_bulkhead.adaptive``, says at DEBUG why an adaptive limit changed
(``log_limit``: the limit before and after, and the algorithm's reason).  It has a logger of
its own because it is the one frequent line that is not about a request (a few a second at
a busy compartment, every window of a sawtooth): a person can turn on the decisions
without every rejection (``logging.getLogger("httpx_bulkhead.adaptive").setLevel(DEBUG)``),
and the parent's DEBUG turns on both.

Every record carries ``compartment`` (empty for the transport's own line) and ``event``
(and ``reason`` where there is one) as ``extra`` attributes, for structured handlers; the
message says the same in words.

Cost: the events on paths that are not error paths (a connection closed, an eviction) are
guarded by ``debug()``, one ``isEnabledFor`` check, so a logger at WARNING costs no
formatting and no allocation there.
"""

from __future__ import annotations

import logging

__all__ = ["LOGGER_NAME", "debug", "log_debug", "log_limit", "log_warning", "logger"]

LOGGER_NAME = "httpx_bulkhead"
logger = logging.getLogger(LOGGER_NAME)
adaptive_logger = logging.getLogger(LOGGER_NAME + ".adaptive")

_DEBUG = logging.DEBUG
_enabled = logger.isEnabledFor


def debug() -> bool:
    """Whether DEBUG records of this logger go anywhere (guard the call sites with it)."""
    return _enabled(_DEBUG)


def log_debug(event: str, compartment: str, message: str, *args: object, reason: str = "") -> None:
    """A DEBUG record for ``event`` in ``compartment`` (``message % args``)."""
    if _enabled(_DEBUG):
        extra = {"compartment": compartment, "event": event, "reason": reason}
        logger.debug("compartment %r: " + message, compartment, *args, extra=extra)


def log_warning(
    event: str, compartment: str, message: str, *args: object, reason: str = ""
) -> None:
    """A WARNING record for ``event`` in ``compartment`` (``message % args``)."""
    extra = {"compartment": compartment, "event": event, "reason": reason}
    logger.warning("compartment %r: " + message, compartment, *args, extra=extra)


def log_limit(compartment: str, previous: int, limit: int, reason: str, detail: str) -> None:
    """A DEBUG record on ``httpx_bulkhead.adaptive``: the adaptive limit of ``compartment``
    went from ``previous`` to ``limit`` for ``reason`` (a code, see ``_adaptive.py``),
    ``detail`` in words; ``previous``, ``limit`` and ``detail`` are ``extra`` attributes too."""
    if adaptive_logger.isEnabledFor(_DEBUG):
        extra = {
            "compartment": compartment,
            "event": "limit",
            "reason": reason,
            "previous": previous,
            "limit": limit,
            "detail": detail,
        }
        adaptive_logger.debug(
            "compartment %r: adaptive limit %d -> %d (%s: %s)",
            compartment,
            previous,
            limit,
            reason,
            detail,
            extra=extra,
        )
