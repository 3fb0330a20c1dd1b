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
platform.py's (see its docstring). Here are the limits on a request itself: a request a browser
made (`Origin`, `Sec-Fetch-Site`) is refused (403), as at every door (doors.browser_refusal); a
body needs a Content-Length of at most MAX_BODY_BYTES (411/400/413 before anything is read); a
request's head not in within `request_timeout_s` is answered 408, and so is its body not in
within as long again. A request gets a thread only once its head is in and its token is good
(http_gate.py), so connections without a token cannot starve those with one; at most
`max_connections` requests are served at once (503 beyond).
"""

from __future__ import annotations

import contextlib
import json
import logging
import re
import socket
import threading
from http import HTTPStatus
from urllib.parse import parse_qs, urlsplit

from pydantic import ValidationError

from pytest_gap.bind import exposure_notice
from pytest_gap.doors import bearer, browser_refusal, same_secret
from pytest_gap.errors import GapError
from pytest_gap.service.http_gate import GatedHandler, GatedHTTPServer
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


def _refusal(platform: Platform, headers) -> tuple[HTTPStatus, str] | None:
    """Why a request may not go on, before anything else is read of it: a browser's (403) or
    one without a good bearer token (401); None when it may."""
    why = browser_refusal(headers)
    if why is not None:
        return HTTPStatus.FORBIDDEN, why
    if _owner_of(platform, bearer(headers) or "") is None:
        return HTTPStatus.UNAUTHORIZED, "missing or wrong bearer token"
    return None


def _owner_of(platform: Platform, token: str) -> str | None:
    # constant time per token, on bytes: a timing probe learns nothing about valid prefixes,
    # and a non-ASCII header is a 401 like any wrong token
    matches = [o for t, o in platform.tokens.items() if same_secret(token, t)]
    return matches[0] if matches else None


class TaskHandler(GatedHandler):
    """One request of the platform's API (the module's docstring), one request per connection
    (HTTP/1.0), on a thread of its own once the server's gate let its head through.
    `handler_for` makes the class a server uses: it sets `platform` and `timeout`."""

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

    def _owner(self) -> str | None:
        """The request's owner; None after answering 403 or 401. The gate already refused
        such requests: asked again here, a handler never serves one it let by."""
        refused = _refusal(self.platform, self.headers)
        if refused is not None:
            self._error(*refused)
            return None
        return _owner_of(self.platform, bearer(self.headers) or "")

    def do_GET(self) -> None:
        owner = self._owner()
        if owner is None:
            return
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
        owner = self._owner()
        if owner is None:
            return
        if urlsplit(self.path).path.rstrip("/") != "/tasks":
            return self._error(HTTPStatus.NOT_FOUND, f"no such path {self.path[:200]}")
        try:
            body = self._body()
            request = TaskRequest.model_validate_json(body or b"{}")
            task, created = self.platform.create(owner, request)
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


def handler_for(platform: Platform) -> type[TaskHandler]:
    """The handler class of `platform`'s server (socketserver makes one instance a request)."""
    attributes = {"platform": platform, "timeout": platform.limits.request_timeout_s}
    return type("Handler", (TaskHandler,), attributes)


def make_platform_server(platform: Platform, host: str, port: int) -> GatedHTTPServer:
    notice = exposure_notice("the platform", host)
    if notice:
        log.warning(notice)
    return GatedHTTPServer(
        (host, port),
        handler_for(platform),
        max_connections=platform.limits.max_connections,
        head_timeout_s=platform.limits.request_timeout_s,
        screen=lambda headers: _refusal(platform, headers),
    )
