"""The proxy handshakes, sans I/O: exact bytes sent, any split of the proxy's bytes reads
the same, refusals and garbage become ``httpx.ProxyError`` naming the proxy and never the
credentials, and what a proxy can make us buffer is bounded."""

from __future__ import annotations

import itertools
import os
from collections.abc import Callable

import httpx
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from httpx_bulkhead._proxy import (
    MAX_CONNECT_HEAD,
    ConnectHandshake,
    Handshake,
    Socks5Handshake,
    tunnel_authority,
)

EXAMPLES = int(os.environ.get("BULKHEAD_PROXY_EXAMPLES", "300"))
PROXY = "http://127.0.0.1:3128"
SECRET = "s3cret-pa55"


def feed(handshake: Handshake, chunks: list[bytes]) -> tuple[str, object]:
    """Feed ``chunks`` (then end of stream); the verdict: ``("open", leftover)``,
    ``("error", message)`` or ``("waiting", None)``."""
    try:
        for i, chunk in enumerate(chunks):
            if handshake.receive(chunk):
                # What arrived after the answer belongs to the tunnel, however it was split.
                return ("open", handshake.leftover + b"".join(chunks[i + 1 :]))
            handshake.outgoing()
    except httpx.ProxyError as exc:
        return ("error", str(exc))
    return ("waiting", None)


def splits(data: bytes, cuts: list[int]) -> list[bytes]:
    points = sorted({c % (len(data) + 1) for c in cuts} | {0, len(data)})
    return [data[a:b] for a, b in itertools.pairwise(points) if b > a]


# -- CONNECT -------------------------------------------------------------------------------


def test_connect_request_bytes() -> None:
    handshake = ConnectHandshake(
        PROXY, "example.com:443", ((b"Proxy-Authorization", b"Basic eA=="),)
    )
    assert handshake.outgoing() == (
        b"CONNECT example.com:443 HTTP/1.1\r\nHost: example.com:443\r\n"
        b"Proxy-Authorization: Basic eA==\r\n\r\n"
    )
    assert handshake.outgoing() == b""


def test_an_ipv6_target_is_bracketed() -> None:
    assert tunnel_authority("::1", 8443) == "[::1]:8443"
    assert tunnel_authority("127.0.0.1", 8443) == "127.0.0.1:8443"
    assert (
        ConnectHandshake(PROXY, tunnel_authority("::1", 1))
        .outgoing()
        .startswith(b"CONNECT [::1]:1 ")
    )


def test_a_2xx_opens_the_tunnel_and_keeps_what_follows_it() -> None:
    handshake = ConnectHandshake(PROXY, "a:443")
    answer = (
        b"HTTP/1.1 100 Continue\r\n\r\n"
        b"HTTP/1.1 200 Connection established\r\nX: y\r\n\r\n\x16\x03\x01"
    )
    assert feed(handshake, [answer]) == ("open", b"\x16\x03\x01")
    assert (handshake.status, handshake.reason) == (200, "Connection established")
    with pytest.raises(RuntimeError):
        handshake.receive(b"more")


@pytest.mark.parametrize(
    ("answer", "says"),
    [
        (
            b"HTTP/1.1 407 Proxy Authentication Required\r\nContent-Length: 0\r\n\r\n",
            ": 407 Proxy Authentication Required",
        ),
        (b"HTTP/1.1 403 Forbidden\r\n\r\n", ": 403 Forbidden"),
        (b"HTTP/1.0 502 Bad Gateway\r\n\r\nbody", ": 502 Bad Gateway"),
        (b"HTTP/1.1 502 \r\n\r\n", ": 502"),
        (b"HTTP/1.1 301 Moved\r\nLocation: x\r\n\r\n", ": 301 Moved"),
        # A hostile proxy's control characters are escaped (messages reach logs, terminals).
        (b"HTTP/1.1 407 Bad\x1b[31mred\r\n\r\n", ": 407 Bad\\x1b[31mred"),
        (b"HTTP/1.1 403 caf\xe9\r\n\r\n", ": 403 caf\\xe9"),
    ],
)
def test_a_refusal_names_the_proxy_the_target_the_status_and_the_reason(
    answer: bytes, says: str
) -> None:
    verdict, message = feed(ConnectHandshake(PROXY, "a:443"), [answer])
    assert verdict == "error"
    assert message == f"proxy {PROXY} refused the tunnel to a:443{says}"


@pytest.mark.parametrize(
    ("chunks", "says"),
    [
        ([b"SSH-2.0-OpenSSH\r\n\r\n"], "sent an invalid answer to CONNECT a:443"),
        ([b"HTTP/1.1 200 OK\r\nbad header\r\n\r\n"], "sent an invalid answer"),
        ([b"HTTP/1.1 2000 OK\r\n\r\n"], "sent an invalid answer"),
        ([b"HTTP/1.1 200 Conn", b""], "closed the connection before answering CONNECT a:443"),
        ([b""], "closed the connection before answering"),
    ],
)
def test_garbage_and_early_ends_are_proxy_errors(chunks: list[bytes], says: str) -> None:
    verdict, message = feed(ConnectHandshake(PROXY, "a:443"), chunks)
    assert verdict == "error"
    assert f"proxy {PROXY} " in str(message) and says in str(message)


