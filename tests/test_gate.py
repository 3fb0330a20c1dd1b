"""The gate in real pytest sessions on the fake backend (tests/fake_backend.py): the Wilson rule's
three verdicts and their exit statuses, and coverage (what the session planned, what it
recorded, what it left out or lost); and the rules at their boundaries on constructed records
(the Wilson interval's ends from scipy)."""

from __future__ import annotations

import json
import math

import pytest
from scipy.stats import binomtest

from pytest_gap.config import parse_config
from pytest_gap.plan import plan
from pytest_gap.report import fold_run
from tests.fake_session import BACKEND, FakeSession
from tests.test_report import ROOT, _result

pytest_plugins = ["pytester"]


@pytest.fixture
def fake(pytester) -> FakeSession:
    return FakeSession(pytester)


def _grid(task_ids: list[int], n_seeds: int, **gate) -> dict:
    return {
        "benchmark": {
            "backend": BACKEND,
            "families": ["fake"],
            "variations": ["easy"],  # succeeds iff seed % 3 != 0
            "modes": ["workflow"],
            "task_ids": task_ids,
            "n_seeds": n_seeds,
            "output_dir": "runs",
            "mode_overrides": {"workflow": {"workflow_dir": "wf"}},
            **gate,
        }
    }


def test_the_wilson_gate_decides_pass_fail_or_inconclusive(fake):
    """18 trials, 12 successes: 0.667 with a Wilson interval [0.437,0.837]. Against 0.6 (where
    the point rule would pass) the Wilson rule cannot tell and says so (exit 1), with the trials
    that would decide it; against 0.3 it passes, against 0.9 it fails."""
    fake.config(_grid([0, 1], 9, gate_threshold=0.6, gate_rule="wilson"))
    unsure = fake.run_inprocess("bench.yaml")
    out = unsure.stdout.str()
    unsure.assert_outcomes(passed=12, failed=6)
    assert unsure.ret == 1, out
    assert (
        "gate INCONCLUSIVE: success_rate=0.667 ci95=[0.437,0.837] threshold=0.600 rule=wilson "
        "(interval straddles the threshold (12/18); about "
    ) in out
    assert "more trials at 0.667 would decide it); recorded 18/18 planned" in out
    assert "0.67 [0.44,0.84] n=18" in out  # the terminal pivot
    run_dir = fake.run_dir()
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["gate"]["verdict"] == "INCONCLUSIVE" and summary["gate"]["to_decide"] > 0
    assert summary["success_ci_low"] == pytest.approx(0.4375, abs=1e-3)
    header, row = (run_dir / "summary.tsv").read_text().splitlines()[:2]
    assert (  # after the spec's columns (the reference loops' rate comes after them)
        "\terror\tsuccess_ci_low\tsuccess_ci_high\tcompletion_ci_low\tcompletion_ci_high\t"
    ) in header
    values = dict(zip(header.split("\t"), row.split("\t"), strict=True))
    assert (values["success_ci_low"], values["success_ci_high"]) == ("0.437", "0.837")

    # The same records, re-gated (--gap-resume replays them): a clear PASS and a clear FAIL.
    for threshold, verdict, status, why in [
        (0.3, "PASS", 0, ""),
        (0.9, "FAIL", 1, " (interval below threshold (12/18))"),
    ]:
        fake.config(_grid([0, 1], 9, gate_threshold=threshold, gate_rule="wilson"))
        again = fake.run_inprocess("bench.yaml", "--gap-resume")
        out = again.stdout.str()
        assert again.ret == status, out
        assert (
            f"gate {verdict}: success_rate=0.667 ci95=[0.437,0.837] threshold={threshold:.3f} "
            f"rule=wilson{why}; recorded 18/18 planned"
        ) in out


def test_coverage_counts_deselected_trials_out_and_earlier_records_in(fake):
    fake.config(_grid([0, 1], 3, gate_threshold=0.5))  # 6 trials; seed 0 fails
    picked = fake.run_inprocess("bench.yaml", "-k", "seed001 or seed002")
    picked.assert_outcomes(passed=4, deselected=2)
    assert picked.ret == 0, picked.stdout.str()
    assert "gate PASS: success_rate=1.000 threshold=0.500; recorded 4/4 planned, 2 deselected" in (
        picked.stdout.str()
    )
    # The same run dir: a resumed full session records the other two; --lf then re-runs the two
    # failures and deselects the four passes, which earlier sessions recorded: all six are
    # planned and recorded, none is "deselected".
    full = fake.run_inprocess("bench.yaml", "--gap-resume")
    assert "recorded 6/6 planned" in full.stdout.str() and full.ret == 0
    last_failed = fake.run_inprocess("bench.yaml", "--lf")
    last_failed.assert_outcomes(failed=2, deselected=4)
    out = last_failed.stdout.str()
    assert "gate PASS: success_rate=0.667 threshold=0.500; recorded 6/6 planned" in out
    assert last_failed.ret == 0, out


