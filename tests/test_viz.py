"""`gap viz`, the run dir's plots/ and the session's progress lines, over real sessions on the
fake backend (tests/fake_session.py): what the report holds, the files it links, the server,
the comparison, and every input a user can get wrong. The page in a real browser is
tests/test_viz_browser.py."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import sys
import threading
import urllib.error
import urllib.request
from pathlib import Path

import pytest

from pytest_gap.cli import main
from pytest_gap.progress import Progress
from pytest_gap.results import TrialResult
from pytest_gap.viz.html import render
from pytest_gap.viz.model import load_report, outcome
from pytest_gap.viz.serve import make_server
from pytest_gap.viz.trace import layered_layout
from tests.fake_session import BACKEND, IDLE_THEN_CHECK, FakeSession

pytest_plugins = ["pytester"]

WF_NODES = len(IDLE_THEN_CHECK["nodes"])
GAP = shutil.which("gap", path=str(Path(sys.executable).parent)) or "gap"


@pytest.fixture
def fake(pytester) -> FakeSession:
    return FakeSession(pytester)


def _mixed_run(fake: FakeSession, *args: str, seeds=(0, 1, 2), output: str = "runs"):
    """fake_easy fails seed 0 (s % 3 == 0) and succeeds 1 and 2; fake_hard never succeeds."""
    fake.config(
        {
            "backend": BACKEND,
            "trials": {"output_dir": output},
            "suites": [
                {
                    "suite_name": "fake_easy",
                    "task_ids": [0, 1],
                    "seeds": list(seeds),
                    "workflow_dir": "wf",
                },
                {
                    "suite_name": "fake_hard",
                    "task_ids": [0],
                    "seeds": [max(seeds)],
                    "workflow_dir": "wf",
                },
            ],
            "gate_threshold": 0.0,
        }
    )
    return fake.run_inprocess("bench.yaml", *args)


# -- pure parts ----------------------------------------------------------------------------------
def test_layers_follow_the_fewest_edges_from_the_start_and_loops_do_not_stretch_them():
    nodes = ["start", "act", "route", "done", "orphan"]
    edges = [("start", "act"), ("act", "route"), ("route", "act"), ("route", "done")]
    places = layered_layout(nodes, edges)
    assert {n: layer for n, (layer, _) in places.items()} == {
        "start": 0,
        "act": 1,
        "route": 2,
        "done": 3,
        "orphan": 4,  # no edge reaches it: a layer of its own, below the rest
    }
    assert layered_layout([], []) == {}


def _record(**fields) -> TrialResult:
    base = {
        "nodeid": "b.yaml::x",
        "config": "b.yaml",
        "mode": "workflow",
        "family": "f",
        "variation": "v",
        "suite": "s",
        "task_id": 0,
        "seed": 0,
    }
    return TrialResult(**{**base, **fields})


def test_each_record_falls_under_one_filter():
    assert outcome(_record(success=True)) == "success"
    assert outcome(_record(success=False)) == "failed"
    assert outcome(_record(error="no workflow", exit_code=1)) == "errored"
    assert outcome(_record(error="server gone", infra_failure=True, exit_code=1)) == "infra"
    assert outcome(_record(error="watchdog", infra_failure=True, exit_code=124)) == "timeout"


def test_progress_eta_is_the_median_trial_time_over_the_parallel_trials():
    progress = Progress(name="b.yaml", total=10, started=0.0, parallel=2)
    assert progress.eta() is None
    for wall in (10.0, 30.0, 20.0):
        progress.record(_record(success=True, wall_s=wall), replayed=False)
    progress.record(_record(error="x", exit_code=1, wall_s=500.0), replayed=True)
    assert (progress.done, progress.succeeded, progress.errored) == (4, 3, 1)
    assert progress.eta() == 20.0 * 6 / 2  # replayed records do not count towards the median
    assert progress.line(now=125.0) == (
        "b.yaml: 4/10 trials, 3 succeeded (0.75), 1 errored, 2m05s elapsed, ETA 1m00s"
    )


# -- the report of a real session ----------------------------------------------------------------
def test_the_report_holds_every_cell_and_trial_with_their_traces(fake):
    assert _mixed_run(fake).ret == 0
    run_dir = fake.run_dir()
    report = load_report(run_dir, run_dir, inline_budget=10_000_000)
    summary = json.loads((run_dir / "summary.json").read_text())
    assert [c.key for c in report.cells] == [c["key"] for c in summary["cells"]]
    assert report.overview.rows == ["workflow"] and report.overview.verdict == "PASS"
    assert report.overview.coverage == "recorded 7/7 planned"
    by_key = {t.key: t for t in report.trials}
    assert len(by_key) == 7
    assert by_key["suites/fake_easy/task_00/seed_000"].outcome == "failed"
    assert by_key["suites/fake_easy/task_01/seed_002"].outcome == "success"
    assert by_key["suites/fake_hard/task_00/seed_002"].outcome == "failed"
    easy = next(c for c in report.cells if c.key == "suites/fake_easy")
    assert [(t.task_id, t.n_success, t.n_trials) for t in easy.tasks] == [(0, 2, 3), (1, 2, 3)]
    assert easy.tasks[0].ci_low < 2 / 3 < easy.tasks[0].ci_high
    # every trace inlined: the graph as the workflow has it, and what the trial took
    assert set(report.traces) == set(by_key)
    trace = report.traces["suites/fake_easy/task_00/seed_000"]
    assert len(trace.nodes) == WF_NODES
    taken = {(e.source, e.target): e.taken for e in trace.edges}
    assert taken[("idle", "check")] == 1 and taken[("route", "failed")] == 1
    assert taken[("route", "ok")] == 0
    idle = next(n for n in trace.nodes if n.id == "idle")
    assert idle.runs[0].inputs == {"steps": 4} and idle.runs[0].outputs == {"steps": 4}


def test_a_small_budget_inlines_the_failed_trials_first(fake):
    assert _mixed_run(fake).ret == 0
    run_dir = fake.run_dir()
    full = load_report(run_dir, run_dir, inline_budget=10_000_000)
    one = max(len(t.model_dump_json()) for t in full.traces.values())
    failed = {t.key for t in full.trials if t.outcome == "failed"}
    report = load_report(run_dir, run_dir, inline_budget=one * len(failed))
    assert set(report.traces) == failed


def test_gap_viz_writes_one_self_contained_file_and_prints_its_path(fake, capsys):
    assert _mixed_run(fake).ret == 0
    run_dir = fake.run_dir()
    capsys.readouterr()  # the session's own output
    assert main(["viz", str(run_dir)]) == 0
    path = Path(capsys.readouterr().out.strip())
    assert path == (run_dir / "report.html").resolve()
    page = path.read_text()
    assert not re.search(r"""(src|href)=["']?(https?:)?//""", page)  # nothing from the network
    data = json.loads(re.search(r'id="gap-data" type="application/json">(.*?)</script>', page)[1])
    assert len(data["trials"]) == 7 and len(data["cells"]) == 2

    elsewhere = fake.path / "out" / "r.html"
    assert main(["viz", str(run_dir), "--out", str(elsewhere)]) == 0
    moved = json.loads(
        re.search(r'type="application/json">(.*?)</script>', elsewhere.read_text())[1]
    )
    trace_dirs = [t["trace"] for t in moved["trials"]]
    assert all(t.startswith("../runs/") for t in trace_dirs)  # still found from there
    assert all((elsewhere.parent / t / "dag_trace.json").is_file() for t in trace_dirs)


