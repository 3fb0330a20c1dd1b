"""The sequential gate (`gate_rule: sequential`, pytest_gap/sequential.py): the e-values
against an independent integral, the boundaries' error rates computed by enumerating every
outcome, decisions on constructed records with known answers, the run's fold (coverage, the
gate line), and a session on the fake backend that stops its cells early and does not run
their remaining trials again on --gap-resume."""

from __future__ import annotations

import itertools
import json
import math

import numpy as np
import pytest
from scipy.integrate import quad
from scipy.stats import binom

from pytest_gap.config import ConfigError, parse_config
from pytest_gap.plan import plan
from pytest_gap.report import fold_run
from pytest_gap.sequential import (
    PRIOR_STRENGTHS,
    Block,
    alpha_per_cell,
    boundaries,
    cell_state,
    decide,
    log_e_value,
)
from tests.fake_session import BACKEND, FakeSession
from tests.test_report import ROOT, _result

pytest_plugins = ["pytester"]


@pytest.mark.parametrize(
    ("successes", "trials", "threshold"),
    [(18, 20, 0.8), (45, 50, 0.8), (8, 20, 0.8), (3, 10, 0.5), (0, 7, 0.3), (30, 30, 0.95)],
)
def test_the_e_value_is_the_prior_mixture_of_likelihood_ratios(successes, trials, threshold):
    """The closed form against the mixture integrated numerically: the likelihood ratio of p
    against the threshold, averaged over each prior restricted to one side of it, the priors
    mixed evenly."""
    for side, (low, high) in (("above", (threshold, 1)), ("below", (0, threshold))):

        def ratio(p):
            return (p / threshold) ** successes * ((1 - p) / (1 - threshold)) ** (
                trials - successes
            )

        mixed = []
        for c in PRIOR_STRENGTHS:
            a, b = c * threshold, c * (1 - threshold)
            # the prior's endpoint singularities go to quad's algebraic weight
            at_0, at_1 = (a - 1 if low == 0 else 0.0), (b - 1 if high == 1 else 0.0)

            def rest(p, a=a, b=b, at_0=at_0, at_1=at_1):
                return p ** (a - 1 - at_0) * (1 - p) ** (b - 1 - at_1)

            def integral(f, low=low, high=high, wvar=(at_0, at_1)):
                return quad(f, low, high, weight="alg", wvar=wvar, limit=200)[0]

            mixed.append(integral(lambda p, rest=rest: rest(p) * ratio(p)) / integral(rest))
        assert log_e_value(successes, trials, threshold, side) == pytest.approx(
            math.log(sum(mixed) / len(mixed)), abs=1e-7
        )
    assert log_e_value(0, 0, threshold, "above") == 0.0


def _error_rates(sizes, bars, threshold):
    """P(PASS) and P(FAIL) of the looks' `bars`, for trials at exactly `threshold`, by
    enumerating every sequence of block counts (an independent count of what _final_look
    carries from look to look)."""
    passed = failed = 0.0
    for counts in itertools.product(*[range(size + 1) for size in sizes]):
        weight = math.prod(
            binom.pmf(c, size, threshold) for c, size in zip(counts, sizes, strict=True)
        )
        total = 0
        for count, (pass_at, fail_at) in zip(counts, bars, strict=True):
            total += count
            if total >= pass_at:
                passed += weight
                break
            if total <= fail_at:
                failed += weight
                break
    return passed, failed


@pytest.mark.parametrize(("threshold", "alpha"), [(0.5, 0.05), (0.8, 0.1), (0.3, 0.2)])
def test_the_last_look_spends_exactly_the_level_the_earlier_ones_left(threshold, alpha):
    sizes = [6, 6, 6, 6]
    bars = boundaries(sizes, threshold, alpha, final=True)
    passed, failed = _error_rates(sizes, bars, threshold)
    assert passed <= alpha and failed <= alpha
    # one success fewer to pass (or one more to fail) at the last look would exceed alpha
    looser_pass = [*bars[:-1], (bars[-1][0] - 1, bars[-1][1])]
    looser_fail = [*bars[:-1], (bars[-1][0], bars[-1][1] + 1)]
    assert _error_rates(sizes, looser_pass, threshold)[0] > alpha
    assert _error_rates(sizes, looser_fail, threshold)[1] > alpha
    # the looks before the last are the e-values' (anytime-valid): they spend less than alpha
    interim = boundaries(sizes, threshold, alpha, final=False)
    assert bars[:-1] == interim[:-1]
    assert sum(_error_rates(sizes, interim, threshold)) < alpha


