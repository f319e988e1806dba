"""Adaptive concurrency: a compartment that finds its dependency's capacity by itself.

``Policy(max_concurrency=AdaptiveLimit(...))`` replaces a fixed number of slots with one an
algorithm moves as it watches the exchanges end.  This module holds the configuration
(``AdaptiveLimit``), the two algorithms (``Gradient``, ``AIMD``: pure, clock-free, fed
samples and "now") and ``AdaptiveController``, the few lines that feed an algorithm from a
compartment and apply its verdict with ``Limiter.set_limit``.

Theory of operation
-------------------
*A sample* is one exchange that ended: the instant its request was handed to a connection
(after the wait for a slot and for a connection, which are our own queues, and after the
connect, which the limit's growth would otherwise pay for in new connections), the
seconds from then to the response head, and whether it was a *drop*.  The
response head, not the body's end: it is what the dependency's queueing and work delay,
it is known for every response (also one closed early), and it does not grow when the
caller reads the body slowly.  The sample is fed when the exchange ends (body read, closed,
or failed), so a body that then times out counts as a drop.  A drop is a timeout of the
exchange (``RequestTimeout``, httpx's connect/read/write timeouts; not ``AcquireTimeout``,
which is our queue) or a status of ``AdaptiveLimit.drop_statuses`` (opt-in, e.g. 429/503).
An exchange that failed otherwise (connection refused, protocol error) or was cancelled
before its head says nothing about load and is not fed; nor is a *refusal* that is not a
drop, a response of status 5xx or 429: it is answered without the work of a request, often
at once (a server shedding its excess, a proxy whose upstream is down, a dependency
failing fast), so its latency would read as a dependency without load, and a gradient fed
it grew the limit into the dependency's refusals (the lab's model with ``--shed 8``:
12-17% of phase 2's requests refused, now 1-3%, all while the capacity falls).  It still
frees its slot (and closes a test's, as an unfed end does) and counts towards its
window, without a latency: a window of refusals alone changes nothing, and a window
refused more often than answered does not grow the limit (the dependency said no; a
share of refusals that does not grow with the load, a buggy endpoint's, leaves the
growth alone).  A refusal slower than ``no_load * tolerance`` is fed all the same: it did
the work or waited in a queue (a gateway whose upstream timed out: a 504 after seconds).

*Gradient* (after Envoy's adaptive concurrency filter and Netflix's Gradient2): samples
are gathered in windows of ``max(WINDOW_SAMPLES, limit)`` exchanges (about one round
trip of the whole limit); after the limit changed, only exchanges that *started* after the
change count, so a window measures the limit in force, not the queue an older, higher
limit built.  At a window's end its median latency ``m`` is compared with the no-load
latency: ``ratio = m / no_load``.  With a dependency of N workers and a queue, a limit
above what keeps the N busy (call it ``L*``: N plus the slots our own side holds while
the workers are idle) gives ``m = no_load * limit / L*`` (Little's law), so the ratio is
how far above ``L*`` the limit is, and below ``L*`` the ratio is 1 (plus noise).  The
limit is to sit just above ``L*``: every worker busy, a queue of a slot or two.

The first window after the limit was *raised* (a growth or a test's doubling) is the
exception: its ``m`` is the median of the exchanges that started after its median start
(if they are a quarter of it at least: starts that tie, a batch or a coarse clock, leave
the window's median).  Under load that arrives regardless of our responses, the queue a
raise past ``L*`` makes builds over the window (at the rate the arrivals exceed the
capacity), and the exchanges that started first find little of it: the window's median
under-reads the queue, reads within the tolerance or just above it (a cut of a slot or
none), and the next window pays for it (in the lab's model, a climb's x1.5 step to 43
slots for 24 workers cut nothing for a window, then 5 slots, and the overshoot lasted
0.8 s; a window at 12 slots for 4 workers read 1.07x, its later half 1.57x).  By start,
not by end: the last exchanges to end are the slowest of those that started together,
queue or none (judged by the later half to end, a spread of sigma 1 held the limit down
in a review's test).  Later windows, at a limit that held or was cut, are judged by
their median: there a tail of slow exchanges is a stall of our own as often as a queue.
Nor is a probe's end a raise: the burst of exchanges it starts, on new connections, can
end late for reasons of our own (in the real lab, the window after the first probe, at
10 slots for 16 workers, read a queue in its later half and cut a slot).  In the model
(seeds 1-80, quiet/loaded): runs that meet all of phases 1 and 3's targets 26 and 6 (16
and 2 before); phase 1's whole-phase p99 above 1.5x in 5 and 23 runs (18 and 44), phase
3's in 24 and 42 (39 and 62); phase 2's from 5 s in 1.38x/1.45x on average
(1.40x/1.44x); at the price of phase 3's goodput, 0.898/0.879 of the best static limit's
(0.905/0.887).  What it costs (``tests/adversary/test_adaptive_review3.py``): the later
starters are also those a stall of our own late in the window delays (a quarter of it
stalled to 1.5x cuts 24 slots to 21); with a fixed pool of callers (a closed loop) and a
spread of sigma 0.2 and more, those that end within the window are the quicker ones, and
hide a queue the median would show until the next window; and a dependency slower to its
first requests than to its later ones (one serving the newest first) reads no queue.
Each mend tried there (the higher of the two medians, a lower quantile of the later
starters, the rule only on a window whose median reads some queue) gave back most of the
gain in the model.

- ``ratio > tolerance`` (default 1.1): a queue.  The limit is cut to
  ``applied * tolerance * CUT_AIM / ratio``: ``L*`` plus the queue the tolerance allows
  (and at most by half per window, ``MIN_GRADIENT``; never up); a window just above the
  tolerance is noise as often as a queue and barely moves it.  The second such window in
  a row since the last cut takes at least one slot: at a small capacity one slot of
  queue is 25% of latency (N=4) yet reads as a ratio of about 1.12, which the rounding
  of the aimed cut would keep for good.  A cut records the limit it cut from (the
  *ceiling*; after cuts in a row that leave the limit within two tolerances of it, the
  highest of them: the sawtooth's top, where the next queue will be; the tolerance there
  taken within ``TOP_TOLERANCE``, since at 1.01 two are less than a slot and at 3.0 a fall
  to a ninth) and starts a hold.
  At small limits (``TEST_BELOW`` and below, with tests) one window over the tolerance
  after more than ``HOLD`` in a row that found the limit in use and within it counts as
  such a first window, whatever its ratio: there a cut is a slot at least (12% of the
  capacity and more) and only the tests win it back, while a queue the limit causes
  shows in every window and one window alone is a stall of our own process as often as
  not; the next window over cuts.
- Otherwise, when the limit is in use (its peak at least half, else no evidence: no
  change), after ``HOLD`` windows since the last cut the limit grows:

  - *beyond* the ceiling (``ESCAPE`` times it and two slots more: the capacity grew past
    where the queue was), *quiet* (``ratio < 1 + (tolerance - 1) * QUIET``) and *used*
    (the slots in use, averaged over the window, at least ``IN_USE`` of it: an open-loop
    load just above the capacity fills a higher limit only at its peaks): by ``GROWTH``
    (1.35; also before the first cut, whose ceiling is 0);
  - beyond and used but not quiet (our own noise, or a queue starting), or quiet
    (near the ceiling): by one slot (a multiplicative step near the last queue
    overshoots into the queue it just left; growth only on quiet windows there keeps the
    limit from drifting into a queue of a slot), but into *beyond* only on a used window
    (in a lull of the traffic the limit would drift there unproven, then grow fast).
  - at small limits (``TEST_BELOW``, 8, and below) near the ceiling, not by windows but by
    *headroom tests* (below), when a timer can open them (``AdaptiveController`` given
    ``call_later``, as a transport's are).

  This is what the climb after the capacity rose needs: 4 -> 24 slots (in band) in about
  1.4 s in the model, each step a window of about two round trips, with one window of
  overshoot (at most ``GROWTH``) cut back at its end.  That window is why ``GROWTH`` is
  1.35, not 1.5: the step that crosses ``L*`` lands anywhere up to ``GROWTH`` above it, and
  the latency of that window's exchanges with it; at 1.5 it put phase 3's whole-phase p99
  above 1.5x in 59 and 91 of 160 model runs (seeds 1-160, quiet and loaded), at 1.35 in 0
  and 36.  In phase 3's climb the extra step is paid for by the headroom tests' quicker
  verdicts (below); a climb that starts above ``TEST_BELOW`` pays it.

So above ``TEST_BELOW`` the limit saws between about ``L*`` and ``tolerance * L*``.  At a
small capacity a slot of queue is dear: at N=4 a static limit of 5 puts 9% and 11% of the
responses above 1.5x the service time (quiet, loaded; 4 puts none;
``python -m benchmarks.adaptive_sim --by-limit 2``), and growth by a window at ``L* + 1``
ran a third of the time there, so phase 2's p99 from 5 s in was 1.7x-1.9x.

*The latency's spread.*  A window's median is a noisy measure, and so is the probe's that
gave ``no_load``.  The lab's dependency spreads its service time over +-10%; a real one
often spreads it far wider (an API whose p99 is three times its median, an LLM's ten
times), and then the median of 8 or 16 exchanges moves by 15-40% from one window to the
next with no queue at all.  Judged against a fixed tolerance of 10%, such windows read as
queues half the time: in the model at a steady 16 workers, lognormal spreads of sigma
0.25, 0.5 and 1 held the limit at a slot or two for much of the run (goodput 0.74, 0.42
and 0.16 of a static 16's, quiet, seeds 1-12).  So the gradient measures the spread: the log
latencies of the last ``SPREAD_SAMPLES`` exchanges of full windows, each less its window's
median (a queue moves a window as a whole; what is left is the dependency's own spread; but
while the spread measured reads narrow, not a window whose median reads over the tolerance
its own dispersion would widen to: the capacity fell under it, and it mixes exchanges that
waited with ones that did not; taken as spread, a fall's windows read as one of up to 0.32
in lab runs, and in one the tolerance widened to 1.26-1.41 and a slot or two of queue stood
at 4 workers for 6 s.  Judged by the window's own dispersion, not by the tolerance, so that
a wide spread is still learned from the windows that show it: left out for reading over the
narrow tolerance, with a share of fast refusals it was learned at round 91, not 23, in a
review's rotation), their interquartile range as a standard deviation (robust to the few
exchanges a test or a stall delays; a deviation from its own window's median is smaller than
from the dependency's, by ``CENTRE_BIAS / n`` of its variance, which is corrected; a latency
of 0, a clock too coarse to see it, is left out).  Above ``TEST_SPREAD`` the spread is
*wide*: a window of n samples is judged against ``tolerance`` plus whatever ``SPREAD_Z``
standard errors of the ratio of the window's median to the probes' estimate (of
their samples) exceed it (``_margin``; up to ``MAX_TOLERANCE`` in all), the fall of a median
that moves ``no_load`` is widened as much, and no headroom test is run (the wait of its
one exchange, a third of the service time at most, would be lost in the spread; windows
grow the limit instead).  Below it (the lab's +-10% measures 0.06-0.11, rarely more under our
own stalls) nothing changes: the tests and the rules for a lone noisy window deal with
the noise, and a margin there let a slot of queue stand at 4 workers (phase 2's p99 from
5 s in, loaded, 1.50x on average over seeds 1-30 with the threshold at 0.15, 1.44x as
before at 0.2).  Over seeds 1-12 at a steady 16 workers, quiet and loaded, sigma 0.25,
0.5 and 1 now give 1.01/1.03, 1.00/1.03 and 0.90/0.91 of a static 16's goodput (0.73
and 0.60 at the worst, at sigma 1), with a p99 1.1-1.2x its; a steady mix of requests at 20
and 200 ms, 45-50% of them slow, no longer holds the limit at one slot.  A wide spread
costs precision: the limit sits further above the capacity (up to the widened
tolerance), and a probe of 8 exchanges leaves ``no_load`` uncertain (at sigma 0.5, off by
15% as often as not: read low, it can hold the limit at a slot or two until the next
probe, as in 14 and 8 phases of 480 of the lab's model at that spread, quiet and loaded;
11 and 3 since windows at one slot refine it, below).

*A headroom test* asks whether one more request would wait, and is timed so that the
answer is clear and cheap.  In a steady rotation (every slot in use, each end's slot taken
again at once), the exchanges in flight began at the last ``limit - 1`` ends, so the first
of them is due to end ``no_load`` after the earliest of those.  If the dependency has no
worker free, a request sent ``TEST_AIM * no_load`` (a third) before that instant waits that
long; if it has one, it does not wait.  So at the end of an exchange, with the test armed
and every slot in use, the algorithm names that instant (``open_at``); the controller sets
a timer, and at it ``open_test`` raises the limit by one (``applied``; the windows still
judge ``limit``, ``base``, which ``limit_history`` records).  The next end closes the
slot again (with a sample or without one: a request cancelled or failed frees a slot all
the same, ``unfed_end``), so exactly one request more is admitted; nobody else waits for
it, since it takes the worker that frees next, in the place of the request that would
have.  Above ``TEST_BELOW`` no test is armed.  The exchanges admitted while the slot was open are
then judged each against ``no_load`` plus half the wait it would have had
(``TEST_VERDICT``), until the instant named or, if it came sooner, the end that closed the
slot (the first of the others to end: as a rule a worker came free for it then, whatever
that exchange's own spread; the exceptions below); any above it is a failure; a test
whose last request would have waited less than ``TEST_INFORMATIVE`` of ``no_load`` (the
dependency's own spread, +-10% in the lab) says nothing (a failure, less than
``TEST_FAIL_INFORMATIVE``).  Two successes in a row (one can be the spread; a failure that says
nothing, within our own noise, does not break the run) double the limit (``TEST_GROWTH``)
and clear the ceiling, so windows grow it on from there; but below the base of the last
informative test that failed, they grow it to that base at most, where the tests resume
(the limit was cut below what the tests had found, by our own noise: doubling from there
overshoots into a queue), and a doubling is not the *peak* that ``FALL_TO_PROBE``
compares with until a window found it in use and without a queue (a false success would
otherwise make the cut back from it read as a fall of the capacity, and start a probe at
a slot or two).  A failure doubles the windows before the next test, up to ``TEST_GAP``
(2), so that at a capacity that did not move, tests are a few percent of the requests,
each about 1.3x the service time.  An end before the instant named (the rotation was not
as predicted) or a slot nobody took cancels the test; twice in a row, or no verdict for
``TEST_FALLBACK`` (6) windows, means the traffic gives tests no chance (a batch of requests at
a time, a client that waits for all of them), and a quiet window grows the limit by one
slot as above.  In the model
(seeds 1-12, quiet and loaded), phase 2's p99 from 5 s in is now 1.43x and 1.43x on
average (1.71x and 1.75x with a window at ``L* + 1``), phase 3's goodput 0.91 and 0.91 of
the best static limit's (0.91 and 0.90); phase 2's goodput from 5 s in is at least 0.91
of the best static limit's in every run (0.88 before the rules for a lone noisy window
and for wins below the last failure).  Earlier attempts, each measured in the model:
testing ``L* + 1`` by windows less often (p99 1.50x/1.65x, phase 3's goodput 0.77/0.70), a
slot more for five exchanges (1.45x/1.51x, 0.83/0.83), tests of one or a few requests at
any instant (their verdict is either weak or dear: 1.49x/1.50x with 0.88/0.84), and a slot
opened when an exchange was due to end (free, and uninformative for the same reason).
Against our own noise (seeds 1-12, quiet/loaded), also tried: a failure that says nothing
taken as no verdict at all (tests again at once: more of them, p99 1.47x/1.48x); counting
towards the fallback growth only the windows in which a test was due (it also finds phase
3's capacity: p99 1.36x/1.49x, goodput 0.90/0.90); a lone noisy window that restarts the
hold (no verdict for long: the fallback grows into the queue); and a peak of windows'
confirmed limits only (the probe after a lasting lag came later: phase 3's goodput under
the slow-loop noise 0.87, was 0.89).

*The wait measured, not predicted.*  At 4 slots ends come every quarter of ``no_load``, so
a test opens at an end about that long before the next one is due: a predicted wait of
0.2-0.33 ``no_load``, often under the 0.22 that ``TEST_INFORMATIVE`` was, and 31% of the
tests that followed phase 3's rise in the model said nothing (seeds 1-40, quiet).  Judged
by the instant predicted, a test whose first exchange due ended early by its own spread
waited less than predicted and could pass with no worker free: 1.5% of phase 2's
informative tests at 4 workers passed (6% loaded).  Judged by the end that closed the slot,
a success tells from a wait of 0.15 ``no_load`` (``TEST_INFORMATIVE``), and 1.1% (3.3%) of
those tests pass (a rate per test: with twice as many tests, a review counted 13 and 32
false passes in phase 2 of seeds 1-40, against 7 and 29), while 12% of phase 3's say
nothing; so tests can come twice as often (``TEST_GAP`` 2, was 4).  A failure still needs a
wait of 0.22 (``TEST_FAIL_INFORMATIVE``): half the wait is the allowance, and under the
dependency's own spread a request served at once would fail (a review: 9 of 95 tests failed
so while the capacity had risen, seeds 1-40).  The end that closed the slot may have freed
no worker (a cancel, a refusal): the wait then reads short, which can fail a test or make
it say nothing, never pass it.  Our own stall over that end makes us see it late, and the
test is judged by the instant predicted, as before
(``tests/adversary/test_adaptive_review4.py``).  In the model (seeds 1-160, quiet/loaded),
with ``GROWTH`` at 1.35 (above): runs meeting every target of phases 1 and 3 120/33 (57/8
before); phase 3's goodput 0.913/0.894 of the best static limit's (0.900/0.878), under 0.9
in 30/83 runs of 160 (61/111); its whole-phase p99 above 1.5x in 0/36 (59/91).  The price
is the tests' own requests, each about 1.3x the service time and now twice as many: phase
2's p99 from 5 s in 1.415x/1.49x on average (1.39x/1.46x), above 1.5x in 3/34 runs (5/24);
phase 1's whole-phase p99 above 1.5x in 7/76 (5/57; in the loaded noise a static limit at
the capacity has a p99 of 1.29x already); and climbs above ``TEST_BELOW``, where no test
speeds them, take more windows (4 -> 64 workers from ``initial_limit=4``: in band after 3.3
s on average over seeds 1-10, 2.6 s before, 5.2 s in one).
``benchmarks/adaptive_sim.py`` models the lab event by event, and
``tests/unit/test_adaptive_sim.py`` checks these choices there.

*Tried since: a clear success counting twice.*  Of the tests that waited a quarter of
``no_load`` or more, the false successes in phase 2 (seeds 1-80, loaded: 7) came within 0.06
``no_load`` of the allowance, and the true ones after phase 3's rise 0.12 under it as the
median (81).  So a success with such a wait, each of its exchanges within ``no_load`` and a
quarter of its wait, was made to double the limit by itself (with an informative failure
marking the ceiling one slot over its base: quiet windows just after a doubling grew the
limit into that queue).  Runs meeting every target of phases 1 and 3 went from 120/33 to
130/39 in the model (seeds 1-160, quiet/loaded), and from 6 to 10 of 12 in the lab
(interleaved).  But when the slot closed after the instant named, the wait read is the one
predicted, and our stall over an earlier end reads the same: a review had a request that
waited 15 ms and was served in 0.9x pass as clear, and, with a client that always has a
request ready under the loaded noise's stalls, saw a steady 6 and 8 workers doubled 29 and
16 times in 40 runs of 55 s (4 and 0 before), the p99 from 5 s in above 1.5x in 14 of the 40
at 6 (none).  Restricted to 4 slots and below, and to a latency within ``no_load`` where the
wait read was the predicted one: 127/35 in the model, but at a steady 4 workers 8 false
doublings (3), and in the lab 7 of 12 runs meeting every target against 7 of 12, one of them
doubled to 8 in phase 2 (its p99 from 5 s in 1.96x).  Not landed.

*A more precise no-load latency.*  Given it exactly (an oracle, in the model), the runs
meeting every target of phases 1 and 3 rise from 120 to 131 of 160 (quiet; loaded, 33 to
44): the ratio of a window is then the window's own noise alone.  The gain holds with an
estimate off by 1% (a standard deviation) and is gone at 2%; a probe's median of 8
exchanges is off by about 3% for the lab's spread of +-10%, of 16 by 2.3%.  A probe long
enough for 1% (some 60 exchanges at one slot) costs more capacity than the precision gains;
so ``no_load`` is measured better from the exchanges it has (``_estimate``): the geometric
mean of their middle (``_centre``: an eighth left out at each end; their median instead
when further from it than ``CENTRE_BOUND``, 5%, so that a stall of our own over more than
the eighth moves it no more than the median), over the probe's exchanges and, while each
probe's own estimate agrees with ``no_load`` within ``POOL_AGREE`` (6%; less at a
tolerance under 1.08, where the part of a change the pool keeps would not read as quiet),
the last probes' (``POOL_SAMPLES``, 24): off by about 1.75% for a probe of 16 and 1.4% for
24.  Geometric, because a plain trimmed mean reads a skewed latency above its median (6% at
a lognormal sigma of 0.5), and the windows are judged by their medians.  A ``no_load``
moved down by windows (``DESCENT``) empties the pool: its exchanges are a slower
dependency's.  In the model, seeds 1-480 (quiet/loaded):
runs meeting every target of phases 1 and 3 376/101 (333/88 with the median; of seeds
1-160, 132/40 against 120/33); phase 3's goodput under 0.9 of the best static limit's in
83/203 runs (106/235), at least 0.69/0.75 (0.61/0.55), its whole-phase p99 above 1.5x in
3/79 (7/92); phase 2's p99 from 5 s in 1.414x/1.477x on average (1.419x/1.490x).  The
estimate clamped to 3% of the median instead of falling back to it, and pooled within
``POOL_AGREE`` at any tolerance, gave 376/100 (review 8 found both wanting); the median
beyond 3% gave 373/99 (it sent one first probe of 8 in eight or so back to its median:
review 4's climb from 4 slots, seed 8, in band after 5.17 s again, 3.04 s at 5%).  Tried
in a first sketch (no bound, nor an emptied pool: 371/100): a quarter left out at each end
(361/78: less precise), agreement within 10% (372/104, no different); a plain trimmed mean,
pooled (354/100) and not (346/87); the median of the pooled exchanges (329/73).

A window with a drop also multiplies the limit by ``backoff``.

``no_load`` is measured by *probes*, and moves halfway down when two window medians in a row
are more than ``DESCENT`` (5%) below it (to the higher of the two: a dependency that became
faster); closer medians, or one alone, are noise, and following them would sink the estimate
to the lowest of many, a few percent under the truth, which then reads as a standing queue
and stalls the growth.  A probe drops the limit to ``limit * PROBE_FRACTION`` (at least
``min_limit``) for one window of ``PROBE_ROUNDS`` rounds of its limit
(``FIRST_PROBE_SAMPLES`` exchanges at least), from which (and the last probes', above) it
measures the new ``no_load``, then restores the limit.  A probe that reads ``no_load`` more
than the tolerance (``REPROBE_OVER`` at least) above the last estimate runs again at half
its slots (``REPROBE_LIMIT`` of them at least), and so on while the reading stays that far
over the estimate before the first and fell that far since the last (``REPROBE_FALL`` at
most: a halving halves a queue's reading at most); a probe of the chain that measures
nothing leaves the estimate before it: after a fall the probe runs at a quarter of the limit
that showed the queue, and below the concurrency that queue implies, but that window's
median lags the fall, and where the capacity fell further (a lab run: 20 slots, a window at
2.24x, a probe at 5 for 4 workers) the probe's own exchanges queued and read as a dependency
24% slower, and the limit sawed a slot above the capacity until the next probe (phase 2's
p99 from 5 s in 1.95x).  A queue at the probe's slots shrinks with them (8 slots for 2
workers read 4x, 4 read 2x, 2 read the truth: review 17); a dependency that did slow reads
the same at half the slots, and that reading stands, for the cost of one more probe.  Probes
run first (no estimate yet: at ``min_limit``, as Envoy's do, since nothing says yet how many
a quarter would be), every ``probe_interval`` seconds (jittered by ``PROBE_JITTER`` so a
fleet does not probe at once), when the limit fell to ``FALL_TO_PROBE`` of its peak since
the last probe in two windows in a row over the tolerance (at a quarter of the limit the
second window measured, and below the concurrency its queue implies; one window alone can be
a stall of our own process, whose probe would re-measure nothing and cost up to a second of
the capacity: likely the real lab's probe at 40.5 s), and after ``MIN_LIMIT_WINDOWS``
windows in a row at ``min_limit`` (the dependency became slower for good: the old
``no_load`` is obsolete), as Envoy does.  At one slot, though, with one exchange in flight
at most (no headroom test's second), none of ours waited behind another, so a window there
measures what a probe there would: one without a drop whose median is within the tolerance
(with the spread's margin) of ``no_load``, above or below it, joins the pool (the last
``POOL_SAMPLES``), refines ``no_load``, and counts as no window at ``min_limit`` (it says
the dependency did not change).  ``_probe_n`` stays the probes' (those windows are chosen by
their medians: counted, they narrowed the margin while the pool read low, review 9), and a
window in which ``DESCENT`` moved ``no_load`` is not pooled.  A probe of 8 exchanges is
uncertain under a wide spread (at lognormal sigma 0.5, off by 15% as often as not, by a
fifth or more in 37% of probes); read low, its windows at one slot read as a queue of ours
that cannot exist there, and held the limit at a slot or two until ``MIN_LIMIT_WINDOWS``
brought a probe that could read low again.  A window beyond the tolerance is not pooled: a
dependency slower (or faster) for good would move the estimate after one window instead of
after the probe's debounce.  In the lab's model at sigma 0.5 (seeds 1-160, quiet/loaded),
phases whose goodput from 5 s in is under half the best static limit's: 11 and 3 of 480,
against 14 and 8 (with the probe windows of ``PROBE_ROUNDS``; at the lab's spread, 319 of
320 runs as before, seeds 1-160: the limit is rarely at one slot there; the other's phase 2,
loaded seed 39, 0.63 of the best static limit's goodput from 5 s in, not 0.40).

*AIMD* (as TCP's congestion avoidance): each drop multiplies the limit by ``backoff``,
once per round trip (drops of exchanges that started before the last cut are the old
limit's and are ignored); each other sample adds ``1 / limit`` while at least half the
slots are in use, about one slot per round trip.

Invariants: ``min_limit <= applied <= max_limit`` after every call; the applied limit is an
int (the float state rounded down, and one slot more while a headroom test is open, from
``open_test`` to the next end); the algorithms read no clock, do no I/O and keep
O(window) memory (and at most ``HISTORY`` moves); the controller holds at most one timer
(cancelled at the next sample and by ``close``) and records each change of the base limit
(not a test's slot) in a bounded history (``HISTORY`` entries).

*Why the limit moved.*  Whatever changes the base limit says why: a *move* ``(base, reason,
words)`` in the algorithm's ``moves``, the reason a code of ``REASONS`` and the words with the
figure that decided it.  ``probe``: a probe began (a periodic one, or the limit fell to half
its peak; one that leaves the base where it is, the first and those at ``min_limit``, is no
move, nor is its end); ``probed``: it ended, with the no-load latency it measured, the limit
restored; ``queue``: a window over the tolerance cut it (the tolerance
named when the spread widened it); ``growth``: a window without a queue (AIMD: an exchange
without a drop) grew it; ``headroom``: two headroom tests grew it (doubled, or back to the
base of the last test that failed); ``drop``: drops multiplied it by ``backoff``.  One call
can make several (a window that cuts and starts the fall's probe, or grows and starts a
periodic one; a cut and a drop), each from the last one's base.  The controller takes them
after each call and records each in ``history`` and in a DEBUG line on
``httpx_bulkhead.adaptive`` (``_log.log_limit``), also a change that a test's open slot hid
from the applied limit (the base grew as the slot closed): the history and the lines are one
chain, and the lines are the one account of why.
"""

