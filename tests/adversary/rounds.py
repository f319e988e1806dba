"""A saturated round against a dependency that refuses a share of requests at once, fed to
a gradient as its exchanges end: the reviews' rotations (16, 17, 18) share it."""

from __future__ import annotations

import random
from collections.abc import Callable

from httpx_bulkhead._adaptive import Gradient


def narrow(rng: random.Random) -> float:
    """The lab's spread: U[0.9, 1.1]."""
    return rng.uniform(0.9, 1.1)


def saturated_round(
    algorithm: Gradient,
    rng: random.Random,
    now: float,
    service: float,
    factor: Callable[[random.Random], float],
    queue: float,
    refused: float = 0.0,
    seen: Callable[[float], float] | None = None,
) -> int:
    """``algorithm.applied`` exchanges started at ``now``: each refused at once (1 ms) with
    probability ``refused``, else taking ``service * factor(rng) * queue`` seconds (a spread,
    and the wait of a FIFO queue), whose latency the algorithm is given as ``seen(latency)``
    (a clock's view; exact by default).  Fed in the order they end (refusals to
    ``unfed_end``); returns how many were answered."""
    limit = algorithm.applied
    ends: list[tuple[float, float | None]] = []
    for _ in range(limit):
        if rng.random() < refused:
            ends.append((now + 0.001, None))
        else:
            took = service * factor(rng) * queue
            ends.append((now + took, took))
    for end, latency in sorted(ends, key=lambda pair: pair[0]):
        if latency is None:
            algorithm.unfed_end(end, limit, refused=now)
        else:
            algorithm.update(end, now, latency if seen is None else seen(latency), False, limit)
    return sum(latency is not None for _, latency in ends)