def test_a_head_that_never_ends_is_refused_at_the_bound() -> None:
    handshake = ConnectHandshake(PROXY, "a:443")
    handshake.receive(b"HTTP/1.1 200 OK\r\n")
    fed = 0
    with pytest.raises(httpx.ProxyError, match="invalid answer"):
        while fed <= 2 * MAX_CONNECT_HEAD:
            handshake.receive(b"X-Pad: " + b"p" * 1000 + b"\r\n")
            fed += 1009
    assert fed <= MAX_CONNECT_HEAD + 1009


connect_answers = st.builds(
    lambda infos, status, reason, headers, tail: (
        b"".join(b"HTTP/1.1 %d Info\r\n\r\n" % code for code in infos)
        + b"HTTP/1.1 %d %s\r\n" % (status, reason)
        + b"".join(b"X-%d: %s\r\n" % (i, v) for i, v in enumerate(headers))
        + b"\r\n"
        + tail
    ),
    st.lists(st.sampled_from([100, 102, 103]), max_size=2),
    st.sampled_from([200, 204, 299, 400, 403, 407, 500, 502, 504]),
    st.from_regex(rb"[A-Za-z ]{0,20}", fullmatch=True),
    st.lists(st.from_regex(rb"[!-~]{1,10}", fullmatch=True), max_size=4),
    st.binary(max_size=40),
)


@settings(max_examples=EXAMPLES, deadline=None)
@given(connect_answers, st.lists(st.integers(min_value=0), max_size=12), st.booleans())
def test_any_split_of_a_connect_answer_reads_the_same(
    answer: bytes, cuts: list[int], garble: bool
) -> None:
    if garble:
        answer = answer.replace(b"HTTP/1.1", b"HTTP/x.1", 1)
    whole = feed(ConnectHandshake(PROXY, "a:443"), [answer, b""])
    split = feed(ConnectHandshake(PROXY, "a:443"), [*splits(answer, cuts), b""])
    one_by_one = feed(
        ConnectHandshake(PROXY, "a:443"), [answer[i : i + 1] for i in range(len(answer))] + [b""]
    )
    assert whole == split == one_by_one
    assert whole[0] in {"open", "error"}


# -- SOCKS5 --------------------------------------------------------------------------------

OK_V4 = b"\x05\x00\x00\x01\x7f\x00\x00\x01\x1f\x90"


def socks(
    host: str = "example.com", port: int = 443, auth: tuple[str, str] | None = None
) -> Socks5Handshake:
    return Socks5Handshake("socks5://127.0.0.1:1080", host, port, auth)


def test_socks5_without_credentials() -> None:
    handshake = socks()
    assert handshake.outgoing() == b"\x05\x01\x00"
    assert handshake.receive(b"\x05\x00") is False
    assert handshake.outgoing() == b"\x05\x01\x00\x03\x0bexample.com\x01\xbb"
    assert handshake.receive(OK_V4 + b"tls") is True
    assert handshake.leftover == b"tls"


def test_socks5_with_credentials() -> None:
    handshake = socks(auth=("user", SECRET))
    assert handshake.outgoing() == b"\x05\x02\x00\x02"  # no auth, or user and password
    assert handshake.receive(b"\x05\x02") is False
    assert handshake.outgoing() == b"\x01\x04user" + bytes([len(SECRET)]) + SECRET.encode()
    assert handshake.receive(b"\x01\x00") is False
    assert handshake.outgoing().startswith(b"\x05\x01\x00\x03")
    assert handshake.receive(OK_V4) is True and handshake.leftover == b""


@pytest.mark.parametrize(
    ("host", "address"),
    [
        ("127.0.0.1", b"\x01\x7f\x00\x00\x01"),
        ("::1", b"\x04" + b"\x00" * 15 + b"\x01"),
        ("xn--bcher-kva.de", b"\x03\x10xn--bcher-kva.de"),
    ],
)
def test_socks5_sends_addresses_as_addresses_and_names_as_names(host: str, address: bytes) -> None:
    handshake = socks(host, 8080)
    handshake.outgoing()
    handshake.receive(b"\x05\x00")
    assert handshake.outgoing() == b"\x05\x01\x00" + address + b"\x1f\x90"


@pytest.mark.parametrize("host", ["", "a" * 256, "bücher.de"])
def test_socks5_refuses_names_it_cannot_send(host: str) -> None:
    with pytest.raises(ValueError, match="SOCKS5 target name"):
        socks(host)