from __future__ import annotations

import math
import random
from collections import deque
from collections.abc import Callable
from collections.abc import Set as AbstractSet
from dataclasses import dataclass, field
from typing import Literal, Protocol

import httpx

from ._log import log_limit

__all__ = [
    "AIMD",
    "AdaptiveController",
    "AdaptiveLimit",
    "Gradient",
    "is_drop",
    "make_algorithm",
    "refusal",
]


class _Default(int):
    """An int that says the field was left at its default (``AdaptiveLimit`` then fits
    it to the fields that were set, instead of refusing a valid setting of those)."""

    __slots__ = ()


DEFAULT_MIN_LIMIT = 1
DEFAULT_MAX_LIMIT: int = _Default(200)
DEFAULT_INITIAL_LIMIT: int = _Default(10)
#: Gradient: latency accepted above the no-load latency before the limit is cut (10%).
DEFAULT_TOLERANCE = 1.1
#: Gradient: seconds between two probes of the no-load latency.
DEFAULT_PROBE_INTERVAL = 60.0
#: The limit is multiplied by this on a drop (both algorithms).
DEFAULT_BACKOFF = 0.9
#: Fewest samples in a gradient window (the window is ``max(this, limit)`` samples).
WINDOW_SAMPLES = 8
#: A probe window is this many rounds of the probe's limit (``FIRST_PROBE_SAMPLES`` at
#: least): its exchanges end in time order, and a window shorter than a round of the limit
#: closes on the quickest of those in flight.  Capped at 16 samples, periodic probes at
#: 16-21 slots (limits of 64-84) read the no-load latency 4% low at a lognormal spread of
#: sigma 0.25 and 12% low at 0.5 in the model; four rounds, with ``EXPOSURE``, within 1%.
PROBE_ROUNDS = 4
#: Under a wide spread, a probe's estimate is of its exchanges that started this many
#: medians before its end, if there are ``FIRST_PROBE_SAMPLES`` of them: of those, only the
#: ones slower than that are still in flight, where of all of them the slower part of the
#: last round is (the window closes on the quickest of those in flight).  In a steady
#: rotation at a probe of 16 slots, the estimate's mean log error at sigma 0.25, 0.5 and 1:
#: +0.2%, -0.2% and -8% (-1.5%, -6% and -17% with all of them; capped at 16 samples,
#: -2.5% and -18% at 0.25 and 0.5).  Under a narrow spread the bias is negligible and all
#: of the exchanges are more precise.  Left as they are (review 10): at sigma 2 the probe
#: still reads about 20% low (45% before; 29% of such a spread is slower than the cut), and
#: its four rounds, counted in ends, last four mean latencies, about 7 medians each there
#: (a probe at 16 slots: 4.7 s of 100 ms exchanges, 2.5 s before).
EXPOSURE = 3.0
#: ``no_load`` is measured over the samples of the last probes (the last this many) while
#: each probe's own estimate agrees with it within ``POOL_AGREE`` (for the lab's spread of
#: +-10%, 24 samples make it about 1.4% off, 16 about 1.75%, the median of 16 2.3%).
POOL_SAMPLES = 24
POOL_AGREE = 0.06
#: ``no_load`` leaves out this share of its samples at each end (see ``_centre``; a quarter
#: is less precise: in the model, 361/78 runs of 480 met all targets, against 371/100) ...
TRIM = 0.125
#: ... and is their median when further from it than this share.
CENTRE_BOUND = 0.05
#: Fewest samples in a probe window (at one slot, as the first probe is by default,
#: ``PROBE_ROUNDS`` rounds are 4 samples: too few for an estimate).
FIRST_PROBE_SAMPLES = 8
#: A probe runs at ``limit * PROBE_FRACTION`` (at least ``min_limit``).
PROBE_FRACTION = 0.25
#: A probe that reads ``no_load`` over the tolerance above the last estimate probes again at
#: half its slots if that is this many at least (a probe at one slot takes 8 exchanges one
#: at a time, a second at the lab's service time; it cost a lasting lag of our own 3-20% of
#: phase 1's goodput from 5 s in, in the model).
REPROBE_LIMIT = 2
#: A probe's reading is compared with the estimate before it at the tolerance, and at this
#: ratio at least: two probes' estimates of the same latency differ by a few percent (at a
#: tolerance of 1.01 a probe again on such noise cost 3-5% of the goodput: review 17).
REPROBE_OVER = 1.1
#: A chain of probes goes on while the reading fell since the last by the threshold above,
#: or by this at most: halving the slots halves a queue's reading at most, so at a tolerance
#: of 2 no chain went past its second probe (review 18).
REPROBE_FALL = 1.5
#: Probes are delayed by up to this fraction of ``probe_interval``, at random.
PROBE_JITTER = 0.1
#: Windows in a row at ``min_limit`` that start a probe.
MIN_LIMIT_WINDOWS = 5
#: A limit that fell to this share of its highest since the last probe starts a probe:
#: either the capacity fell (the probe costs little then) or the latency is high for a
#: reason the limit does not cure (the dependency, or our own loop on a busy machine,
#: became slower), and the ``no_load`` it is measured against is obsolete; without
#: this, such a latency cuts the limit down to ``min_limit``.
FALL_TO_PROBE = 0.5
#: A window's median below ``no_load * (1 - DESCENT)`` moves ``no_load`` halfway down to
#: it; closer ones are noise (moving on every lower median sinks the estimate to the
#: lowest of many, a few percent under the truth, which then reads as a standing queue).
DESCENT = 0.05
#: A cut aims at a latency of ``tolerance * CUT_AIM`` times the no-load latency: a window
#: just above the tolerance is noise as often as a queue, so it stops the growth (and
#: starts ``HOLD``) but barely moves the limit.
CUT_AIM = 1.02
#: Largest cut of one window (the limit falls at most by half per window).
MIN_GRADIENT = 0.5
#: After a cut, windows that leave the limit where it is before it grows again.
HOLD = 2
#: The tolerance that says whether cuts in a row stay at the sawtooth's top (within two of
#: them of the ceiling) is the user's, taken within these bounds: at 1.01 two were less than
#: a slot below 50, so any two cuts read as a fall, and at 3.0 a fall from 40 to 10 read as
#: the top (review 16).  Two of the highest stay under the fall that starts a probe
#: (``FALL_TO_PROBE``, a factor of 2): at 1.5 a fall from 36 to 16 probed and yet kept 36
#: (review 19).
TOP_TOLERANCE = (1.1, 1.4)
#: Growth of one quiet window past the last queue (a window of overshoot costs at most
#: this factor in latency, cut back at its end).
GROWTH = 1.35
#: The latency shows no queue while below ``no_load * (1 + (tolerance - 1) * QUIET)``.
QUIET = 0.5
#: The limit is in use when the slots in use, averaged over a window's samples, reach
#: this share of it (an open-loop load a little above the capacity fills a limit above
#: the capacity only now and then: its peak alone proves nothing).
IN_USE = 0.9
#: A limit at ``ESCAPE`` times the limit of the last cut and two slots more is past where
#: the queue was: the capacity has grown, and a quiet window grows it by ``GROWTH``.
ESCAPE = 1.1
#: At limits up to this, growth near the last queue is by timed headroom tests, not by
#: a slot more for a window (a slot of queue is an eighth of the latency and more).
TEST_BELOW = 8
#: A test opens ``TEST_AIM * no_load`` before a slot of the dependency is due to free:
#: the wait of its request if none is free now, enough to tell and cheap to pay (at most
#: about 1.5x the service time with a spread of +-10%).
TEST_AIM = 0.33
#: No test opens less than this share of ``no_load`` before that instant (too cheap to tell).
TEST_MIN_WAIT = 0.2
#: A test succeeds when each of its exchanges took at most ``no_load`` and this share of
#: the wait it would have had with no worker free.
TEST_VERDICT = 0.5
#: A test that succeeded, its last request having been due to wait less than this share of
#: ``no_load``, tells nothing (the dependency's own spread hides it) ...
TEST_INFORMATIVE = 0.15
#: ... and a test that failed, less than this: half of it, the allowance, must exceed the
#: dependency's own spread (+-10% in the lab), or a request served at once fails.
TEST_FAIL_INFORMATIVE = 0.22
#: Growth after two tests in a row found a slot free.
TEST_GROWTH = 2.0
#: Windows between two tests: doubled after each failed one up to this, 1 after a success.
TEST_GAP = 2
#: Windows with no verdict (the traffic gives tests no chance) before a quiet window grows
#: the limit by one slot without one.
TEST_FALLBACK = 6
#: A test whose exchanges have not all ended after this many ``no_load`` is forgotten.
TEST_EXPIRY = 4.0
#: The latency's spread is measured over this many of the last samples (see ``_margin``).
SPREAD_SAMPLES = 64
#: A window measures the spread from this many latencies (centred on their own median, 6
#: read a lognormal's sigma within 2%, 4 read it 15% high).  A window of ``WINDOW_SAMPLES``
#: exchanges, a fifth of them refused at once, holds fewer than 8: with 8 the spread that
#: widened at a fall with refusals was learned late or never (review 17); with 5, review
#: 16's refusals held one run of twelve at 4 slots or fewer for 21% of its rounds.
SPREAD_MIN = 6
#: A median of n samples has a standard error of about 1.25 sigma / sqrt(n) (normal data).
MEDIAN_SE = 1.25
#: Standard errors of the difference between a window's median and ``no_load`` that the
#: tolerance covers at least.
SPREAD_Z = 2.0
#: An interquartile range is 1.349 standard deviations (normal data); that of
#: ``SPREAD_SAMPLES`` values reads 0.98 of it on average.
IQR_SD = 1.349
IQR_BIAS = 0.98
#: Deviations from a window's own median, of n samples, have about ``1 - CENTRE_BIAS / n``
#: of the variance of deviations from the true centre (measured: 0.82x at n = 8).
CENTRE_BIAS = 2.4
#: The tolerance a wide spread widens to at most (``AdaptiveLimit.tolerance``'s own bound).
MAX_TOLERANCE = 3.0
#: A spread (a standard deviation of the log latency) above this is *wide*: the tolerance
#: widens with it and no headroom test runs (its one exchange's wait, a third of the
#: service time at most, would be lost in it).  The lab's +-10% measures 0.06-0.11.
TEST_SPREAD = 0.2
#: Changes of the applied limit kept for ``statistics().limit_history``.
HISTORY = 256
#: Why the limit changed, the codes of a ``Move`` (see the module docstring).
REASONS = ("probe", "probed", "queue", "growth", "headroom", "drop")
#: A change of the base limit: the new base, a code of ``REASONS``, and the same in words.
Move = tuple[int, str, str]