def test_decisions_on_constructed_records():
    alpha = 0.05
    strong = [Block(complete=True, successes=10, scored=10)] * 5
    state = decide(strong, 0.5, alpha, planned=50)
    assert (state.verdict, state.looks, state.decided_at) == ("PASS", state.looks, state.n)
    assert state.n < 50 and state.line() == f"PASS at n={state.n} of 50 planned"
    weak = [Block(complete=True, successes=1, scored=10)] * 5
    assert decide(weak, 0.5, alpha, planned=50).verdict == "FAIL"

    # an incomplete block stops the looks there, whatever the blocks after it hold
    waiting = [Block(complete=True, successes=5, scored=10), Block(complete=False, **_none())]
    state = decide(waiting + strong, 0.5, alpha, planned=70)
    assert (state.verdict, state.n, state.looks, state.spent) == ("UNDECIDED", 10, 1, False)

    # a rate at the threshold all the way: undecided with the plan spent
    even = [Block(complete=True, successes=5, scored=10)] * 5
    state = decide(even, 0.5, alpha, planned=50)
    assert (state.verdict, state.spent, state.stopped) == ("UNDECIDED", True, True)

    # the cap ends the looks early, undecided for good; its look spends the rest of alpha
    state = decide(even, 0.5, alpha, planned=50, cap=20)
    assert (state.verdict, state.n, state.spent, state.stopped) == ("UNDECIDED", 20, True, True)

    # errored trials complete a block and are no observation
    errored = [Block(complete=True, successes=0, scored=0), *strong]
    assert decide(errored, 0.5, alpha, planned=60).n == decide(strong, 0.5, alpha, planned=50).n

    # threshold 0 passes at the first scored trial; threshold 1 fails on the first failure
    assert decide(weak[:1], 0.0, alpha, planned=50).verdict == "PASS"
    assert decide(
        [Block(complete=True, successes=10, scored=10)], 1.0, alpha, planned=50
    ).verdict == ("UNDECIDED")
    assert decide(
        [Block(complete=True, successes=9, scored=10)], 1.0, alpha, planned=50
    ).verdict == ("FAIL")
    assert alpha_per_cell(0.05, 4) == pytest.approx(0.0125) and alpha_per_cell(0.05, 0) == 0.05


def _none() -> dict:
    return {"successes": 0, "scored": 0}


def _sequential_config(**gate) -> dict:
    return {
        "benchmark": {
            "families": ["libero"],
            "variations": ["object", "spatial"],
            "modes": ["policy_only"],
            "policies": ["pi05"],
            "task_ids": [0, 1],
            "n_seeds": 20,
            "gate_threshold": 0.5,
            "gate_rule": "sequential",
            "sequential": {"block_seeds": 2, **gate},
            "mode_overrides": {"policy_only": {"template": "policy_only"}},
        },
        "policies": {"pi05": {"url": "ws://h:1"}},
    }


def test_a_sequential_plan_runs_block_by_block_and_each_block_holds_every_task():
    (cell, _) = plan(parse_config(_sequential_config(), "grid.yaml", base=ROOT))
    assert cell.block_seeds == 2
    order = [(t.task_id, t.seed) for t in cell.trials()]
    assert order[:8] == [(0, 0), (0, 1), (1, 0), (1, 1), (0, 2), (0, 3), (1, 2), (1, 3)]
    assert sorted(order) == [(t, s) for t in (0, 1) for s in range(20)]
    assert all(len(block) == 4 for block in cell.blocks())
    with pytest.raises(ConfigError, match=r"sequential\.alpha"):
        parse_config(_sequential_config(alpha=1.5), "grid.yaml", base=ROOT)


