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
3. Else httptools if it can be imported and is at least ``MIN_HTTPTOOLS`` (the ``[fast]``
   extra's floor: the differential tests hold from there; httptools 0.5's llhttp, for
   one, leaves obs-fold unfolded), else h11.  A broken install counts as absent; an older
   httptools, often installed by another package (``uvicorn[standard]``), is left alone.

What cannot be honoured is refused, never quietly replaced: a value we do not know, or
``httptools`` asked for (argument or variable) when it cannot be imported or is older than
``MIN_HTTPTOOLS``, is a ``ValueError`` naming where the value came from and the value.

The decision is pure (the environment and httptools' state are passed in), so the rule is
tested without touching the process; ``Choice.source`` says which step decided, for the DEBUG line
the transport logs and for tests.
"""

from __future__ import annotations

import importlib
import logging
import os
import re
from collections.abc import Callable, Mapping
from typing import NamedTuple

from ._codec import PARSERS
from ._log import logger

__all__ = [
    "ENV_VARIABLE",
    "MIN_HTTPTOOLS",
    "Choice",
    "choose_parser",
    "httptools_unusable",
    "log_choice",
]

#: The environment variable that overrides the automatic choice (``h11`` or ``httptools``).
ENV_VARIABLE = "HTTPX_BULKHEAD_HTTP1_PARSER"
#: The oldest httptools used (``pyproject.toml``'s ``fast`` extra says the same).
MIN_HTTPTOOLS = (0, 6)
_NEEDS = f"needs httptools>={MIN_HTTPTOOLS[0]}.{MIN_HTTPTOOLS[1]}"
_INSTALL = "pip install 'httpx-bulkhead[fast]'"


class Choice(NamedTuple):
    """The parser a transport runs, and which rule chose it."""

    parser: str  # "h11" or "httptools"
    source: str  # "argument", "environment", "installed", or why httptools is not usable


def httptools_unusable() -> str | None:
    """``None`` if httptools can be used, else why not: ``"not installed"`` (its import
    fails), ``"its import fails: RuntimeError"`` (a broken install counts as absent),
    ``"0.5.0 is installed"`` (older than ``MIN_HTTPTOOLS``, or no version) or ``"it has no
    HttpResponseParser"``."""
    try:
        module = importlib.import_module("httptools")
    except ImportError:
        return "not installed"
    except Exception as exc:  # a broken install counts as absent: h11 is always there
        return f"its import fails: {type(exc).__name__}"
    version = str(getattr(module, "__version__", "?"))
    numbers = tuple(int(n) for n in re.findall(r"\d+", version)[:2])
    if numbers < MIN_HTTPTOOLS:
        return f"{version} is installed"
    if not callable(getattr(module, "HttpResponseParser", None)):
        return "it has no HttpResponseParser"  # (all the codec uses of it)
    return None


def choose_parser(
    argument: str | None,
    environ: Mapping[str, str] | None = None,
    unusable: Callable[[], str | None] = httptools_unusable,
) -> Choice:
    """The HTTP/1.1 parser for a transport given ``http1_parser=argument``.

    Args:
        argument: ``"h11"``, ``"httptools"``, or ``None`` (the default): the variable, else
            httptools when installed (``MIN_HTTPTOOLS`` or later), else h11.
        environ: the environment to read ``HTTPX_BULKHEAD_HTTP1_PARSER`` from; ``None``
            (default) means ``os.environ``.
        unusable: why httptools cannot be used, or ``None`` (tests pass a stand-in).

    Raises:
        ValueError: an unknown value, or ``httptools`` when it cannot be used (not
            installed, or too old); the message names ``http1_parser`` or the variable,
            the value, and why.
    """
    if argument is not None:
        return Choice(_checked("http1_parser", argument, unusable), "argument")
    value = (os.environ if environ is None else environ).get(ENV_VARIABLE, "")
    if value:
        return Choice(_checked(ENV_VARIABLE, value, unusable), "environment")
    why = unusable()
    return Choice("h11", why) if why else Choice("httptools", "installed")


def _checked(field: str, value: object, unusable: Callable[[], str | None]) -> str:
    if not isinstance(value, str) or value not in PARSERS:
        raise ValueError(f"{field} must be 'h11' or 'httptools', got {value!r}")
    if value == "httptools":
        why = unusable()
        if why:
            raise ValueError(f"{field}={value!r} {_NEEDS} ({why}): {_INSTALL}")
    return value


_WHY = {
    "argument": "http1_parser= given",
    "environment": f"from {ENV_VARIABLE}",
    "installed": f"httptools is installed; {ENV_VARIABLE}=h11 chooses h11",
}


def log_choice(transport: str, choice: Choice) -> None:
    """One DEBUG line saying which parser a new transport runs, and why."""
    if logger.isEnabledFor(logging.DEBUG):
        why = _WHY.get(choice.source) or (
            f"httptools not used: {_NEEDS}, {choice.source}; {_INSTALL} for the faster parser"
        )
        logger.debug(
            "%s: HTTP/1.1 parser %s (%s)",
            transport,
            choice.parser,
            why,
            extra={"compartment": "", "event": "http1_parser", "reason": choice.source},
        )
