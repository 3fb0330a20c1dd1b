"""`gap compare`: paired statistics checked against answers computed here independently (exact
binomial sums, the bootstrap's lattice, Holm by hand) and every refusal. The real A/B run on
LIBERO compared through the `gap` console script is the A/B tutorial's
(tests/test_tutorial_ab_compare.py)."""

from __future__ import annotations

import json
import math
import shutil
import sys
from pathlib import Path

import numpy as np
import pytest

from pytest_gap.cli import main
from pytest_gap.compare import cluster_interval
from pytest_gap.results import TrialResult, write_json, write_result

ROOT = Path(__file__).resolve().parent.parent
GAP = shutil.which("gap", path=str(Path(sys.executable).parent)) or "gap"
BASE, CAND = "policy_only@base", "policy_only@cand"


def _record(policy: str, variation: str, task: int, seed: int, success: bool, **extra):
    values = {
        "backend": "libero",
        "plan_digest": "sha256:plan1",
        "init_state_digest": f"sha256:init-{variation}-{task}-{seed}",
        "scene_digest": f"sha256:scene-{variation}-{task}-{seed}",
        "harness_surface": "sha256:surface1",
        "policy_url": f"ws://127.0.0.1:{9100 if policy == 'base' else 9200}",
        **extra,
    }
    return TrialResult(
        nodeid=f"grid.yaml::policy_only@{policy}::libero/{variation}::task{task:02d}::seed{seed:03d}",
        config="grid.yaml",
        mode="policy_only",
        policy_id=policy,
        family="libero",
        variation=variation,
        suite=f"libero_{variation}",
        task_id=task,
        seed=seed,
        success=success,
        completion=float(success),
        **values,
    )


def _pairs(outcomes, variation="object", a="base", b="cand", a_extra=None, b_extra=None):
    """Records of two policies from (task, seed, A succeeded, B succeeded) tuples."""
    records = []
    for task, seed, a_ok, b_ok in outcomes:
        records.append(_record(a, variation, task, seed, a_ok, **(a_extra or {})))
        records.append(_record(b, variation, task, seed, b_ok, **(b_extra or {})))
    return records


