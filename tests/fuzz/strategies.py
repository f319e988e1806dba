"""Hypothesis strategies for HTTP/1.1 messages, valid and malformed, on purpose close to
what real peers get wrong: framing headers that disagree, odd transfer codings, line
endings, header syntax (CR, LF, NUL, obs-fold, whitespace), chunk syntax, trailers,
truncation and bytes nobody asked for."""

from __future__ import annotations

from hypothesis import strategies as st

from tests.fuzz.harness import Exchange, Headers, Request, cut

# -------------------------------------------------------------------------- pieces

#: Bytes that make header syntax interesting.
_ODD = [b"\x00", b"\r", b"\n", b"\t", b" ", b"\x01", b"\x0b", b"\x7f", b"\x80", b"\xff", b":"]
_PLAIN = [b"a", b"Z", b"0", b"-", b"/", b"=", b",", b";", b'"']


def _odd_bytes(max_size: int = 6) -> st.SearchStrategy[bytes]:
    return st.lists(st.sampled_from(_PLAIN * 3 + _ODD), max_size=max_size).map(b"".join)


names = st.one_of(
    st.sampled_from(
        [b"X-Test", b"Server", b"Content-Type", b"Connection", b"Keep-Alive", b"x", b"Date"]
    ),
    _odd_bytes(),
)
values = st.one_of(
    st.sampled_from([b"1", b"text/plain", b"a b", b"", b"  padded  ", b"a\tb", b"\xe9t\xe9"]),
    _odd_bytes(),
)


def _length_values(size: int) -> st.SearchStrategy[bytes]:
    n = b"%d" % size
    return st.sampled_from(
        [n] * 6
        + [
            b"%d" % (size + 1),
            b"%d" % max(size - 1, 0),
            n + b", " + n,
            n + b"," + n,
            n + b", " + b"%d" % (size + 1),
            b"+" + n,
            b"0" + n,
            b"0" * 19 + n,
            b"0" * 21 + n,
            b"",
            b" " + n,
            n + b" ",
            b"-1",
            b"0x" + n,
            b"99999999999999999999999",
        ]
    )


codings = st.sampled_from(
    [b"chunked"] * 6
    + [
        b"Chunked",
        b"CHUNKED",
        b"gzip, chunked",
        b"chunked, identity",
        b"identity",
        b"gzip",
        b"chunked, chunked",
        b"chunked ",
        b"",
        b"chunked;q=1",
    ]
)
connections = st.sampled_from(
    [b"keep-alive", b"close", b"Close", b"keep-alive, close", b"closed", b"upgrade", b"x"]
)
line_ends = st.sampled_from([b"\r\n"] * 10 + [b"\n", b"\r", b"\r\r\n", b"\n\r"])


@st.composite
def header_block(draw: st.DrawFn, framing: list[tuple[bytes, bytes]]) -> bytes:
    """Header lines in a random order with the framing headers among them; mostly CRLF,
    sometimes another line end, obs-fold or a malformed line."""
    lines: list[tuple[bytes, bytes]] = list(framing)
    lines += draw(st.lists(st.tuples(names, values), max_size=3))
    if draw(st.booleans()):
        lines.append((b"Connection", draw(connections)))
    order = draw(st.permutations(range(len(lines))))
    end = draw(line_ends) if draw(st.integers(0, 9)) == 0 else b"\r\n"
    out = b""
    for index in order:
        name, value = lines[index]
        colon = draw(st.sampled_from([b": "] * 8 + [b":", b" : ", b":\t", b":  "]))
        out += name + colon + value + draw(st.sampled_from([end] * 8 + [b" " + end]))
        shape = draw(st.integers(0, 19))
        if shape == 0:  # obs-fold: a continuation line
            out += draw(st.sampled_from([b" ", b"\t", b"  "])) + b"folded" + end
        elif shape == 1:
            out += draw(st.sampled_from([b"no colon", b": no name", b"\x00", b" "])) + end
    return out + end


@st.composite
def status_lines(draw: st.DrawFn, status: int) -> bytes:
    version = draw(
        st.sampled_from(
            [b"HTTP/1.1"] * 10
            + [b"HTTP/1.0"] * 2
            + [b"HTTP/2.0", b"HTTP/1.2", b"HTTP/0.9", b"HTTX/1.1", b"http/1.1"]
        )
    )
    code = (
        b"%03d" % status
        if draw(st.integers(0, 9))
        else draw(st.sampled_from([b"99", b"2000", b"20x", b"099"]))
    )
    reason = draw(
        st.one_of(
            st.sampled_from([b" OK", b" OK", b" Not Found", b" ", b"", b"  two  spaces"]),
            _odd_bytes().map(lambda r: b" " + r),
        )
    )
    return version + b" " + code + reason


