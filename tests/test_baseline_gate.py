"""The regression gate against a baseline run (issue 35 part 4; pytest_gap/baseline.py): the
paired statistics on counts with known answers, the fold over constructed records, the
refusals before any trial, and whole sessions on the fake backend through pytest, `gap
benchmark` and the API."""

from __future__ import annotations

import json
import math
import shutil
import subprocess
import sys
from itertools import product
from pathlib import Path

import pytest
from scipy.stats import multinomial, norm

from pytest_gap import benchmark
from pytest_gap.baseline import (
    Baseline,
    cell_states,
    load_baseline,
    look_at,
    outcome,
    start_problems,
)
from pytest_gap.compare.noninferiority import log_e_within, log_e_worse, tango_p
from pytest_gap.compare.pairing import RunDir, load_run
from pytest_gap.config import ConfigError, parse_config
from pytest_gap.config.model import BaselineGate
from pytest_gap.errors import GapError
from pytest_gap.outputs.parquet import write_episodes
from pytest_gap.plan import plan
from pytest_gap.report import fold_run
from tests.fake_session import BACKEND, CHECK_TAIL, FakeSession, workflow
from tests.stat_references import tango_p_by_likelihood
from tests.test_report import ROOT, _result
from tests.test_sequential import _sequential_config

GAP = str(Path(sys.executable).with_name("gap"))
pytest_plugins = ["pytester"]


# -- the statistics -------------------------------------------------------------------------------
@pytest.mark.parametrize(("a_only", "b_only", "n"), [(7, 2, 30), (0, 5, 12), (3, 3, 40)])
def test_tango_with_no_margin_is_mcnemars_z_test(a_only, b_only, n):
    z = (b_only - a_only) / math.sqrt(a_only + b_only)
    assert tango_p(a_only, b_only, n, 0.0) == pytest.approx(norm.cdf(z))


def test_tango_reads_the_margin_one_sided():
    # a difference of exactly -margin over many pairs is the null's boundary: p near 1/2
    assert tango_p(50, 0, 1000, 0.05) == pytest.approx(0.5, abs=0.02)
    # worse than the margin: small p; within it or better: large
    assert tango_p(30, 0, 100, 0.05) < 0.001
    assert tango_p(2, 2, 100, 0.05) > 0.95
    assert tango_p(0, 0, 0, 0.05) == 1.0 and tango_p(0, 0, 10, 0.0) == 1.0
    # more pairs where only the baseline succeeded: stronger evidence of a regression
    ps = [tango_p(k, 1, 60, 0.05) for k in range(1, 20)]
    assert ps == sorted(ps, reverse=True)


@pytest.mark.parametrize("counts", [(2, 2, 100, 0.05), (7, 3, 50, 0.1), (5, 9, 60, 0.2)])
def test_tangos_closed_form_is_the_constrained_likelihoods_maximum(counts):
    """The score test's variance uses the discordant rates that maximise the likelihood under
    the null's boundary; the closed-form root equals a numerical maximisation."""
    assert tango_p(*counts) == pytest.approx(tango_p_by_likelihood(*counts), rel=1e-6)


def _expected_e(log_e, n: int, p_a_only: float, p_b_only: float, margin: float) -> float:
    """E[e-value] over every split of n pairs, exactly (multinomial enumeration)."""
    total = 0.0
    for a, b in product(range(n + 1), repeat=2):
        if a + b <= n:
            prob = multinomial.pmf(
                [a, b, n - a - b], n, [p_a_only, p_b_only, 1 - p_a_only - p_b_only]
            )
            total += prob * math.exp(log_e(a, b, n, margin))
    return total


@pytest.mark.parametrize(("margin", "p_b_only"), [(0.0, 0.2), (0.05, 0.1), (0.1, 0.3)])
def test_both_e_values_have_expectation_at_most_one_under_their_null(margin, p_b_only):
    """What makes them e-values: at the null's boundary (B worse by exactly the margin) each
    has expectation exactly 1, and inside its null less."""
    n = 12
    at_boundary = (p_b_only + margin, p_b_only)  # P(A only) - P(B only) = margin
    assert _expected_e(log_e_worse, n, *at_boundary, margin) == pytest.approx(1.0)
    assert _expected_e(log_e_within, n, *at_boundary, margin) == pytest.approx(1.0)
    better = (p_b_only / 2, p_b_only)  # inside the null of "worse"
    worse = (p_b_only + margin + 0.1, p_b_only)  # inside the null of "within"
    assert _expected_e(log_e_worse, n, *better, margin) < 1.0
    assert _expected_e(log_e_within, n, *worse, margin) < 1.0


