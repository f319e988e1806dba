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

Prose (comments and triple-quoted strings) gets ``PROSE`` first: the async modules speak of
the event loop, tasks and awaiting where the sync twin has the loop lock (``_threads.py``),
threads and waiting, so each phrase found in them is reworded to read true there.  These
rules touch only the prose part of a line (after a comment's ``#``, inside a docstring),
never code; a phrase the rules do not know reads as in the async module (``--check`` does
not look for them: read the generated docstrings when you add one).

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
    # messages
    (r"needs an async request stream", "needs a sync request stream"),
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

#: (pattern, replacement) for prose only, in order: the async shell's words for what the
#: sync shell does with threads and the loop lock (see the module docstring).
PROSE: tuple[tuple[str, str], ...] = (
    # the loop: in the sync shell, the loop lock, and the timer thread for hand-offs
    (r"\bon the loop that owns the transport\b", "by the transport's timer thread"),
    (r"\bthe loop that owns it\b", "the transport's timer thread"),
    (r"\bremember the loop that owns the transport\b", "bind the timers (any thread may call)"),
    (r"\bno loop left\b", "no timer thread left"),
    (r"\bDone on the transport's event loop$", "Done under the transport's loop lock"),
    (r"^(\s*)when it runs \(so a compartment\b", r"\1when it is free (so a compartment"),
    (r"\bthe transport's event loop\b", "the transport's loop lock"),
    (r"\bfrom a thread other than the event loop's, the snapshot is\b", "the snapshot is"),
    (r"\btaken on the loop between two of its steps\b", "taken under the loop lock"),
    (r"\bfor a busy loop\b", "for a busy loop lock"),
    (r"\bon the loop\b", "under the loop lock"),
    (r"\ban anyio byte stream\b", "a blocking byte stream (``_blocking``)"),
    # tasks: threads
    (r"\bbackground task \(a transport owns no task group\)", "background thread"),
    (r"\b(T|t)he task\b", r"\1he thread"),
    (r"\banother task\b", "another thread"),
    (r"\bThe async shell\b", "The sync shell"),
    # awaiting: waiting (what the sync twin returns, it has already done)
    (r"\bnobody is awaiting\b", "nobody is waiting for"),
    (r"\bnobody awaits\b", "nobody waits for"),
    (r"\bwithout awaiting\b", "without waiting"),
    (r"\bthe returned awaitable finishes\b", "the call finishes"),
    (r"\(the returned$", "(the call"),
    (r"^(\s*)awaitable finishes\b", r"\1finishes"),
    (r"\breturns the awaitable that finishes\b", "then finishes"),
    (r", awaited\.", ", waited for by threads."),
    (r"\bthe next await\b", "the next wait"),
)
_PROSE = tuple((re.compile(p), r) for p, r in PROSE)
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


def _prose_columns(name: str, source: str) -> dict[int, int]:
    """Line number -> column where the line's prose starts (a comment, or a line of a
    triple-quoted string), for the lines that have some."""
    columns: dict[int, int] = {}
    try:
        tokens = list(tokenize.generate_tokens(io.StringIO(source).readline))
    except (tokenize.TokenError, SyntaxError) as exc:
        raise UnasyncError(f"{name}.py does not tokenize: {exc}") from exc
    for tok in tokens:
        if tok.type == tokenize.COMMENT:
            columns.setdefault(tok.start[0], tok.start[1])
        elif tok.type == tokenize.STRING and tok.string[-3:] in ('"""', "'''"):
            for number in range(tok.start[0], tok.end[0] + 1):
                column = tok.start[1] if number == tok.start[0] else 0
                columns[number] = min(columns.get(number, column), column)
    return columns


def _reword(line: str, column: int) -> str:
    """``PROSE`` applied to ``line`` from ``column`` on (the code before it untouched)."""
    body, newline = (line[:-1], "\n") if line.endswith("\n") else (line, "")
    code, prose = body[:column], body[column:]
    for pattern, replacement in _PROSE:
        prose = pattern.sub(replacement, prose)
    return code + prose + newline


def convert(name: str, source: str) -> str:
    """The sync twin of async module ``name`` (its text ``source``)."""
    out: list[str] = []
    skipping = False
    prose = _prose_columns(name, source)
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
        if number in prose:
            line = _reword(line, prose[number])
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
