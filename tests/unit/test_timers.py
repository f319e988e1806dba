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


async def test_a_failing_awaitable_is_logged(caplog: pytest.LogCaptureFixture) -> None:
    timers = Timers()
    done = anyio.Event()

    async def broken() -> None:
        done.set()
        raise RuntimeError("bug")

    timers.call_later(0, broken)
    with anyio.fail_after(5):
        await done.wait()
    await until(lambda: "a timer task failed" in caplog.text, timeout=5)
    await timers.aclose()


async def test_run_in_loop_hands_exceptions_to_the_calling_thread() -> None:
    timers = Timers()
    timers.bind()

    def broken() -> int:
        raise ZeroDivisionError("from the loop")

    with pytest.raises(ZeroDivisionError, match="from the loop"):
        await anyio.to_thread.run_sync(lambda: timers.run_in_loop(broken, 5))
    await timers.aclose()


def test_run_in_loop_gives_up_on_a_blocked_loop_and_never_runs_it_late() -> None:
    """The loop is blocked past the caller's patience: the caller reads directly, and the
    work handed over is dropped rather than run after the caller stopped waiting."""
    import asyncio

    timers = Timers()
    ran: list[int] = []
    answered = threading.Event()
    results: list[tuple[bool, object]] = []

    def caller() -> None:
        results.append(timers.run_in_loop(lambda: ran.append(1), 0.05))
        answered.set()

    async def main() -> None:
        timers.bind()
        thread = threading.Thread(target=caller)
        thread.start()
        answered.wait(5)  # blocks the loop until the caller gave up
        await asyncio.sleep(0)  # now the loop runs what was handed over
        await asyncio.sleep(0)
        thread.join()
        await timers.aclose()

    asyncio.run(main())
    assert results == [(False, None)] and ran == []


def test_a_loop_that_is_gone_takes_no_work() -> None:
    """Bound to a loop that has since finished (in another thread): hand-offs report that
    nobody can run them, so the caller acts directly."""
    import asyncio

    timers = Timers()

    async def bind() -> None:
        timers.bind()

    thread = threading.Thread(target=lambda: asyncio.run(bind()))
    thread.start()
    thread.join()
    assert timers.bound
    assert not timers.call_soon_threadsafe(lambda: None)
    assert timers.run_in_loop(lambda: 1, 1) == (False, None)
    handle = timers.call_later(0, lambda: None)  # outside any loop: never runs
    assert handle.cancelled


def test_trio_loop_that_is_gone_takes_no_work() -> None:
    import trio

    timers = Timers()

    async def bind() -> None:
        timers.bind()

    thread = threading.Thread(target=lambda: trio.run(bind))
    thread.start()
    thread.join()
    assert timers.bound and not timers.call_soon_threadsafe(lambda: None)


def test_timers_follow_the_transport_to_another_loop() -> None:
    """Used under trio, then under asyncio, then trio again: each new loop takes over (the
    old one is gone, and its timers with it)."""
    import asyncio

    import trio

    timers = Timers()
    fired: list[str] = []

    async def under_trio(label: str) -> None:
        timers.call_later(0, lambda: fired.append(label))
        with trio.fail_after(5):
            while label not in fired:
                await trio.sleep(0)

    async def under_asyncio() -> None:
        timers.call_later(0, lambda: fired.append("asyncio"))
        await until(lambda: "asyncio" in fired, timeout=5)

    trio.run(under_trio, "trio")
    asyncio.run(under_asyncio())
    trio.run(under_trio, "trio again")
    assert fired == ["trio", "asyncio", "trio again"]


def test_work_cancelled_before_it_started_is_closed_quietly() -> None:
    """``asyncio.run`` ends just after a hand-off spawned its work (a module-level client's
    lease removal): the task is cancelled before its first step, and the work it would
    have awaited is closed, not left to warn "coroutine ... was never awaited"."""
    import asyncio
    import gc
    import warnings

    timers = Timers()
    started: list[str] = []

    async def work() -> None:
        started.append("work")

    async def main() -> None:
        timers.bind()
        # Main ends now: the hand-off spawns the task in the loop's last turn, and
        # ``asyncio.run`` cancels it before its first step.
        assert timers.call_soon_threadsafe(work)

    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        asyncio.run(main())
        gc.collect()
    assert started == []
    assert not [w for w in caught if "never awaited" in str(w.message)], caught


def test_trio_timers_drop_cancelled_handles_as_they_pile_up() -> None:
    import trio

    timers = Timers()
    fired: list[int] = []

    async def main() -> None:
        handles = [timers.call_later(60, lambda: fired.append(0)) for _ in range(100)]
        for handle in handles:
            handle.cancel()
        timers.call_later(0, lambda: fired.append(1))
        with trio.fail_after(5):
            while not fired:
                await trio.sleep(0)
        await timers.aclose()

    trio.run(main)
    assert fired == [1]


def test_trio_aclose_before_any_timer() -> None:
    import trio

    async def main() -> None:
        timers = Timers()
        timers.bind()
        await timers.aclose()
        assert not timers.bound

    trio.run(main)


async def test_bind_after_aclose_does_nothing() -> None:
    timers = Timers()
    await timers.aclose()
    timers.bind()
    assert not timers.bound
