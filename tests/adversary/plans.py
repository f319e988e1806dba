"""What the adversary does with one request: a ``Plan``, drawn from a seeded generator and
carried in the request's path (``/adv?m=reset&c=8&...``), so the Python adversary
(``server.py``) and Node's ``http2`` server (``tests/servers/node_h2.js``) can both play
it, and a failing schedule reproduces from its seed alone.

A plan has a *mode* (how the stream is answered) and *connection effects* (what happens
to the whole connection when the request arrives):

==========  ==================================================================================
mode        the server...
==========  ==================================================================================
ok          reads the body, answers ``status`` with ``size`` bytes (``trailers``: then trailers)
early       answers at once, before the body, and never reads it (``rst_after``: then
            RST_STREAM(NO_ERROR), as Node does)
reset       RST_STREAM(``code``) ``at`` "head" (on the request's HEADERS) or "body" (after
            the response head and half its body)
refuse      RST_STREAM(REFUSED_STREAM) at once
lie         reads the body, announces ``size`` bytes and sends ``actual``
hang        reads the body, never answers
stall       never reads the body (its window stays shut), never answers
stallreset  never reads the body; once the client has used up the stream's window (it
            waits for more), RST_STREAM(``code``)
stallgoaway never reads the body; once the client waits for window, GOAWAY below the
            stream (so it was not processed); plays "ok" when the request comes again
==========  ==================================================================================

``once``: a plan id; a plan whose id the server has seen before plays "ok" (with its status
and size) instead.
``interim`` 1xx responses come first in every mode but refuse/reset-at-head.  Effects:
``cap`` (SETTINGS_MAX_CONCURRENT_STREAMS, 0 included), ``window`` (SETTINGS_INITIAL_WINDOW_SIZE,
0 included; set back to 65,535 after ``window_back`` ms, 0: never), ``overflow`` (a
WINDOW_UPDATE that overflows the client's send window: a connection error), ``goaway``
(1: GOAWAY keeping this stream, 2: GOAWAY refusing it), ``ping`` (how the server answers
the client's PINGs from now on: answer, late, never, wrong), ``server_ping`` (the server
PINGs the client), ``close`` (the connection is closed abruptly ``close`` ms later).
"""

from __future__ import annotations

import random
import urllib.parse
from dataclasses import asdict, dataclass, fields

__all__ = ["MODES", "Plan", "body_of", "random_plan", "strict_plan"]

MODES = ("ok", "early", "reset", "refuse", "lie", "hang", "stall", "stallreset", "stallgoaway")
_SHORT = {
    "mode": "m",
    "status": "s",
    "size": "n",
    "actual": "k",
    "interim": "i",
    "trailers": "tr",
    "code": "c",
    "at": "at",
    "rst_after": "er",
    "cap": "cap",
    "window": "win",
    "window_back": "wb",
    "overflow": "wu",
    "goaway": "ga",
    "ping": "ping",
    "server_ping": "sp",
    "close": "close",
    "once": "id",
}


@dataclass(frozen=True)
class Plan:
    mode: str = "ok"
    status: int = 200
    size: int = 0
    actual: int = 0
    interim: int = 0
    trailers: int = 0
    code: int = 0
    at: str = "head"
    rst_after: int = 0
    cap: int = -1  # -1: leave it
    window: int = -1
    window_back: int = 0
    overflow: int = 0
    goaway: int = 0
    ping: str = ""  # "": leave it
    server_ping: int = 0
    close: int = 0  # ms; 0: no close
    once: int = 0

    def path(self) -> str:
        default = Plan()
        query = {
            _SHORT[name]: value
            for name, value in asdict(self).items()
            if value != getattr(default, name)
        }
        return "/adv?" + urllib.parse.urlencode(query)

    @classmethod
    def from_path(cls, path: str) -> Plan | None:
        """The plan a request's ``:path`` carries (``None``: not an adversary path)."""
        route, _, query = path.partition("?")
        if route != "/adv":
            return None
        given = dict(urllib.parse.parse_qsl(query))
        values: dict[str, object] = {}
        for f in fields(cls):
            short = _SHORT[f.name]
            if short in given:
                values[f.name] = given[short] if f.type == "str" else int(given[short])
        return cls(**values)  # type: ignore[arg-type]

    @property
    def answers_in_full(self) -> bool:
        """A client that gets a response to this plan must get exactly ``body_of(size)``."""
        return self.mode in ("ok", "early", "stallgoaway")


