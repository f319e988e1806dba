"""The adaptive-concurrency lab as a virtual-time simulation: no sockets, no event loop.

    python -m benchmarks.adaptive_sim                      # loaded noise, seeds 1-5
    python -m benchmarks.adaptive_sim --noise quiet --seeds 1 2 3
    python -m benchmarks.adaptive_sim --noise quiet --seeds 1-160 --summary  # ~1 min
    python -m benchmarks.adaptive_sim --noise quiet --seeds 1-160 --summary --phase-seconds 30

``adaptive_lab.py`` runs the real thing (Node's capacity server, three processes, 100 s of
wall time) and is noisy on a shared machine; this models it event by event in virtual
time, so an algorithm can be tuned and checked in a fraction of a second per run, and the
same seed gives the same figures.  Its phases last 15 s (``PHASE_SECONDS``), half the
lab's: the harsher case, where the climbs after the capacity moved weigh twice as much in
a phase's goodput and p99 (``adaptive_lab.PHASE_SECONDS`` says why the lab's are longer);
the model's figures in the README and the docstrings, and its unit tests, are at 15 s.

The model
---------
*The dependency* (``capacity_server.js``): ``N`` workers and a FIFO queue, each request
served in ``service * U[0.9, 1.1]``; ``N`` follows the phases (16 -> 4 -> 24); when it
falls, requests in service finish and nobody starts until fewer than ``N`` are busy.

*The load*: open-loop Poisson arrivals at ``rate`` per second, the same arrival times for
the three contestants (static 64, static 16, ``AdaptiveLimit()``), each with
``max_pending=0``: the real ``Limiter`` admits a request when ``running < limit`` (nobody
waits) and rejects it otherwise.  The adaptive contestant is driven by the real
``AdaptiveController`` (and so the real ``Gradient``/``AIMD``) on the virtual clock: a
sample from the instant the request is sent to the instant our process sees the response
head, fed when the body has been read, before the slot is released (as
``_response.py`` does).

*Our own noise* (``Noise``): each contestant is a process of its own; a loaded machine
deschedules it now and then (*stalls*: Poisson starts, exponential lengths), during which
nothing on our side happens: an arrival is handled, a response seen, a body read, at the
stall's end.  Every step on our side also costs an exponential *jitter*, and loopback a
fixed one-way delay.  The slot is held from admission to the body's end, so a stall keeps
the dependency's workers idle (it costs goodput) and lengthens the samples (it reads as a
queue).  ``LOADED`` is fitted, roughly, to the lab's static contestants on the shared
2-core machine (static 16 in phase 3, with no queue at the dependency: p50 ~103 ms, p99
~120 ms on a 100 ms service; the model gives ~104 and ~130 ms); ``QUIET`` is a machine
with nothing else to do.  The real lab on a loaded machine is noisier still (its static
16 lost 25% of phase 1's capacity to our own stalls; the model's loses 10%).

Reported as the lab does (``adaptive_lab.report``): per phase and contestant, goodput,
p50/p99 (arrival to body end), rejections, and for the adaptive limit its settling into
N +- 25% (the limit sampled every 50 ms), with the issue's targets.  ``--by-limit PHASE``
breaks the adaptive contestant's responses from 5 s into a phase down by the limit in
force when each was admitted (``by_limit``): at N=4, a response admitted under a limit of
5 (one slot of queue) is above 1.5x the service time about one time in ten, so a p99 of
1.5x allows about one request in ten under that limit.
"""

from __future__ import annotations

import argparse
import bisect
import heapq
import itertools
import random
import re
from collections import deque
from collections.abc import Callable, Sequence
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass, field
from typing import Any

from benchmarks.adaptive_lab import (
    PHASES,
    SAMPLE_EVERY,
    SHED_CONTESTANT,
    Decision,
    Decisions,
    markdown,
    outer_met,
    phase_seconds_error,
    report,
    runs_summary,
    targets,
)
from benchmarks.adaptive_lab import (
    verdicts as verdicts,  # (the lab owns the targets; the model's callers use it here)
)
from httpx_bulkhead import AdaptiveLimit
from httpx_bulkhead._adaptive import AdaptiveController
from httpx_bulkhead._limiter import Limiter


