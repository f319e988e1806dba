"""Generate the synchronous I/O shell (``httpx_bulkhead/_sync/``) from the async one.

    python scripts/unasync.py          # write httpx_bulkhead/_sync/*.py
    python scripts/unasync.py --check  # exit 1 if a generated file is missing or stale

One source of truth: the async shell (``httpx_bulkhead/_<name>.py`` for each name in
``MODULES``) is what engineers edit; its sync twin is derived by the substitutions below,
line by line, with word boundaries (the approach httpcore's ``scripts/unasync.py`` takes).
The pure core is not copied: a generated module imports it from the package
(``from ._config`` becomes ``from .._config``).  Modules whose I/O differs have a
hand-written counterpart instead (``COUNTERPARTS``): the sync byte streams and connector
(``_blocking.py``) and the thread primitives and timers (``_threads.py``), which also stand
in for ``anyio`` (``anyio.Event`` becomes ``_threads.Event``, and so on).

Robustness (the async shell changes under us): after the substitutions, every Python
token of the output is checked; an ``async``/``await`` keyword or a name the rules do not
know how to turn sync (``asyncio``, ``trio``, ``anyio``, ``Async...``, ``aclose``, ...)
left anywhere outside a string or comment stops the generator with the file and line, so
new async code gets a rule (or a ``# unasync: skip`` block) instead of a broken sync twin.
A block of async-only code (e.g. the async transport's refusal of a sync client) is left
out of the sync twin between the comment lines ``# unasync: skip`` and ``# unasync: end``;
a comment line ``# unasync: use <code>`` is ``<code>`` in the sync twin (e.g. to import a
type from the async module rather than define a second one).

``--check`` (run by ``.ci/run`` and ``tests/test_unasync.py``) regenerates in memory and
compares, byte for byte, and also reports files in ``_sync/`` that no module generates.
"""

from __future__ import annotations

import argparse
import ast
import io
import re
import sys
import tokenize
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = ROOT / "httpx_bulkhead"
OUT = PACKAGE / "_sync"

#: The async shell modules that get a generated sync twin (``_sync/<name>.py``).
MODULES = (
    "_compartment",
    "_connections",
    "_exchange",
    "_http11",
    "_http2",
    "_proxied",
    "_respx",
    "_response",
    "_slots",
    "_stacked",
    "_trace",
    "_transport",
)
#: Async modules whose sync counterpart is hand-written (the I/O is what differs).
COUNTERPARTS = {"_network": "_blocking", "_streams": "_blocking", "_timers": "_threads"}
#: Async-only modules with no sync counterpart (the Redis fleet limit is asyncio only): a
#: generated module importing one stops the generator (put the code that needs it between
#: ``# unasync: skip`` and ``# unasync: end``; ``BulkheadHTTPTransport`` refuses the
#: settings that would reach it, see ``_sync_transport.ASYNC_ONLY_FIELDS``).
ASYNC_ONLY = frozenset({"_fleet", "_fleet_config", "_fleet_lua", "fleet"})

#: (pattern, replacement), applied in order to every line.
SUBSTITUTIONS: tuple[tuple[str, str], ...] = (
    # httpx and respx names
    (r"\bAsyncBaseTransport\b", "BaseTransport"),
    (r"\bAsyncByteStream\b", "SyncByteStream"),
    (r"\bhandle_async_request\b", "handle_request"),
    (r"\basync_handler\b", "handler"),
    (r"\bAsyncConnectionPool\b", "ConnectionPool"),
    (r"\bhttpx\.AsyncClient\b", "httpx.Client"),
    (r"\bhttpx\.AsyncHTTPTransport\b", "httpx.HTTPTransport"),
    (r"\bBulkheadTransport\b", "BulkheadHTTPTransport"),
    # the language
    (r"\bAsyncIterable\b", "Iterable"),
    (r"\bAsyncIterator\b", "Iterator"),
    (r"\basynccontextmanager\b", "contextmanager"),
    (r"\bStopAsyncIteration\b", "StopIteration"),
    (r"\b__aenter__\b", "__enter__"),
    (r"\b__aexit__\b", "__exit__"),
    (r"\b__aiter__\b", "__iter__"),
    (r"\b__anext__\b", "__next__"),
    (r"\baread\b", "read"),
    (r"\baclose\b", "close"),
    # a request body is user code: iterate it with the loop lock released
    (r"\baiter\(", "_threads.iterate_unlocked("),
    (r"\bAwaitable\[None\] \| None\b", "None"),
    (r'"Awaitable\[None\] \| None"', "None"),
    (r"\bAwaitable\[(\w+)\]", r"\1"),
    (r"\bAwaitable, ", ""),
    (r", Awaitable\b", ""),
    (r"\basync (def|with|for)\b", r"\1"),
    (r"\bawait ", ""),
    # anyio's primitives: the thread versions (same names, same meaning)
    (r"^import anyio$", "from .. import _threads"),
    (r"\banyio\.", "_threads."),
)
_COMPILED = tuple((re.compile(p), r) for p, r in SUBSTITUTIONS)
_IMPORT = re.compile(r"^(\s*)from \.(_\w+) import\b")
_SKIP, _END, _USE = "# unasync: skip", "# unasync: end", "# unasync: use "

#: Names that must not survive in generated code (outside strings and comments).
_FORBIDDEN_NAMES = re.compile(
    r"^(async|await|anyio|asyncio|trio|aclose|aread|aiter|anext|Awaitable"
    r"|Async\w*|\w*_async_\w*|__a(enter|exit|iter|next)__|StopAsyncIteration)$"
)


class UnasyncError(Exception):
    """A construct the rules do not turn sync."""