def _table(a_only=0, b_only=0, both=0, neither=0, tasks=1):
    """Outcomes with the given discordant and concordant counts, spread over `tasks` tasks."""
    kinds = (
        [(True, False)] * a_only
        + [(False, True)] * b_only
        + [(True, True)] * both
        + [(False, False)] * neither
    )
    return [(i % tasks, i // tasks, a_ok, b_ok) for i, (a_ok, b_ok) in enumerate(kinds)]


def _run(path: Path, records, surface=None, grid=None, rows=()) -> Path:
    for r in records:
        cell = "/".join(x for x in (r.mode, r.policy_id, r.family, r.variation) if x)
        write_result(path / cell / f"task_{r.task_id:02d}" / f"seed_{r.seed:03d}", r)
    if surface is not None:
        write_json(path / "run_manifest.json", {"harness_surface": surface})
    if grid is not None or rows:
        write_json(path / "summary.json", {"grid": grid or {}, "cells": [{"row": r} for r in rows]})
    return path


def _gap_compare(capsys, *args) -> tuple[int, str, str]:
    code = main(["compare", *map(str, args)])
    out = capsys.readouterr()
    return code, out.out, out.err


def _json(capsys, *args) -> tuple[int, dict]:
    code, out, _ = _gap_compare(capsys, *args, "--json")
    return code, json.loads(out)


def _exact_mcnemar(b: int, c: int) -> float:
    """Two-sided exact McNemar: twice the smaller binomial tail of Bin(b + c, 1/2), at most 1."""
    n = b + c
    tail = sum(math.comb(n, k) for k in range(min(b, c) + 1)) / 2**n
    return min(1.0, 2 * tail)


# -- statistics against known answers ------------------------------------------------------------
def test_mcnemar_p_is_the_exact_binomial_sum_over_discordant_pairs_only(tmp_path, capsys):
    outcomes = _table(a_only=7, b_only=2, both=5, neither=3)
    run = _run(tmp_path / "run", _pairs(outcomes))
    code, data = _json(capsys, run, "--a", BASE, "--b", CAND)
    (cell,) = data["cells"]
    assert (cell["n_pairs"], cell["a_success"], cell["b_success"]) == (17, 12, 7)
    assert (cell["a_only"], cell["b_only"]) == (7, 2)
    assert cell["diff"] == pytest.approx(-5 / 17)
    # 2 * (C(9,0) + C(9,1) + C(9,2)) / 2^9 = 92/512: the 8 concordant pairs do not enter it
    assert cell["p_value"] == pytest.approx(_exact_mcnemar(7, 2), rel=1e-12)
    assert cell["p_value"] == pytest.approx(92 / 512, rel=1e-12)
    assert cell["verdict"] == "n.s." and code == 0


@pytest.mark.parametrize(("a_only", "b_only"), [(0, 0), (3, 3), (0, 6), (1, 11)])
def test_mcnemar_p_on_other_tables(tmp_path, capsys, a_only, b_only):
    run = _run(tmp_path / "run", _pairs(_table(a_only=a_only, b_only=b_only, both=2)))
    _, data = _json(capsys, run, "--a", BASE, "--b", CAND)
    expected = 1.0 if a_only + b_only == 0 else _exact_mcnemar(a_only, b_only)
    assert data["cells"][0]["p_value"] == pytest.approx(expected, rel=1e-12)


def _lattice_quantile(n: int, q: float) -> float:
    """The q-quantile of the mean of n draws of +-1 with probability 1/2: (2K - n)/n, K ~ Bin."""
    cdf = 0.0
    for k in range(n + 1):
        cdf += math.comb(n, k) / 2**n
        if cdf >= q:
            return (2 * k - n) / n
    return 1.0


def test_the_interval_resamples_whole_tasks(tmp_path, capsys):
    """Ten tasks of ten seeds; in five B wins every seed, in five A does: the true difference
    is 0. Resampling the ten tasks gives the mean of ten +-1 draws, whose 2.5% and 97.5%
    quantiles are -0.6 and +0.6 exactly; resampling the 100 trials would give about +-0.2."""
    outcomes = [(t, s, t >= 5, t < 5) for t in range(10) for s in range(10)]
    run = _run(tmp_path / "run", _pairs(outcomes))
    _, data = _json(capsys, run, "--a", BASE, "--b", CAND)
    cell = data["cells"][0]
    assert cell["diff"] == 0.0 and cell["n_tasks"] == 10
    assert cell["ci_low"] <= 0.0 <= cell["ci_high"]
    assert cell["ci_low"] == pytest.approx(_lattice_quantile(10, 0.025))
    assert cell["ci_high"] == pytest.approx(_lattice_quantile(10, 0.975))
    assert (cell["ci_low"], cell["ci_high"]) == pytest.approx((-0.6, 0.6))
    assert _lattice_quantile(100, 0.975) == pytest.approx(0.2)  # what trials would give
    # the same records give the same interval (fixed seed)
    assert _json(capsys, run, "--a", BASE, "--b", CAND)[1]["cells"][0] == cell


def test_the_interval_covers_a_known_difference_where_trials_resampled_would_not():
    """40 experiments drawn from a model with a true difference of -0.25 (A succeeds with 0.8
    on every task, B with 0.2 or 0.9 by task): the task-resampled interval covers it in about
    95% of them. Trials of one task share B's rate, so an interval over trials is too narrow
    (covers about 65%)."""
    rng = np.random.default_rng(0)
    covered, covered_by_trials = 0, 0
    for _ in range(40):
        tasks = []
        for _task in range(12):
            rate_b = rng.choice([0.2, 0.9])
            a_ok, b_ok = rng.random(8) < 0.8, rng.random(8) < rate_b
            tasks.append([float(b) - float(a) for a, b in zip(a_ok, b_ok, strict=True)])
        low, high = cluster_interval(tasks)
        covered += low <= -0.25 <= high
        low, high = cluster_interval([[d] for task in tasks for d in task])  # trials resampled
        covered_by_trials += low <= -0.25 <= high
    assert covered >= 35, covered  # 38 of 40 with this seed
    assert covered_by_trials <= 30, covered_by_trials  # 28: the design tells the two apart


def _holm_by_hand(pvalues: list[float]) -> list[float]:
    order = sorted(range(len(pvalues)), key=lambda i: pvalues[i])
    adjusted, running = [0.0] * len(pvalues), 0.0
    for rank, i in enumerate(order):
        running = max(running, (len(pvalues) - rank) * pvalues[i])
        adjusted[i] = min(1.0, running)
    return adjusted


def test_holm_across_three_cells_and_the_pooled_row(tmp_path, capsys):
    """Discordant tables (A only, B only): object (8, 1), goal (10, 0), spatial (6, 0); raw
    p 0.039, 0.00195, 0.031. The family is the three cells and the pooled row (24, 1). Holm
    keeps goal and pooled significant; spatial (x2) and object (x1, but not below the one
    ranked before it) both end at 0.0625, though both were below 0.05 raw."""
    tables = {"object": (8, 1), "goal": (10, 0), "spatial": (6, 0)}
    records = []
    for variation, (a_only, b_only) in tables.items():
        records += _pairs(_table(a_only=a_only, b_only=b_only, both=3, tasks=2), variation)
    run = _run(tmp_path / "run", records)
    code, data = _json(capsys, run, "--a", BASE, "--b", CAND)
    cells = {c["cell"]: c for c in data["cells"]}
    raw = {v: _exact_mcnemar(*t) for v, t in tables.items()}
    pooled_raw = _exact_mcnemar(24, 1)
    names = ["object", "goal", "spatial"]
    expected = _holm_by_hand([raw[n] for n in names] + [pooled_raw])
    for name, holm in zip(names, expected, strict=False):
        cell = cells[f"libero/{name}"]
        assert cell["p_value"] == pytest.approx(raw[name], rel=1e-12)
        assert cell["p_holm"] == pytest.approx(holm, rel=1e-12)
    assert data["pooled"]["p_value"] == pytest.approx(pooled_raw, rel=1e-12)
    assert data["pooled"]["p_holm"] == pytest.approx(expected[3], rel=1e-12)
    assert cells["libero/goal"]["p_holm"] == pytest.approx(3 * 2 / 2**10)
    assert cells["libero/spatial"]["p_holm"] == pytest.approx(0.0625)
    assert cells["libero/object"]["p_holm"] == pytest.approx(0.0625)
    verdicts = {name: c["verdict"] for name, c in cells.items()}
    assert verdicts == {
        "libero/object": "n.s.",
        "libero/goal": "B worse",
        "libero/spatial": "n.s.",
    }
    assert data["pooled"]["verdict"] == "B worse" and code == 1


# -- exit status and output ----------------------------------------------------------------------
def test_a_clearly_worse_b_exits_1_with_the_table(tmp_path, capsys):
    run = _run(
        tmp_path / "run",
        _pairs(_table(a_only=10, both=2, tasks=5)),
        rows=["policy_only@base[privileged]", CAND],
    )
    code, out, err = _gap_compare(capsys, run, "--a", BASE, "--b", f"{CAND}[privileged]")
    assert code == 1, out + err
    lines = out.splitlines()
    assert lines[0] == f"A  policy_only@base[privileged]  ({run})"  # the pivot's label
    assert lines[1] == f"B  {CAND}  (same run)"
    row = next(line for line in lines if line.startswith("libero/object"))
    assert row.split() == [
        "libero/object",
        "12",
        "12/12",
        "2/12",
        "-0.833",
        "[-1.000,",  # every task sums to -2 over 3 trials (tasks 0, 1) or 2 (tasks 2-4): a
        "-0.714]",  # resample is -10/(10 + X), X ~ Bin(5, 0.4) picks of tasks 0-1; quantiles
        # X=0 (P(X=0) = 0.078 > 0.025) and X=4 (P(X<=3) = 0.913 < 0.975 <= P(X<=4) = 0.990)
        "10",
        "0",
        "0.00195",
        "0.00195",
        "0",
        "B",
        "worse",
    ]
    assert lines[-1] == (
        "B is significantly worse than A (Holm, alpha 0.05): libero/object (p_holm=0.00195), "
        "pooled (p_holm=0.00195)"
    )
    markdown = _gap_compare(capsys, run, "--a", BASE, "--b", CAND, "--markdown")[1]
    assert "| libero/object | 12      | 12/12 | 2/12 |" in markdown
    assert markdown.splitlines()[-1].startswith("**B is significantly worse")


def test_b_better_or_equal_exits_0(tmp_path, capsys):
    run = _run(tmp_path / "run", _pairs(_table(b_only=10, neither=2, tasks=5)))
    code, data = _json(capsys, run, "--a", BASE, "--b", CAND)
    assert code == 0 and data["exit_code"] == 0
    assert data["cells"][0]["verdict"] == "B better"
    assert data["verdict"] == "B is not significantly worse than A anywhere (Holm, alpha 0.05)"


def test_errored_trials_are_excluded_pairwise_and_counted(tmp_path, capsys):
    records = _pairs(_table(a_only=6, both=2, tasks=2))
    records.append(_record("base", "object", 5, 0, True))
    records.append(
        _record("cand", "object", 5, 0, False, error="policy server closed", infra_failure=True)
    )
    records.append(_record("base", "object", 5, 1, False, error="no workflow"))
    records.append(_record("cand", "object", 5, 1, True))
    run = _run(tmp_path / "run", records)
    _, data = _json(capsys, run, "--a", BASE, "--b", CAND)
    cell = data["cells"][0]
    assert (cell["n_pairs"], cell["a_success"], cell["b_success"]) == (8, 8, 2)
    assert (cell["n_excluded"], cell["n_infra"]) == (2, 1)
    _, out, _ = _gap_compare(capsys, run, "--a", BASE, "--b", CAND)
    assert "2 (1 infra)" in out


def test_records_without_provenance_compare_and_say_so(tmp_path, capsys):
    unknown = dict.fromkeys(
        (
            "backend",
            "plan_digest",
            "init_state_digest",
            "scene_digest",
            "harness_surface",
            "policy_url",
        )
    )
    records = _pairs(_table(a_only=3, b_only=1, tasks=2), a_extra=unknown, b_extra=unknown)
    run = _run(tmp_path / "run", records)
    code, data = _json(capsys, run, "--a", BASE, "--b", CAND)
    assert code == 0 and data["cells"][0]["n_pairs"] == 4
    (note,) = data["notes"]
    assert note == (
        "not recorded in some records (written before provenance was kept): backend, "
        "init_state_digest, scene_digest, harness_surface, plan_digest, policy_url; the checks "
        "on them were skipped, and trials were paired without the backend"
    )


# -- refusals: exit 2, one line each --------------------------------------------------------------
def _refused(capsys, *args) -> list[str]:
    code, out, err = _gap_compare(capsys, *args)
    assert code == 2, out + err
    assert out == ""
    lines = err.splitlines()
    assert all(line.startswith("gap compare: refused: ") for line in lines), err
    return [line.removeprefix("gap compare: refused: ") for line in lines]


def test_pairs_from_different_initial_states_are_refused(tmp_path, capsys):
    records = _pairs(_table(a_only=3, tasks=1))
    records[3] = records[3].model_copy(update={"init_state_digest": "sha256:other"})  # seed 1
    run = _run(tmp_path / "run", records)
    (line,) = _refused(capsys, run, "--a", BASE, "--b", CAND)
    assert line.startswith("init states differ for 1 pair (libero/object task 0 seed 1): ")
    assert "did not run the same episodes" in line
    code, data = _json(capsys, run, "--a", BASE, "--b", CAND)
    assert code == 2 and data == {"refused": [line], "exit_code": 2}


def test_pairs_whose_seed_settled_into_another_scene_are_refused(tmp_path, capsys):
    """Same init state, fixtures placed otherwise: what a harness drawing the jitter from a
    stream shared by every episode of an env recorded (vla-eval's default)."""
    records = _pairs(_table(a_only=3, tasks=1))
    records[3] = records[3].model_copy(update={"scene_digest": "sha256:jittered-otherwise"})
    run = _run(tmp_path / "run", records)
    (line,) = _refused(capsys, run, "--a", BASE, "--b", CAND)
    assert line.startswith("scenes differ for 1 pair (libero/object task 0 seed 1): ")
    assert "scene_digest" in line


SURFACE = {
    "digest": "sha256:surface1",
    "files": {"pytest_gap/runner.py": "aa", "pytest_gap/skills/motion.py": "bb"},
    "packages": {"mujoco": "3.2.0", "robosuite": "1.4.1"},
}


def test_a_different_harness_surface_is_refused_naming_the_changed_files(tmp_path, capsys):
    outcomes = _table(a_only=6, tasks=3)
    run_a = _run(
        tmp_path / "a", [r for r in _pairs(outcomes) if r.policy_id == "base"], surface=SURFACE
    )
    changed = {
        "digest": "sha256:surface2",
        "files": {"pytest_gap/runner.py": "cc", "pytest_gap/skills/motion.py": "bb"},
        "packages": {"mujoco": "3.3.0", "robosuite": "1.4.1"},
    }
    cand = _pairs(outcomes, b_extra={"harness_surface": "sha256:surface2"})
    run_b = _run(tmp_path / "b", [r for r in cand if r.policy_id == "cand"], surface=changed)
    (line,) = _refused(capsys, run_a, run_b)
    assert line == (
        "harness_surface differs for 6 pairs (A surface1, B surface2); changed: "
        "pytest_gap/runner.py, mujoco 3.2.0 -> 3.3.0: rerun both sides on one checkout, or read "
        "the changes and pass --allow-harness-mismatch"
    )
    code, data = _json(capsys, run_a, run_b, "--allow-harness-mismatch")
    assert code == 1  # compared: B lost all six
    assert data["notes"] == [
        "harness_surface differs for 6 pairs (A surface1, B surface2), allowed: changed: "
        "pytest_gap/runner.py, mujoco 3.2.0 -> 3.3.0"
    ]


def test_one_server_answering_both_sides_is_refused(tmp_path, capsys):
    records = _pairs(_table(a_only=2, b_only=2), b_extra={"policy_url": "ws://127.0.0.1:9100"})
    (line,) = _refused(capsys, _run(tmp_path / "run", records), "--a", BASE, "--b", CAND)
    assert line == (
        "both sides were answered by ws://127.0.0.1:9100 with no different policy digest: a "
        "policy compared with itself; serve each side on its own url, or record both runs with "
        "servers that send their metadata"
    )
    same_server = {"policy_url": "ws://127.0.0.1:9100", "policy_digest": "sha256:ckpt1"}
    records = _pairs(_table(a_only=2, b_only=2), a_extra=same_server, b_extra=same_server)
    (line,) = _refused(capsys, _run(tmp_path / "same", records), "--a", BASE, "--b", CAND)
    assert line.startswith("both sides were answered by ws://127.0.0.1:9100 with no different")


def test_one_url_serving_two_checkpoints_in_turn_is_compared(tmp_path, capsys):
    """Two runs days apart on the same loopback port: the servers' digests tell them apart."""
    url = "ws://127.0.0.1:9100"
    records = _pairs(
        _table(a_only=6, tasks=3),
        a_extra={"policy_url": url, "policy_digest": "sha256:ckpt1"},
        b_extra={"policy_url": url, "policy_digest": "sha256:ckpt2"},
    )
    code, data = _json(capsys, _run(tmp_path / "run", records), "--a", BASE, "--b", CAND)
    assert code == 1  # compared: B lost all six
    assert data["notes"] == [f"both sides used {url}, told apart by their policy digests"]


def test_no_paired_trials_is_refused(tmp_path, capsys):
    records = [r for r in _pairs(_table(a_only=2)) if r.policy_id == "base"]
    records += [_record("cand", "object", 7, 0, True)]
    (line,) = _refused(capsys, _run(tmp_path / "run", records), "--a", BASE, "--b", CAND)
    assert line.startswith("no paired trials: the sides share no (backend, family, variation")


def test_pairs_that_all_errored_are_refused(tmp_path, capsys):
    records = _pairs(_table(a_only=2), b_extra={"error": "server gone", "infra_failure": True})
    (line,) = _refused(capsys, _run(tmp_path / "run", records), "--a", BASE, "--b", CAND)
    assert line.startswith("no scored pair: each of the 2 pairs has an errored trial")


def test_two_rows_run_under_different_plans_are_refused(tmp_path, capsys):
    """A run resumed with a changed config: B's trials ran under another plan than A's."""
    records = _pairs(_table(a_only=2, b_only=1), b_extra={"plan_digest": "sha256:plan2"})
    (line,) = _refused(capsys, _run(tmp_path / "run", records), "--a", BASE, "--b", CAND)
    assert line == (
        "plan digest differs between the rows (A plan1, B plan2): the run was resumed with a "
        "changed config; rerun one row into a fresh run dir"
    )


def test_a_side_whose_trials_ran_under_two_plans_is_refused(tmp_path, capsys):
    records = _pairs(_table(a_only=2, b_only=1))
    records[2] = records[2].model_copy(update={"plan_digest": "sha256:plan2"})  # A, seed 1
    (line,) = _refused(capsys, _run(tmp_path / "run", records), "--a", BASE, "--b", CAND)
    assert line == (
        "plan digest: side A's paired records ran under 2 plans (plan1, plan2): the run was "
        "resumed with a changed config; rerun that row into a fresh run dir"
    )


def _grid(policy: str, timeout: float = 600.0) -> dict:
    return {
        "policies": {policy: {"url": f"ws://gpu:{len(policy)}"}},
        "trials": {"task_timeout_secs": timeout, "output_dir": f"/tmp/{policy}"},
        "benchmark": {
            "families": ["libero"],
            "variations": ["object"],
            "modes": ["policy_only"],
            "policies": [policy],
            "task_ids": [0, 1] if policy == "base" else [0, 1, 2],
            "mode_overrides": {"policy_only": {"template": "policy_only", "num_workers": 4}},
            "output_dir": f"runs_{policy}",
        },
    }


def test_two_runs_of_different_policies_compare_on_the_paired_part_of_their_plans(tmp_path, capsys):
    """Two configs, one per policy: their plan digests differ by construction. What decides is
    the config without the policy axis, the grid's extent and the outputs; a different
    timeout on the paired part is refused, naming the key."""
    outcomes = _table(a_only=3, b_only=1, tasks=2)
    base = [r for r in _pairs(outcomes) if r.policy_id == "base"]
    cand = _pairs(outcomes, b_extra={"plan_digest": "sha256:plan2"})
    cand = [r for r in cand if r.policy_id == "cand"]
    run_a = _run(tmp_path / "a", base, grid=_grid("base"))
    run_b = _run(tmp_path / "b", cand, grid=_grid("cand"))
    code, data = _json(capsys, run_a, run_b)
    assert code == 0 and data["cells"][0]["n_pairs"] == 4
    assert data["notes"] == [
        "the two runs' plans differ only in what is compared (policies, modes) or in the "
        "grid's extent; the paired part is the same"
    ]
    run_c = _run(tmp_path / "c", cand, grid=_grid("cand", timeout=60.0))
    (line,) = _refused(capsys, run_a, run_c)
    assert line == (
        "plan differs on the paired part (trials.task_timeout_secs: 600.0 vs 60.0): run both "
        "sides from one config (list both policies, or select each with -k)"
    )


def test_rows_and_run_dirs_a_user_can_get_wrong(tmp_path, capsys):
    records = _pairs(_table(a_only=1))
    run = _run(tmp_path / "out" / "20260101_000000", records)
    other = _run(tmp_path / "other", [r for r in records if r.policy_id == "cand"])
    cases = {
        (run,): "needs both --a ROW and --b ROW",
        (run, "--a", "policy_only@bsae", "--b", CAND): (
            "--a policy_only@bsae: " + str(run) + " has no such row (rows: policy_only@base, "
            "policy_only@cand)"
        ),
        (run, "--a", BASE, "--b", BASE): "--a and --b name the same row policy_only@base",
        (run, run): "needs both --a ROW and --b ROW",  # one run named twice
        (run, other): "has rows policy_only@base, policy_only@cand: choose one with --a ROW",
        (tmp_path / "out", run, "--a", BASE): "an output dir holding run dirs (20260101_000000)",
        (tmp_path / "nope", run): "not a directory",
    }
    for args, message in cases.items():
        code, out, err = _gap_compare(capsys, *args)
        assert code == 2, (args, out, err)
        assert err.count("\n") == 1 and message in err, (args, err)
