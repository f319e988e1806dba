"""Open file descriptors of this process, to check that nothing leaks a socket.

``FdSnapshot.take()`` reads ``/proc/self/fd``: every descriptor's link target
(``socket:[inode]``, ``pipe:[inode]``, ``anon_inode:[eventpoll]``, a path).  ``growth(before)``
is what is open now and was not before, as a multiset of targets, so descriptors that other
code closed in between (a server thread finishing a connection of an earlier test) cannot
hide a new one, and a reused descriptor number with a new socket behind it still counts.

Take the "before" snapshot *before* starting the servers of the test and the "after" one
once they are closed: then the servers' own descriptors (listeners, accepted connections,
their event loops) are in neither, and whatever remains is the client's.  Measure before
``gc.collect()``: the collector would close a leaked socket (with a ``ResourceWarning``),
and a socket still registered with an event loop is never collected at all.
"""

from __future__ import annotations

import collections
import os
from dataclasses import dataclass

import anyio

__all__ = ["FdSnapshot", "assert_no_fd_growth", "settle_io"]

_FD_DIR = "/proc/self/fd"


@dataclass(frozen=True)
class FdSnapshot:
    """The open descriptors of this process at one moment."""

    targets: collections.Counter[str]

    @classmethod
    def take(cls) -> FdSnapshot:
        targets: collections.Counter[str] = collections.Counter()
        for name in os.listdir(_FD_DIR):
            try:
                targets[os.readlink(os.path.join(_FD_DIR, name))] += 1
            except OSError:  # closed meanwhile (or the listing's own descriptor)
                continue
        return cls(targets)

    @property
    def fds(self) -> int:
        return sum(self.targets.values())

    @property
    def sockets(self) -> int:
        return sum(n for target, n in self.targets.items() if target.startswith("socket:"))

    def growth(self, before: FdSnapshot) -> list[str]:
        """Targets open now that were not open in ``before`` (with repeats)."""
        return sorted((self.targets - before.targets).elements())


async def settle_io() -> None:
    """Let the event loop run the close callbacks it has scheduled (asyncio closes a
    transport's socket one loop turn after ``abort()``): checkpoints, not a timed wait."""
    for _ in range(20):
        await anyio.sleep(0)


def assert_no_fd_growth(before: FdSnapshot, what: str = "") -> FdSnapshot:
    """Fail if descriptors were opened since ``before`` and are still open."""
    after = FdSnapshot.take()
    growth = after.growth(before)
    assert not growth, (
        f"{what}: {len(growth)} descriptor(s) left open "
        f"(fds {before.fds} -> {after.fds}, sockets {before.sockets} -> {after.sockets}): "
        f"{growth[:10]}"
    )
    return after