def test_a_look_fails_at_2_over_alpha_passes_at_1_over_alpha_and_tests_the_last_look_too():
    """Half the level for the e-value at every look, half for Tango's test at the last."""
    alpha, margin = 0.05, 0.05
    needed = next(k for k in range(1, 60) if log_e_worse(k, 0, k, margin) >= math.log(2 / alpha))
    assert log_e_worse(needed - 1, 0, needed - 1, margin) < math.log(2 / alpha)
    assert look_at(needed, 0, needed, margin, alpha, last=False)[0] == "FAIL"
    assert look_at(needed - 1, 0, needed - 1, margin, alpha, last=False)[0] == "UNDECIDED"
    # a regression the e-value has not seen by the last look: Tango's test at alpha / 2
    a_only, b_only, n = 40, 10, 300
    assert log_e_worse(a_only, b_only, n, margin) < math.log(2 / alpha)
    verdict, _, _, p = look_at(a_only, b_only, n, margin, alpha, last=True)
    assert p == tango_p(a_only, b_only, n, margin) < alpha / 2 and verdict == "FAIL"
    assert look_at(a_only, b_only, n, margin, alpha, last=False)[0] == "UNDECIDED"
    # agreement: PASS early once the other e-value reaches 1 / alpha
    agree = next(n for n in range(1, 400) if log_e_within(0, 0, n, margin) >= math.log(1 / alpha))
    assert look_at(0, 0, agree, margin, alpha, last=False)[0] == "PASS"


def test_the_e_values_grow_with_the_evidence_they_test():
    assert log_e_worse(0, 0, 0, 0.05) == 0.0 == log_e_within(0, 0, 0, 0.05)
    assert log_e_worse(10, 0, 10, 0.05) > math.log(20) > log_e_worse(3, 0, 10, 0.05)
    assert log_e_within(0, 0, 200, 0.05) > math.log(20)  # agreement is evidence of no regression
    assert log_e_within(0, 0, 200, 0.0) == pytest.approx(0.0)  # not without a margin


# -- the fold over constructed records ------------------------------------------------------------
def _grid(**gate) -> dict:
    """test_sequential's grid (2 cells x 2 tasks x 20 seeds), gated against a baseline."""
    config = _sequential_config()
    for key in ("gate_threshold", "gate_rule", "sequential"):
        del config["benchmark"][key]
    return {**config, "gate": {"baseline": "base_run", **gate}}


def _baseline(cells, success, **gate) -> Baseline:
    records = {t.key: _result(t, success=success(t)) for c in cells for t in c.trials()}
    settings = BaselineGate(baseline=Path("base_run"), **gate)
    rows = {c.row: c.row for c in cells}
    return Baseline(
        path="base_run", run=RunDir(path="base_run", results=records), settings=settings, rows=rows
    )


def _labels(cells):
    return {c.key: f"{c.row} {c.column}" for c in cells}


def test_a_regressed_cell_fails_early_and_its_other_trials_are_not_needed():
    """The baseline succeeded everywhere. Cell 1 now fails everywhere: FAIL after its first
    blocks, the rest not needed. Cell 2 succeeds as the baseline did, then its plan is spent
    undecided (40 agreeing pairs are not enough evidence at margin 0.05): not shown worse."""
    cells = plan(parse_config(_grid(block_seeds=2), "grid.yaml", base=ROOT))
    assert all(c.block_seeds == 2 for c in cells)
    baseline = _baseline(cells, lambda t: True, block_seeds=2)
    results = {}
    for block in cells[0].blocks():
        results |= {t.key: _result(t, success=False) for t in block}
        if cell_states(cells, results, baseline)[cells[0].key].decided:
            break
    state = cell_states(cells, results, baseline)[cells[0].key]
    assert state.verdict == "FAIL" and state.stopped and state.n == len(results) < 40
    assert (state.a_only, state.b_only, state.baseline_success, state.success) == (
        state.n,
        0,
        state.n,
        0,
    )
    results |= {t.key: _result(t, success=True) for t in cells[1].trials()}
    selected = {t.id for c in cells for t in c.trials()}
    summary = fold_run(cells, results, 0.9, "point", selected=selected, baseline=baseline)
    gate = summary.gate
    assert gate.verdict == "FAIL" and gate.rule == "baseline"
    assert gate.coverage.not_needed == 40 - state.n and not gate.coverage.missing
    one, two = (f"{c.row} {c.column}" for c in cells)
    line = gate.line()
    assert line.startswith("gate FAIL: success_rate=")
    assert "margin=0.05 rule=baseline:sequential alpha=0.05" in line and "threshold" not in line
    assert f"worse than the baseline by more than the margin: {one} FAIL at n={state.n}" in line
    assert gate.baseline.states[two].verdict == "UNDECIDED" and gate.baseline.states[two].spent

    # the same records of both cells as the baseline's: nothing is worse, the run passes
    same = {t.key: _result(t, success=True) for c in cells for t in c.trials()}
    passed = fold_run(cells, same, 0.9, "point", selected=selected, baseline=baseline).gate
    assert passed.verdict == "PASS"
    assert f"(against the baseline: {one} undecided at n=40 of 40 planned" in passed.line()


