"""Folding trial records into cell rows, pivots, the gate and the run dir's files."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from pytest_gap import intervals
from pytest_gap.cell_summary import reference_counts, summarize_cell
from pytest_gap.config import parse_config
from pytest_gap.gate import Gate, evaluate_gate
from pytest_gap.outputs.done import write_flags
from pytest_gap.outputs.json import write_summary_json
from pytest_gap.outputs.videos import collate_videos
from pytest_gap.plan import plan
from pytest_gap.report import (
    CI_COLUMNS,
    REF_COLUMNS,
    TSV_COLUMNS,
    console_table,
    fold_run,
    format_tsv,
    summary_document,
)
from pytest_gap.results import TrialResult, read_result, scan_results, write_result
from tests.fake_session import GIVE_UP, write_workflow

ROOT = Path(__file__).resolve().parent.parent
PICK_PLACE = str(ROOT / "examples/workflows/pick_place")


def _cells(task_ids=(0, 1), n_seeds=2):
    config = parse_config(
        {
            "benchmark": {
                "families": ["libero", "posvar"],
                "variations": ["object", "pos_var"],
                "modes": ["workflow", "policy_only"],
                "policies": ["pi05"],
                "task_ids": list(task_ids),
                "n_seeds": n_seeds,
                "mode_overrides": {"workflow": {"workflow_dir": PICK_PLACE}},
            },
            "policies": {"pi05": {"url": "ws://h:1"}},
        },
        "grid.yaml",
        base=ROOT,
    )
    return plan(config)


def _result(trial, success=True, completion=None, error=None, infra=False, wall=2.0):
    cell = trial.cell
    return TrialResult(
        nodeid=f"grid.yaml::{trial.id}",
        config="grid.yaml",
        mode=cell.mode,
        policy_id=cell.policy_id,
        family=cell.family,
        variation=cell.variation,
        suite=cell.suite,
        task_id=trial.task_id,
        seed=trial.seed,
        success=success,
        completion=completion if completion is not None else float(success),
        reward=float(success),
        error=error,
        infra_failure=infra,
        wall_s=wall,
        produce_s=0.5,
        eval_s=1.5,
    )


def test_cell_summary_counts_scored_trials_only():
    cell = _cells()[0]
    t = cell.trials()
    results = [
        _result(t[0]),
        _result(t[1], success=False, completion=0.5),
        _result(t[2], success=False, error="worker died", infra=True),
        _result(t[3]),
    ]
    summary = summarize_cell(cell, results)
    assert (summary.n_trials, summary.n_success, summary.n_infra) == (3, 2, 1)
    assert summary.success_rate == 2 / 3
    assert summary.completion_rate == (1 + 0.5 + 1) / 3
    assert summary.error == "1 of 4 trials errored: worker died"
    assert [(r.task_id, r.n_trials, r.n_success) for r in summary.tasks] == [(0, 2, 1), (1, 1, 1)]
    assert (summary.wall_clock_s, summary.produce_s, summary.eval_s) == (8.0, 2.0, 6.0)


def test_gate_needs_a_trial_no_errored_cell_and_the_threshold():
    cells = _cells()
    ok = summarize_cell(cells[0], [_result(t) for t in cells[0].trials()])
    half = summarize_cell(
        cells[1], [_result(t, success=i % 2 == 0) for i, t in enumerate(cells[1].trials())]
    )
    errored = summarize_cell(
        cells[2], [_result(t, success=False, error="no server") for t in cells[2].trials()]
    )
    assert evaluate_gate([ok, half], 0.75).passed  # 6 of 8
    failing = evaluate_gate([ok, half], 0.8)
    assert not failing.passed
    assert failing.line() == (
        "gate FAIL: success_rate=0.750 threshold=0.800 (success rate below threshold (6/8))"
    )
    blocked = evaluate_gate([ok, errored], 0.5)
    assert not blocked.passed and "errored cells: policy_only@pi05 libero/object" in blocked.line()
    assert not evaluate_gate([], 0.0).passed
    assert evaluate_gate([ok], 0.9).line() == "gate PASS: success_rate=1.000 threshold=0.900"


def _two_thirds():
    """A cell of 36 trials over 4 tasks, 24 successes (seeds 0, 3, 6 fail): Wilson [0.503,0.798]."""
    cell = _cells(task_ids=range(4), n_seeds=9)[0]
    results = [_result(t, success=t.seed % 3 != 0) for t in cell.trials()]
    return cell, results, summarize_cell(cell, results)


def test_the_wilson_gate_passes_fails_or_is_inconclusive():
    _, _, cell = _two_thirds()
    assert (cell.success_ci_low, cell.success_ci_high) == pytest.approx((0.5033, 0.7979), abs=1e-4)
    passing = evaluate_gate([cell], 0.5, "wilson")
    assert (passing.verdict, passing.passed) == ("PASS", True)
    assert passing.line() == (
        "gate PASS: success_rate=0.667 ci95=[0.503,0.798] threshold=0.500 rule=wilson"
    )
    failing = evaluate_gate([cell], 0.85, "wilson")
    assert (failing.verdict, failing.passed) == ("FAIL", False)
    assert failing.reasons == ["interval below threshold (24/36)"]
    unsure = evaluate_gate([cell], 0.6, "wilson")
    assert (unsure.verdict, unsure.passed) == ("INCONCLUSIVE", False)
    assert unsure.to_decide == intervals.trials_to_decide(24, 36, 0.6) > 0
    assert unsure.line() == (
        "gate INCONCLUSIVE: success_rate=0.667 ci95=[0.503,0.798] threshold=0.600 rule=wilson "
        f"(interval straddles the threshold (24/36); about {unsure.to_decide} more trials at "
        "0.667 would decide it)"
    )
    # The point rule (the default) reads the same cell as it always did.
    assert evaluate_gate([cell], 0.6).verdict == "PASS"
    assert evaluate_gate([cell], 0.7).line() == (
        "gate FAIL: success_rate=0.667 threshold=0.700 (success rate below threshold (24/36))"
    )
    # An errored cell fails under either rule, whatever the interval says.
    errored = summarize_cell(
        _cells()[2], [_result(t, error="no server") for t in _cells()[2].trials()]
    )
    assert evaluate_gate([cell, errored], 0.5, "wilson").verdict == "FAIL"
    assert evaluate_gate([cell, errored], 0.6, "wilson").verdict == "FAIL"
    # A gate written before verdicts existed still reads (benchmark.py validates report JSON).
    old = evaluate_gate([cell], 0.6).model_dump()
    del old["verdict"], old["rule"]
    assert Gate.model_validate(old).verdict == "PASS"


def test_the_gate_counts_the_sessions_plan_and_names_missing_trials():
    cells = _cells()
    trials = [t for c in cells for t in c.trials()]  # 16 trials in 4 cells
    results = {t.key: _result(t) for t in trials[:3]}
    # Selected: trials 0-7; recorded: 0-2. Trial 12, recorded by an earlier session but not
    # selected now (--lf, --gap-resume), counts as planned and recorded.
    results[trials[12].key] = _result(trials[12])
    selected = {t.id for t in trials[:8]}
    summary = fold_run(cells, results, threshold=0.5, selected=selected)
    coverage = summary.gate.coverage
    assert (coverage.planned, coverage.recorded, coverage.deselected) == (9, 4, 7)
    assert coverage.missing == [t.id for t in trials[3:8]]
    assert summary.gate.verdict == "FAIL"
    assert summary.gate.line() == (
        "gate FAIL: success_rate=1.000 threshold=0.500 (5 planned trials have no record; "
        "missing: workflow::libero/object::task01::seed001, "
        "workflow::posvar/pos_var::task00::seed000, workflow::posvar/pos_var::task00::seed001, "
        "... (+2 more)); recorded 4/9 planned, 7 deselected"
    )
    complete = fold_run(cells, results, threshold=0.5, selected={t.id for t in trials[:3]})
    assert complete.gate.passed
    assert complete.gate.line().endswith("recorded 4/4 planned, 12 deselected")
    # Outside a session (no selection given) there is no coverage to check.
    assert fold_run(cells, results, threshold=0.5).gate.coverage is None


def test_intervals_in_the_terminal_pivot_and_summary_json(tmp_path):
    cell, results, row = _two_thirds()
    errored = summarize_cell(
        _cells()[2], [_result(t, error="no server") for t in _cells()[2].trials()]
    )
    table = console_table([row, errored])
    assert "0.67 [0.50,0.80] n=36" in table
    assert "policy_only@pi05  ERR" in table
    records = {t.key: r for t, r in zip(cell.trials(), results, strict=True)}
    summary = fold_run([cell], records, 0.5, "wilson")
    write_summary_json(tmp_path, summary, {})
    written = json.loads((tmp_path / "summary.json").read_text())
    assert written["success_ci_low"] == pytest.approx(0.5033, abs=1e-4)
    assert written["cells"][0]["success_ci_high"] == pytest.approx(0.7979, abs=1e-4)
    assert written["gate"]["verdict"] == "PASS" and written["gate"]["rule"] == "wilson"
    # completion: per-task means 6/9 each, so every task resample gives 2/3
    assert (written["completion_ci_low"], written["completion_ci_high"]) == pytest.approx(
        (2 / 3, 2 / 3)
    )


def test_summary_tsv_exact_format():
    cells = _cells()
    rows = [
        summarize_cell(cells[0], [_result(t, wall=1.25) for t in cells[0].trials()]),
        summarize_cell(
            cells[1],
            [_result(t, success=False, completion=0.25, wall=1.0) for t in cells[1].trials()],
        ),
        summarize_cell(cells[2], [_result(t, error="no server") for t in cells[2].trials()]),
    ]
    assert format_tsv(rows) == (
        "mode\tpolicy_id\tfamily\tvariation\tsuite_name\tsuccess_rate\tcompletion_rate\t"
        "avg_reward\tn_success\tn_trials\tn_infra\twall_clock_s\terror\t"
        "success_ci_low\tsuccess_ci_high\tcompletion_ci_low\tcompletion_ci_high\t"
        "ref_success_rate\tref_n_trials\tref_success_ci_low\tref_success_ci_high\n"
        "workflow\t\tlibero\tobject\t\t1.000\t1.000\t1.000\t4\t4\t0\t5.0\t\t"
        "0.510\t1.000\t1.000\t1.000\t1.000\t4\t0.510\t1.000\n"
        "workflow\t\tposvar\tpos_var\t\t0.000\t0.250\t0.000\t0\t4\t0\t4.0\t\t"
        "0.000\t0.490\t0.250\t0.250\t0.000\t4\t0.000\t0.490\n"
        "policy_only\tpi05\tlibero\tobject\t\t\t\t\t0\t0\t0\t8.0\t"
        "4 of 4 trials errored: no server\t\t\t\t\t\t0\t\t\n"
        "\n"
        "success_rate_pivot\tlibero/object\tposvar/pos_var\n"
        "workflow\t1.000\t0.000\n"
        "policy_only@pi05\tERR\t-\n"
        "\n"
        "completion_rate_pivot\tlibero/object\tposvar/pos_var\n"
        "workflow\t1.000\t0.250\n"
        "policy_only@pi05\tERR\t-\n"
    )


def _ref_grid():
    """Four cells: scored trials with one infrastructure failure and one config error; a cell
    whose server was down (every trial an infrastructure failure); a cell never run (config
    errors only); a clean cell of 2 successes in 4."""
    cells = _cells()
    t = cells[0].trials()
    mixed = [
        _result(t[0]),
        _result(t[1], success=False),
        _result(t[2], success=False, error="policy server timed out", infra=True),
        _result(t[3], success=False, error="no template", infra=False),
    ]
    down = [_result(x, success=False, error="down", infra=True) for x in cells[1].trials()]
    never = [_result(x, success=False, error="no template") for x in cells[2].trials()]
    clean = [_result(x, success=x.seed == 0) for x in cells[3].trials()]
    return cells, [mixed, down, never, clean]


def test_the_reference_rate_counts_infrastructure_failures_as_failures():
    """ref_success_rate is what openpi's and vla-eval's loops report: every trial run in the
    denominator, an infrastructure failure as a failure; a trial errored for another reason
    was never run and stays out. Today's rate is unchanged beside it."""
    cells, (mixed, down, never, clean) = _ref_grid()
    assert reference_counts(mixed) == (1, 3)
    row = summarize_cell(cells[0], mixed)
    assert (row.n_success, row.n_trials, row.n_infra, row.n_errored) == (1, 2, 1, 2)
    assert row.success_rate == 1 / 2
    assert row.ref_n_trials == row.n_trials + row.n_infra == 3
    assert row.ref_success_rate == 1 / 3
    assert (row.ref_success_ci_low, row.ref_success_ci_high) == intervals.wilson(1, 3)
    down_row = summarize_cell(cells[1], down)
    assert down_row.success_rate is None and down_row.success_ci_low is None
    assert (down_row.ref_success_rate, down_row.ref_n_trials) == (0.0, 4)
    assert (down_row.ref_success_ci_low, down_row.ref_success_ci_high) == intervals.wilson(0, 4)
    never_row = summarize_cell(cells[2], never)
    assert (never_row.ref_success_rate, never_row.ref_n_trials) == (None, 0)
    assert (never_row.ref_success_ci_low, never_row.ref_success_ci_high) == (None, None)
    clean_row = summarize_cell(cells[3], clean)
    assert clean_row.ref_success_rate == clean_row.success_rate == 1 / 2
    assert clean_row.ref_n_trials == clean_row.n_trials == 4