Algorithm = Literal["gradient", "aimd"]


#: The largest limit: the algorithms count slots in floats, exact up to 2**53 (a larger int
#: overflowed or rounded there, and a raw ``OverflowError`` left a request: review 20).
MAX_SLOTS = 2**53


def _check_int(name: str, value: object, minimum: int) -> None:
    if isinstance(value, bool) or not isinstance(value, int):
        raise TypeError(f"AdaptiveLimit.{name} must be an int, got {value!r}")
    if value < minimum:
        raise ValueError(f"AdaptiveLimit.{name} must be >= {minimum}, got {value}")
    if value > MAX_SLOTS:
        raise ValueError(f"AdaptiveLimit.{name} must be <= 2**53, got {value}")


def _check_number(
    name: str, value: object, low: float, high: float, *, high_open: bool = False
) -> None:
    """``low < value <= high`` (``< high`` if ``high_open``; a number, not a bool)."""
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise TypeError(f"AdaptiveLimit.{name} must be a number, got {value!r}")
    if not (low < value < high if high_open else low < value <= high):  # NaN fails too
        shown = f"({low:g}, {high:g}{')' if high_open else ']'}"
        raise ValueError(f"AdaptiveLimit.{name} must be in {shown}, got {value!r}")


@dataclass(frozen=True, slots=True)
class AdaptiveLimit:
    """A concurrency limit that follows the dependency: ``Policy(max_concurrency=AdaptiveLimit())``.

    Every default is meant to be left alone; ``min_limit``/``max_limit`` bound what the
    algorithm may do and are the ones worth setting.

    Args:
        min_limit: fewest slots, whatever the latency. Default 1.
        max_limit: most slots, whatever the latency; also the compartment's connection
            limit when ``Policy.max_connections`` is ``None``. Default 200.
        initial_limit: slots once the gradient's first probe (a few exchanges at
            ``min_limit``, to measure the no-load latency) is over, and AIMD's at the start.
            Default 10, brought into ``[min_limit, max_limit]``; a value given must be in
            that range.
        algorithm: ``"gradient"`` (default): follows the response latency against its
            no-load value, and drops; ``"aimd"``: follows drops only (a timeout, or a
            status of ``drop_statuses``), for dependencies whose latency says nothing of
            their load.
        tolerance: gradient only: how far the latency may rise above its no-load value
            before the limit is cut (1.1: 10%). It sets the queue the limit allows at the
            dependency: the limit stays between about its capacity and ``tolerance`` x
            its capacity. Lower values than the default read the latency's own noise as
            a queue. Default 1.1; in ``(1, 3]``.
        probe_interval: gradient only: seconds between two measures of the no-load
            latency (the limit drops to a quarter for 8 to 16 exchanges: a few round
            trips, eight at a limit below 8, where a quarter is one slot). ``None``:
            only the first probe and those after the limit fell to half its peak (or
            stayed at ``min_limit``). Default 60.
        backoff: the limit is multiplied by this on a drop (at most once per round trip
            for AIMD, per window for the gradient). Default 0.9; in ``(0, 1)``.
        drop_statuses: response status codes that count as drops, e.g. ``{429, 503}``
            (kept as a frozenset). Default: none (only timeouts are drops).

    Raises:
        TypeError, ValueError: a value of the wrong type or out of range (the message
            names the field and the value).
    """

    min_limit: int = DEFAULT_MIN_LIMIT
    max_limit: int = DEFAULT_MAX_LIMIT
    initial_limit: int = DEFAULT_INITIAL_LIMIT
    algorithm: Algorithm = "gradient"
    tolerance: float = DEFAULT_TOLERANCE
    probe_interval: float | None = DEFAULT_PROBE_INTERVAL
    backoff: float = DEFAULT_BACKOFF
    drop_statuses: AbstractSet[int] = field(default_factory=frozenset)

    def __post_init__(self) -> None:
        _check_int("min_limit", self.min_limit, 1)
        _check_int("max_limit", self.max_limit, 1)
        if self.min_limit > self.max_limit:  # blame the field that was set
            default = (
                " (the default: set max_limit too)" if type(self.max_limit) is _Default else ""
            )
            raise ValueError(
                f"AdaptiveLimit.min_limit must be <= max_limit={self.max_limit}{default},"
                f" got {self.min_limit}"
            )
        object.__setattr__(self, "max_limit", int(self.max_limit))
        if type(self.initial_limit) is _Default:  # left alone: within [min, max]
            # (fitted from the default, not from an earlier fit: ``dataclasses.replace``
            # passes the fitted value on, still marked as a default)
            fitted = min(self.max_limit, max(self.min_limit, int(DEFAULT_INITIAL_LIMIT)))
            object.__setattr__(self, "initial_limit", _Default(fitted))
        _check_int("initial_limit", self.initial_limit, self.min_limit)
        if self.initial_limit > self.max_limit:
            raise ValueError(
                f"AdaptiveLimit.initial_limit must be <= max_limit={self.max_limit},"
                f" got {self.initial_limit}"
            )
        if self.algorithm not in ("gradient", "aimd"):
            raise ValueError(
                f"AdaptiveLimit.algorithm must be 'gradient' or 'aimd', got {self.algorithm!r}"
            )
        _check_number("tolerance", self.tolerance, 1.0, 3.0)
        if self.probe_interval is not None:
            _check_number("probe_interval", self.probe_interval, 0.0, math.inf)
        _check_number("backoff", self.backoff, 0.0, 1.0, high_open=True)
        statuses = self.drop_statuses
        if not isinstance(statuses, AbstractSet):
            raise TypeError(
                f"AdaptiveLimit.drop_statuses must be a set of status codes, got {statuses!r}"
            )
        for status in statuses:
            if isinstance(status, bool) or not isinstance(status, int) or not 100 <= status < 600:
                raise ValueError(
                    f"AdaptiveLimit.drop_statuses must hold status codes, got {status!r}"
                )
        object.__setattr__(self, "drop_statuses", frozenset(statuses))