def test_the_fixed_rule_tests_every_pair_and_adjusts_across_cells():
    cells = plan(parse_config(_grid(rule="fixed"), "grid.yaml", base=ROOT))
    assert all(c.block_seeds == 0 for c in cells)  # no blocks: nothing stops early
    baseline = _baseline(cells, lambda t: t.seed % 2 == 0, rule="fixed")
    # cell 1: 4 of the baseline's 20 successes lost; cell 2: 18 of 20 lost
    lost = {cells[0].key: 4, cells[1].key: 18}
    results = {}
    for c in cells:
        wins = [t for t in c.trials() if t.seed % 2 == 0]
        for t in c.trials():
            results[t.key] = _result(t, success=t in wins[lost[c.key] :])
    states = cell_states(cells, results, baseline)
    first, second = states[cells[0].key], states[cells[1].key]
    assert first.p_value == pytest.approx(tango_p(4, 0, 40, 0.05))
    assert first.p_holm == pytest.approx(
        min(1.0, 2 * first.p_value)
    ) or first.p_holm == pytest.approx(first.p_value)
    assert (first.verdict, second.verdict) == ("PASS", "FAIL")
    assert not any(s.stopped for s in states.values())
    # before every trial ran, the fixed rule decides nothing
    partial = {k: v for k, v in list(results.items())[:10]}
    assert all(s.verdict == "UNDECIDED" for s in cell_states(cells, partial, baseline).values())


def test_pairs_that_ran_other_episodes_fail_the_gate_naming_them():
    cells = plan(parse_config(_grid(block_seeds=2), "grid.yaml", base=ROOT))
    baseline = _baseline(cells, lambda t: True, block_seeds=2)
    for r in baseline.run.results.values():
        r.init_state_digest = "a" * 64
    results = {
        t.key: _result(t).model_copy(update={"init_state_digest": "b" * 64})
        for c in cells
        for t in c.trials()
    }
    found = outcome(cells, results, baseline, _labels(cells))
    (problem,) = found.problems
    assert problem.startswith("gate.baseline base_run: init states differ for 80 pairs")


# -- refusals before any trial --------------------------------------------------------------------
def _run_dir(tmp_path: Path, cells, success, **fields) -> Path:
    run = tmp_path / "base_run"
    for c in cells:
        for t in c.trials():
            record = _result(t, success=success(t)).model_copy(update=fields)
            (run / t.key).mkdir(parents=True)
            (run / t.key / "result.json").write_text(record.model_dump_json())
    return run


def test_a_baseline_on_other_code_or_another_plan_or_without_the_rows_is_refused(tmp_path):
    config = parse_config(_grid(), tmp_path / "grid.yaml", base=tmp_path)
    cells = plan(config)
    _run_dir(tmp_path, cells, lambda t: True, harness_surface="1" * 64, plan_digest="2" * 64)
    baseline = load_baseline(config, cells)
    surface = {"digest": "3" * 64, "files": {}, "packages": {}}
    (harness, plan_problem) = start_problems(baseline, "4" * 64, config.echo(), surface)
    assert harness.startswith(
        f"gate.baseline: {tmp_path / 'base_run'} was recorded on another harness surface"
    )
    assert harness.endswith("set gate.allow_harness_mismatch: true")
    # the run dir has no summary.json to say where the plans differ
    assert plan_problem.startswith("gate.baseline:") and "holds no config echo" in plan_problem
    allowed = parse_config(
        _grid(allow_harness_mismatch=True), tmp_path / "grid.yaml", base=tmp_path
    )
    baseline = load_baseline(allowed, cells)
    assert start_problems(baseline, "2" * 64, allowed.echo(), surface) == []  # same plan digest
    # another row: refused naming both
    other = parse_config(
        {
            **_grid(),
            "policies": {"pi06": {"url": "ws://h:1"}, "pi07": {"url": "ws://h:2"}},
            "benchmark": {**_grid()["benchmark"], "policies": ["pi06", "pi07"]},
        },
        tmp_path / "grid.yaml",
        base=tmp_path,
    )
    with pytest.raises(
        GapError,
        match=r"gate.baseline: .* has no row policy_only@pi06, policy_only@pi07 "
        r"\(its rows: policy_only@pi05\)",
    ):
        load_baseline(other, plan(other))
    both = r"benchmark\.gate_rule and gate\.baseline each decide when a cell stops"
    with pytest.raises(ConfigError, match=both):
        parse_config(
            {**_grid(), "benchmark": {**_grid()["benchmark"], "gate_rule": "sequential"}},
            "g.yaml",
            base=tmp_path,
        )