def test_the_pooled_reference_rate_is_reported_beside_the_gates():
    cells, groups = _ref_grid()
    records = {
        t.key: r
        for cell, results in zip(cells, groups, strict=True)
        for t, r in zip(cell.trials(), results, strict=True)
    }
    summary = fold_run(cells, records, threshold=0.4)
    gate = summary.gate
    # today's pooled rate: 3 successes in 6 scored trials; the reference loops': in 3+4+0+4 run
    assert (gate.n_success, gate.n_trials, gate.success_rate) == (3, 6, 0.5)
    assert (gate.ref_n_trials, gate.ref_success_rate) == (11, 3 / 11)
    assert (gate.ref_success_ci_low, gate.ref_success_ci_high) == intervals.wilson(3, 11)
    # The gate reads today's rate: 0.5 clears 0.4 (0.27 would not); the errored cells fail it.
    assert gate.reasons == [
        "errored cells: workflow libero/object, workflow posvar/pos_var, "
        "policy_only@pi05 libero/object"
    ]
    assert "ref" not in gate.line()
    document = summary_document(summary, {})
    assert (document["success_rate"], document["n_trials"]) == (0.5, 6)
    assert (document["ref_success_rate"], document["ref_n_trials"]) == (3 / 11, 11)
    assert document["ref_success_ci_low"] == gate.ref_success_ci_low
    assert document["gate"]["ref_success_rate"] == 3 / 11
    assert [c["ref_n_trials"] for c in document["cells"]] == [3, 4, 0, 4]


