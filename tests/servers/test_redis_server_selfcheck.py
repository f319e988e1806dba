"""Self-checks for ``redis.py``'s ``RedisServer``: the real redis-server it runs answers on
127.0.0.1, stops by PID, restarts empty on the same port, and hangs while paused."""

from __future__ import annotations

import os
import socket

import pytest

from .raw import LOCALHOST
from .redis import RedisServer


def _answers(port: int, timeout: float) -> bytes | None:
    """A raw PING; the reply, or None when nothing answered within ``timeout``."""
    with socket.create_connection((LOCALHOST, port), 2.0) as sock:
        sock.settimeout(timeout)
        sock.sendall(b"*1\r\n$4\r\nPING\r\n")
        try:
            return sock.recv(16)
        except TimeoutError:
            return None


def test_server_runs_stops_restarts_and_pauses() -> None:
    with RedisServer() as server:
        assert server.url == f"redis://{LOCALHOST}:{server.port}/0"
        pid = server.pid
        assert pid is not None
        client = server.client()
        assert client is server.client()
        assert client.ping()
        client.set("k", "v")
        # no persistence, own temp dir: nothing written to disk
        assert client.config_get("save") == {"save": ""}
        assert client.config_get("appendonly") == {"appendonly": "no"}
        assert client.config_get("bind")["bind"] == LOCALHOST

        server.pause()
        assert _answers(server.port, 0.3) is None  # connected, but no answer
        server.resume()
        assert _answers(server.port, 5.0) == b"+PONG\r\n"

        server.stop()
        assert not server.running
        with pytest.raises(ProcessLookupError):
            os.kill(pid, 0)  # stopped by PID: that process is gone
        with pytest.raises(ConnectionRefusedError):
            socket.create_connection((LOCALHOST, server.port), 2.0).close()

        server.start()
        assert server.running and server.pid != pid and server.starts == 2
        assert client.get("k") is None  # came back empty, on the same port
        paused_pid = server.pid
        server.pause()  # exit must continue it and stop it anyway
    assert paused_pid is not None
    with pytest.raises(ProcessLookupError):
        os.kill(paused_pid, 0)
