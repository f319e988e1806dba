"""The transport's clock hooks on both backends: timers fire in order and only once,
cancelled ones never, hand-offs from other threads run on the loop, ``aclose`` stops all."""

from __future__ import annotations

import threading

import anyio
import pytest

from httpx_bulkhead._timers import Timers
from tests.conftest import until

pytestmark = pytest.mark.anyio


async def test_timers_fire_in_deadline_order_once_and_cancelled_ones_never() -> None:
    timers = Timers()
    fired: list[str] = []
    timers.call_later(0.06, lambda: fired.append("late"))
    cancelled = timers.call_later(0.01, lambda: fired.append("cancelled"))
    timers.call_later(0.02, lambda: fired.append("early"))
    cancelled.cancel()
    cancelled.cancel()  # idempotent
    await until(lambda: len(fired) == 2, timeout=5)
    assert fired == ["early", "late"]
    await timers.aclose()


async def test_a_callback_may_return_work_to_await() -> None:
    timers = Timers()
    done = anyio.Event()

    async def close_sockets() -> None:
        await anyio.sleep(0)
        done.set()

    timers.call_later(0, close_sockets)
    with anyio.fail_after(5):
        await done.wait()
    await timers.aclose()


async def test_a_failing_callback_is_logged_and_the_timers_go_on(
    caplog: pytest.LogCaptureFixture,
) -> None:
    timers = Timers()
    fired: list[int] = []

    def broken() -> None:
        raise RuntimeError("bug")

    timers.call_later(0, broken)
    timers.call_later(0.01, lambda: fired.append(1))
    await until(lambda: fired == [1], timeout=5)
    assert "a timer callback failed" in caplog.text
    await timers.aclose()


async def test_hand_off_from_another_thread_runs_on_the_loop() -> None:
    timers = Timers()
    timers.bind()
    loop_thread = threading.get_ident()
    ran_in: list[int] = []
    thread = threading.Thread(
        target=lambda: timers.call_soon_threadsafe(lambda: ran_in.append(threading.get_ident()))
    )
    thread.start()
    await until(lambda: bool(ran_in), timeout=5)  # the loop wakes for it: no other event
    thread.join()
    assert ran_in == [loop_thread]
    result: list[tuple[bool, object]] = []
    await anyio.to_thread.run_sync(lambda: result.append(timers.run_in_loop(lambda: 42, 5)))
    assert result == [(True, 42)]
    assert timers.run_in_loop(lambda: 42, 5) == (False, None)  # from the loop itself: direct
    await timers.aclose()


async def test_nothing_runs_after_aclose() -> None:
    timers = Timers()
    fired: list[int] = []
    timers.call_later(0.01, lambda: fired.append(1))
    await timers.aclose()
    timers.call_later(0, lambda: fired.append(2))
    assert not timers.call_soon_threadsafe(lambda: fired.append(3))
    with anyio.move_on_after(0.1):
        await until(lambda: bool(fired), timeout=1)
    assert fired == []


def test_without_a_loop_nothing_is_scheduled() -> None:
    timers = Timers()
    handle = timers.call_later(0, lambda: None)
    assert handle.cancelled and not timers.bound
    assert not timers.call_soon_threadsafe(lambda: None)
    assert timers.run_in_loop(lambda: 1, 1) == (False, None)