def header(name: str) -> str:
    return (
        f"# Generated by scripts/unasync.py from httpx_bulkhead/{name}.py: do not edit.\n"
        "# Change the async module and run `python scripts/unasync.py`.\n"
    )


def _import(line: str) -> str:
    match = _IMPORT.match(line)
    if match is None:
        return line
    indent, module = match.groups()
    if module in ASYNC_ONLY:
        raise UnasyncError(f"imports the async-only module {module} (see ASYNC_ONLY): {line!r}")
    target = f".{module}" if module in MODULES else f"..{COUNTERPARTS.get(module, module)}"
    return f"{indent}from {target} import{line[match.end() :]}"


def _dedupe(line: str) -> str:
    """``from x import Iterable, Iterable`` (two async names became one): once each."""
    head, sep, names = line.partition(" import ")
    if not sep or not head.lstrip().startswith("from ") or "(" in names:
        return line
    parts = [n.strip() for n in names.split(",")]
    unique = list(dict.fromkeys(parts))
    return line if unique == parts else f"{head} import {', '.join(unique)}\n"


def convert(name: str, source: str) -> str:
    """The sync twin of async module ``name`` (its text ``source``)."""
    out: list[str] = []
    skipping = False
    for number, line in enumerate(source.splitlines(keepends=True), 1):
        stripped = line.strip()
        if stripped == _SKIP:
            if skipping:
                raise UnasyncError(f"{name}.py:{number}: nested {_SKIP!r}")
            skipping = True
            continue
        if stripped == _END:
            if not skipping:
                raise UnasyncError(f"{name}.py:{number}: {_END!r} without {_SKIP!r}")
            skipping = False
            continue
        if skipping:
            continue
        if stripped.startswith(_USE):  # a line of the sync twin only
            indent = line[: len(line) - len(line.lstrip())]
            out.append(f"{indent}{stripped[len(_USE) :]}\n")
            continue
        for pattern, replacement in _COMPILED:
            line = pattern.sub(replacement, line)
        out.append(_dedupe(_import(line)))
    if skipping:
        raise UnasyncError(f"{name}.py: {_SKIP!r} without {_END!r}")
    text = header(name) + "".join(out)
    _check_tokens(name, text)
    return text


def _threads_names() -> frozenset[str]:
    """``httpx_bulkhead/_threads.py``'s ``__all__`` (read, not imported)."""
    tree = ast.parse((PACKAGE / "_threads.py").read_text(encoding="utf-8"))
    for node in tree.body:
        if isinstance(node, ast.Assign) and any(
            isinstance(t, ast.Name) and t.id == "__all__" for t in node.targets
        ):
            return frozenset(ast.literal_eval(node.value))
    raise UnasyncError("httpx_bulkhead/_threads.py has no __all__")  # pragma: no cover


_THREADS_USE = re.compile(r"\b_threads\.(\w+)")


def _check_tokens(name: str, text: str) -> None:
    try:
        tokens = list(tokenize.generate_tokens(io.StringIO(text).readline))
    except (tokenize.TokenError, SyntaxError) as exc:  # pragma: no cover - a broken rule
        raise UnasyncError(f"_sync/{name}.py does not tokenize: {exc}") from exc
    left = [
        f"_sync/{name}.py:{tok.start[0]}: {tok.string!r} (from {name}.py)"
        for tok in tokens
        if tok.type == tokenize.NAME and _FORBIDDEN_NAMES.match(tok.string)
    ]
    known = _threads_names()
    left += [
        f"_sync/{name}.py:{number}: _threads.{use} (anyio.{use} has no thread version in"
        " _threads.py)"
        for number, line in enumerate(text.splitlines(), 1)
        for use in _THREADS_USE.findall(line)
        if use not in known
    ]
    if left:
        raise UnasyncError(
            "async code the rules in scripts/unasync.py do not turn sync (add a rule, or put"
            " async-only code between '# unasync: skip' and '# unasync: end'):\n  "
            + "\n  ".join(left)
        )


def generate() -> dict[Path, str]:
    """Every generated file, by path."""
    files = {OUT / "__init__.py": '"""The sync I/O shell, generated by scripts/unasync.py."""\n'}
    for name in MODULES:
        source = (PACKAGE / f"{name}.py").read_text(encoding="utf-8")
        files[OUT / f"{name}.py"] = convert(name, source)
    return files


def check(files: dict[Path, str]) -> list[str]:
    """What is missing, stale or unexpected in ``_sync/`` (empty: current)."""
    problems = []
    for path, text in files.items():
        if not path.exists():
            problems.append(f"missing: {path.relative_to(ROOT)}")
        elif path.read_text(encoding="utf-8") != text:
            problems.append(f"stale: {path.relative_to(ROOT)}")
    if OUT.exists():
        for path in sorted(OUT.glob("*.py")):
            if path not in files:
                problems.append(f"not generated (delete it): {path.relative_to(ROOT)}")
    return problems


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="fail if _sync/ is not current")
    args = parser.parse_args(argv)
    try:
        files = generate()
    except UnasyncError as exc:
        print(f"unasync: {exc}", file=sys.stderr)
        return 2
    if args.check:
        problems = check(files)
        for problem in problems:
            print(f"unasync: {problem}", file=sys.stderr)
        if problems:
            print("unasync: run `python scripts/unasync.py` and commit the result", file=sys.stderr)
            return 1
        print(f"unasync: {len(files)} generated files are current")
        return 0
    OUT.mkdir(exist_ok=True)
    for path, text in files.items():
        if not path.exists() or path.read_text(encoding="utf-8") != text:
            path.write_text(text, encoding="utf-8")
    for path in OUT.glob("*.py"):
        if path not in files:
            path.unlink()
    return 0


if __name__ == "__main__":
    sys.exit(main())