def test_the_fold_reads_each_cell_and_counts_undone_trials_of_decided_cells_as_not_needed():
    """Cell 1 is decided PASS after its first blocks and its other trials never ran; cell 2
    has run one block. Cell 1's other trials are not needed (not missing, in no rate); cell 2's
    are missing, which fails a session that ends there; folded without a session's selection
    the run is INCONCLUSIVE, and the gate line names each cell's state."""
    cells = plan(parse_config(_sequential_config(), "grid.yaml", base=ROOT))
    alpha = alpha_per_cell(0.05, 2)
    results = {}
    for block in cells[0].blocks():
        results |= {t.key: _result(t, success=True) for t in block}
        if cell_state(cells[0], results, 0.5, alpha).decided:
            break
    first = cell_state(cells[0], results, 0.5, alpha)
    assert first.verdict == "PASS" and first.n == len(results) < 40
    for trial in cells[1].blocks()[0]:
        results[trial.key] = _result(trial, success=trial.seed % 2 == 0)
    selected = {t.id for c in cells for t in c.trials()}
    ended = fold_run(cells, results, 0.5, "sequential", selected=selected).gate
    assert ended.verdict == "FAIL" and ended.coverage.not_needed == 40 - first.n
    assert ended.coverage.missing == [t.id for t in cells[1].trials()[4:]]
    assert ended.coverage.planned == first.n + 40
    assert "not needed (decided by the sequential gate)" in ended.line()
    summary = fold_run(cells, results, 0.5, "sequential")
    gate = summary.gate
    assert gate.verdict == "INCONCLUSIVE" and gate.alpha == 0.05
    assert (gate.n_trials, gate.n_success) == (first.n + 4, first.n + 2)
    line = gate.line()
    one, two = (f"{c.row} {c.column}" for c in cells)
    assert f"(undecided: {two} undecided at n=4 of 40 planned; " in line
    assert f"decided: {one} PASS at n={first.n} of 40 planned)" in line
    assert summary.cells[0].sequential.verdict == "PASS"
    assert summary.by_mode["policy_only"].planned == first.n + 40

    # with cell 2 failing outright, the run fails
    for block in cells[1].blocks():
        results |= {t.key: _result(t, success=False) for t in block}
    assert fold_run(cells, results, 0.5, "sequential", selected=selected).gate.verdict == "FAIL"


