"""`gap viz RUN_DIR --serve`: the report on loopback for runs too big to inline. The page is
built without traces; each trial's trace is read when its page asks (`api/trace?key=`), and
videos, frame strips and perception images are served from the run dir as files.

What it serves is an allow-list built from the run's records when it starts: the page, the
trace endpoint, and the files the page links (each trial's video and frame strip, its trace's
images), each confined to the run dir. Anything else (a directory, result.json, a `..` path, a
symlink out of the run dir) answers 404: a run dir may hold prompts, configs and traces not
meant to leave, and a page on another site must not read them through the user's browser, so a
`Host` other than this server's own names is refused too (DNS rebinding).
"""

from __future__ import annotations

import contextlib
import mimetypes
import shutil
from http import HTTPStatus
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from urllib.parse import parse_qs, unquote, urlsplit

from pytest_gap.viz.files import inside, relative
from pytest_gap.viz.html import compare_json, render
from pytest_gap.viz.model import Report, load_report
from pytest_gap.viz.trace import read_trace, trace_images

HOST = "127.0.0.1"  # loopback only: a run dir may hold prompts and traces not meant to leave
PAGE_PATHS = frozenset({"/", "/index.html", "/report.html"})
TRACE_PATH = "/api/trace"
REQUEST_TIMEOUT_S = 30.0  # a connection that sends nothing does not hold a thread for ever


def linked_files(report: Report, root: Path) -> dict[str, Path]:
    """URL path -> file, for every file the page links: each trial's video and frame strip and
    the perception images of its trace. The report's paths are already confined to `root`
    (files.confined); this is the whole of what the server hands out besides the page."""
    files: dict[str, Path] = {}
    for trial in report.trials:
        for link in (trial.video, trial.frames):
            if link:
                files["/" + link] = root / link
        if trial.trace:
            for paths in trace_images(root / trial.trace).values():
                for path in paths:
                    files["/" + (relative(path, root) or "")] = path
    return files


class _Handler(BaseHTTPRequestHandler):
    report: Report
    page: bytes
    root: Path
    files: dict[str, Path]
    hosts: frozenset[str]  # the Host values that name this server
    timeout = REQUEST_TIMEOUT_S

    def do_GET(self) -> None:
        host = self.headers.get("Host", "")
        if host not in self.hosts:
            mine = sorted(self.hosts)[0]
            return self._refuse(
                HTTPStatus.FORBIDDEN,
                f"Host {host!r} is not this server; open http://{mine}/ (gap viz answers only "
                "its own loopback names)",
            )
        url = urlsplit(self.path)
        path = unquote(url.path)
        if path in PAGE_PATHS:
            return self._send(self.page, "text/html; charset=utf-8")
        if path == TRACE_PATH:
            return self._trace(parse_qs(url.query).get("key", [""])[0])
        return self._file(path)

    def _trace(self, key: str) -> None:
        trial = next((t for t in self.report.trials if t.key == key), None)
        found = trial.trace if trial else None  # only a trial of this run: no path tricks
        trace = read_trace(self.root / found, self.root) if found else None
        if trace is None:
            return self._refuse(HTTPStatus.NOT_FOUND, f"no trace for trial {key!r}")
        self._send(trace.model_dump_json().encode(), "application/json")

    def _file(self, path: str) -> None:
        file = self.files.get(path)
        # checked again now: a link swapped in after the server started points nowhere new
        if file is None or not inside(file, self.root) or not file.is_file():
            return self._refuse(
                HTTPStatus.NOT_FOUND,
                f"{path[:200]!r} is not a file this report links (gap viz serves the page and "
                "its videos, frame strips and images only)",
            )
        kind = mimetypes.guess_type(file.name)[0] or "application/octet-stream"
        with open(file, "rb") as source:
            size = source.seek(0, 2)
            source.seek(0)
            self._head(HTTPStatus.OK, kind, size)
            with contextlib.suppress(ConnectionError):  # a video the browser stopped loading
                shutil.copyfileobj(source, self.wfile)

    def _head(self, status: HTTPStatus, kind: str, size: int) -> None:
        self.send_response(status)
        self.send_header("Content-Type", kind)
        self.send_header("Content-Length", str(size))
        self.send_header("X-Content-Type-Options", "nosniff")
        self.end_headers()

    def _send(self, body: bytes, kind: str) -> None:
        self._head(HTTPStatus.OK, kind, len(body))
        self.wfile.write(body)

    def _refuse(self, status: HTTPStatus, line: str) -> None:
        body = (line.replace("\n", " ") + "\n").encode()
        self._head(status, "text/plain; charset=utf-8", len(body))
        self.wfile.write(body)

    def log_message(self, format: str, *args) -> None:
        pass  # one line per video request drowns the URL the user needs


def make_server(run_dir: Path, port: int = 0, against: Path | None = None) -> ThreadingHTTPServer:
    """A server for `run_dir` on loopback (port 0: any free port); call serve_forever()."""
    root = run_dir.resolve()
    report = load_report(root, root, inline_budget=0, serve=True)
    if against is not None:
        report.compare = compare_json(against, run_dir)
    server = ThreadingHTTPServer((HOST, port), _Handler)
    bound = server.server_address[1]
    server.RequestHandlerClass = type(
        "GapVizHandler",
        (_Handler,),
        {
            "report": report,
            "page": render(report).encode(),
            "root": root,
            "files": linked_files(report, root),
            "hosts": frozenset({f"{HOST}:{bound}", f"localhost:{bound}"}),
        },
    )
    return server


__all__ = ["make_server"]
