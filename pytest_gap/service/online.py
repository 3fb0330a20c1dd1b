"""`gap online serve`: the online platform's HTTP face. The platform (platform.py) takes
evaluation tasks (a model name and a benchmark set) from token holders, queues them, and when
capacity frees up starts an evaluation server for the task and hands out its endpoint; this
module answers the requests that create and read tasks, and bounds what a request may take.

HTTP JSON, bearer tokens (`--tokens FILE`: one `token owner` pair per line): a token sees and
controls only its owner's tasks (others answer 404); a wrong or missing token answers 401. Tokens
are never logged, written under the runs dir, or put on a command line.

    POST /tasks {model_name, benchmark_set, idempotency_key?}  -> Task (201 new, 200 existing)
    GET  /tasks[?offset=K&limit=N]                             -> [Task] (the owner's, oldest
                                                                  first; X-Total-Count: all)
    GET  /tasks/<task id>                                      -> Task

A ready task's run secret, the task servers' environment and the limits on tasks are
platform.py's (see its docstring). Here are the limits on a request itself: a body needs a
Content-Length of at most MAX_BODY_BYTES (411/400/413 before anything is read); a connection
idle for `request_timeout_s` is closed (408), and at most `max_connections` are served at once
(503 beyond).
"""

from __future__ import annotations

import contextlib
import json
import logging
import re
import socket
import threading
from http import HTTPStatus
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import parse_qs, urlsplit

from pydantic import ValidationError

from pytest_gap.bind import exposure_notice
from pytest_gap.doors import bearer, same_secret
from pytest_gap.errors import GapError
from pytest_gap.service.platform import MAX_LIST, Platform, Refused, TaskRequest

log = logging.getLogger(__name__)
MAX_BODY_BYTES = 64 * 1024  # a task request is a few hundred bytes
LENGTH_RE = re.compile(r"[0-9]{1,12}")  # int() would take "-1", " 1 ", "+1", "1_0"


def _page(query: str) -> tuple[int, int]:
    """(offset, limit) of `GET /tasks?offset=K&limit=N`; GapError naming the bad one."""
    values = parse_qs(query)
    page = []
    for name, low, high, default in (("offset", 0, 10**9, 0), ("limit", 1, MAX_LIST, MAX_LIST)):
        text = values.get(name, [str(default)])[-1]
        if not LENGTH_RE.fullmatch(text) or not low <= int(text) <= high:
            raise GapError(f"{name} {text[:20]!r}: give an integer from {low} to {high}")
        page.append(int(text))
    return page[0], page[1]


def _content_length(headers) -> int:
    """The body's declared size, before a byte of it is read; Refused (411/400/413) unless it
    is one plain number within MAX_BODY_BYTES: a negative or huge one would have the handler
    read for ever, or into memory, on the sender's word."""
    if headers.get("Transfer-Encoding"):
        raise Refused(
            HTTPStatus.LENGTH_REQUIRED,
            "Transfer-Encoding: not taken; send the JSON body with a Content-Length",
        )
    values = headers.get_all("Content-Length") or []
    if not values:
        raise Refused(
            HTTPStatus.LENGTH_REQUIRED,
            f"Content-Length: required; send the JSON body's size (at most {MAX_BODY_BYTES})",
        )
    text = values[0].strip()
    if len(set(values)) > 1 or not LENGTH_RE.fullmatch(text):
        raise Refused(
            HTTPStatus.BAD_REQUEST,
            f"Content-Length {', '.join(values)[:40]!r}: give one size in bytes, 0 to "
            f"{MAX_BODY_BYTES}",
        )
    if int(text) > MAX_BODY_BYTES:
        raise Refused(
            HTTPStatus.REQUEST_ENTITY_TOO_LARGE,
            f"Content-Length {text[:20]}: a task request is at most {MAX_BODY_BYTES} bytes",
        )
    return int(text)


def _one_line(text: str) -> str:
    return " ".join(text.split())