def test_a_session_stops_a_decided_cell_and_resume_does_not_run_its_remaining_trials(pytester):
    """On the fake backend (success iff seed % 3 != 0: rate 2/3), two tasks, 30 seeds each: a
    cell with threshold 0.3 is decided PASS and one with 0.95 FAIL, after a few blocks; the
    rest are skipped as not needed; --gap-resume runs none of them."""
    fake = FakeSession(pytester)
    fake.setenv(GAP_TEST_FAKE_MODULES=None)
    base = {
        "backend": BACKEND,
        "trials": {"output_dir": "runs", "trials_per_generation": 30},
        "suites": [{"suite_name": "fake_easy", "task_ids": [0, 1], "workflow_dir": "wf"}],
        "gate_rule": "sequential",
        "sequential": {"block_seeds": 3},
    }
    for threshold, verdict, exit_code in ((0.3, "PASS", 0), (0.95, "FAIL", 1)):
        fake.config({**base, "gate_threshold": threshold})
        first = fake.run_inprocess("bench.yaml", "-rs")
        out = first.stdout.str()
        outcomes = first.parseoutcomes()
        ran = outcomes.get("passed", 0) + outcomes.get("failed", 0)
        assert first.ret == exit_code, out
        assert 0 < ran < 60 and outcomes["skipped"] == 60 - ran, outcomes
        assert ran % 6 == 0  # whole blocks (3 seeds of 2 tasks), run in order
        assert f"fake_easy {verdict} at n={ran} of 60 planned" in out
        assert f"{60 - ran} not needed (decided by the sequential gate)" in out
        assert "not needed: the sequential gate stopped" in out
        run_dir = fake.run_dir()
        seeds = sorted({r["seed"] for r in fake.results(run_dir).values()})
        assert seeds == list(range(ran // 2))
        summary = json.loads((run_dir / "summary.json").read_text())
        assert summary["gate"]["verdict"] == verdict and summary["n_trials"] == ran
        assert (run_dir / "aaa_done_flag.txt").is_file()  # nothing left to run

        again = fake.run_inprocess("bench.yaml", "--gap-resume")
        outcomes = again.parseoutcomes()
        assert outcomes["skipped"] == 60 - ran and len(fake.results(run_dir)) == ran
        assert again.ret == exit_code
        for path in (fake.path / "runs").iterdir():
            if path.is_dir():
                import shutil

                shutil.rmtree(path)


def test_the_bench_boundaries_agree_with_the_decisions():
    """bench/sequential.py reads boundaries; a session reads decide: the same verdicts."""
    sizes = [10, 10, 10]
    bars = boundaries(sizes, 0.7, 0.05, final=True)
    rng = np.random.default_rng(0)
    for _ in range(200):
        counts = rng.integers(0, 11, size=3)
        blocks = [Block(complete=True, successes=int(c), scored=10) for c in counts]
        state = decide(blocks, 0.7, 0.05, planned=30)
        total, expected = 0, "UNDECIDED"
        for count, (pass_at, fail_at) in zip(counts, bars, strict=True):
            total += count
            if total >= pass_at or total <= fail_at:
                expected = "PASS" if total >= pass_at else "FAIL"
                break
        assert state.verdict == expected


def test_xdist_workers_see_a_decision_before_their_next_trial(pytester):
    """Under -n 2 each worker reads the cell's records before each trial: once the cell is
    decided, the trials not yet started are skipped, whichever worker holds them."""
    fake = FakeSession(pytester)
    fake.config(
        {
            "backend": BACKEND,
            "trials": {"output_dir": "runs", "trials_per_generation": 40, "num_workers": 2},
            "suites": [{"suite_name": "fake_easy", "task_ids": [0, 1], "workflow_dir": "wf"}],
            "gate_rule": "sequential",
            "gate_threshold": 0.3,
            "sequential": {"block_seeds": 2},
        }
    )
    result = fake.run("bench.yaml", "-n", "2")
    out = result.stdout.str()
    outcomes = result.parseoutcomes()
    assert result.ret == 0, out
    ran = outcomes.get("passed", 0) + outcomes.get("failed", 0)
    state = json.loads((fake.run_dir() / "summary.json").read_text())["gate"]["decisions"]
    (decision,) = state.values()
    # trials a worker started before the decision still run (a worker may run ahead of a
    # slower one by whole blocks); every other trial is skipped
    assert decision["verdict"] == "PASS" and decision["n"] <= ran < 80
    assert outcomes["skipped"] == 80 - ran
    assert f"{80 - ran} not needed (decided by the sequential gate)" in out


def test_a_real_libero_session_fails_the_random_policy_early(pytester):
    """Real LIBERO (libero_object task 0) with the built-in random policy served by `gap
    policy serve`, 20 seeds against a threshold of 0.5: every trial fails, the cell is decided
    FAIL after four blocks of two seeds (n=8), and the other 12 trials are not run."""
    pytester.makefile(
        ".yaml",
        bench=json.dumps(
            {
                "policies": {
                    "random": {"command": ["gap", "policy", "serve", "random", "--port", "{port}"]}
                },
                "trials": {"max_steps": 10},
                "benchmark": {
                    "families": ["libero"],
                    "variations": ["object"],
                    "modes": ["policy_only"],
                    "policies": ["random"],
                    "task_ids": [0],
                    "n_seeds": 20,
                    "num_workers": 1,
                    "output_dir": "runs",
                    "gate_threshold": 0.5,
                    "gate_rule": "sequential",
                    "sequential": {"block_seeds": 2},
                    "mode_overrides": {"policy_only": {"template": "policy_only"}},
                },
            }
        ),
    )
    result = pytester.runpytest_subprocess("bench.yaml", "-p", "no:cacheprovider", timeout=600)
    out = result.stdout.str()
    assert result.ret == 1, out
    result.assert_outcomes(failed=8, skipped=12)
    assert "policy_only@random libero/object FAIL at n=8 of 20 planned" in out
    assert "12 not needed (decided by the sequential gate)" in out