@st.composite
def chunked_body(draw: st.DrawFn) -> bytes:
    out = b""
    for _ in range(draw(st.integers(0, 3))):
        data = draw(st.binary(min_size=1, max_size=12))
        size = b"%x" % len(data)
        style = draw(st.integers(0, 11))
        if style == 1:
            size = size.upper()
        elif style == 2:
            size = b"0" * draw(st.integers(1, 20)) + size
        elif style == 3:
            size += draw(st.sampled_from([b";a=b", b";a", b'; a="x y"', b";\x01", b";a\rb", b";"]))
        elif style == 4:
            size += draw(st.sampled_from([b" ", b"\t", b" ;a=b", b"  "]))
        elif style == 5:
            size = draw(st.sampled_from([b"", b"g", b"-1", b"0x5", b"1" * 21]))
        after = (
            b"\r\n"
            if draw(st.integers(0, 7))
            else draw(st.sampled_from([b"\n", b"", b"\r", b"XX", b"\r\r\n"]))
        )
        eol = b"\r\n" if draw(st.integers(0, 9)) else b"\n"
        out += size + eol + data + after
    last = (
        b"0"
        if draw(st.integers(0, 5))
        else draw(st.sampled_from([b"00", b"0;ext=1", b"0 ", b"000000000000000000000"]))
    )
    out += last + b"\r\n"
    for _ in range(draw(st.integers(0, 2)) if draw(st.integers(0, 2)) == 0 else 0):
        out += draw(
            st.sampled_from(
                [
                    b"X-Trailer: 1\r\n",
                    b"X-Trailer: 1\n",
                    b"X: a\r\n folded\r\n",
                    b" leading fold\r\n",
                    b"bad line\r\n",
                    b"X: \x00\r\n",
                    b"X: \x01\r\n",
                    b"Content-Length: 5\r\n",
                    b"Transfer-Encoding: gzip\r\n",
                    b"X:\r\n",
                ]
            )
        )
    out += draw(st.sampled_from([b"\r\n"] * 6 + [b"\n", b"", b"\r"]))
    return out


@st.composite
def response_wire(draw: st.DrawFn) -> bytes:
    """One response (maybe after interim 1xx ones), often malformed, and what follows it."""
    out = draw(st.sampled_from([b""] * 12 + [b"\r\n", b"\n", b" "]))
    for _ in range(draw(st.integers(0, 2)) if draw(st.integers(0, 4)) == 0 else 0):
        interim = draw(st.sampled_from([100, 103, 102, 101]))
        out += draw(status_lines(interim)) + b"\r\n" + draw(header_block([]))
    status = draw(st.sampled_from([200] * 6 + [204, 304, 404, 500, 101, 199]))
    framing_kind = draw(
        st.sampled_from(["length", "length", "chunked", "chunked", "eof", "both", "split"])
    )
    if framing_kind == "split":
        return out + draw(split_response(status))
    body = draw(st.binary(max_size=16))
    framing: Headers = []
    if framing_kind in ("length", "both"):
        framing.append((b"Content-Length", draw(_length_values(len(body)))))
        if draw(st.integers(0, 5)) == 0:  # a second one, equal or not
            framing.append((b"content-length", draw(_length_values(len(body)))))
    if framing_kind in ("chunked", "both"):
        framing.append((b"Transfer-Encoding", draw(codings)))
        if draw(st.integers(0, 7)) == 0:
            framing.append((b"Transfer-Encoding", draw(codings)))
    out += draw(status_lines(status)) + b"\r\n" + draw(header_block(framing))
    if framing_kind in ("chunked", "both") and draw(st.integers(0, 5)):
        out += draw(chunked_body())
    else:
        out += body
    out += draw(
        st.sampled_from(
            [b""] * 8
            + [
                b"\r\n",
                b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok",
                b"\x00garbage",
                b"0\r\n\r\n",
            ]
        )
    )
    return out


#: What a response splitter hides after the chunked body, under its Content-Length.
SMUGGLED = b"HTTP/1.1 200 OK\r\nContent-Length: 8\r\n\r\nsmuggled"


@st.composite
def split_response(
    draw: st.DrawFn, status: int, version: bytes | None = None, clean: bool = False
) -> bytes:
    """Response splitting (RFC 9112 §6.3, §11.1): ``Transfer-Encoding: chunked`` and a
    ``Content-Length`` counting the chunked body *and* a second response after it, which a
    peer framing by ``Content-Length`` (a proxy on the way) takes for part of the first.
    ``clean``: a valid chunked body; ``version``: that status line, not a drawn one."""
    chunks = draw(_clean_chunks() if clean else chunked_body())
    rest = draw(st.sampled_from([SMUGGLED, SMUGGLED[:20], b""]))
    length = b"Content-Length", b"%d" % (len(chunks) + len(SMUGGLED))
    coding = b"Transfer-Encoding", draw(codings)
    framing = [length, coding] if draw(st.booleans()) else [coding, length]
    line = draw(status_lines(status)) if version is None else version + b" %d OK" % status
    return line + b"\r\n" + draw(header_block(framing)) + chunks + rest