def test_the_reference_rate_follows_the_spec_columns_in_summary_tsv():
    cells, groups = _ref_grid()
    rows = [summarize_cell(c, r) for c, r in zip(cells, groups, strict=True)]
    lines = format_tsv(rows).splitlines()
    header = lines[0].split("\t")
    assert header == [*TSV_COLUMNS, *CI_COLUMNS, *REF_COLUMNS]  # readers by position keep working
    values = [dict(zip(header, line.split("\t"), strict=True)) for line in lines[1:5]]
    low, high = intervals.wilson(1, 3)
    assert values[0]["success_rate"] == "0.500" and values[0]["n_trials"] == "2"
    assert [values[0][k] for k in REF_COLUMNS] == ["0.333", "3", f"{low:.3f}", f"{high:.3f}"]
    assert [v["ref_success_rate"] for v in values] == ["0.333", "0.000", "", "0.500"]
    assert [v["ref_n_trials"] for v in values] == ["3", "4", "0", "4"]
    assert lines[5:9] == [  # the spec's pivot: errored cells stay ERR
        "",
        "success_rate_pivot\tlibero/object\tposvar/pos_var",
        "workflow\tERR\tERR",
        "policy_only@pi05\tERR\t0.500",
    ]


def test_the_terminal_shows_the_reference_rate_in_a_labelled_block():
    cells, groups = _ref_grid()
    rows = [summarize_cell(c, r) for c, r in zip(cells, groups, strict=True)]
    ours, ref = console_table(rows).split("\n\n")
    assert ours.startswith("success_rate ") and "ref" not in ours
    assert ours.splitlines()[2].split() == ["workflow", "ERR", "ERR"]  # errored: no rate shown
    assert ref.startswith("ref_success_rate ")
    low, high = intervals.wilson(1, 3)
    workflow, policy = ref.splitlines()[2:4]
    assert workflow.startswith("workflow ")
    assert f"0.33 [{low:.2f},{high:.2f}] n=3" in workflow and "0.00 [0.00," in workflow
    assert policy.split()[:2] == ["policy_only@pi05", "ERR"]  # no trial of it was run
    assert "n=4" in policy
    low, high = intervals.wilson(3, 11)
    assert ref.splitlines()[-1] == (
        "ref_success_rate (as openpi's and vla-eval's loops count: infrastructure failures "
        f"count as failures): pooled 0.27 [{low:.2f},{high:.2f}] n=11; the gate reads "
        "success_rate"
    )
    # No infrastructure failure: the two rates are one, and one line says so.
    clean = console_table([rows[3]])
    assert clean.splitlines()[-1] == (
        "ref_success_rate = success_rate: no trial failed on infrastructure"
    )
    assert clean.count("ref_success_rate") == 1