class Gradient:
    """The latency-gradient algorithm (see the module docstring).  Pure: ``now`` is given."""

    __slots__ = (
        "_armed",
        "_at_min",
        "_below",
        "_calm",
        "_ceiling",
        "_chain",
        "_cut_last",
        "_deviations",
        "_doubled",
        "_drops",
        "_ends",
        "_extra",
        "_fail_base",
        "_gap",
        "_inflight",
        "_misses",
        "_next_probe",
        "_opened",
        "_over",
        "_peak",
        "_pool",
        "_probe_n",
        "_probing",
        "_raised",
        "_refused",
        "_reported",
        "_rng",
        "_samples",
        "_saved",
        "_skip",
        "_spread",
        "_starts",
        "_steady",
        "_streak",
        "_test_at_end",
        "_test_base",
        "_test_closed",
        "_test_due",
        "_test_expect",
        "_test_failed",
        "_test_latest",
        "_test_opened",
        "_test_seen",
        "_timed",
        "_untested",
        "_used",
        "_wide",
        "_wins",
        "limit",
        "moves",
        "no_load",
        "open_at",
        "spec",
    )

    def __init__(
        self, spec: AdaptiveLimit, rng: random.Random | None = None, *, timed: bool = False
    ) -> None:
        self.spec = spec
        self._rng = rng or random.Random()
        #: Whether ``open_test`` is called at ``open_at`` (a timer): then growth near the
        #: last queue at small limits is by headroom tests, else by a slot a window.
        self._timed = timed
        self.limit = float(spec.initial_limit)
        #: The no-load latency estimate, seconds (``None`` until the first probe ends).
        self.no_load: float | None = None
        self._samples: list[float] = []
        self._starts: list[float] = []  # when each sample's exchange started
        self._raised = False  # the window is the first at a limit just raised
        #: The log latencies of the last windows, each less its window's median.
        self._deviations: deque[float] = deque(maxlen=SPREAD_SAMPLES)
        self._spread: float | None = None  # their spread (see ``_margin``)
        #: The samples behind ``no_load``: the last probe's and those pooled with them.
        self._probe_n = 0
        self._pool: deque[float] = deque(maxlen=POOL_SAMPLES)
        self._wide = False  # a spread too wide for the headroom tests
        self._drops = 0
        self._refused = 0  # refusals in the window (no latency)
        self._inflight = 0  # most slots in use seen in the window
        self._used = 0  # sum of the slots in use at each sample of the window
        self._opened = -math.inf  # samples of exchanges that started earlier are ignored
        self._at_min = 0
        self._below: float | None = None  # a window median well below no_load, if the last
        self._calm = 0  # windows since the last cut
        self._peak = 0  # the highest limit since the last probe
        self._ceiling = 0  # the limit at the last cut (the highest of a sawtooth's cuts in a row)
        self._cut_last = False  # the last window judged cut the limit
        self._over = 0  # windows in a row above the tolerance since the last cut
        self._streak = 0  # windows in a row above the tolerance
        self._steady = 0  # windows in a row that found the limit in use and without a queue
        self._saved = self.limit
        self._probing = False
        self._chain: float | None = None  # (see ``_start_probe``)
        self._next_probe = math.inf
        # The timed headroom test (small limits): armed by a window, open while _extra.
        self._ends: deque[float] = deque(maxlen=TEST_BELOW + 1)
        self._armed = False
        self._extra = 0
        #: When the headroom test wants its slot opened (``open_test``), or ``None``.
        self.open_at: float | None = None
        self._test_base = 0
        self._test_at_end = False
        self._test_opened = self._test_due = self._test_latest = 0.0
        self._test_closed: float | None = None
        self._test_seen = self._test_expect = self._wins = 0
        self._test_failed = False
        self._gap, self._skip = 1, 0  # windows between tests, and left to wait
        self._untested = 0  # windows without a test's verdict
        self._misses = 0  # tests in a row since the last verdict that nobody took
        self._fail_base = 0  # the base of the last informative test that failed (0: none)
        self._doubled = 0  # the limit a test's doubling set, until a window confirmed it
        #: The changes of ``base`` since the caller last emptied it, each ``(base, reason,
        #: words)``: the reason a code of ``REASONS`` (see the module docstring).
        self.moves: list[Move] = []
        self._reported = self.base  # the base of the last move (or the initial one)
        self._start_probe(-math.inf, "the first, no estimate yet", float(spec.min_limit))
        self.moves.clear()  # (the initial state, not a change)
        self._reported = self.base

    @property
    def base(self) -> int:
        """The limit the windows judge, without a headroom test's slot (the one
        ``limit_history`` records): the state rounded down, within the bounds."""
        return _applied(self.spec, self.limit)

    @property
    def applied(self) -> int:
        """The limit to apply: ``base``, and the slot of a headroom test while it is open."""
        return min(self.spec.max_limit, _applied(self.spec, self.limit) + self._extra)

    def update(
        self, now: float, started: float, latency: float, dropped: bool, inflight: int
    ) -> int:
        """Feed one sample (see the module docstring); returns the limit to apply."""
        if started < self._opened:
            return self.applied  # measures a limit no longer in force
        if self._timed and not self._probing:
            self._ends.append(now)
            if self.limit < TEST_BELOW + 1 or self._extra or self._test_closed is not None:
                self._headroom(now, started, latency, dropped, inflight)
        self._inflight = max(self._inflight, inflight)
        self._used += inflight
        if dropped:
            self._drops += 1
        else:
            self._samples.append(latency)
            self._starts.append(started)
        if self._window_full():
            self._close_window(now)
        return self.applied

    def _window_full(self) -> bool:
        count = len(self._samples) + self._drops + self._refused
        if not self._probing:
            return count >= max(WINDOW_SAMPLES, self.base)
        return count >= max(FIRST_PROBE_SAMPLES, PROBE_ROUNDS * self.base)

    def _close_window(self, now: float) -> None:
        samples, drops, inflight, refused = (
            self._samples,
            self._drops,
            self._inflight,
            self._refused,
        )
        used = self._used / max(1, len(samples) + drops)
        starts = self._starts
        self._samples, self._drops, self._inflight, self._used = [], 0, 0, 0
        self._starts = []
        self._refused = 0
        before = self.base
        median = _median(samples) if samples else None
        margin = self._margin(len(samples))
        tolerance = self.spec.tolerance + margin
        if self._probing:
            self._measure_spread(samples, median)
            self._probing = False
            self.limit = self._saved
            if median:  # (a clock too coarse to see a latency gives no estimate)
                if self._wide:  # (see ``EXPOSURE``)
                    cut = now - EXPOSURE * median
                    exposed = [x for x, at in zip(samples, starts, strict=True) if at <= cut]
                    # (on a coarse clock their median can be 0: no estimate, review 18)
                    if len(exposed) >= FIRST_PROBE_SAMPLES and _median(exposed) > 0:
                        samples, median = exposed, _median(exposed)
                last, chain = self.no_load, self._chain
                _moved(self, "probed", self._estimate(samples, median))
                # A queue at the probe's limit reads as a slower dependency: again at half
                # the slots while the reading is over the estimate before the first probe
                # and, after the first, fell since the last (see the module docstring).
                first = last if chain is None else chain
                over = max(self.spec.tolerance, REPROBE_OVER) + margin
                if (
                    first is not None
                    and last is not None
                    and self.no_load is not None
                    and self.no_load > first * over
                    and (chain is None or last > self.no_load * min(over, REPROBE_FALL))
                    and before // 2 >= max(REPROBE_LIMIT, self.spec.min_limit)
                ):
                    than = "the last estimate" if chain is None else "the estimate before"
                    self._start_probe(
                        now,
                        f"the probe at {before} slots read {self.no_load / first:.2f}x {than}",
                        before // 2,
                        chain=first,
                    )
                    return
            elif samples:
                _moved(self, "probed", "no latency measured (the clock is too coarse)")
            else:
                _moved(self, "probed", "no latency measured (drops or refusals only)")
            if not median and self._chain is not None:
                # A chain's probe that measured nothing: the reading it was to check is not
                # believed either; back to the estimate before the chain (review 18).
                self.no_load = self._chain
                self._pool.clear()  # (the doubted reading's exchanges)
            self._schedule_probe(now)
            self._opened = now  # the probe's own samples say nothing of the limit restored
            # (a probe's end is no raise: its burst of new exchanges, on new connections,
            # can end late for reasons of our own, not the dependency's queue)
            self._raised = False
            return
        spec = self.spec
        descended = False
        cut_last, self._cut_last = self._cut_last, False
        ratio: float | None = None
        if median is not None and self.no_load is not None and median > 0:
            if median >= self.no_load * (1 - DESCENT - margin):
                self._below = None
            elif self._below is None:  # once may be noise
                self._below = median
            else:  # twice in a row: halfway to the higher one (the minimum would sink)
                self.no_load = (self.no_load + max(median, self._below)) / 2
                self._below = None
                self._pool.clear()  # (a slower dependency's: the next probe starts anew)
                descended = True
            judged, what = median, "window median"
            if self._raised and len(samples) >= WINDOW_SAMPLES:
                # The first window at a raised limit: the exchanges that started first
                # found the queue the raise makes still building; those started after
                # the window's median start show it (by start, not by end: the last to
                # end are the slowest of those that started together, queue or none).
                middle = _median(starts)
                later = [x for x, start in zip(samples, starts, strict=True) if start > middle]
                if len(later) * 4 >= len(samples):
                    judged, what = _median(later), "median of the later starters"
            ratio = judged / self.no_load
            # At a small limit a cut is a slot at least, and only tests win it back: one
            # window over the tolerance after more than HOLD that found this limit without
            # a queue is our own stall as often as not (a queue shows in every window).
            lone = (
                ratio > tolerance
                and before <= TEST_BELOW
                and self._timed
                and self._streak == 0
                and self._steady > HOLD
            )
            if lone:  # counts as a first window over, as one too close to move the limit
                self._over += 1
                self._streak += 1
            elif ratio > tolerance:  # a queue: cut to the concurrency it implies
                self._over += 1
                self._streak += 1
                cut = before * tolerance * CUT_AIM / ratio
                if self._over >= 2:  # twice in a row since the last cut: not noise
                    cut = min(cut, before - 1.0)
                self.limit = max(self.limit * MIN_GRADIENT, min(self.limit, cut))
                if self.base < before:
                    widened = f" (a tolerance of {tolerance:.2f}: the spread)" if margin else ""
                    _moved(self, "queue", f"{what} {ratio:.2f}x the no-load latency{widened}")
                    self._calm = self._over = 0
                    self._cut_last = True
                    # Cuts in a row at the sawtooth's top (21 -> 19 -> 18) keep the highest
                    # as the ceiling: the last one's would read the next climb to the top as
                    # past the queue (``ESCAPE``) and grow it x1.35 into it.  Not after a fall
                    # (the limit now further below the ceiling than two tolerances).
                    low, high = TOP_TOLERANCE
                    band = min(max(spec.tolerance, low), high) ** 2
                    top = cut_last and self.base * band >= self._ceiling
                    self._ceiling = max(self._ceiling, before) if top else before
                    # The spacing of tests starts over.  A test armed before the cut stays
                    # armed and may open in the hold, testing the limit just cut to:
                    # disarming on a cut missed the steady-capacity p99 in the model
                    # (tests/unit/test_adaptive_headroom.py).
                    self._gap, self._skip = 1, 0
            else:
                self._streak = self._over = 0
                # (not used: no evidence; mostly refused: the dependency said no, whatever
                # the few latencies of the window say)
                if inflight * 2 >= before and refused <= len(samples):
                    self._grow(before, ratio, used, tolerance, what)
                self._untested += 1
                if before <= TEST_BELOW and self._timed and not self._wide and self._calm > HOLD:
                    # A slot of queue is dear here: timed tests instead, fewer while they fail.
                    self._skip -= 1
                    if self._skip < 0:
                        self._armed = True
        self._measure_spread(samples, median, ratio)
        if drops:
            self.limit *= spec.backoff
            _moved(self, "drop", f"{drops} drop(s) in the window, x{spec.backoff:g}")
        self.limit = min(float(spec.max_limit), max(float(spec.min_limit), self.limit))
        confirmed = (  # the window found the limit it judged in use and without a queue
            median is not None
            and self.no_load is not None
            and median <= self.no_load * tolerance
            and used >= IN_USE * before
        )
        self._steady = self._steady + 1 if confirmed else 0
        if confirmed and before == self._doubled:
            self._doubled = 0
        self._raised = self.base > before
        if self.base != before:
            self._steady = 0
            self._opened = now  # exchanges that started before measure another limit
            self._end_test()
            if self.base > TEST_BELOW:
                self._armed = False  # (above it, growth is by windows)
        # One exchange in flight at most (one slot, and no headroom test's second): none of
        # ours waited behind another, so a window within the tolerance of ``no_load``, either
        # way, refines the estimate as a probe there would (see the module docstring);
        # beyond it, the dependency may have changed, and the probes decide.
        at_one = (
            before == 1
            and inflight <= 1
            and not drops
            and not descended  # (that rule moved no_load halfway: review 9)
            and median is not None
            and self.no_load is not None
            and self.no_load <= median * tolerance
            and median <= self.no_load * tolerance
            and all(0 < sample < math.inf for sample in samples)
        )
        if at_one:  # (``_probe_n`` stays the probes': the windows are chosen by their median)
            self._pool.extend(samples)
            self.no_load = _centre(list(self._pool))
        self._at_min = self._at_min + 1 if self.base == spec.min_limit and not at_one else 0
        stale = now >= self._next_probe or self._at_min >= MIN_LIMIT_WINDOWS
        if self.base != self._doubled:  # (a test's doubling, once a window confirmed it)
            self._peak = max(self._peak, self.base)
        # A fall to half the peak over two windows in a row (one window's latency can be
        # a stall of our own process: a probe then would measure nothing new).
        fell = self.base <= self._peak * FALL_TO_PROBE and self._streak >= 2
        if fell and median and self.no_load:
            # At a quarter of the limit that showed the queue (the limit before this cut),
            # and below the concurrency that queue implies.
            implied = before * self.no_load / median
            self._start_probe(
                now,
                f"the limit fell to half its peak of {self._peak} or less",
                math.floor(min(before * PROBE_FRACTION, implied * 0.75)),
            )
        elif self.no_load is None:
            self._start_probe(now, "no estimate yet")
        elif stale:
            at_min = self._at_min >= MIN_LIMIT_WINDOWS
            self._start_probe(now, "windows in a row at min_limit" if at_min else "periodic")

    def _grow(self, before: int, ratio: float, in_use: float, tolerance: float, what: str) -> None:
        """A window without a queue, of a limit in use (see the module docstring)."""
        self._calm += 1
        quiet = ratio < 1 + (tolerance - 1) * QUIET
        # Past where the last queue was (by two slots at least: one could be noise).
        beyond = before >= max(self._ceiling * ESCAPE, self._ceiling + 2)
        if self._calm <= HOLD:
            return
        used = in_use >= IN_USE * before
        if quiet and beyond and used:
            self.limit = max(self.limit * GROWTH, before + 1.0)
        elif not (quiet or (beyond and used)):
            return
        # Near the last queue, or not quiet: one slot.  At small limits the timed tests do
        # it, unless the traffic gives them no chance (a batch of requests at a time: nobody
        # takes a slot opened between two batches): no verdict for long, or twice in a row
        # nobody took the test's slot.
        elif before <= TEST_BELOW and self._timed and not self._wide:
            if self._untested < TEST_FALLBACK and self._misses < 2:
                return
            self.limit = before + 1.0
            what = f"no headroom test's verdict; {what}"
        # Into ``beyond`` only on a window that used the limit: in a lull the limit would
        # drift there unproven, and then grow fast.
        elif used or before + 1 < max(self._ceiling * ESCAPE, self._ceiling + 2):
            self.limit = before + 1.0
        else:
            return
        share = f"{in_use / before:.0%}"
        _moved(
            self, "growth", f"{what} {ratio:.2f}x the no-load latency, {share} of the slots in use"
        )

    def _estimate(self, samples: list[float], median: float) -> str:
        """A probe ended with ``samples`` (their median above 0): sets ``no_load``, the
        ``_centre`` of the probe's samples and the pool's last, and returns the move's
        words.  The pool is the probe's samples, after the last probes' if its own estimate
        agrees with ``no_load`` within ``POOL_AGREE`` and what leaves a window at the rest
        of the change quiet (the last ``POOL_SAMPLES``; a probe of that many or more counts
        alone and whole: the last of its exchanges to end are its slowest).  A clock too
        coarse to see some of the latencies (a 0) gives the median, as before, and an empty
        pool (a log of 0 is none)."""
        pool = self._pool
        if min(samples) <= 0:
            pool.clear()
            self.no_load, self._probe_n = median, len(samples)
            return f"no-load latency {median * 1000:.1f} ms"
        own = _centre(samples)
        # Pooled, a change moves no_load by the probe's share of the pool (a third at
        # least), and the rest of it must read as quiet, not as a standing queue: review 8.
        left = (POOL_SAMPLES - FIRST_PROBE_SAMPLES) / POOL_SAMPLES
        band = min(POOL_AGREE, (self.spec.tolerance - 1) * QUIET / left)
        agrees = self.no_load is not None and abs(own / self.no_load - 1) <= band
        if not (agrees and pool):
            pool.clear()
        # All of the probe's samples, after the last probes' up to ``POOL_SAMPLES`` in all
        # (a probe of as many or more, at a large limit, counts alone).
        kept = max(0, min(len(pool), POOL_SAMPLES - len(samples)))
        used = [*list(pool)[len(pool) - kept :], *samples]
        if len(samples) < POOL_SAMPLES:
            pool.extend(samples)
        else:  # (its last to end are its slowest: review 10)
            pool.clear()
            pool.extend(_quantiles(samples, POOL_SAMPLES))
        self.no_load = no_load = _centre(used)
        # At most the pool's count: a large probe's exchanges are censored and share their
        # rounds, not as many independent samples (counted whole, windows without a queue
        # read as one after a probe in 21 of 150 rotations at sigma 1, capped 8: review 10).
        self._probe_n = min(len(used), POOL_SAMPLES)
        words = f"no-load latency {no_load * 1000:.1f} ms"
        if kept:
            words += f" (its {len(samples)} exchanges pooled with the last probes' {kept})"
        return words

    def _measure_spread(
        self, samples: list[float], median: float | None, ratio: float | None = None
    ) -> None:
        """A window ended: its log latencies, less its median's, join the last
        ``SPREAD_SAMPLES`` (a queue moves a window as a whole: what is left is the
        dependency's own spread), whose interquartile range, as a standard deviation, is the
        spread (robust to the few exchanges a test or a stall delays).  A latency the clock
        could not see (0) says nothing of the spread and is left out.

        Unless the spread measured so far is narrow and the window read a queue that its
        own dispersion cannot explain: its ``ratio`` (judged to ``no_load``) over the
        tolerance that dispersion would widen to (``_widening``).  Such a window mixes
        exchanges that waited with ones that did not (the capacity falling under it): its
        dispersion is the queue's (see the module docstring)."""
        seen = [sample for sample in samples[-SPREAD_SAMPLES:] if sample > 0]
        n = len(seen)
        if n < SPREAD_MIN or not median or median <= 0:
            return
        # A deviation from the window's own median is smaller than from the dependency's:
        # by about CENTRE_BIAS / n of its variance (0.82x the spread at n = 8).
        log, middle = math.log, math.log(median)
        scale = 1 / math.sqrt(1 - CENTRE_BIAS / n)
        deviations = [(log(sample) - middle) * scale for sample in seen]
        if ratio is not None and self._spread is not None and not self._wide:
            own = _iqr(sorted(deviations)) / IQR_SD
            if ratio > self.spec.tolerance + self._widening(n, own):
                return
        self._deviations.extend(deviations)
        ordered = sorted(self._deviations)
        iqr = _iqr(ordered)
        self._spread = iqr / (IQR_SD * IQR_BIAS)
        self._wide = self._spread > TEST_SPREAD

    def _margin(self, n: int) -> float:
        """What a wide spread adds to the tolerance (and to the fall of a window's median
        that moves ``no_load``) for a window of ``n`` samples: its median and the probes'
        estimate, ``no_load`` (of ``_probe_n`` samples), are both uncertain, and
        ``SPREAD_Z`` standard errors of their ratio beyond what ``tolerance`` already allows
        are noise, not a queue.  None below ``TEST_SPREAD``: there the tolerance is the
        user's, and the headroom tests and the rules for a lone noisy window deal with the
        noise (a margin there, from our own stalls, let a slot of queue stand at 4 workers:
        phase 2's p99 from 5 s in 1.54x against 1.44x in the model's loaded noise, seeds
        1-30)."""
        if self._spread is None or not self._wide:
            return 0.0
        return self._widening(n, self._spread)

    def _widening(self, n: int, spread: float) -> float:
        """``_margin`` for a window of ``n`` samples at a given ``spread`` (0 if narrow)."""
        if n < 1 or spread <= TEST_SPREAD:
            return 0.0
        se = MEDIAN_SE * spread * math.sqrt(1 / n + 1 / max(1, self._probe_n))
        widened = SPREAD_Z * se - (self.spec.tolerance - 1)
        return min(max(0.0, widened), max(0.0, MAX_TOLERANCE - self.spec.tolerance))

    def _headroom(
        self, now: float, started: float, latency: float, dropped: bool, inflight: int
    ) -> None:
        """The timed headroom test at a small limit (see the module docstring)."""
        no_load = self.no_load
        if no_load is None:
            return
        if self._extra:
            self._close_slot(now, inflight)
            return
        if self._test_closed is not None:
            if self._test_opened <= started < self._test_closed:
                # Each exchange the test admitted waits, if no worker was free, until the
                # first of the others ends: the instant named, or the end that closed the
                # slot if it came sooner (that exchange's own spread), so a wait the
                # dependency's spread cut short is not taken for a free worker.  Judged
                # against no_load plus a share of that wait.
                due_at = min(self._test_due, self._test_closed)
                self._test_seen += 1
                self._test_latest = max(self._test_latest, started)
                if dropped or latency > no_load + TEST_VERDICT * max(0.0, due_at - started):
                    self._test_failed = True
                if self._test_seen >= self._test_expect:
                    self._judge(now, no_load, due_at)
            elif now - self._test_closed > TEST_EXPIRY * no_load:
                self._end_test()  # (its exchanges failed or were cancelled)
            return
        self._stale()  # an end came before the instant named: the rotation was not as predicted
        base = self.base
        if not self._armed or inflight < base or len(self._ends) < base:
            return
        if base >= self.spec.max_limit:
            return  # (no slot more to open)
        # In a steady rotation, the earliest of the others in flight began at the end
        # base - 1 ends before this one (each end's slot was taken again at once): it is
        # due to end no_load after that, and a request sent before then waits for it if no
        # worker is free.  The test opens TEST_AIM * no_load before that instant.
        due = self._ends[-base] + no_load
        if due - now >= TEST_MIN_WAIT * no_load:
            self._test_due = due
            self.open_at = max(now, due - TEST_AIM * no_load)
            if self.open_at == now:
                self.open_test(now, base, at_end=True)

    def _close_slot(self, now: float, inflight: int) -> None:
        """The first end since the test's slot opened (``inflight``: with the ending one)."""
        self._extra = 0
        if inflight > self._test_base:  # the test's request is in flight
            # (every slot of the base was in use when it opened: those admitted since)
            self._test_closed = now
            self._test_expect = inflight - self._test_base + self._test_at_end
        else:  # no request took the slot in time: no test, the next chance will do
            self._test_closed = None
            self._armed = True
            self._misses += 1

    def unfed_end(self, now: float, inflight: int, refused: float | None = None) -> None:
        """An exchange ended without a sample (cancelled, or failed otherwise than by a
        drop; ``inflight``: with it): it frees a slot all the same, so it closes a test's
        slot as an end does, and makes a named instant stale.  ``refused``: the start of a
        refusal, which counts towards its window without a latency (see the module
        docstring)."""
        if self._extra:
            self._close_slot(now, inflight)
        else:
            self._stale()
        if refused is not None and refused >= self._opened:
            self._refused += 1
            if self._window_full():
                self._close_window(now)

    def _stale(self) -> None:
        """An end came before the instant named, if any: that test is off (a miss)."""
        if self.open_at is not None:
            self.open_at = None
            self._misses += 1

    def open_test(self, now: float, inflight: int, *, at_end: bool = False) -> bool:
        """Open the test's slot at ``open_at`` (``now``; ``inflight``: the slots in use),
        if it is still due; returns whether ``applied`` changed."""
        if self.open_at is None or self._extra or self._probing:
            return False
        self.open_at = None
        base, no_load = self.base, self.no_load
        if no_load is None or inflight < base or self._test_due - now < TEST_MIN_WAIT * no_load:
            self._misses += 1  # (not saturated now, or the slot due to free came free early)
            return False
        self._armed = False
        self._extra = 1
        self._test_base, self._test_opened, self._test_at_end = base, now, at_end
        self._test_seen, self._test_latest, self._test_failed = 0, now, False
        return True

    def _judge(self, now: float, no_load: float, due_at: float) -> None:
        """All the exchanges of a test ended (``due_at``: when a worker came free for them
        at the latest, see ``_headroom``): grow, or not."""
        failed = self._test_failed
        waited = due_at - self._test_latest
        informative = waited >= (TEST_FAIL_INFORMATIVE if failed else TEST_INFORMATIVE) * no_load
        self._end_test()
        self._misses = 0
        if failed or informative:
            self._untested = 0
        if failed:
            if informative:  # (a failure too small to tell is our noise as often as not)
                self._wins = 0
                # (the highest: a failure at a base a noisy cut lowered, our own noise as
                # often as not, must not lift the cap that a failure above it set)
                self._fail_base = max(self._fail_base, self.base)
            self._gap = min(TEST_GAP, self._gap * 2)
            self._skip = self._gap - 1
        elif informative:  # a slot more was free
            self._wins += 1
            self._gap, self._skip = 1, 0
            if self._wins >= 2:  # twice in a row: the capacity grew, grow past it
                self._wins = 0
                base = self.base
                self.limit = max(base * TEST_GROWTH, base + 1.0)
                words = "two headroom tests in a row found a slot free"
                if self._fail_base > base:
                    # Below the base of the last test that failed (a cut by our own noise):
                    # back to it at most, where the tests resume.
                    self.limit = min(self.limit, float(self._fail_base))
                    words += f", up to where the last test that failed was ({self._fail_base})"
                else:
                    self._ceiling = self._fail_base = 0
                _moved(self, "headroom", words)
                self._doubled = self.base
                self._raised = True
                self._steady = 0
                self._opened = now
            else:  # once may be the dependency's own spread: test again at once
                self._armed = True
        else:  # told nothing: the next chance will do
            self._armed = True

    def _end_test(self) -> None:
        self._extra = 0
        self._test_closed = self.open_at = None

    def _start_probe(
        self, now: float, why: str, limit: float | None = None, chain: float | None = None
    ) -> None:
        """A probe at ``limit`` (default: ``PROBE_FRACTION`` of the limit); ``chain``: the
        estimate before the first probe of a chain of them (``None``: this is the first)."""
        self._end_test()
        self._chain = chain
        self._armed = False
        self._at_min = self._peak = self._steady = self._doubled = 0
        self._cut_last = False
        self._probing = True
        self._saved = self.limit
        if limit is None:
            limit = math.floor(self.limit * PROBE_FRACTION)
        self.limit = max(float(self.spec.min_limit), limit)
        self._opened = now
        _moved(self, "probe", why)

    def _schedule_probe(self, now: float) -> None:
        interval = self.spec.probe_interval
        if interval is None:
            self._next_probe = math.inf
        else:
            self._next_probe = now + interval * (1 + PROBE_JITTER * self._rng.random())