def test_user_text_cannot_break_out_of_the_page(fake):
    assert _mixed_run(fake).ret == 0
    run_dir = fake.run_dir()
    report = load_report(run_dir, run_dir, inline_budget=0)
    report.trials[0].reason = "</script><script>alert('x')</script>"
    page = render(report)
    assert page.count("<script") == 2  # the data block and the page's own script
    data = re.search(r'type="application/json">(.*?)</script>', page)[1]
    assert json.loads(data)["trials"][0]["reason"] == report.trials[0].reason


def test_gap_viz_refuses_what_is_not_one_run_dir(fake, capsys):
    assert main(["viz", str(fake.path / "nowhere")]) == 2
    assert "nowhere: not a directory; give a run dir" in capsys.readouterr().err
    assert _mixed_run(fake).ret == 0
    capsys.readouterr()
    assert main(["viz", str(fake.path / "runs")]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("gap: error: ") and "an output dir holding run dirs" in err
    assert str(fake.run_dir()) in err and len(err.splitlines()) == 1
    empty = fake.path / "empty"
    empty.mkdir()
    assert main(["viz", str(empty)]) == 2
    assert "no trial records" in capsys.readouterr().err
    run = str(fake.run_dir())
    assert main(["viz", run, run, run]) == 2
    assert "give one run dir, or two to compare, not 3" in capsys.readouterr().err


def _viz(*args: str) -> dict:
    """`gap viz ...` as a user runs it (a process of its own: the comparison's scipy stays out
    of this one, where it made a later MuJoCo render in the same test process crash), and the
    data its report holds."""
    done = subprocess.run(
        [GAP, "viz", *args], capture_output=True, text=True, timeout=120, check=True
    )
    page = Path(done.stdout.strip()).read_text()
    return json.loads(re.search(r'type="application/json">(.*?)</script>', page)[1])


def test_two_runs_give_the_comparison_or_why_there_is_none(fake):
    assert _mixed_run(fake, output="a").ret == 0
    assert _mixed_run(fake, output="b").ret == 0
    run_a, run_b = fake.run_dir("a"), fake.run_dir("b")
    compare = _viz(str(run_a), str(run_b))["compare"]
    assert compare["exit_code"] == 0 and compare["pooled"]["n_pairs"] == 7
    assert compare["pooled"]["diff"] == 0.0  # the fake is deterministic: same episodes, same ends

    assert _mixed_run(fake, seeds=(5,), output="c").ret == 0  # no trial of c pairs with a's
    refused = _viz(str(run_a), str(fake.run_dir("c")))["compare"]
    assert refused["exit_code"] == 2 and refused["refused"]


def test_the_server_serves_the_page_and_traces_on_demand_but_no_file_it_does_not_link(fake):
    assert _mixed_run(fake).ret == 0
    run_dir = fake.run_dir()
    server = make_server(run_dir)
    host, port = server.server_address[:2]
    assert host == "127.0.0.1"  # loopback only
    threading.Thread(target=server.serve_forever, daemon=True).start()
    base = f"http://{host}:{port}/"
    try:
        page = urllib.request.urlopen(base).read().decode()
        data = json.loads(re.search(r'type="application/json">(.*?)</script>', page)[1])
        assert data["serve"] is True and data["traces"] == {}  # nothing inlined: fetched
        key = "suites/fake_easy/task_00/seed_000"
        trace = json.loads(urllib.request.urlopen(f"{base}api/trace?key={key}").read())
        assert len(trace["nodes"]) == WF_NODES
        with pytest.raises(urllib.error.HTTPError) as missing:
            urllib.request.urlopen(f"{base}api/trace?key=../../etc")
        assert missing.value.code == 404
        with pytest.raises(urllib.error.HTTPError) as unlinked:  # the page does not link it
            urllib.request.urlopen(f"{base}{key}/result.json")
        assert unlinked.value.code == 404
    finally:
        server.shutdown()
        server.server_close()


# -- plots and progress ----------------------------------------------------------------------
def test_the_session_draws_plots_unless_told_not_to(fake, monkeypatch):
    monkeypatch.delenv("GAP_NO_PLOTS")  # tests/conftest.py turns them off for other tests
    assert _mixed_run(fake).ret == 0
    plots = fake.run_dir() / "plots"
    assert sorted(p.name for p in plots.iterdir()) == ["bars_suites.png", "success.png"]
    for png in plots.iterdir():
        assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and png.stat().st_size > 5_000

    assert _mixed_run(fake, "--gap-no-plots", output="quiet").ret == 0
    assert not (fake.run_dir("quiet") / "plots").exists()
    fake.setenv(GAP_NO_PLOTS="1")  # the environment's form of --gap-no-plots
    assert _mixed_run(fake, output="env").ret == 0
    assert not (fake.run_dir("env") / "plots").exists()


def test_progress_lines_while_it_runs_and_in_the_summary_but_not_under_q(fake):
    result = _mixed_run(fake, "--gap-progress")
    out = result.stdout.str()
    lines = [x for x in out.splitlines() if x.startswith("gap progress bench.yaml: ")]
    assert [x.split(": ")[1].split(" trials")[0] for x in lines] == [f"{i}/7" for i in range(1, 8)]
    assert re.search(r"ETA \d+s$", lines[0]) and lines[-1].endswith("ETA 0s")
    done = r"^progress: bench.yaml: 7/7 trials, 4 succeeded \(0\.57\), 0 errored"
    assert re.search(done, out, re.M), out

    quiet = _mixed_run(fake, "-q", output="q").stdout.str()
    assert "gap progress" not in quiet and "progress:" not in quiet and "gate PASS" in quiet