def test_run_outputs_are_rebuilt_from_every_result_in_the_run_dir(tmp_path):
    cells = _cells()
    trials = cells[0].trials() + cells[1].trials()
    for i, trial in enumerate(trials):
        result = _result(trial, success=i != 3)
        if i == 0:
            video = tmp_path / trial.key / "video.mp4"
            video.parent.mkdir(parents=True)
            video.write_bytes(b"mp4")
            result.video = f"{trial.key}/video.mp4"
        write_result(tmp_path / trial.key, result)
    (tmp_path / "junk").mkdir()
    (tmp_path / "junk/result.json").write_text("{not json")
    assert read_result(tmp_path / "junk").problem
    results = scan_results(tmp_path)
    assert len(results) == 8
    summary = fold_run(cells, results, threshold=0.8)
    write_summary_json(tmp_path, summary, {"x": 1})
    collate_videos(tmp_path, list(results.values()))
    write_flags(tmp_path, summary)
    summaries, gate = summary.cells, summary.gate
    assert [s.key for s in summaries] == ["workflow/libero/object", "workflow/posvar/pos_var"]
    assert gate.passed and gate.n_trials == 8 and gate.n_success == 7
    summary = json.loads((tmp_path / "summary.json").read_text())
    assert summary["grid"] == {"x": 1}
    assert summary["matrix"]["success_rate"]["workflow"]["libero/object"] == 0.75
    assert summary["cells"][0]["tasks"][1]["n_success"] == 1
    assert (tmp_path / "workflow/posvar/pos_var/cell_result.json").is_file()
    # the workflow mode is complete, the policy_only cells have no records: no run-level flag
    assert (tmp_path / "workflow/aaa_done_flag.txt").is_file()
    assert not (tmp_path / "aaa_done_flag.txt").exists()
    video = tmp_path / "videos/workflow__libero__object__task00__seed000__pass.mp4"
    assert video.read_bytes() == b"mp4"
    assert video.stat().st_ino == (tmp_path / trials[0].key / "video.mp4").stat().st_ino


