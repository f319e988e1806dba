"""The sync shell (``httpx_bulkhead/_sync/``) is what ``scripts/unasync.py`` makes of the
async one, and the generator refuses async code it has no rule for."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from typing import Any

import pytest


def _load() -> Any:
    path = Path(__file__).resolve().parents[1] / "scripts" / "unasync.py"
    spec = importlib.util.spec_from_file_location("unasync", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules.setdefault("unasync", module)
    spec.loader.exec_module(module)
    return module


unasync = _load()


def test_the_generated_sync_shell_is_current() -> None:
    problems = unasync.check(unasync.generate())
    assert problems == [], "run `python scripts/unasync.py`: " + "; ".join(problems)


def test_the_rules_turn_async_code_sync() -> None:
    source = (
        "import anyio\n"
        "from ._config import Policy\n"
        "from ._slots import Slots\n"
        "from ._timers import Timers\n"
        "from collections.abc import AsyncIterator, Awaitable, Iterator\n"
        "class S(httpx.AsyncByteStream):\n"
        "    async def __anext__(self) -> bytes:\n"
        "        async with self._lock:\n"
        "            with anyio.fail_after(1):\n"
        "                await self._exchange.aclose()\n"
        "        raise StopAsyncIteration\n"
        "    def later(self) -> Awaitable[None] | None: ...\n"
    )
    out = unasync.convert("_x", source).splitlines()
    assert out[2:] == [
        "from .. import _threads",
        "from .._config import Policy",
        "from ._slots import Slots",
        "from .._threads import Timers",
        "from collections.abc import Iterator",
        "class S(httpx.SyncByteStream):",
        "    def __next__(self) -> bytes:",
        "        with self._lock:",
        "            with _threads.fail_after(1):",
        "                self._exchange.close()",
        "        raise StopIteration",
        "    def later(self) -> None: ...",
    ]


def test_skip_and_use_blocks() -> None:
    source = (
        "a = 1\n# unasync: use b = 2\n# unasync: skip\nasync def c() -> None: ...\n# unasync: end\n"
    )
    assert unasync.convert("_x", source).splitlines()[2:] == ["a = 1", "b = 2"]
    with pytest.raises(unasync.UnasyncError, match="without"):
        unasync.convert("_x", "# unasync: skip\n")


@pytest.mark.parametrize(
    "line",
    ["asyncio.get_running_loop()", "trio.sleep(0)", "x = AsyncThing()", "f(aiter)"],
)
def test_async_code_without_a_rule_stops_the_generator(line: str) -> None:
    with pytest.raises(unasync.UnasyncError, match=r"_sync/_x\.py:3: .*\(from _x\.py\)"):
        unasync.convert("_x", f"{line}\n")


def test_strings_and_comments_are_not_checked() -> None:
    unasync.convert("_x", 'x = "asyncio"  # trio\n')


def test_an_anyio_name_without_a_thread_version_stops_the_generator() -> None:
    with pytest.raises(unasync.UnasyncError, match=r"_threads\.create_task_group"):
        unasync.convert(
            "_x", "import anyio\nasync def f() -> None:\n    anyio.create_task_group()\n"
        )


def test_an_async_only_module_stops_the_generator() -> None:
    with pytest.raises(unasync.UnasyncError, match="async-only module _fleet"):
        unasync.convert("_x", "from ._fleet import FleetLimit\n")


def test_prose_is_reworded_and_code_is_not() -> None:
    """The event loop, tasks and awaiting of the async prose read as the loop lock, threads
    and waiting in the sync twin; the same words in code are left alone."""
    source = (
        "def f(on_the_loop: int) -> None:\n"
        '    """Runs on the loop, without awaiting; the returned awaitable finishes."""\n'
        "    the_task = on_the_loop  # the task that needs it, on the loop\n"
        '    g("on the loop")  # a one-line string is code: a message may mean it\n'
    )
    out = unasync.convert("_x", source).splitlines()
    assert out[2:] == [
        "def f(on_the_loop: int) -> None:",
        '    """Runs under the loop lock, without waiting; the call finishes."""',
        "    the_task = on_the_loop  # the thread that needs it, under the loop lock",
        '    g("on the loop")  # a one-line string is code: a message may mean it',
    ]


def test_the_generated_prose_speaks_of_threads() -> None:
    """No phrase of the event loop's world is left in the generated docstrings and
    comments (a new one needs a PROSE rule)."""
    for path, text in unasync.generate().items():
        for number, line in enumerate(text.splitlines(), 1):
            for phrase in ("event loop", "on the loop", "returned awaitable", " task "):
                assert phrase not in line, f"{path.name}:{number}: {line.strip()}"