@pytest.mark.parametrize(
    ("auth", "chunks", "says"),
    [
        (None, [b"\x05\xff"], "accepts none of our authentication methods (it wants credentials)"),
        (None, [b"\x05\x02"], "accepts none of our authentication methods (it wants credentials)"),
        (("u", SECRET), [b"\x05\xff"], "(it wants other credentials)"),
        (("u", SECRET), [b"\x05\x02", b"\x01\x01"], "refused the user name and password"),
        (
            ("u", SECRET),
            [b"\x05\x02", b"\x02\x00"],
            "for example.com:443: authentication reply version 2",
        ),
        (None, [b"\x04\x00"], "invalid reply during the handshake for example.com:443: version 4"),
        (None, [b"\x05\x01"], "authentication method 0x01, which we did not offer"),
        (
            None,
            [b"\x05\x00", b"\x05\x05"],
            "refused the tunnel to example.com:443: connection refused",
        ),
        (None, [b"\x05\x00", b"\x05\x02\x00\x01"], "connection not allowed by ruleset"),
        (
            None,
            [b"\x05\x00", b"\x05\x09\x00\x01\x00\x00\x00\x00\x00\x00"],
            "refused the tunnel to example.com:443: reply 0x09",
        ),
        (None, [b"\x05\x00", b"\x04\x00\x00\x01"], "version 4"),
        (None, [b"\x05\x00", b"\x05\x00\x00\x07\x00"], "address type 0x07"),
        (
            None,
            [b"\x05\x00", b"\x05\x00\x00\x01\x7f", b""],
            "closed the connection during the handshake for example.com:443",
        ),
        (None, [b""], "closed the connection during the handshake"),
    ],
)
def test_socks5_refusals_and_garbage_are_proxy_errors(
    auth: tuple[str, str] | None, chunks: list[bytes], says: str
) -> None:
    handshake = socks(auth=auth)
    handshake.outgoing()
    verdict, message = feed(handshake, chunks)
    assert verdict == "error"
    assert "SOCKS5 proxy socks5://127.0.0.1:1080 " in str(message)
    assert says in str(message)
    assert SECRET not in str(message) and "'u'" not in str(message)


def socks_replies(kind: int, name: bytes, tail: bytes, code: int) -> bytes:
    address = {
        1: b"\x01\x0a\x00\x00\x01",
        4: b"\x04" + bytes(16),
        3: b"\x03" + bytes([len(name)]) + name,
    }[kind]
    return b"\x05\x02" + b"\x01\x00" + bytes([5, code, 0]) + address + b"\x04\x38" + tail


@settings(max_examples=EXAMPLES, deadline=None)
@given(
    st.sampled_from([1, 3, 4]),
    st.binary(min_size=1, max_size=255),
    st.binary(max_size=30),
    st.sampled_from([0, 0, 0, 1, 5, 8, 0x42]),
    st.lists(st.integers(min_value=0), max_size=10),
)
def test_any_split_of_socks5_replies_reads_the_same(
    kind: int, name: bytes, tail: bytes, code: int, cuts: list[int]
) -> None:
    replies = socks_replies(kind, name, tail, code)

    def run(chunks: list[bytes]) -> tuple[str, object]:
        handshake = socks(auth=("u", SECRET))
        handshake.outgoing()
        return feed(handshake, chunks)

    whole = run([replies, b""])
    assert whole == run([*splits(replies, cuts), b""])
    assert whole == run([replies[i : i + 1] for i in range(len(replies))] + [b""])
    assert whole == (("open", tail) if code == 0 else ("error", whole[1]))


@pytest.mark.parametrize("make", [lambda: ConnectHandshake(PROXY, "a:1"), lambda: socks()])
def test_the_handshakes_say_nothing_until_asked(make: Callable[[], Handshake]) -> None:
    handshake = make()
    first = handshake.outgoing()
    assert first and handshake.outgoing() == b""


@pytest.mark.parametrize(
    ("size", "outgrown"),  # reads of ``size`` bytes; whether one left the head over the bound
    [(13, True), (4096, True), (65_000, False), (70_000, True), (200_000, False)],
)
def test_a_huge_reason_names_its_status_however_the_reads_are_cut(
    size: int, outgrown: bool
) -> None:
    """A 502 whose reason phrase is 100 kB: read whole, h11 parses it (a refusal, the reason
    cut); read in pieces, its head outgrows the bound first.  Either way the message names
    the status (once, in CI's h11 pass, pieces gave h11's bare "Receive buffer too long")."""
    answer = b"HTTP/1.1 502 " + b"\xff" * 100_000 + b"\r\n\r\n"
    chunks = splits(answer, list(range(size, len(answer), size)))
    verdict, message = feed(ConnectHandshake(PROXY, "a:443"), chunks)
    assert verdict == "error"
    assert "502" in str(message) and "Receive buffer" not in str(message), message
    assert len(str(message)) < 400, len(str(message))
    too_long = f"status 502, answer head too long (over {MAX_CONNECT_HEAD} bytes)"
    assert str(message).endswith(too_long) == outgrown, message


def test_a_head_too_long_without_a_status_line_says_so() -> None:
    verdict, message = feed(
        ConnectHandshake(PROXY, "a:443"), [b"X" * 1000 for _ in range(2 * MAX_CONNECT_HEAD // 1000)]
    )
    assert verdict == "error"
    assert str(message).endswith(f"answer head too long (over {MAX_CONNECT_HEAD} bytes)"), message
