"""Which HTTP/1.1 parser a transport runs: the ``http1_parser`` argument, else the
``HTTPX_BULKHEAD_HTTP1_PARSER`` environment variable, else httptools when it can be
imported, else h11.

Theory of operation
-------------------
httptools (llhttp, C) is several times cheaper per exchange than h11 (pure Python), and the
two give one verdict on every input (``_codec.py``; ``tests/fuzz`` checks it).  So, as
aiohttp does with its C extensions, a transport takes the fast parser when it is installed
and the reference one otherwise.  The rule, decided once per transport, at construction:

1. ``http1_parser="h11"`` or ``"httptools"`` wins: it is the code's explicit wish.
2. Else ``HTTPX_BULKHEAD_HTTP1_PARSER`` (``h11`` or ``httptools``), read when the transport
   is made (not at import, so a test or a service can set it late): the operator's way to
   opt out (or in) without a code change.  An empty value counts as unset (``VAR= cmd``).
3. Else httptools if ``import httptools`` succeeds (a broken install, whose import fails,
   counts as absent), else h11.

What cannot be honoured is refused, never quietly replaced: a value we do not know, or
``httptools`` asked for (argument or variable) when it cannot be imported, is a
``ValueError`` naming where the value came from and the value.

The decision is pure (the environment and the import are passed in), so the rule is tested
without touching the process; ``Choice.source`` says which step decided, for the DEBUG line
the transport logs and for tests.
"""

from __future__ import annotations

import importlib
import logging
import os
from collections.abc import Callable, Mapping
from typing import NamedTuple

from ._codec import PARSERS
from ._log import logger

__all__ = ["ENV_VARIABLE", "Choice", "choose_parser", "httptools_importable", "log_choice"]

#: The environment variable that overrides the automatic choice (``h11`` or ``httptools``).
ENV_VARIABLE = "HTTPX_BULKHEAD_HTTP1_PARSER"
_INSTALL = "pip install 'httpx-bulkhead[fast]'"


class Choice(NamedTuple):
    """The parser a transport runs, and which rule chose it."""

    parser: str  # "h11" or "httptools"
    source: str  # "argument", "environment" or "installed" / "not installed"


def httptools_importable() -> bool:
    """Whether ``import httptools`` succeeds (a cached module after the first time)."""
    try:
        importlib.import_module("httptools")
    except ImportError:
        return False
    return True


def choose_parser(
    argument: str | None,
    environ: Mapping[str, str] | None = None,
    importable: Callable[[], bool] = httptools_importable,
) -> Choice:
    """The HTTP/1.1 parser for a transport given ``http1_parser=argument``.

    Args:
        argument: ``"h11"``, ``"httptools"``, or ``None`` (the default): the variable, else
            httptools when installed, else h11.
        environ: the environment to read ``HTTPX_BULKHEAD_HTTP1_PARSER`` from; ``None``
            (default) means ``os.environ``.
        importable: whether httptools can be imported (tests pass a stand-in).

    Raises:
        ValueError: an unknown value, or ``httptools`` when it cannot be imported; the
            message names ``http1_parser`` or the variable, and the value.
    """
    if argument is not None:
        return Choice(_checked("http1_parser", argument, importable), "argument")
    value = (os.environ if environ is None else environ).get(ENV_VARIABLE, "")
    if value:
        return Choice(_checked(ENV_VARIABLE, value, importable), "environment")
    if importable():
        return Choice("httptools", "installed")
    return Choice("h11", "not installed")


def _checked(field: str, value: object, importable: Callable[[], bool]) -> str:
    if not isinstance(value, str) or value not in PARSERS:
        raise ValueError(f"{field} must be 'h11' or 'httptools', got {value!r}")
    if value == "httptools" and not importable():
        raise ValueError(f"{field}={value!r} needs httptools: {_INSTALL}")
    return value


_WHY = {
    "argument": "http1_parser= given",
    "environment": f"from {ENV_VARIABLE}",
    "installed": f"httptools is installed; {ENV_VARIABLE}=h11 chooses h11",
    "not installed": f"httptools is not installed ({_INSTALL} for the faster parser)",
}


def log_choice(transport: str, choice: Choice) -> None:
    """One DEBUG line saying which parser a new transport runs, and why."""
    if logger.isEnabledFor(logging.DEBUG):
        logger.debug(
            "%s: HTTP/1.1 parser %s (%s)",
            transport,
            choice.parser,
            _WHY[choice.source],
            extra={"compartment": "", "event": "http1_parser", "reason": choice.source},
        )