def _clean_chunks() -> st.SearchStrategy[bytes]:
    return st.lists(st.binary(min_size=1, max_size=12), max_size=3).map(
        lambda parts: b"".join(b"%x\r\n%s\r\n" % (len(p), p) for p in parts) + b"0\r\n\r\n"
    )


@st.composite
def doubtful_exchanges(draw: st.DrawFn) -> Exchange:
    """Exchanges whose final response's framing is in doubt (both framings, or
    ``Transfer-Encoding`` in HTTP/1.0), mostly well formed and with the connection left
    open: the shapes a codec would otherwise keep, so a verdict of reuse is a finding."""
    request = draw(requests_for_responses())
    status = draw(st.sampled_from([200] * 6 + [204, 304, 404]))
    version = draw(st.sampled_from([b"HTTP/1.1"] * 3 + [b"HTTP/1.0"]))
    if version == b"HTTP/1.1" or draw(st.booleans()):  # (HTTP/1.0: with or without a length)
        wire = draw(split_response(status, version, clean=draw(st.integers(0, 3)) > 0))
    else:
        chunks = draw(_clean_chunks())
        extra = [(b"Connection", b"keep-alive")] if draw(st.booleans()) else []
        head = draw(header_block([(b"Transfer-Encoding", draw(codings)), *extra]))
        wire = version + b" %d OK\r\n" % status + head + chunks
    return Exchange(
        request=request,
        reads=cut(wire, draw(reads)),
        eof=draw(st.integers(0, 3)) == 0,
        end_before=draw(st.integers(0, 2)),
    )


@st.composite
def requests_for_responses(draw: st.DrawFn) -> Request:
    """Valid requests: what the response depends on (method, close, 100-continue, body)."""
    method = draw(st.sampled_from([b"GET"] * 4 + [b"POST", b"HEAD", b"PUT"]))
    headers: Headers = [(b"Host", b"example.com")]
    body: list[bytes] = []
    if method in (b"POST", b"PUT"):
        body = [b"hello"]
        if draw(st.booleans()):
            headers.append((b"Content-Length", b"5"))
        else:
            headers.append((b"Transfer-Encoding", b"chunked"))
        if draw(st.integers(0, 3)) == 0:
            headers.append((b"Expect", b"100-continue"))
    if draw(st.integers(0, 4)) == 0:
        headers.append((b"Connection", b"close"))
    return Request(method=method, headers=headers, body=body)


reads = st.lists(st.integers(1, 64), max_size=16)


@st.composite
def exchanges(draw: st.DrawFn) -> Exchange:
    request = draw(requests_for_responses())
    wire = draw(response_wire())
    pieces = cut(wire, draw(reads))
    return Exchange(
        request=request,
        reads=pieces,
        eof=draw(st.integers(0, 3)) > 0,
        end_before=draw(st.integers(0, 2)),
    )


# ------------------------------------------------------------------------- requests

methods = st.sampled_from(
    [b"GET"] * 4 + [b"POST"] * 4 + [b"HEAD", b"PUT", b"CONNECT", b"G T", b"", b"GET\x00", b"\xe9"]
)
targets = st.sampled_from(
    [b"/"] * 4 + [b"/a?b=c", b"*", b"http://x/", b"/a b", b"/\x7f", b"/\x80", b"", b"/\r\n", b"x:1"]
)


@st.composite
def requests(draw: st.DrawFn) -> Request:
    """Requests as a caller might build them: declared and actual body lengths that
    disagree, both framings, header syntax, Host missing or repeated."""
    body = draw(st.lists(st.binary(max_size=8), max_size=4))
    size = sum(map(len, body))
    headers: Headers = []
    for _ in range(draw(st.sampled_from([1] * 8 + [0, 2]))):
        headers.append((draw(st.sampled_from([b"Host", b"host", b"HOST"])), b"example.com"))
    framing = draw(st.sampled_from(["length", "length", "chunked", "none", "both"]))
    if framing in ("length", "both"):
        headers.append((b"Content-Length", draw(_length_values(size))))
        if draw(st.integers(0, 5)) == 0:
            headers.append((b"content-length", draw(_length_values(size))))
    if framing in ("chunked", "both"):
        headers.append((b"Transfer-Encoding", draw(codings)))
    headers += draw(st.lists(st.tuples(names, values), max_size=3))
    if draw(st.integers(0, 3)) == 0:
        headers.append(
            (
                b"Expect",
                draw(st.sampled_from([b"100-continue", b"100-Continue", b"x, 100-continue"])),
            )
        )
    if draw(st.integers(0, 3)) == 0:
        headers.append((b"Connection", draw(connections)))
    order = draw(st.permutations(range(len(headers))))
    return Request(
        method=draw(methods),
        target=draw(targets),
        headers=[headers[i] for i in order],
        body=body,
        end=draw(st.integers(0, 7)) > 0,
        extra=draw(st.one_of(st.none(), st.binary(max_size=3)))
        if draw(st.integers(0, 7)) == 0
        else None,
    )
