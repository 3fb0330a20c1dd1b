"""An HTTP server whose connections get a thread only once their request has passed the door.

`gap online serve` answers each request on a thread of its own, and threads are few
(`max_connections`). A connection that sends nothing, or half a head, must not hold one: a
client that keeps such connections open (reconnecting as they close) would keep every honest
client at 503. So the server's own loop accepts every connection and reads every request's head
(request line and headers) itself, with a selector, and hands a request to a thread only once
its head is in and `screen` (the caller's check: a browser's request, a missing or wrong token)
let it through:

- before its head is in, a connection costs a descriptor and at most MAX_HEAD_BYTES of buffer,
  for at most `head_timeout_s`. At most WAITING_PER_SLOT x `max_connections` heads are waited
  for; a new connection beyond that displaces the one that has waited longest. An honest
  client's head comes with its connection and is read on the loop's next turn, so only as many
  newer connections as are waited for could displace it: a client holding connections open or
  reopening them displaces its own.
- a head `screen` refuses is answered in one line from the loop (403, 401, ...), and one over
  MAX_HEAD_BYTES 431: no thread.
- a request let through takes one of `max_connections` slots, its thread's, until its answer
  (503 beyond). The thread reads on from the bytes the loop already has (`GatedHandler`).

Threads: the loop, and at most `max_connections` handlers. Memory: the heads waited for, and
what each handler holds.
"""

from __future__ import annotations

import contextlib
import http.client
import io
import json
import logging
import selectors
import socket
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from http import HTTPStatus
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

from pytest_gap.errors import one_line, shown

log = logging.getLogger(__name__)
MAX_HEAD_BYTES = 32 * 1024  # a request line and headers (ours: a few hundred bytes)
WAITING_PER_SLOT = 4  # heads waited for at once, per handler slot
READ_BYTES = 4096  # one read of a head
DRAIN_BYTES = 64 * 1024  # what is read off a refused connection before it is closed

# (status, one line) when the request may not go on; None when it may
Screen = Callable[[http.client.HTTPMessage], "tuple[HTTPStatus, str] | None"]


@dataclass
class _Waiting:
    address: tuple
    deadline: float
    head: bytearray = field(default_factory=bytearray)


def _head_end(data: bytes | bytearray) -> int | None:
    """Where the head ends (after its blank line), or None while it has not."""
    ends = [i + len(mark) for mark in (b"\r\n\r\n", b"\n\n") if (i := data.find(mark)) >= 0]
    return min(ends) if ends else None


def error_answer(status: HTTPStatus, message: str) -> bytes:
    """A whole HTTP/1.0 answer: the JSON body `{"error": message}` on one line."""
    body = (json.dumps({"error": one_line(message, 1000)}) + "\n").encode()
    head = (
        f"HTTP/1.0 {status.value} {status.phrase}\r\nContent-Type: application/json\r\n"
        f"Content-Length: {len(body)}\r\nConnection: close\r\n\r\n"
    )
    return head.encode() + body