pytest_plugins = ["pytester"]

# A user's conftest with options of its own, as plugins (an LLM or hub client) add them.
SECRET_OPTIONS = """
def pytest_addoption(parser):
    parser.addoption("--api-key")
    parser.addoption("--token")
    parser.addoption("--header", action="append", default=[])
"""


def test_the_manifest_and_summary_mask_keys_given_on_the_command_line(pytester):
    import yaml

    pytester.makeconftest(SECRET_OPTIONS)
    give_up = write_workflow(pytester.path / "give_up", GIVE_UP)
    tests = str(Path(__file__).resolve().parent)  # the fake backend: no simulator needed here
    path = os.pathsep.join(p for p in (tests, os.environ.get("PYTHONPATH")) if p)
    pytester._monkeypatch.setenv("PYTHONPATH", path)
    config = {
        "benchmark": {
            "backend": "fake_backend:FakeBackend",
            "families": ["fake"],
            "variations": ["easy"],
            "modes": ["workflow"],
            "task_ids": [0],
            "n_seeds": 1,
            "output_dir": "runs",
            "mode_overrides": {"workflow": {"workflow_dir": str(give_up)}},
        },
        "policies": {  # registered, not used: echoed in summary.json's grid
            "remote": {"url": "ws://gap:sk-live-url@127.0.0.1:9"},
            "local": {
                "command": "serve --hf-token sk-live-cmd --port {port}",
                "env": {"HF_TOKEN": "sk-live-env", "CUDA_VISIBLE_DEVICES": "0"},
            },
        },
    }
    (pytester.path / "grid.yaml").write_text(yaml.safe_dump(config))
    result = pytester.runpytest_subprocess(
        "grid.yaml",
        "--api-key",
        "sk-live-1",
        "--token=sk-live-2",
        "--header",
        "Authorization: Bearer sk-live-3",
        "-o",
        "OPENAI_API_KEY=sk-live-4",
        "--gap-no-gate",
        timeout=300,
    )
    assert result.ret == 1, result.stdout.str()  # the trial failed; the session wrote its files
    (run_dir,) = (pytester.path / "runs").iterdir()
    (session,) = json.loads((run_dir / "run_manifest.json").read_text())["sessions"]
    assert session["argv"][-9:] == [
        "grid.yaml",
        "--api-key",
        "***",
        "--token=***",
        "--header",
        "Authorization: Bearer ***",
        "-o",
        "OPENAI_API_KEY=***",
        "--gap-no-gate",
    ]
    grid = json.loads((run_dir / "summary.json").read_text())["grid"]
    assert grid["policies"]["remote"]["url"] == "ws://gap:***@127.0.0.1:9"
    assert grid["policies"]["local"]["command"] == "serve --hf-token *** --port {port}"
    assert grid["policies"]["local"]["env"] == {"HF_TOKEN": "***", "CUDA_VISIBLE_DEVICES": "0"}
    for path in run_dir.rglob("*"):
        if path.is_file() and path.suffix in (".json", ".tsv", ".txt"):
            assert "sk-live" not in path.read_text(), path