class AIMD:
    """Additive increase, multiplicative decrease on drops (see the module docstring)."""

    __slots__ = ("_cut_at", "_reported", "limit", "moves", "no_load", "spec")

    def __init__(self, spec: AdaptiveLimit) -> None:
        self.spec = spec
        self.limit = float(spec.initial_limit)
        self.no_load: float | None = None  # AIMD does not estimate it
        self._cut_at = -math.inf
        self.moves: list[Move] = []  # (as ``Gradient.moves``)
        self._reported = self.applied

    @property
    def applied(self) -> int:
        return _applied(self.spec, self.limit)

    base = applied

    def update(
        self, now: float, started: float, latency: float, dropped: bool, inflight: int
    ) -> int:
        spec = self.spec
        if dropped:
            if started >= self._cut_at:  # one cut per round trip
                self.limit = max(float(spec.min_limit), self.limit * spec.backoff)
                self._cut_at = now
                _moved(self, "drop", f"a drop, x{spec.backoff:g}")
        elif inflight * 2 >= (applied := self.applied):
            self.limit = min(float(spec.max_limit), self.limit + 1 / self.limit)
            if int(self.limit) != applied:  # (most samples grow it by a fraction of a slot)
                _moved(self, "growth", "an exchange without a drop, at least half the slots in use")
        return self.applied