def body_of(size: int) -> bytes:
    """The body the adversary sends for ``size`` bytes (checkable by the client)."""
    return (b"0123456789abcdef" * (size // 16 + 1))[:size]


def strict_plan(rng: random.Random, once: int) -> Plan:
    """A plan with no connection-wide effect (but a GOAWAY refusing only a stalled
    upload and what came after it): its call's outcome is exactly predictable."""
    mode = rng.choice(MODES) if rng.random() < 0.6 else "ok"
    plan = random_plan(rng, modes=(mode,))
    effects: dict[str, object] = {"cap": -1, "window": -1, "window_back": 0, "overflow": 0}
    effects |= {"goaway": 0, "ping": "", "server_ping": 0, "close": 0}
    if mode == "stallgoaway":
        effects["once"] = once
    return Plan(**(asdict(plan) | effects))


def random_plan(
    rng: random.Random, *, node: bool = False, modes: tuple[str, ...] | None = None
) -> Plan:
    """A plan for one request.  Most are benign, so that connections live long enough for
    the interesting interleavings; ``node``: only what Node can be made to play."""
    if modes is None:
        modes = ("ok", "early", "reset", "refuse", "hang", "stall")
        modes += () if node else ("lie", "stallreset")
        mode = rng.choice(modes) if rng.random() < 0.6 else "ok"
    else:
        mode = rng.choice(modes)
    size = rng.choice((0, 10, 1000, 40_000, 70_000, 150_000))
    plan: dict[str, object] = {
        "mode": mode,
        "size": size,
        "interim": rng.choice((0, 0, 0, 1, 2)),
        "status": rng.choice((200, 200, 201, 204, 404, 413, 500)) if mode != "ok" else 200,
    }
    if plan["status"] == 204:
        if mode in ("reset", "lie", "stallreset"):
            plan["status"] = 200  # a 204 ends with its head: nothing left to reset or lie about
        else:
            plan["size"] = 0
    if mode == "ok" and not node:  # (Node 20 aborts, an assertion in OnTrailers, when a
        plan["trailers"] = int(rng.random() < 0.2)  # stream with trailers due is reset)
    elif mode == "early":
        plan["rst_after"] = int(rng.random() < 0.5)
    elif mode in ("reset", "stallreset"):
        plan["code"] = rng.choice((0, 1, 2, 8, 11))  # NO_ERROR, PROTOCOL, INTERNAL, CANCEL...
        plan["at"] = rng.choice(("head", "body"))
        if plan["at"] == "body":  # a body to cut (Node ends a stream it closes empty)
            plan["size"] = max(size, 1000)
    elif mode == "lie":  # (a 204 announcing a length would be no lie: it has no content)
        plan["status"] = 200
        plan["size"] = size or 10
        plan["actual"] = rng.choice((0, size // 2, size + 1, size + 20_000))
    if rng.random() < 0.12:
        plan["cap"] = rng.choice((0, 1, 2, 5, 100))
    if rng.random() < 0.08:
        plan["window"] = rng.choice((0, 1, 100, 65_535, 1_000_000))
        plan["window_back"] = rng.choice((50, 200) if node else (0, 50, 200))
    if not node and rng.random() < 0.02:
        plan["overflow"] = 1
    if rng.random() < 0.05:
        plan["goaway"] = rng.choice((1, 2))
    if not node and rng.random() < 0.1:
        plan["ping"] = rng.choice(("answer", "late", "never", "wrong"))
    if rng.random() < 0.05:
        plan["server_ping"] = 1
    if rng.random() < 0.03:
        plan["close"] = rng.choice((1, 30, 150))
    return Plan(**plan)  # type: ignore[arg-type]