class GatedHTTPServer(ThreadingHTTPServer):
    """The module's docstring. `handler` must be a GatedHandler; serve_forever() runs the loop
    (in the calling thread) until shutdown()."""

    def __init__(
        self,
        address: tuple[str, int],
        handler: type[GatedHandler],
        *,
        max_connections: int,
        head_timeout_s: float,
        screen: Screen,
    ):
        self.max_connections = max_connections
        self.max_waiting = WAITING_PER_SLOT * max_connections
        self.head_timeout_s = head_timeout_s
        self.screen = screen
        self.slots = threading.BoundedSemaphore(max_connections)
        self.waiting: dict[socket.socket, _Waiting] = {}  # arrival order: oldest first
        self.heads: dict[socket.socket, bytes] = {}  # handed over, not yet taken by a handler
        self._stop = threading.Event()
        self._stopped = threading.Event()
        self._stopped.set()
        # the kernel's accept queue: connections past it would wait unseen for retransmits
        self.request_queue_size = self.max_waiting
        super().__init__(address, handler)

    # -- the loop ---------------------------------------------------------------------------------
    def serve_forever(self, poll_interval: float = 0.5) -> None:
        self._stop.clear()
        self._stopped.clear()
        self.socket.setblocking(False)
        with selectors.DefaultSelector() as selector:
            selector.register(self.socket, selectors.EVENT_READ)
            try:
                while not self._stop.is_set():
                    for key, _ in selector.select(self._wait_s(poll_interval)):
                        if key.fileobj is self.socket:
                            self._accept(selector)
                        else:
                            self._read(selector, key.fileobj)
                    self._expire(selector)
            finally:
                for conn in list(self.waiting):
                    self._drop(selector, conn)
                self._stopped.set()

    def shutdown(self) -> None:
        """Stop serve_forever() (from another thread) and wait until it has."""
        self._stop.set()
        self._stopped.wait()

    def _wait_s(self, poll_interval: float) -> float:
        if not self.waiting:
            return poll_interval
        first = next(iter(self.waiting.values()))
        return max(0.0, min(poll_interval, first.deadline - time.monotonic()))

    def _accept(self, selector: selectors.BaseSelector) -> None:
        try:
            conn, address = self.socket.accept()
        except OSError:  # gone before it was taken, or out of descriptors: the next turn
            return
        conn.setblocking(False)
        if len(self.waiting) >= self.max_waiting:  # the one waited for longest makes room
            why = (
                f"{self.max_waiting} connections were waiting to send their request and this "
                "one had waited longest; send the request as soon as the connection is open"
            )
            self._refuse(selector, next(iter(self.waiting)), HTTPStatus.SERVICE_UNAVAILABLE, why)
        self.waiting[conn] = _Waiting(address, time.monotonic() + self.head_timeout_s)
        selector.register(conn, selectors.EVENT_READ)

    def _read(self, selector: selectors.BaseSelector, conn: socket.socket) -> None:
        waiting = self.waiting.get(conn)
        if waiting is None:  # displaced earlier on this turn of the loop
            return
        try:
            data = conn.recv(READ_BYTES)
        except BlockingIOError:
            return
        except OSError:
            data = b""
        if not data:  # the client left
            return self._drop(selector, conn)
        waiting.head += data
        end = _head_end(waiting.head)
        if (end or len(waiting.head)) > MAX_HEAD_BYTES:
            why = f"the request's head is over {MAX_HEAD_BYTES} bytes (MAX_HEAD_BYTES)"
            return self._refuse(selector, conn, HTTPStatus.REQUEST_HEADER_FIELDS_TOO_LARGE, why)
        if end is None:
            return
        refusal = self._screened(bytes(waiting.head[:end]))
        if refusal is not None:
            return self._refuse(selector, conn, *refusal)
        if not self.slots.acquire(blocking=False):
            why = (
                f"the platform is serving its {self.max_connections} connections "
                "(max_connections); try again shortly"
            )
            return self._refuse(selector, conn, HTTPStatus.SERVICE_UNAVAILABLE, why)
        self._hand_over(selector, conn, waiting)

    def _screened(self, head: bytes) -> tuple[HTTPStatus, str] | None:
        _, _, fields = head.partition(b"\n")
        try:
            headers = http.client.parse_headers(io.BytesIO(fields))
        except (http.client.HTTPException, ValueError):
            return HTTPStatus.BAD_REQUEST, "the request's headers cannot be read"
        return self.screen(headers)

    def _hand_over(
        self, selector: selectors.BaseSelector, conn: socket.socket, waiting: _Waiting
    ) -> None:
        selector.unregister(conn)
        del self.waiting[conn]
        self.heads[conn] = bytes(waiting.head)
        conn.setblocking(True)
        try:
            self.process_request(conn, waiting.address)  # a thread: process_request_thread
        except Exception:  # no thread to be had: the slot and the connection go back
            self.heads.pop(conn, None)
            self.slots.release()
            self.shutdown_request(conn)
            log.warning("could not start a thread for a request: %s", shown(sys.exception()))

    def _expire(self, selector: selectors.BaseSelector) -> None:
        now = time.monotonic()
        while self.waiting:
            conn, first = next(iter(self.waiting.items()))
            if first.deadline > now:
                return
            why = f"the request's head did not all arrive within {self.head_timeout_s:g} s"
            self._refuse(selector, conn, HTTPStatus.REQUEST_TIMEOUT, why)

    def _refuse(
        self,
        selector: selectors.BaseSelector,
        conn: socket.socket,
        status: HTTPStatus,
        message: str,
    ) -> None:
        """Answer in one line and close. What the client sent on (a body, a drip) is read
        first, up to DRAIN_BYTES: closing on unread bytes would reset the connection, answer
        and all. Nothing here waits: the socket is non-blocking, the answer a few hundred
        bytes."""
        with contextlib.suppress(OSError):
            for _ in range(DRAIN_BYTES // READ_BYTES):
                if not conn.recv(READ_BYTES):
                    break
        with contextlib.suppress(OSError):
            conn.send(error_answer(status, message))
            conn.shutdown(socket.SHUT_WR)
        self._drop(selector, conn)

    def _drop(self, selector: selectors.BaseSelector, conn: socket.socket) -> None:
        self.waiting.pop(conn, None)
        with contextlib.suppress(KeyError, ValueError):
            selector.unregister(conn)
        conn.close()

    # -- the handlers' threads --------------------------------------------------------------------
    def process_request_thread(self, request, client_address) -> None:
        try:
            super().process_request_thread(request, client_address)
        finally:
            self.heads.pop(request, None)
            self.slots.release()

    def take_head(self, conn: socket.socket) -> bytes:
        """The bytes the loop read of `conn` (its head, perhaps the start of its body)."""
        return self.heads.pop(conn, b"")

    def handle_error(self, request, client_address) -> None:
        """One line in the log, escaped (socketserver would print a traceback that may quote
        the request); a client that hung up is not an error."""
        exc = sys.exception()
        if isinstance(exc, ConnectionError):
            return
        why = f"{type(exc).__name__}: {shown(exc)}"
        log.warning("a request from %s failed: %s", client_address[0], why)


class _Prefixed:
    """A connection's reader that first gives the bytes already read off it."""

    def __init__(self, head: bytes, rest):
        self.head = io.BytesIO(head)
        self.rest = rest

    def readline(self, limit: int = -1) -> bytes:
        line = self.head.readline(limit)
        if line.endswith(b"\n") or 0 <= limit <= len(line):
            return line
        return line + self.rest.readline(-1 if limit < 0 else limit - len(line))

    def read(self, size: int = -1) -> bytes:
        data = self.head.read(size)
        if size < 0:
            return data + self.rest.read()
        return data if len(data) >= size else data + self.rest.read(size - len(data))

    def close(self) -> None:
        self.rest.close()


class GatedHandler(BaseHTTPRequestHandler):
    """A request handler of a GatedHTTPServer: it reads the request from the start, the part
    the server's loop already read included."""

    server: GatedHTTPServer

    def setup(self) -> None:
        super().setup()
        self.rfile = _Prefixed(self.server.take_head(self.request), self.rfile)