@dataclass(frozen=True)
class Noise:
    """Delays of our own side (see the module docstring); seconds."""

    name: str
    stall_rate: float  # stalls per second
    stall_mean: float  # mean stall length
    jitter: float  # mean delay of each step on our side
    network: float  # one-way loopback delay
    busy_rate: float = 0.0  # busy spells (the machine's other users) per second
    busy_length: float = 0.0  # their mean length, seconds
    busy_stalls: float = 0.0  # stalls per second during a spell (of stall_mean each)
    lag_from: float = 0.0  # from this instant on, ...
    lag: float = 0.0  # ... our process sees each response head this much later


QUIET = Noise("quiet", stall_rate=0.0, stall_mean=0.0, jitter=0.0003, network=0.0001)
LOADED = Noise("loaded", stall_rate=5.0, stall_mean=0.012, jitter=0.0015, network=0.0003)
#: Loaded, with spells of a few seconds when other processes take most of the CPU (the
#: real lab's machine while other test suites ran): our steps are stalled far more often.
SPELLS = Noise(
    "spells",
    stall_rate=5.0,
    stall_mean=0.012,
    jitter=0.0015,
    network=0.0003,
    busy_rate=0.1,
    busy_length=3.0,
    busy_stalls=25.0,
)
#: Loaded, and from 3 s in (after the first probe) 25 ms slower to see each response:
#: the lab's machine once the other contestants and test suites got going.  No limit of
#: ours makes it go away; a gradient that takes it for a queue cuts the limit to nothing.
SLOWER = Noise("slower", 5.0, 0.012, 0.0015, 0.0003, lag_from=3.0, lag=0.025)
NOISES = {noise.name: noise for noise in (QUIET, LOADED, SPELLS, SLOWER)}


@dataclass
class Run:
    """One contestant's record, shaped as ``adaptive_lab.Contestant``'s."""

    name: str
    limit: int | AdaptiveLimit
    #: (arrival, end, outcome) per request: outcome "ok" or "rejected".
    calls: list[tuple[float, float, str]] = field(default_factory=list)
    #: (time, limit) every ``SAMPLE_EVERY`` seconds.
    limits: list[tuple[float, int]] = field(default_factory=list)
    #: (arrival, end, limit in force when it was admitted) per response.
    admitted: list[tuple[float, float, int]] = field(default_factory=list)
    #: (time, previous, limit, reason, detail) per change of an adaptive limit.
    decisions: list[Decision] = field(default_factory=list)


class Timer:
    """A pending callback of the model's ``call_later``."""

    def __init__(self, callback: Callable[[], None]) -> None:
        self.callback = callback
        self.cancelled = False

    def cancel(self) -> None:
        self.cancelled = True


class Stalls:
    """The instants our process is descheduled: ``resume(t)`` is when it next runs."""

    def __init__(self, noise: Noise, total: float, rng: random.Random) -> None:
        spans = self._poisson(noise.stall_rate, noise.stall_mean, 0.0, total, rng)
        for start, end in self._poisson(noise.busy_rate, noise.busy_length, 0.0, total, rng):
            spans += self._poisson(noise.busy_stalls, noise.stall_mean, start, end, rng)
        spans.sort()
        self.starts: list[float] = []
        self.ends: list[float] = []
        for start, end in spans:  # overlapping stalls merge into one
            if self.ends and start <= self.ends[-1]:
                self.ends[-1] = max(self.ends[-1], end)
            else:
                self.starts.append(start)
                self.ends.append(end)

    @staticmethod
    def _poisson(
        rate: float, mean: float, start: float, end: float, rng: random.Random
    ) -> list[tuple[float, float]]:
        """Spans starting at ``rate`` a second in ``[start, end)``, of mean length ``mean``."""
        spans: list[tuple[float, float]] = []
        t = start
        while rate > 0:
            t += rng.expovariate(rate)
            if t >= end:
                return spans
            spans.append((t, t + rng.expovariate(1 / mean)))
            t = spans[-1][1]
        return spans

    def resume(self, t: float) -> float:
        index = bisect.bisect_right(self.starts, t) - 1
        if index >= 0 and t < self.ends[index]:
            return self.ends[index]
        return t