def _moved(algorithm: Gradient | AIMD, reason: str, words: str) -> None:
    """Whatever changed an algorithm's ``limit`` says why: a move, if its ``base`` changed
    (the last ``HISTORY`` kept, if nobody takes them)."""
    base = algorithm.base
    if base != algorithm._reported:
        algorithm._reported = base
        moves = algorithm.moves
        if len(moves) >= HISTORY:
            del moves[0]
        moves.append((base, reason, words))


def _applied(spec: AdaptiveLimit, limit: float) -> int:
    """The float state rounded down, within ``[min_limit, max_limit]`` (both algorithms)."""
    return min(spec.max_limit, max(spec.min_limit, int(limit)))


def make_algorithm(
    spec: AdaptiveLimit, rng: random.Random | None = None, *, timed: bool = False
) -> Gradient | AIMD:
    """The algorithm ``spec`` names, in its initial state (``timed``: see ``Gradient``)."""
    return Gradient(spec, rng, timed=timed) if spec.algorithm == "gradient" else AIMD(spec)


def _quantile(ordered: list[float], q: float) -> float:
    """The ``q`` quantile of sorted values, interpolated between the two nearest."""
    at = q * (len(ordered) - 1)
    low = int(at)
    high = min(low + 1, len(ordered) - 1)
    return ordered[low] + (ordered[high] - ordered[low]) * (at - low)


