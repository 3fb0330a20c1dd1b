"""One self-contained HTML file for a run dir: the page's script and style inline, the report's
data as one JSON block; videos, frame strips and perception images are linked relative to the
file, so nothing is fetched from the network when it is opened."""

from __future__ import annotations

from importlib import resources
from pathlib import Path

from pytest_gap.compare import CompareRefused, compare, load_run
from pytest_gap.viz.model import Report, load_report

REPORT_FILE = "report.html"
# Traces inlined into one file, failed trials first (about 30-80 kB each): beyond this the
# page says to open the run with `--serve`, which loads them one at a time.
INLINE_BUDGET = 40_000_000

PAGE = """<!doctype html>
<html lang="en"><head><meta charset="utf-8">
<meta name="viewport" content="width=device-width, initial-scale=1">
<link rel="icon" href="data:,">
<title>gap viz: {title}</title>
<style>{css}</style></head>
<body>
<header><h1>gap viz</h1><span id="title"></span>
<a href="#/">overview</a><a id="nav-compare" href="#/compare" hidden>compare</a></header>
<main id="main"></main>
<script id="gap-data" type="application/json">{data}</script>
<script>{js}</script>
</body></html>
"""


def _static(name: str) -> str:
    return resources.files("pytest_gap.viz").joinpath("static", name).read_text()


def _script_safe(text: str) -> str:
    """JSON that cannot end the <script> element it sits in (a prompt may hold `</script>`)."""
    return text.replace("<", "\\u003c").replace(">", "\\u003e").replace("&", "\\u0026")


def render(report: Report) -> str:
    from html import escape

    return PAGE.format(
        title=escape(report.title),
        css=_static("report.css"),
        js=_static("report.js"),
        data=_script_safe(report.model_dump_json()),
    )


def compare_json(run_a: Path, run_b: Path) -> dict:
    """`gap compare RUN_A RUN_B --json` as a dict: the comparison, or its refusal reasons."""
    try:
        return compare(load_run(run_a), load_run(run_b), None, None).to_json()
    except CompareRefused as exc:
        return {"refused": exc.reasons, "exit_code": 2}


def write_report(
    run_dir: Path,
    out: Path | None = None,
    *,
    against: Path | None = None,
    inline_budget: int = INLINE_BUDGET,
) -> Path:
    """Write the report of `run_dir` (compared with the earlier run `against`, if given) to
    `out` (default: report.html in the run dir) and return its path."""
    out = (out or run_dir / REPORT_FILE).resolve()
    out.parent.mkdir(parents=True, exist_ok=True)
    report = load_report(run_dir.resolve(), out.parent, inline_budget=inline_budget)
    if against is not None:
        report.compare = compare_json(against, run_dir)
    out.write_text(render(report))
    return out