# Event kinds, in the order they are taken at one instant.
_PHASE, _DONE, _AT_SERVER, _HEAD, _END, _TIMER, _ARRIVAL = range(7)


def simulate(
    who: Run,
    arrivals: Sequence[float],
    phases: Sequence[tuple[float, int]],
    service: float,
    noise: Noise,
    seed: int,
    shed: int | None = None,
    sigma: float | None = None,
) -> Run:
    """Runs one contestant against its own copy of the dependency; fills ``who``.

    ``shed``: the dependency answers 503 at once to a request that finds this many
    already queued (``capacity_server.js --shed-queue``); ``None``: its queue is unbounded.
    ``sigma``: service times spread as a lognormal of this sigma around ``service`` (0.5:
    the p99 three times the median; 1: an LLM's ten times), instead of ``U[0.9, 1.1]``."""
    rng = random.Random(seed)
    total = sum(seconds for seconds, _ in phases)
    stalls = Stalls(noise, total, random.Random(seed * 7919 + 1))
    now = 0.0
    limiter = Limiter(1 if isinstance(who.limit, AdaptiveLimit) else who.limit, 0)
    events: list[tuple[float, int, int, Any]] = []
    seq = 0

    def push(at: float, kind: int, payload: Any = None) -> None:
        nonlocal seq
        seq += 1
        heapq.heappush(events, (at, kind, seq, payload))

    def ours(t: float) -> float:
        """When our process gets to a step due at ``t``."""
        return stalls.resume(t) + rng.expovariate(1 / noise.jitter)

    def call_later(delay: float, callback: Callable[[], None]) -> Timer:
        """A timer of our process (``Timers.call_later``): late by a stall and a jitter."""
        timer = Timer(callback)
        push(ours(now + delay), _TIMER, timer)
        return timer

    controller: AdaptiveController | None = None
    decisions = Decisions(lambda: now, only=who.name)
    if isinstance(who.limit, AdaptiveLimit):
        controller = AdaptiveController(
            who.limit,
            limiter.set_limit,
            lambda: limiter.running,
            lambda: now,
            rng,
            call_later,
            who.name,
        )
        decisions.seen = who.decisions
        decisions.attach()

    capacity = phases[0][1]
    busy = 0
    queue: deque[list[float]] = deque()

    def pump() -> None:
        nonlocal busy
        while queue and busy < capacity:
            busy += 1
            factor = rng.uniform(0.9, 1.1) if sigma is None else rng.lognormvariate(0, sigma)
            push(now + service * factor, _DONE, queue.popleft())

    boundary = 0.0
    for (seconds, _), (_, n) in itertools.pairwise(phases):
        boundary += seconds
        push(boundary, _PHASE, n)
    for at in arrivals:
        push(ours(at), _ARRIVAL)
    next_sample = 0.0
    try:
        while events:
            at, kind, _, payload = heapq.heappop(events)
            while next_sample <= at and next_sample < total:
                who.limits.append((next_sample, limiter.limit))
                next_sample += SAMPLE_EVERY
            now = at
            if kind == _ARRIVAL:
                if limiter.try_acquire():
                    # [arrival, sent, head seen, limit, status]
                    push(now + noise.network, _AT_SERVER, [now, now, 0.0, limiter.limit, 200])
                else:
                    who.calls.append((now, now, "rejected"))
            elif kind == _AT_SERVER:
                if shed is not None and busy >= capacity and len(queue) >= shed:
                    payload[4] = 503
                    push(now, _DONE, payload)
                else:
                    queue.append(payload)
                    pump()
            elif kind == _DONE:
                if payload[4] == 200:
                    busy -= 1
                    pump()
                lag = noise.lag if now >= noise.lag_from else 0.0
                push(ours(now + noise.network + lag), _HEAD, payload)
            elif kind == _HEAD:
                payload[2] = now
                push(ours(now), _END, payload)
            elif kind == _END:
                arrival, sent, head, limit, status = payload
                if controller is not None:
                    controller.ended(sent, head - sent, status, None)
                limiter.release()
                if status == 200:
                    who.calls.append((arrival, now, "ok"))
                    who.admitted.append((arrival, now, limit))
                else:
                    who.calls.append((arrival, now, f"status {status}"))
            elif kind == _TIMER:
                if not payload.cancelled:
                    payload.callback()
            else:  # _PHASE
                capacity = payload
                pump()
    finally:
        decisions.detach()
    return who