def _centre(values: list[float]) -> float:
    """The geometric mean of the values (all above 0) less the ``TRIM`` share at each end:
    the median's estimate, with less noise.  Of a symmetric spread as the lab's it reads the
    median; of a lognormal one too (a plain trimmed mean reads a skewed latency high: 6% at
    sigma 0.5).  Further than ``CENTRE_BOUND`` from the values' median, it is their median:
    a stall of our own over more than ``TRIM`` of them (a fifth of a probe slowed tenfold)
    then moves the estimate as it moves the median, no more (clamped to the bound instead,
    the estimate moved twice as far as the median did: review 8)."""
    ordered = sorted(values)
    cut = int(len(ordered) * TRIM)
    kept = ordered[cut : len(ordered) - cut]
    if kept[0] == kept[-1]:
        return kept[0]  # (exactly: a clock's tick, a test's constant latency)
    mean = math.exp(math.fsum(map(math.log, kept)) / len(kept))
    median = _median(ordered)
    return mean if abs(mean - median) <= median * CENTRE_BOUND else median


def _iqr(ordered: list[float]) -> float:
    """The interquartile range of sorted values."""
    return _quantile(ordered, 0.75) - _quantile(ordered, 0.25)


def _quantiles(values: list[float], n: int) -> list[float]:
    """``n`` of the values, one from the middle of each of ``n`` equal shares of them in
    order, interleaved so that any last ``n - WINDOW_SAMPLES`` of them still span the shares
    (a window pooled after them evicts the first)."""
    ordered = sorted(values)
    picks = [ordered[(2 * i + 1) * len(ordered) // (2 * n)] for i in range(n)]
    step = max(1, n // WINDOW_SAMPLES)
    return [picks[i] for start in range(step) for i in range(start, n, step)]


def _median(values: list[float]) -> float:
    """The median (of an even count, the mean of the middle two: the lower one alone is
    biased low, the more so the smaller the window)."""
    ordered = sorted(values)
    middle = len(ordered) // 2
    if len(ordered) % 2:
        return ordered[middle]
    return (ordered[middle - 1] + ordered[middle]) / 2


def refusal(status: int) -> bool:
    """A status answered without the work a request costs, so its latency says nothing of
    the dependency's load: a server error (5xx) or 429 (a shedding server, a proxy whose
    upstream failed, a dependency failing fast); fed as a drop only when the user lists it
    in ``drop_statuses``."""
    return status >= 500 or status == 429


def is_drop(exc: BaseException) -> bool:
    """An exchange failure that means the dependency is overloaded: one of its timeouts
    (``RequestTimeout`` is one); ``PoolTimeout`` (``AcquireTimeout``) is our own queue."""
    return isinstance(exc, httpx.TimeoutException) and not isinstance(exc, httpx.PoolTimeout)


class AdaptiveController:
    """Feeds a compartment's algorithm and applies its limit to the compartment's limiter.

    Args:
        spec: the configuration.
        set_limit: ``Limiter.set_limit`` of the compartment.
        running: returns the slots in use now.
        clock: the compartment's clock.
        rng: for the probes' jitter.
        call_later: ``(delay, callback)``: runs ``callback`` on the loop ``delay`` seconds
            from now (``Timers.call_later``), for the gradient's headroom tests; ``None``:
            they open only at the end of an exchange.
        name: the compartment's, for the DEBUG line on each change of the limit
            (``_log.log_limit``: the algorithm's ``moves``).
    """

    __slots__ = (
        "_call_later",
        "_clock",
        "_name",
        "_running",
        "_set_limit",
        "_timer",
        "algorithm",
        "drop_statuses",
        "history",
    )

    def __init__(
        self,
        spec: AdaptiveLimit,
        set_limit: Callable[[int], None],
        running: Callable[[], int],
        clock: Callable[[], float],
        rng: random.Random | None = None,
        call_later: Callable[[float, Callable[[], None]], Cancellable] | None = None,
        name: str = "",
    ) -> None:
        self.algorithm = make_algorithm(spec, rng, timed=call_later is not None)
        self._name = name
        self.drop_statuses = spec.drop_statuses
        self._set_limit = set_limit
        self._running = running
        self._clock = clock
        self._call_later = call_later
        self._timer: Cancellable | None = None
        limit = self.algorithm.applied
        set_limit(limit)
        #: ``(clock time, limit)`` at each change of the limit, the latest last: the limit
        #: the algorithm settles on, not a headroom test's slot (which would fill it: tests
        #: run several times a second at a small capacity); ``applied`` shows that slot.
        self.history: deque[tuple[float, int]] = deque([(clock(), limit)], maxlen=HISTORY)

    def ended(
        self, started: float, head_latency: float, status: int, exc: BaseException | None
    ) -> None:
        """An exchange whose response head arrived has ended (``exc``: how, if cut); a
        refusal that is not a drop (``refusal``) is ended unfed, unless it took longer
        than the tolerance allows (then it did the work, or waited in a queue: a sample)."""
        dropped = status in self.drop_statuses or (exc is not None and is_drop(exc))
        if not dropped and refusal(status):
            algorithm = self.algorithm
            no_load = algorithm.no_load
            if no_load is None or head_latency <= no_load * algorithm.spec.tolerance:
                self.unfed(started)
                return
        self._feed(started, head_latency, dropped)

    def failed(self, started: float, exc: BaseException) -> None:
        """An exchange failed before its response head (or was cancelled): fed only if it
        is a drop; call before its slot is released."""
        if is_drop(exc):
            self._feed(started, self._clock() - started, True)
        else:
            self.unfed()

    def unfed(self, refused: float | None = None) -> None:
        """An exchange that held a slot ended without a sample; call before its slot is
        released (a response nobody closed, given back by the garbage collector).
        ``refused``: it was a refusal (``refusal``) of an exchange started then."""
        algorithm = self.algorithm
        if type(algorithm) is not Gradient:
            return
        before, now = algorithm.applied, self._clock()
        algorithm.unfed_end(now, self._running(), refused)
        if algorithm.open_at is None:
            self._cancel_timer()
        self._settle(now, before, algorithm.applied)

    def _feed(self, started: float, latency: float, dropped: bool) -> None:
        now = self._clock()
        algorithm = self.algorithm
        before = algorithm.applied
        limit = algorithm.update(now, started, latency, dropped, self._running())
        self._cancel_timer()  # (each sample names the instant anew, or none)
        open_at = algorithm.open_at if type(algorithm) is Gradient else None
        if open_at is not None and self._call_later is not None:
            self._timer = self._call_later(max(0.0, open_at - now), self._open)
        if limit != before or algorithm.moves:
            self._settle(now, before, limit)

    def _open(self) -> None:
        """The headroom test's instant came (a timer)."""
        self._timer = None
        algorithm, now = self.algorithm, self._clock()
        if type(algorithm) is Gradient:
            before = algorithm.applied
            algorithm.open_test(now, self._running())
            self._settle(now, before, algorithm.applied)

    def _settle(self, now: float, before: int, limit: int) -> None:
        """Applies ``limit`` if it changed (``before``: the applied one), then records the
        algorithm's moves, each in ``history`` and in a DEBUG line: every change of the
        base, also one a test's slot hid from ``applied`` (the base grew as the slot
        closed) and each of several in one call (a window grew it, then started a probe).
        The lines last: a logging handler that raises leaves the limit, the timer and the
        history as they should be."""
        algorithm = self.algorithm
        if limit != before:
            self._set_limit(limit)
        if not algorithm.moves:
            return
        moves, algorithm.moves = algorithm.moves, []
        history = self.history
        changes = []
        for base, reason, words in moves:
            changes.append((history[-1][1], base, reason, words))
            history.append((now, base))
        for previous, base, reason, words in changes:
            log_limit(self._name, previous, base, reason, words)

    def rearm(self) -> None:
        """The transport moved to another event loop: a headroom test's timer armed on the
        old one would never fire; arm it again (on the new one) for the same instant."""
        if self._timer is None or self._call_later is None:
            return
        self._cancel_timer()
        algorithm = self.algorithm
        open_at = algorithm.open_at if type(algorithm) is Gradient else None
        if open_at is not None:
            self._timer = self._call_later(max(0.0, open_at - self._clock()), self._open)

    def close(self) -> None:
        """No more timers (the transport is closing)."""
        self._cancel_timer()
        self._call_later = None

    def _cancel_timer(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None


class Cancellable(Protocol):
    """What ``call_later`` returns (``TimerHandle``)."""

    def cancel(self) -> None: ...