def test_a_baseline_is_read_from_its_episodes_parquet_too(tmp_path):
    config = parse_config(_grid(), tmp_path / "grid.yaml", base=tmp_path)
    cells = plan(config)
    run = _run_dir(tmp_path, cells, lambda t: t.seed % 3 != 0)
    from pytest_gap.results import scan_results

    parquet = write_episodes(run, scan_results(run))
    from_dir, from_parquet = load_run(run), load_run(parquet)
    assert from_parquet.results.keys() == from_dir.results.keys()
    assert all(
        from_parquet.results[k].success == r.success and from_parquet.results[k].seed == r.seed
        for k, r in from_dir.results.items()
    )
    (tmp_path / "junk.parquet").write_text("not parquet")
    with pytest.raises(GapError, match=r"not a readable episodes\.parquet"):
        load_run(tmp_path / "junk.parquet")


# -- whole sessions on the fake backend -----------------------------------------------------------
# One step where the fake backend's goal needs three: never succeeds.
TOO_SHORT = workflow(
    {
        "idle": {"type": "tool", "skill": "idle", "inputs": {"steps": 1}, "next": "check"},
        **CHECK_TAIL,
    },
    "idle",
)


def test_a_session_against_its_baseline_fails_a_regression_early_and_passes_a_rerun(pytester):
    """The baseline: the fake backend's idle-then-check workflow (success iff seed % 3 != 0).
    A workflow that stops short of the goal (never succeeds) is shown worse after the first
    block and the rest of the plan is not run; the baseline's own workflow run again passes.
    Through pytest (`--gap-baseline`), `gap benchmark --baseline` and the API."""
    fake = FakeSession(pytester)
    fake.setenv(GAP_TEST_FAKE_MODULES=None)
    fake.workflow("noop", TOO_SHORT)
    config = {
        "backend": BACKEND,
        "trials": {"output_dir": "runs", "trials_per_generation": 12},
        "suites": [{"suite_name": "fake_easy", "task_ids": [0, 1, 2, 3], "workflow_dir": "wf"}],
        "gate_threshold": 0.5,  # the baseline's own gate (read when no baseline is given)
        "gate": {"block_seeds": 3},
    }
    fake.config(config)
    base = fake.run_inprocess("bench.yaml")
    assert base.ret == 0, base.stdout.str()
    (baseline,) = (fake.path / "runs").iterdir()
    baseline = baseline.rename(fake.path / "baseline")

    fake.config({**config, "suites": [{**config["suites"][0], "workflow_dir": "noop"}]})
    worse = fake.run_inprocess("bench.yaml", f"--gap-baseline={baseline}", "-rs")
    out = worse.stdout.str()
    assert worse.ret == 1, out
    outcomes = worse.parseoutcomes()
    assert outcomes["failed"] == 24 and outcomes["skipped"] == 24, outcomes  # two blocks of 4x3
    assert (
        "gate FAIL: success_rate=0.000 baseline=0.667 margin=0.05 rule=baseline:sequential" in out
    )
    assert (
        "worse than the baseline by more than the margin: "
        "fake_easy FAIL at n=24 of 48 planned (0/24 vs baseline 16/24" in out
    )
    assert "24 not needed (decided by the sequential gate)" in out
    run_dir = fake.run_dir()
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["gate"]["baseline"]["states"]["fake_easy"]["verdict"] == "FAIL"
    shutil.rmtree(run_dir)

    # the baseline's own workflow again, the baseline named in the YAML: passes, undecided
    fake.config({**config, "gate": {"block_seeds": 3, "baseline": "baseline"}})
    again = fake.run_inprocess("bench.yaml")
    assert again.ret == 0, again.stdout.str()
    assert (
        "against the baseline: fake_easy undecided at n=48 of 48 planned (32/48 vs baseline 32/48"
        in again.stdout.str()
    )
    shutil.rmtree(fake.run_dir())

    # the API and `gap benchmark`: a regression fails the gate; a missing baseline is exit 2
    fake.config({**config, "suites": [{**config["suites"][0], "workflow_dir": "noop"}]})
    summary = benchmark.run(fake.path / "bench.yaml", gate=True, baseline=baseline, quiet=True)
    assert not summary.ok and summary.gate_line.startswith("gate FAIL:")
    shutil.rmtree(fake.run_dir())
    done = subprocess.run(
        [GAP, "benchmark", "bench.yaml", "--gate", "--baseline", "nowhere"],
        cwd=fake.path,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 2, done.stdout + done.stderr
    assert f"gate.baseline: {fake.path / 'nowhere'}: not a directory" in done.stderr + done.stdout