def test_a_selected_trial_without_a_record_fails_the_gate(fake):
    """-x stops the session at the first failed trial: the trials it never ran have no record,
    and a lenient threshold must not let the one recorded trial pass the gate."""
    fake.config(_grid([0, 1], 3, gate_threshold=0.0))
    stopped = fake.run_inprocess("bench.yaml", "-x")
    stopped.assert_outcomes(failed=1)
    out = stopped.stdout.str()
    assert stopped.ret == 1, out
    assert (
        "gate FAIL: success_rate=0.000 threshold=0.000 (5 planned trials have no record; "
        "missing: workflow::fake/easy::task00::seed001, workflow::fake/easy::task00::seed002, "
        "workflow::fake/easy::task01::seed000, ... (+2 more)); recorded 1/6 planned"
    ) in out


def test_a_trial_whose_setup_fails_is_missing_under_xdist(fake):
    """A broken fixture errors one item before its trial runs: no record, so the gate fails
    naming it, also when the controller learns the plan from xdist workers."""
    fake.config(_grid([0], 3, gate_threshold=0.0))
    result = fake.run("bench.yaml", "-n", "2", GAP_TEST_FAKE_SETUP_ERROR="0:1")
    result.assert_outcomes(passed=1, failed=1, errors=1)
    out = result.stdout.str()
    assert result.ret == 1, out
    assert (
        "gate FAIL: success_rate=0.500 threshold=0.000 (1 planned trial has no record; "
        "missing: workflow::fake/easy::task00::seed001); recorded 2/3 planned"
    ) in out


# -- the rules at their boundaries, on constructed records ---------------------------------------
def _cells(variations=("object",), n_seeds=2, **benchmark):
    """Cells of 2 tasks x `n_seeds` seeds each (libero, policy_only), planned from a grid."""
    data = {
        "benchmark": {
            "families": ["libero"],
            "variations": list(variations),
            "modes": ["policy_only"],
            "policies": ["p"],
            "task_ids": [0, 1],
            "n_seeds": n_seeds,
            "mode_overrides": {"policy_only": {"template": "policy_only"}},
            **benchmark,
        },
        "policies": {"p": {"url": "ws://h:1"}},
    }
    return plan(parse_config(data, "grid.yaml", base=ROOT))


def test_the_point_rule_passes_a_rate_at_the_threshold_and_fails_one_below():
    (cell,) = _cells()
    results = {t.key: _result(t, success=t.seed == 0) for t in cell.trials()}  # 2 of 4
    assert fold_run([cell], results, 0.5, "point").gate.verdict == "PASS"
    above = math.nextafter(0.5, 1.0)  # the least threshold 0.5 falls short of
    gate = fold_run([cell], results, above, "point").gate
    assert gate.verdict == "FAIL" and "success rate below threshold (2/4)" in gate.reasons


def test_the_wilson_rule_reads_the_ends_of_the_interval():
    """12 of 18: the interval is scipy's Wilson interval. The rule passes a threshold below
    its low end, cannot tell between the ends, and fails one above its high end."""
    cells = _cells(n_seeds=9)
    results = {t.key: _result(t, success=t.seed % 3 != 0) for t in cells[0].trials()}
    low, high = binomtest(12, 18).proportion_ci(confidence_level=0.95, method="wilson")
    for threshold, verdict in [
        (low - 1e-9, "PASS"),
        (low + 1e-9, "INCONCLUSIVE"),
        (high - 1e-9, "INCONCLUSIVE"),
        (high + 1e-9, "FAIL"),
    ]:
        gate = fold_run(cells, results, threshold, "wilson").gate
        assert (gate.n_trials, gate.n_success) == (18, 12)
        assert gate.verdict == verdict, (threshold, gate.line())
        assert gate.success_ci_low == pytest.approx(low, abs=1e-12)
        assert gate.success_ci_high == pytest.approx(high, abs=1e-12)


def test_an_errored_cell_fails_the_gate_whatever_its_rule_would_say():
    """One trial of the second cell errored: the cell is errored and the gate fails, where the
    Wilson rule alone would be INCONCLUSIVE and the sequential rule alone a PASS."""
    cells = _cells(("object", "spatial"), gate_rule="sequential", sequential={"block_seeds": 2})
    results = {t.key: _result(t, success=True) for c in cells for t in c.trials()}
    broken = cells[1].trials()[0]
    results[broken.key] = _result(broken, success=False, error="config error: boom")
    wilson = fold_run(cells, results, 0.9, "wilson").gate  # 7 of 7: [0.65, 1] straddles 0.9
    assert wilson.success_ci_low < 0.9 < wilson.success_ci_high and wilson.verdict == "FAIL"
    assert any(r.startswith("errored cells: ") for r in wilson.reasons)
    sequential = fold_run(cells, results, 0.01, "sequential").gate
    assert all(s.verdict == "PASS" for s in sequential.decisions.values())
    assert sequential.verdict == "FAIL" and not sequential.passed