class TaskHandler(BaseHTTPRequestHandler):
    """One request of the platform's API (the module's docstring), one request per connection
    (HTTP/1.0). `handler_for` makes the class a server uses: it sets `platform` and `timeout`."""

    platform: Platform
    # each read and write on the connection; `setup` adds a deadline for the whole request
    # (a client dripping a byte a second never trips a per-read timeout)
    timeout: float
    cut_off = False  # the request deadline passed: reading stopped

    def setup(self) -> None:
        super().setup()
        self.deadline = threading.Timer(self.timeout, self._cut)
        self.deadline.daemon = True
        self.deadline.start()

    def _cut(self) -> None:
        """Stop reading (a blocked read returns end of file); the answer can still go out.
        One request per connection (HTTP/1.0), so this bounds a connection's thread."""
        self.cut_off = True
        with contextlib.suppress(OSError):
            self.connection.shutdown(socket.SHUT_RD)

    def finish(self) -> None:
        self.deadline.cancel()
        super().finish()

    def _send(self, status: HTTPStatus, body, headers: dict[str, str] | None = None) -> None:
        data = (json.dumps(body) + "\n").encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        for name, value in (headers or {}).items():
            self.send_header(name, value)
        self.end_headers()
        self.wfile.write(data)

    def _error(self, status: HTTPStatus, message: str) -> None:
        self._send(status, {"error": _one_line(message)})

    def _owner(self) -> tuple[str, str] | None:
        """(owner, token) of the request's bearer token; None after answering 401."""
        token = bearer(self.headers) or ""
        # constant time per token, on bytes: a timing probe learns nothing about valid
        # prefixes, and a non-ASCII header is a 401 like any wrong token
        matches = [o for t, o in self.platform.tokens.items() if same_secret(token, t)]
        if not matches:
            self._error(HTTPStatus.UNAUTHORIZED, "missing or wrong bearer token")
            return None
        return matches[0], token

    def do_GET(self) -> None:
        caller = self._owner()
        if caller is None:
            return
        owner = caller[0]
        url = urlsplit(self.path)
        if url.path.rstrip("/") == "/tasks":
            try:
                offset, limit = _page(url.query)
            except GapError as exc:
                return self._error(HTTPStatus.BAD_REQUEST, str(exc))
            tasks, total = self.platform.visible(owner, offset, limit)
            body = [t.model_dump(mode="json") for t in tasks]
            return self._send(HTTPStatus.OK, body, {"X-Total-Count": str(total)})
        if url.path.startswith("/tasks/"):
            task = self.platform.get(owner, url.path[len("/tasks/") :])
            if task is None:
                return self._error(HTTPStatus.NOT_FOUND, "no such task")
            return self._send(HTTPStatus.OK, task.model_dump(mode="json"))
        self._error(HTTPStatus.NOT_FOUND, f"no such path {url.path[:200]}")

    def do_POST(self) -> None:
        # once a body is refused unread, the connection cannot carry another request
        self.close_connection = True
        caller = self._owner()
        if caller is None:
            return
        owner, token = caller
        if urlsplit(self.path).path.rstrip("/") != "/tasks":
            return self._error(HTTPStatus.NOT_FOUND, f"no such path {self.path[:200]}")
        try:
            body = self._body()
            request = TaskRequest.model_validate_json(body or b"{}")
            task, created = self.platform.create(owner, token, request)
        except Refused as exc:
            return self._error(exc.status, str(exc))
        except ValidationError as exc:
            first = exc.errors()[0]
            where = ".".join(str(x) for x in first["loc"]) or "body"
            return self._error(HTTPStatus.BAD_REQUEST, f"{where}: {first['msg']}")
        except GapError as exc:
            return self._error(HTTPStatus.BAD_REQUEST, str(exc))
        status = HTTPStatus.CREATED if created else HTTPStatus.OK
        self._send(status, task.model_dump(mode="json"))

    def _body(self) -> bytes:
        """The request body, read only after its Content-Length passed; Refused (408) when
        it does not all arrive within the request timeout."""
        length = _content_length(self.headers)
        try:
            body = self.rfile.read(length)
        except TimeoutError:
            body, self.cut_off = b"", True
        if len(body) < length and self.cut_off:
            raise Refused(
                HTTPStatus.REQUEST_TIMEOUT,
                f"body: not all {length} bytes arrived within {self.timeout:g} s; send it whole",
            )
        if len(body) < length:
            raise Refused(
                HTTPStatus.BAD_REQUEST,
                f"body: {len(body)} of the {length} bytes Content-Length announced",
            )
        return body

    def log_message(self, format: str, *args) -> None:
        pass  # request lines carry no token, but nothing here needs them either


def handler_for(platform: Platform) -> type[BaseHTTPRequestHandler]:
    """The handler class of `platform`'s server (socketserver makes one instance a request)."""
    attributes = {"platform": platform, "timeout": platform.limits.request_timeout_s}
    return type("Handler", (TaskHandler,), attributes)


class _BoundedServer(ThreadingHTTPServer):
    """A thread per connection, at most `max_connections` at once: beyond that a connection is
    answered 503 and closed at once, so a flood of slow clients cannot pile up threads."""

    def __init__(self, address: tuple[str, int], handler, max_connections: int):
        self.slots = threading.BoundedSemaphore(max_connections)
        self.max_connections = max_connections
        # the kernel's accept queue (socketserver's default is 5): connections past it wait
        # unseen for retransmits, so a flood would look like a platform that does not answer
        self.request_queue_size = 2 * max_connections
        super().__init__(address, handler)

    def process_request(self, request, client_address) -> None:
        if not self.slots.acquire(blocking=False):
            self._turn_away(request)
            return
        try:
            super().process_request(request, client_address)
        except Exception:
            self.slots.release()
            raise

    def process_request_thread(self, request, client_address) -> None:
        try:
            super().process_request_thread(request, client_address)
        finally:
            self.slots.release()

    def _turn_away(self, request: socket.socket) -> None:
        body = (
            json.dumps(
                {
                    "error": f"the platform is serving its {self.max_connections} connections; "
                    "try again shortly"
                }
            )
            + "\n"
        ).encode()
        head = (
            "HTTP/1.1 503 Service Unavailable\r\nContent-Type: application/json\r\n"
            f"Content-Length: {len(body)}\r\nConnection: close\r\n\r\n"
        ).encode()
        try:
            request.settimeout(1.0)
            request.sendall(head + body)
        except OSError:
            pass
        self.shutdown_request(request)


def make_platform_server(platform: Platform, host: str, port: int) -> ThreadingHTTPServer:
    notice = exposure_notice("the platform", host)
    if notice:
        log.warning(notice)
    return _BoundedServer((host, port), handler_for(platform), platform.limits.max_connections)