def poisson(rate: float, total: float, rng: random.Random) -> list[float]:
    arrivals: list[float] = []
    t = 0.0
    while True:
        t += rng.expovariate(rate)
        if t >= total:
            return arrivals
        arrivals.append(t)


#: The model's phases, seconds (see the module docstring).
PHASE_SECONDS = 15.0


def run(
    seed: int = 1,
    noise: Noise = LOADED,
    adaptive: AdaptiveLimit | None = None,
    phase_seconds: float = PHASE_SECONDS,
    rate: float = 300.0,
    service_ms: float = 100.0,
    phases: Sequence[int] = PHASES,
    into: list[Run] | None = None,
    shed: int | None = None,
    sigma: float | None = None,
) -> dict[str, Any]:
    """The lab in the model, one seed: ``adaptive_lab.report``'s result (the contestants'
    records appended to ``into``, if given: static 64, static 16, adaptive, and with
    ``shed``, a dependency that sheds, ``adaptive_lab.SHED_CONTESTANT`` too; ``sigma``: see
    ``simulate``)."""
    spec = [(phase_seconds, n) for n in phases]
    arrivals = poisson(rate, phase_seconds * len(spec), random.Random(seed))
    entries: list[tuple[str, int | AdaptiveLimit]] = [
        ("static 64", 64),
        ("static 16", 16),
        ("adaptive", adaptive or AdaptiveLimit()),
    ]
    if shed is not None:
        entries.append(SHED_CONTESTANT)
    runs = [
        simulate(
            Run(name, limit), arrivals, spec, service_ms / 1000, noise, seed * 31 + i, shed, sigma
        )
        for i, (name, limit) in enumerate(entries)
    ]
    if into is not None:
        into += runs
    args = argparse.Namespace(
        service_ms=service_ms, rate=rate, phase_seconds=phase_seconds, shed=shed
    )
    return report(runs, spec, args)