def test_redaction_keeps_names_and_ordinary_arguments():
    from pytest_gap.redaction import redact_argv, redact_text

    argv = ["-k", "posvar and key", "--keyword", "x", "--gap-output-dir=/tmp/token-runs"]
    assert redact_argv(argv) == argv
    assert redact_argv(["--hf-token", "--verbose", "HF_TOKEN=abc", "-H", "Api-Key abc"]) == [
        "--hf-token",
        "--verbose",
        "HF_TOKEN=***",
        "-H",
        "Api-Key ***",
    ]
    assert redact_text("https://h/v1?api_key=abc&model=m") == "https://h/v1?api_key=***&model=m"


def test_a_records_identity_is_its_trials_and_names_its_video():
    from pytest_gap.outputs.videos import video_name
    from pytest_gap.results import TrialIdentity

    trial = _cells()[2].trials()[3]  # policy_only@pi05 libero/object task 1 seed 1
    identity = TrialIdentity.of(trial, nodeid=f"grid.yaml::{trial.id}", config="grid.yaml")
    record = _result(trial, success=False)
    assert record.identity == identity
    assert identity.slug == "policy_only__pi05__libero__object__task01__seed001"
    assert video_name(record) == "policy_only__pi05__libero__object__task01__seed001__fail.mp4"
