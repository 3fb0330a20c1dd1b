"""`gap viz RUN_DIR --serve`: the report on loopback for runs too big to inline. The page is
built without traces; each trial's trace is read when its page asks (`api/trace?key=`), and
videos and images are served from the run dir as files."""

from __future__ import annotations

from functools import partial
from http import HTTPStatus
from http.server import SimpleHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from urllib.parse import parse_qs, urlsplit

from pytest_gap.viz.html import render
from pytest_gap.viz.model import Report, load_report, read_trace

HOST = "127.0.0.1"  # loopback only: a run dir may hold prompts and traces not meant to leave


class _Handler(SimpleHTTPRequestHandler):
    report: Report
    page: bytes
    root: Path

    def do_GET(self) -> None:
        url = urlsplit(self.path)
        if url.path in ("/", "/index.html", "/report.html"):
            return self._send(self.page, "text/html; charset=utf-8")
        if url.path == "/api/trace":
            key = parse_qs(url.query).get("key", [""])[0]
            trial = next((t for t in self.report.trials if t.key == key), None)
            found = trial.trace if trial else None  # only a trial of this run: no path tricks
            trace = read_trace(self.root / found, self.root) if found else None
            if trace is None:
                return self.send_error(HTTPStatus.NOT_FOUND, f"no trace for trial {key!r}")
            return self._send(trace.model_dump_json().encode(), "application/json")
        return super().do_GET()

    def _send(self, body: bytes, kind: str) -> None:
        self.send_response(HTTPStatus.OK)
        self.send_header("Content-Type", kind)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, format: str, *args) -> None:
        pass  # one line per video range request drowns the URL the user needs


def make_server(run_dir: Path, port: int = 0, against: Path | None = None) -> ThreadingHTTPServer:
    """A server for `run_dir` on loopback (port 0: any free port); call serve_forever()."""
    from pytest_gap.viz.html import compare_json

    root = run_dir.resolve()
    report = load_report(root, root, inline_budget=0, serve=True)
    if against is not None:
        report.compare = compare_json(against, run_dir)
    handler = type(
        "GapVizHandler",
        (_Handler,),
        {"report": report, "page": render(report).encode(), "root": root},
    )
    return ThreadingHTTPServer((HOST, port), partial(handler, directory=str(root)))


__all__ = ["make_server"]
