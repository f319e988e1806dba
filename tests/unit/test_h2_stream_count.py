"""``_H2Connection.open_outbound_streams`` answers with our own count of open streams
instead of h2's scan of every stream (issue 18), and still lets h2's scan forget closed
streams now and then.  Differential: our connection and plain h2 run the same seeded
schedule of opens, answers, resets and cap changes against servers of their own, and must
agree on every verdict (``TooManyStreamsError`` at the peer's cap) and every event; h2's
stream table must stay bounded.  ``H2_COUNT_SEEDS`` runs more schedules.
"""

from __future__ import annotations

import os
import random

import h2.config
import h2.connection
import h2.errors
import h2.events
import h2.exceptions
import h2.settings
import pytest

from httpx_bulkhead._http2 import _H2Connection

SEEDS = int(os.environ.get("H2_COUNT_SEEDS", "20"))
STEPS = 300
HEADERS = [(b":method", b"GET"), (b":scheme", b"http"), (b":authority", b"a"), (b":path", b"/")]


class Side:
    """A client (ours or plain h2) and its server, with the client's open streams as
    ``HTTP2Connection`` counts them: opened, until ended by the server, reset by either."""

    def __init__(self, ours: bool) -> None:
        config = h2.config.H2Configuration(client_side=True, header_encoding=None)
        self.open: dict[int, None] = {}
        self.client = (
            _H2Connection(config, self.open) if ours else h2.connection.H2Connection(config)
        )
        self.server = h2.connection.H2Connection(
            h2.config.H2Configuration(client_side=False, header_encoding=None)
        )
        self.client.initiate_connection()
        self.server.initiate_connection()
        self.pump()

    def pump(self) -> list[str]:
        """Exchange bytes until quiet; the client's events, as comparable strings."""
        seen: list[str] = []
        while True:
            out = self.client.data_to_send()
            if out:
                self.server.receive_data(out)
            back = self.server.data_to_send()
            if not out and not back:
                return seen
            for event in self.client.receive_data(back) if back else []:
                seen.append(f"{type(event).__name__}:{getattr(event, 'stream_id', '')}")
                stream_id = getattr(event, "stream_id", 0)
                if isinstance(event, h2.events.StreamEnded | h2.events.StreamReset):
                    self.open.pop(stream_id, None)

    def step(self, op: str, rng: random.Random) -> str:
        if op == "open":
            stream_id = self.client.get_next_available_stream_id()
            try:
                self.client.send_headers(stream_id, HEADERS, end_stream=True)
            except h2.exceptions.TooManyStreamsError:
                return "too many"
            self.open[stream_id] = None
            return f"opened {stream_id}"
        if not self.open and op != "cap":
            return "nothing open"
        if op == "cap":
            self.server.update_settings(
                {h2.settings.SettingCodes.MAX_CONCURRENT_STREAMS: rng.randint(1, 12)}
            )
            return "cap"
        stream_id = rng.choice(sorted(self.open))
        if op == "answer":
            self.server.send_headers(stream_id, [(b":status", b"200")], end_stream=True)
        elif op == "server reset":
            self.server.reset_stream(stream_id, h2.errors.ErrorCodes.REFUSED_STREAM)
        else:  # our reset (a cancelled request)
            self.client.reset_stream(stream_id, h2.errors.ErrorCodes.CANCEL)
            self.open.pop(stream_id)
        return f"{op} {stream_id}"


@pytest.mark.parametrize("seed", range(SEEDS))
def test_our_count_gives_h2s_verdicts_and_h2_forgets_closed_streams(seed: int) -> None:
    rng = random.Random(seed)
    ours, plain = Side(ours=True), Side(ours=False)
    ops = ["open"] * 6 + ["answer"] * 3 + ["server reset", "our reset", "cap"]
    peak = opened = 0
    for _ in range(STEPS):
        op = rng.choice(ops)
        state = rng.getstate()
        verdict = ours.step(op, rng)
        rng.setstate(state)
        assert plain.step(op, rng) == verdict
        assert ours.pump() == plain.pump()
        opened += verdict.startswith("opened")
        peak = max(peak, len(ours.open))
        # h2's table holds the open streams and at most about as many closed ones.
        assert len(ours.client.streams) <= 2 * peak + 17
        assert len(ours.open) == plain.client.open_outbound_streams  # (h2's scan)
    assert opened > 2 * peak + 17  # enough opens that a table never pruned would overflow
