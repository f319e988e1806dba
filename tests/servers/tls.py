"""TLS material for the test servers, built from in-memory ``trustme`` CAs.

Everything here is generated in-process; nothing touches the system trust store.

* :func:`session_ca` -- one ``trustme.CA`` shared by the whole test session.
* :func:`default_server_tls` -- a :class:`ServerTLS` for ``127.0.0.1`` / ``localhost``
  signed by :func:`session_ca` (the "good" certificate).
* :func:`wrong_host_server_tls` -- same CA, but the certificate is for ``wrong.example``
  only, so hostname verification against ``127.0.0.1`` fails.
* :func:`untrusted_server_tls` -- a valid-looking ``127.0.0.1`` certificate from a
  *different* CA that clients using :meth:`ServerTLS.client_ssl_context` do not trust.

:class:`ServerTLS` hands out fresh ``ssl.SSLContext`` objects (server and client side)
and can write PEM files to a directory (``tmp_path``) for code that needs paths.
"""

from __future__ import annotations

import functools
import ssl
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import trustme

__all__ = [
    "DEFAULT_ALPN",
    "PemFiles",
    "ServerTLS",
    "default_server_tls",
    "session_ca",
    "untrusted_server_tls",
    "wrong_host_server_tls",
]

DEFAULT_ALPN: tuple[str, ...] = ("h2", "http/1.1")
DEFAULT_HOSTS: tuple[str, ...] = ("127.0.0.1", "localhost")


@dataclass(frozen=True)
class PemFiles:
    """Paths of PEM files written by :meth:`ServerTLS.write_pem_files`."""

    ca: Path
    """The CA certificate (what a client should trust)."""
    cert_chain: Path
    """The server certificate followed by its chain."""
    key: Path
    """The server private key (unencrypted)."""


class ServerTLS:
    """A server certificate issued by a ``trustme.CA``, plus context factories.

    ``ServerTLS(ca)`` issues a certificate for ``hosts`` (default ``127.0.0.1`` and
    ``localhost``). The certificate is issued once, in the constructor.
    """

    def __init__(self, ca: trustme.CA, hosts: Sequence[str] = DEFAULT_HOSTS) -> None:
        if not hosts:
            raise ValueError("at least one host identity is required")
        self.ca: trustme.CA = ca
        self.hosts: tuple[str, ...] = tuple(hosts)
        self.cert: trustme.LeafCert = ca.issue_cert(*self.hosts)

    def __repr__(self) -> str:
        return f"ServerTLS(hosts={self.hosts!r})"

    @property
    def ca_pem(self) -> bytes:
        """The PEM bytes of the CA certificate."""
        return self.ca.cert_pem.bytes()

    def server_ssl_context(self, alpn: Sequence[str] | None = DEFAULT_ALPN) -> ssl.SSLContext:
        """A new server-side context presenting this certificate.

        ``alpn`` is the list of protocols offered via ALPN (``None`` or ``()`` disables
        ALPN). TLS 1.2 is the minimum, as RFC 9113 requires for h2.
        """
        ctx = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
        ctx.minimum_version = ssl.TLSVersion.TLSv1_2
        ctx.options |= ssl.OP_NO_COMPRESSION
        self.cert.configure_cert(ctx)
        if alpn:
            ctx.set_alpn_protocols(list(alpn))
        return ctx

    def client_ssl_context(self, alpn: Sequence[str] | None = None) -> ssl.SSLContext:
        """A new client-side context that trusts (only) this certificate's CA.

        Hostname checking and certificate verification are on (the defaults of
        ``ssl.create_default_context``). ``alpn`` optionally sets the client's ALPN
        offer; httpx sets its own ALPN on the context it is given, so leave it ``None``
        when passing the context to httpx.
        """
        ctx = ssl.create_default_context(ssl.Purpose.SERVER_AUTH)
        self.ca.configure_trust(ctx)
        if alpn:
            ctx.set_alpn_protocols(list(alpn))
        return ctx

    def write_pem_files(self, directory: Path) -> PemFiles:
        """Write ``ca.pem``, ``server-chain.pem`` and ``server-key.pem`` to ``directory``.

        Use a per-test directory such as pytest's ``tmp_path``; the caller owns cleanup.
        """
        directory.mkdir(parents=True, exist_ok=True)
        files = PemFiles(
            ca=directory / "ca.pem",
            cert_chain=directory / "server-chain.pem",
            key=directory / "server-key.pem",
        )
        files.ca.write_bytes(self.ca.cert_pem.bytes())
        files.cert_chain.write_bytes(b"".join(blob.bytes() for blob in self.cert.cert_chain_pems))
        files.key.write_bytes(self.cert.private_key_pem.bytes())
        return files


@functools.cache
def session_ca() -> trustme.CA:
    """The CA shared by the whole test session (created lazily, once per process)."""
    return trustme.CA()


@functools.cache
def default_server_tls() -> ServerTLS:
    """Certificate for ``127.0.0.1`` and ``localhost`` signed by :func:`session_ca`."""
    return ServerTLS(session_ca())


@functools.cache
def wrong_host_server_tls() -> ServerTLS:
    """Certificate for ``wrong.example`` only, signed by :func:`session_ca`.

    A client trusting :func:`session_ca` that connects to ``127.0.0.1`` fails hostname
    verification (``ssl.SSLCertVerificationError`` ... "IP address mismatch").
    """
    return ServerTLS(session_ca(), hosts=("wrong.example",))


@functools.cache
def untrusted_server_tls() -> ServerTLS:
    """Certificate for ``127.0.0.1``/``localhost`` from a CA nobody trusts.

    Its own :meth:`ServerTLS.client_ssl_context` trusts that other CA; use
    ``default_server_tls().client_ssl_context()`` to get a verification failure
    ("unable to get local issuer certificate").
    """
    return ServerTLS(trustme.CA())