def by_limit(who: Run, start: float, end: float, service: float) -> dict[int, dict[str, float]]:
    """The responses that ended in ``[start, end)`` by the limit in force when each was
    admitted: their ``share`` of all, ``p50_x``/``p99_x`` of the service time, and the
    share of them above 1.5x (``over_1_5x``): what each limit costs the p99."""
    groups: dict[int, list[float]] = {}
    for arrival, done, limit in who.admitted:
        if start <= done < end:
            groups.setdefault(limit, []).append((done - arrival) / service)
    total = sum(len(values) for values in groups.values())
    out = {}
    for limit, values in sorted(groups.items()):
        values.sort()
        out[limit] = {
            "share": len(values) / total,
            "p50_x": values[len(values) // 2],
            "p99_x": values[min(len(values) - 1, int(0.99 * len(values)))],
            "over_1_5x": sum(value > 1.5 for value in values) / len(values),
        }
    return out


def seed_range(text: str) -> range:
    """``--seeds``: one seed (``7``, ``-3``: any integer seeds ``random.Random``) or an
    inclusive range of them (``1-160``, ``-5--3``)."""
    match = re.fullmatch(r"\s*(-?\d+)\s*(?:-\s*(-?\d+)\s*)?", text)
    if match is None:
        raise argparse.ArgumentTypeError(f"not a seed or a range of seeds: {text!r}")
    low = int(match[1])
    high = low if match[2] is None else int(match[2])
    if high < low:
        raise argparse.ArgumentTypeError(f"an empty range of seeds: {text!r}")
    return range(low, high + 1)


def _run_seed(job: tuple[int, str, float]) -> dict[str, Any]:
    seed, noise, phase_seconds = job
    return run(seed, NOISES[noise], phase_seconds=phase_seconds)


def summary(
    seeds: Sequence[int],
    noise: str,
    workers: int | None = None,
    phase_seconds: float = PHASE_SECONDS,
) -> str:
    """``--summary``: the model over ``seeds`` (each once: a seed's run is the same every
    time; one process a core), summarised as the lab's ``--runs`` are: how often each
    target was met, and every target of phases 1 and 3; then the seeds that missed one."""
    seeds = list(dict.fromkeys(seeds))
    jobs = [(seed, noise, phase_seconds) for seed in seeds]
    with ProcessPoolExecutor(workers) as pool:
        try:
            results = list(pool.map(_run_seed, jobs))
        except BaseException:
            # A Ctrl-C while ``map`` hands the chunks out (seconds of it for a million seeds)
            # escapes ``map``'s own cancelling, and the ``with`` would wait for every chunk.
            pool.shutdown(cancel_futures=True)
            raise
    many = "s" if len(seeds) > 1 else ""
    title = (
        f"The model, {noise} noise, {phase_seconds:g} s a phase, {len(seeds)} seed{many}"
        f" ({_seeds_text(seeds)}): a run a seed."
    )
    missed = [
        seed for seed, result in zip(seeds, results, strict=True) if not outer_met(verdicts(result))
    ]
    where = f"Seeds that missed one: {_seeds_text(missed)}.\n" if missed else ""
    return runs_summary(results, title, table=False) + where


def _seeds_text(seeds: Sequence[int]) -> str:
    """``1-80, 101-180``: runs of consecutive seeds as ranges."""
    spans: list[list[int]] = []
    for seed in seeds:
        if spans and seed == spans[-1][1] + 1:
            spans[-1][1] = seed
        else:
            spans.append([seed, seed])
    return ", ".join(f"{low}-{high}" if high > low else str(low) for low, high in spans)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--seeds",
        type=seed_range,
        nargs="+",
        default=[range(1, 6)],
        help="seeds, or ranges of them (1-160)",
    )
    parser.add_argument("--noise", choices=sorted(NOISES), default="loaded")
    parser.add_argument(
        "--phase-seconds",
        type=float,
        default=PHASE_SECONDS,
        help=f"seconds a phase (default {PHASE_SECONDS:g}, half the lab's: the harsher case)",
    )
    # One output a run: asked for together, one of them would be dropped without a word.
    output = parser.add_mutually_exclusive_group()
    output.add_argument("--markdown", action="store_true", help="the lab's table per seed")
    output.add_argument(
        "--summary",
        action="store_true",
        help="how often each target was met over the seeds (adaptive_lab.runs_summary)",
    )
    output.add_argument(
        "--by-limit",
        type=int,
        metavar="PHASE",
        help="the adaptive contestant's responses from 5 s into PHASE by their limit",
    )
    args = parser.parse_args()
    if args.by_limit is not None and not 1 <= args.by_limit <= len(PHASES):
        parser.error(f"--by-limit: a phase from 1 to {len(PHASES)}, got {args.by_limit}")
    seeds = [seed for seeds in args.seeds for seed in seeds]
    if error := phase_seconds_error(args.phase_seconds):
        parser.error(error)
    if args.by_limit is not None and args.phase_seconds <= 5:
        # Its rows are the responses from 5 s into the phase: there would be none.
        parser.error(
            f"--by-limit reads a phase from 5 s in: --phase-seconds above 5, got"
            f" {args.phase_seconds:g}"
        )
    if args.summary:
        print(summary(seeds, args.noise, phase_seconds=args.phase_seconds), end="")
        return
    for seed in seeds:
        runs: list[Run] = []
        result = run(seed, NOISES[args.noise], phase_seconds=args.phase_seconds, into=runs)
        if args.by_limit is not None:
            seconds = result["phase_seconds"]
            start = seconds * (args.by_limit - 1)
            rows = by_limit(runs[-1], start + 5, start + seconds, result["service_ms"] / 1000)
            print(f"seed {seed}: phase {args.by_limit} from 5 s in, by limit at admission:")
            for limit, row in rows.items():
                print(
                    f"  {limit:3d}: {row['share']:6.1%} of responses, p50 {row['p50_x']:.2f}x,"
                    f" p99 {row['p99_x']:.2f}x, above 1.5x {row['over_1_5x']:.1%}"
                )
        elif args.markdown:
            print(markdown(result))
        else:
            print(f"seed {seed}:")
            print("\n".join(f"  {line}" for line in targets(result)))


if __name__ == "__main__":
    main()
