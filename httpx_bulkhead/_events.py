"""Per-event figures (histograms): where the request path hands them to the exporters.

Theory of operation
-------------------
Most figures are pulled from the compartments' counters when metrics are collected
(``_metrics.py``).  Two cannot be: a histogram needs every value, so it is fed where the
event already happens:

* the *queue time* of a request (seconds waited for a slot and a connection), recorded
  exactly where the compartment records it in its wait window (``Compartment.handle``):
  every acquire that got a response or timed out, 0.0 included, so a histogram's count
  and the ``wait_p50..wait_max`` quantiles describe the same acquires;
* the *duration* of a connection (seconds from dialed to closed), recorded once per
  connection, where the connections shell closes it (``Connections._close_all``), with
  the pool's discard reason.

A compartment holds ``sink``: ``None`` while no exporter listens (the request path then
costs one attribute check, no allocation), else a ``Recorder`` for that compartment.  The
transport's ``Events`` builds them: each ``Listener`` (the OpenTelemetry and Prometheus
exporters) makes its own ``Recorder`` per compartment, and ``Events`` joins them when
there are several.  A recorder keeps whatever it caches (attribute dicts, buckets) for its
one compartment, so these caches are bounded like the compartments: when the router
evicts a compartment, ``retire`` tells the listeners (Prometheus folds its buckets into the
``"(evicted)"`` series, as the counters are) and the recorder goes with the compartment.

A recorder must not raise into the request path: the exporters catch their library's
errors (a broken meter provider) and log them once.

Listeners are attached and detached on the event loop that owns the transport when there is
one (``Timers.run_in_loop``), so a compartment made meanwhile cannot miss its recorder.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Protocol

__all__ = ["Events", "Listener", "Recorder", "protocol_of"]


class Recorder(Protocol):
    """Receives one compartment's events (on the event loop)."""

    def queue_time(self, seconds: float, protocol: str | None) -> None:
        """A request waited ``seconds`` for a slot and a connection; ``protocol`` is the
        connection's ``network.protocol.version`` (``"1.1"``, ``"2"``), ``None`` when the
        wait ended without one (``AcquireTimeout``)."""

    def connection_closed(self, seconds: float, protocol: str, reason: str) -> None:
        """A connection open for ``seconds`` was closed for ``reason`` (a discard reason
        of ``statistics()``; ``"closed"`` for one in use when the transport closed)."""


class Listener(Protocol):
    """An exporter of per-event figures."""

    def recorder(self, compartment: str) -> Recorder:
        """The recorder for a new compartment named ``compartment``."""

    def retire(self, compartment: str) -> None:
        """The compartment was evicted (its later events may still arrive)."""


class _Fanout:
    """The recorders of several listeners, as one."""

    __slots__ = ("_recorders",)

    def __init__(self, recorders: Iterable[Recorder]) -> None:
        self._recorders = tuple(recorders)

    def queue_time(self, seconds: float, protocol: str | None) -> None:
        for recorder in self._recorders:
            recorder.queue_time(seconds, protocol)

    def connection_closed(self, seconds: float, protocol: str, reason: str) -> None:
        for recorder in self._recorders:
            recorder.connection_closed(seconds, protocol, reason)


class Events:
    """The listeners of one transport, and the recorder each compartment gets."""

    __slots__ = ("_listeners", "_recorders")

    def __init__(self) -> None:
        self._listeners: tuple[Listener, ...] = ()
        #: Per compartment name, each listener's recorder (only while listeners exist).
        self._recorders: dict[str, dict[Listener, Recorder]] = {}

    @property
    def listeners(self) -> tuple[Listener, ...]:
        return self._listeners

    def sink(self, compartment: str) -> Recorder | None:
        """The ``sink`` of the compartment named ``compartment``: ``None`` without
        listeners, its one listener's recorder, or all of them joined."""
        if not self._listeners:
            return None
        known = self._recorders.setdefault(compartment, {})
        for listener in self._listeners:
            if listener not in known:
                known[listener] = listener.recorder(compartment)
        recorders = [known[listener] for listener in self._listeners]
        return recorders[0] if len(recorders) == 1 else _Fanout(recorders)

    def attach(self, listener: Listener) -> bool:
        """Add ``listener``; False if it was attached already.  The caller gives every
        live compartment its new ``sink``."""
        if listener in self._listeners:
            return False
        self._listeners = (*self._listeners, listener)
        return True

    def detach(self, listener: Listener) -> bool:
        """Remove ``listener``; False if it was not attached.  The caller gives every live
        compartment its new ``sink``."""
        if listener not in self._listeners:
            return False
        self._listeners = tuple(x for x in self._listeners if x is not listener)
        for known in self._recorders.values():
            known.pop(listener, None)
        return True

    def retire(self, compartment: str) -> None:
        """The compartment named ``compartment`` was evicted: its listeners are told, and
        its recorders forgotten (the compartment keeps its ``sink`` for its last events)."""
        known = self._recorders.pop(compartment, None)
        if known:
            for listener in known:
                listener.retire(compartment)


def protocol_of(multiplexed: bool) -> str:
    """``network.protocol.version`` of a connection."""
    return "2" if multiplexed else "1.1"
