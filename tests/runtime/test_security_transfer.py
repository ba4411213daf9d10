"""The object-transfer data channel under slow-loris peers.

A peer that connects to a raylet's data channel and sends its handshake a byte at a
time must not hold anything a legitimate pull needs: the handshake has one deadline
(not one per read), unauthenticated peers hold no serving thread, and each address
may have only a few handshakes in progress (a newer one drops its oldest).
"""

from __future__ import annotations

import os
import socket
import threading
from typing import Any, Iterator

import psutil
import pytest

import lumos
from lumos._private.protocol import auth
from lumos._private.raylet.object_manager import MAX_UNAUTHENTICATED_PER_ADDRESS
from lumos.testing import Cluster

from ..conftest import TEST_CONFIG, check_no_leaks, wait_for

pytestmark = [pytest.mark.timeout(120), pytest.mark.slow]

HANDSHAKE_TIMEOUT_S = 4.0


@pytest.fixture(scope="module")
def two_nodes() -> Iterator[dict[str, Any]]:
    config = dict(TEST_CONFIG, handshake_timeout_s=HANDSHAKE_TIMEOUT_S)
    cluster = Cluster(initialize_head=True, head_node_args={"num_cpus": 1, "_system_config": config})
    try:
        node = cluster.add_node(num_cpus=1, resources={"special": 1})
        cluster.connect()
        raylet = psutil.Process(node.raylet_pid)
        (port,) = [c.laddr.port for c in raylet.net_connections(kind="inet")
                   if c.status == psutil.CONN_LISTEN and c.laddr.port != node.node_manager_port]
        log = os.path.join(cluster.session_dir, "logs", f"raylet-{node.node_id[:12]}.log")
        yield {"cluster": cluster, "data": (node.node_manager_address, port), "log": log}
    finally:
        cluster.shutdown()
        check_no_leaks(cluster.session_dir)


class Loris:
    """``count`` connections to ``address`` that send their nonce one byte per
    ``interval_s``; each one the server drops is opened again, until ``stop``."""

    def __init__(self, address: tuple[str, int], sources: list[str], count: int, interval_s: float) -> None:
        self.address = address
        self.sources = sources
        self.interval_s = interval_s
        self.socks: list[socket.socket | None] = [None] * count
        #: Bytes of its nonce each connection has sent.
        self.sent = [0] * count
        #: Connections the server closed before their nonce was complete.
        self.dropped = 0
        #: Connections that got their whole nonce out (the server never dropped them).
        self.completed = 0
        self._stop = threading.Event()
        for i in range(count):
            self.socks[i] = self._open(i)
        self._thread = threading.Thread(target=self._run, name="test.loris", daemon=True)
        self._thread.start()

    def _open(self, i: int) -> socket.socket:
        s = socket.create_connection(self.address, timeout=5, source_address=(self.sources[i % len(self.sources)], 0))
        s.setblocking(False)
        self.sent[i] = 0
        return s

    def _run(self) -> None:
        while not self._stop.wait(self.interval_s):
            for i, s in enumerate(self.socks):
                if s is None:
                    continue
                try:
                    closed = s.recv(1) == b""
                except BlockingIOError:
                    closed = False
                except OSError:
                    closed = True
                if not closed:
                    try:
                        s.send(b"n")
                        self.sent[i] += 1
                    except OSError:
                        closed = True
                if closed:
                    s.close()
                    self.dropped += 1
                    self.socks[i] = None if self._stop.is_set() else self._reopen(i)
                elif self.sent[i] >= auth.NONCE_BYTES:
                    self.completed += 1
                    s.close()
                    self.socks[i] = self._reopen(i)

    def _reopen(self, i: int) -> socket.socket | None:
        try:
            return self._open(i)
        except OSError:
            return None

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(10)
        for s in self.socks:
            if s is not None:
                s.close()


@lumos.remote(resources={"special": 1})
def make(n: int) -> Any:
    import numpy as np
    return np.ones(n)


def test_slow_loris_peers_do_not_block_pulls(two_nodes):
    """64 peers trickling their handshakes, 16 of them from the puller's own address:
    a pull from that node still completes."""
    sources = ["127.0.0.1", "127.0.0.2", "127.0.0.3", "127.0.0.4"]
    # A byte every 2 s: a per-read timeout never fires, and the nonce takes a minute.
    loris = Loris(two_nodes["data"], sources, 64, 2.0)
    try:
        value = lumos.get(make.remote(2_000_000), timeout=30)  # made on the second node, pulled here
        assert float(value.sum()) == 2_000_000.0
    finally:
        loris.stop()


def test_handshake_has_one_deadline_not_one_per_read(two_nodes):
    """A byte every half second never trips a per-read timeout; the whole-handshake
    deadline drops the peer long before its 32-byte nonce is out."""
    loris = Loris(two_nodes["data"], ["127.0.0.7"], 1, 0.5)
    try:
        wait_for(lambda: loris.dropped >= 1 or loris.completed >= 1, HANDSHAKE_TIMEOUT_S + 30)
    finally:
        loris.stop()
    assert loris.completed == 0 and loris.dropped >= 1


def test_each_address_has_only_a_few_handshakes_in_progress(two_nodes):
    extra = 4
    socks = [socket.create_connection(two_nodes["data"], timeout=5, source_address=("127.0.0.8", 0))
             for _ in range(MAX_UNAUTHENTICATED_PER_ADDRESS + extra)]
    try:
        def closed(s: socket.socket) -> bool:
            s.settimeout(0.01)
            try:
                return s.recv(1) == b""
            except socket.timeout:
                return False
            except OSError:
                return True
        # The oldest ones make room for the newer ones; the newest are still waiting.
        wait_for(lambda: all(closed(s) for s in socks[:extra]), HANDSHAKE_TIMEOUT_S)
        with open(two_nodes["log"], errors="replace") as f:
            lines = [line for line in f if "peer 127.0.0.8 " in line]
        assert len(lines) == 1 and "too many unauthenticated connections from one address" in lines[0], lines
    finally:
        for s in socks:
            s.close()
