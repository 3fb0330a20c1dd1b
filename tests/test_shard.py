"""--gap-shard K/N and `gap merge`: shards partition the plan the same way in every process, and
merging the shards' run dirs gives what one unsharded run of the plan gives.

The sessions are real (pytest and `gap` in subprocesses, as a job array runs them) on the fake
backend (tests/fake_backend.py); the cluster examples (examples/cluster/) run as their scheduler
would run them, with its index variables set.
"""

from __future__ import annotations

import json
import os
import random
import shutil
import subprocess
import sys
from pathlib import Path

import pyarrow.parquet as pq
import pytest
import yaml

from pytest_gap.cells import Cell
from pytest_gap.errors import GapError
from pytest_gap.results import TrialResult
from pytest_gap.scale.merge import choose
from pytest_gap.scale.shard import RESET_COST, parse_shard, shard_plan, trial_cost
from tests.fake_session import BACKEND, CONFTEST, IDLE_THEN_CHECK, TESTS

ROOT = TESTS.parent
BIN = Path(sys.executable).parent
CLUSTER = ROOT / "examples" / "cluster"
TIMEOUT = 180
SHARDS = 3


# -- the shard function: pure --------------------------------------------------------------------
def _cell(mode, variation, tasks, seeds, *, policy=None, llm=False, steps=100) -> Cell:
    return Cell(
        mode=mode,
        policy_id=policy,
        backend=BACKEND,
        family="fake",
        variation=variation,
        suite=f"fake_{variation}",
        task_ids=tuple(tasks),
        seeds=tuple(seeds),
        uses_llm=llm,
        max_steps=steps,
    )


PLANS = {
    "even": [("a.yaml", [_cell("workflow", "easy", range(4), range(5))])],
    "uneven": [
        ("a.yaml", [_cell("workflow", "easy", range(3), range(7), steps=280)]),
        (
            "b.yaml",
            [
                _cell("policy_only", "hard", [0, 5], range(2), policy="pi0", steps=520),
                _cell("llm_generation", "easy", [1], range(11), llm=True),
            ],
        ),
    ],
    "one big task": [("a.yaml", [_cell("workflow", "easy", [0], range(13))])],
    "primes": [("a.yaml", [_cell("policy_only", "easy", range(5), range(3), policy="p")])],
}


@pytest.mark.parametrize("name", list(PLANS))
@pytest.mark.parametrize("n", [1, 2, 3, 4, 7])
def test_shards_partition_the_plan_the_same_way_whatever_the_input_order(name, n):
    plans = PLANS[name]
    every = [f"{label}::{t.id}" for label, cells in plans for c in cells for t in c.trials()]
    shards = shard_plan(plans, n)
    flat = [key for keys in shards.keys for key in keys]
    assert sorted(flat) == sorted(every) and len(set(flat)) == len(flat)  # a partition
    assert all(shards.keys), "no shard is empty while the plan has a trial for each"
    shuffled = list(plans)
    random.Random(n).shuffle(shuffled)
    assert shard_plan(shuffled, n) == shards  # configs are ordered by label, not by arrival


def test_shards_balance_cost_and_keep_a_tasks_seeds_together():
    cheap = _cell("workflow", "easy", range(6), range(4), steps=100)  # 24 trials
    dear = _cell("policy_only", "hard", [0], range(4), policy="p", steps=400)  # 4 trials
    shards = shard_plan([("a.yaml", [cheap, dear])], 2)
    # a policy trial costs 300 + 3 * 400 = 1500, a workflow trial 300 + 100 = 400
    assert trial_cost(dear, 0) == 1500 and trial_cost(cheap, 0) == 400
    assert max(shards.costs) - min(shards.costs) <= trial_cost(cheap, 0) * 4  # one group at most
    # the 4 dear trials cost what 15 cheap ones do: their shard gets 4 cheap trials, not 10
    assert sorted(len(keys) for keys in shards.keys) == [8, 20]
    for keys in shards.keys:  # every (cell, task) is whole: its 4 seeds in one shard
        tasks = {key.rsplit("::", 1)[0] for key in keys}
        assert all(sum(k.startswith(t + "::") for k in keys) == 4 for t in tasks)


def test_a_family_that_lengthens_a_tasks_episodes_costs_them_more():
    """grocery_packing task t packs 2 + t % 4 items, 280 steps each: its cost follows."""
    cell = Cell(
        mode="workflow",
        family="grocery_packing",
        variation="object",
        suite="libero_object",
        task_ids=(0, 3),
        seeds=(0,),
    )
    assert trial_cost(cell, 0) == RESET_COST + 2 * 280
    assert trial_cost(cell, 3) == RESET_COST + 5 * 280
    plain = cell.model_copy(update={"family": "libero"})
    assert trial_cost(plain, 3) == RESET_COST + 280  # the suite's own limit


def test_a_group_bigger_than_a_share_is_split_into_runs_of_seeds():
    shards = shard_plan(PLANS["one big task"], 4)
    sizes = [len(keys) for keys in shards.keys]
    assert sorted(sizes) == [3, 3, 3, 4]
    for keys in shards.keys:
        seeds = sorted(int(k.rsplit("seed", 1)[1]) for k in keys)
        assert seeds == list(range(seeds[0], seeds[0] + len(seeds)))  # consecutive


@pytest.mark.parametrize("raw", ["0/4", "5/4", "a/b", "2", "1/0", "-1/4"])
def test_a_bad_shard_spec_names_the_option_and_the_form(raw):
    with pytest.raises(GapError, match=r"--gap-shard .*expected K/N .*e\.g\. --gap-shard 2/4"):
        parse_shard(raw)
    assert str(parse_shard("2/4")) == "2/4"


def _record(**fields) -> TrialResult:
    base = {"nodeid": "x", "config": "c", "mode": "m", "family": "f", "variation": "v"}
    return TrialResult(suite="s", task_id=0, seed=0, **base, **fields)


def test_the_merge_keeps_a_scored_record_over_an_errored_one_else_the_later():
    early = "2026-01-01T10:00:00+00:00"
    late = "2026-01-01T11:00:00+00:00"
    scored, infra = _record(finished_at=early), _record(error="gone", infra_failure=True)
    infra = infra.model_copy(update={"finished_at": late})
    assert choose([(0, infra), (1, scored)]) == (1, "scored over errored")
    assert choose([(0, _record(finished_at=late)), (1, scored)]) == (0, "later finished_at")
    # the same instant in another zone is not later: the earlier input wins the tie
    same = _record(finished_at="2026-01-01T12:00:00+02:00")
    assert choose([(0, _record(finished_at=early)), (1, same)])[0] == 0


# -- real sessions ---------------------------------------------------------------------------------
def _env(**extra) -> dict:
    env = dict(os.environ)
    # The checkout first; what is inherited after it (the fast tier's tripwire, tests/tiers.py)
    inherited = env.get("PYTHONPATH")
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(ROOT), str(TESTS), inherited) if p)
    env["PATH"] = os.pathsep.join([str(BIN), env.get("PATH", "")])
    env.pop("PYTEST_XDIST_WORKER", None)
    return {**env, **{k: str(v) for k, v in extra.items()}}


def _run(cwd: Path, *argv: str, **env) -> subprocess.CompletedProcess:
    return subprocess.run(
        [str(a) for a in argv],
        cwd=cwd,
        env=_env(**env),
        capture_output=True,
        text=True,
        timeout=TIMEOUT,
    )


def _pytest(cwd: Path, *args: str) -> subprocess.CompletedProcess:
    return _run(cwd, sys.executable, "-m", "pytest", *args, "-p", "no:cacheprovider")


def _gap(cwd: Path, *args: str) -> subprocess.CompletedProcess:
    return _run(cwd, BIN / "gap", *args)


def _grid(seeds=(0, 1, 2, 3)) -> dict:
    """24 trials: fake easy + hard, tasks 0-2, `seeds`; easy succeeds on seeds 1 and 2."""
    return {
        "benchmark": {
            "backend": BACKEND,
            "families": ["fake"],
            "variations": ["easy", "hard"],
            "task_ids": [0, 1, 2],
            "seeds": list(seeds),
            "modes": ["workflow"],
            "mode_overrides": {"workflow": {"workflow_dir": "wf"}},
            "gate_threshold": 0.2,
            "output_dir": "runs",
        }
    }


@pytest.fixture(scope="module")
def project(tmp_path_factory) -> Path:
    path = tmp_path_factory.mktemp("shard_project")
    (path / "pytest.ini").write_text("[pytest]\nfilterwarnings =\n    error\n")  # as ours
    shutil.copy(CONFTEST, path / "conftest.py")
    (path / "wf").mkdir()
    (path / "wf" / "workflow.json").write_text(json.dumps(IDLE_THEN_CHECK))
    (path / "bench.yaml").write_text(yaml.safe_dump(_grid()))
    return path


def _run_dir(output: Path) -> Path:
    dirs = sorted(p for p in output.iterdir() if p.is_dir())
    assert len(dirs) == 1, dirs
    return dirs[0]


@pytest.fixture(scope="module")
def runs(project) -> dict[str, Path]:
    """Shards 1..3 of bench.yaml (shard 2 under xdist, 2 workers; shard 3 through `gap
    benchmark --shard`) and one unsharded run."""
    found = {}
    for k in range(1, SHARDS + 1):
        out = project / "out" / f"shard_{k}"
        if k == SHARDS:
            done = _gap(project, "benchmark", "bench.yaml", "--shard", f"{k}/{SHARDS}",
                        "--output-dir", out)  # fmt: skip
        else:
            xdist = ["-n", "2"] if k == 2 else []
            done = _pytest(
                project, "bench.yaml", f"--gap-shard={k}/{SHARDS}", "--gap-output-dir", out, *xdist
            )
        assert done.returncode in (0, 1), done.stdout + done.stderr  # its gate: 2 of 8
        found[f"shard_{k}"] = _run_dir(out)
    done = _pytest(project, "bench.yaml", "--gap-output-dir", project / "out" / "full")
    assert done.returncode == 0, done.stdout + done.stderr  # 6/24 >= 0.2
    found["full"] = _run_dir(project / "out" / "full")
    return found


def _trials(run_dir: Path) -> set[str]:
    return {p.parent.relative_to(run_dir).as_posix() for p in run_dir.rglob("result.json")}


def _counts(run_dir: Path) -> dict:
    summary = json.loads((run_dir / "summary.json").read_text())
    cells = [(c["key"], c["n_trials"], c["n_success"], c["n_planned"]) for c in summary["cells"]]
    gate = summary["gate"]
    keep = ("verdict", "n_trials", "n_success", "success_rate", "completion_rate", "coverage")
    return {"cells": cells, "gate": {k: gate[k] for k in keep}}


def test_shards_of_a_session_partition_its_plan_under_xdist_too(runs):
    shards = [_trials(runs[f"shard_{k}"]) for k in range(1, SHARDS + 1)]
    assert all(shards) and sum(len(s) for s in shards) == len(_trials(runs["full"])) == 24
    assert set().union(*shards) == _trials(runs["full"])  # disjoint (sizes add up) and whole
    manifest = json.loads((runs["shard_2"] / "run_manifest.json").read_text())
    full = json.loads((runs["full"] / "run_manifest.json").read_text())
    assert manifest["shard"] == {
        "spec": "2/3",
        "index": 2,
        "count": 3,
        "plan_digest": full["plan_digest"],
    }
    assert manifest["sessions"][-1]["shard"] == "2/3" and full["shard"] is None
    gate = json.loads((runs["shard_2"] / "summary.json").read_text())["gate"]["coverage"]
    assert gate["planned"] == 8 and gate["deselected"] == 16 and gate["missing"] == []


def test_gap_benchmark_refuses_a_shard_the_plan_cannot_fill_in_one_line(project, tmp_path):
    done = _gap(project, "benchmark", "bench.yaml", "--shard", "25/25", "--output-dir", tmp_path)
    assert done.returncode == 2, done.stdout + done.stderr
    (line,) = done.stderr.strip().splitlines()
    assert "bench.yaml" in line and "24 trials, fewer than 25 shards; use at most 24" in line
    assert not list(tmp_path.iterdir())  # nothing ran, no run dir


def test_merging_the_shards_gives_the_unsharded_runs_summary(project, runs, tmp_path):
    out = tmp_path / "merged"
    shards = [runs[f"shard_{k}"] for k in range(1, SHARDS + 1)]
    done = _gap(project, "merge", *shards, "--out", out)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "shards 1/3, 2/3, 3/3" in done.stdout and "24 of 24 planned" in done.stdout
    assert _counts(out) == _counts(runs["full"])
    assert _trials(out) == _trials(runs["full"])
    episodes = pq.read_table(out / "episodes.parquet")
    assert episodes.num_rows == 24 and set(episodes.column("run_id").to_pylist()) == {"merged"}
    assert (out / "summary.tsv").read_text().splitlines()[0].startswith("mode\t")
    assert (out / "aaa_done_flag.txt").is_file()
    manifest = json.loads((out / "run_manifest.json").read_text())
    assert [i["shard"] for i in manifest["merged_from"]["inputs"]] == ["1/3", "2/3", "3/3"]
    assert len(manifest["sessions"]) == 4  # the three shards' sessions, then the merge
    assert manifest["sessions"][-1]["argv"][0] == "merge" and manifest["shard"] is None


def test_bad_shard_options_stop_the_session_in_one_line(project):
    for raw in ("0/4", "5/4", "a/b"):
        done = _pytest(project, "bench.yaml", "--gap-shard", raw)
        lines = (done.stdout + done.stderr).strip().splitlines()
        assert done.returncode == 2 and len(lines) == 1, lines
        assert f"--gap-shard {raw!r}: expected K/N" in lines[0]
    for xdist in ([], ["-n", "2"]):  # said before any worker starts
        done = _pytest(project, "bench.yaml", "--gap-shard", "30/30", *xdist)
        said = done.stdout + done.stderr
        assert done.returncode == 4 and "INTERNALERROR" not in said, said  # a usage error
        assert "plans 24 trials, fewer than 30 shards; use at most 24" in said


def test_a_merge_missing_a_shard_is_refused_or_written_with_a_failing_gate(project, runs, tmp_path):
    given = [runs["shard_1"], runs["shard_3"]]
    done = _gap(project, "merge", *given, "--out", tmp_path / "m")
    assert done.returncode == 2 and not (tmp_path / "m").exists()
    [line] = done.stderr.strip().splitlines()
    assert "8 of 24 planned trials have no record" in line and "shard 2/3 not given" in line
    done = _gap(project, "merge", *given, "--out", tmp_path / "m", "--allow-partial")
    assert done.returncode == 1, done.stdout + done.stderr
    gate = json.loads((tmp_path / "m" / "summary.json").read_text())["gate"]
    assert gate["verdict"] == "FAIL" and gate["coverage"]["missing"]
    assert any("8 planned trials have no record" in r for r in gate["reasons"])
    assert not (tmp_path / "m" / "aaa_done_flag.txt").exists()
    done = _gap(project, "merge", *given, "--out", tmp_path / "m")  # not a new directory
    assert done.returncode == 2 and "exists and is not empty" in done.stderr


def test_a_trial_in_two_inputs_is_kept_once_by_the_stated_rule(project, runs, tmp_path):
    """Shard 1 again, as a retried task would leave it: one trial an infrastructure failure
    recorded later, one re-run later with a different outcome. The merge keeps the scored
    record over the failure, the later of two scored ones, and reports both."""
    again = tmp_path / "retry"
    shutil.copytree(runs["shard_1"], again)
    keys = sorted(_trials(again))
    failure, rerun = again / keys[0] / "result.json", again / keys[1] / "result.json"
    record = json.loads(failure.read_text())
    record |= {"error": "policy server gone", "infra_failure": True, "exit_code": 137}
    record["finished_at"] = "2099-01-01T00:00:00+00:00"
    failure.write_text(json.dumps(record))
    record = json.loads(rerun.read_text())
    record |= {"success": not record["success"], "finished_at": "2099-01-01T00:00:00+00:00"}
    rerun.write_text(json.dumps(record))
    # and its task's workflow written anew (as an LLM mode would): the merge says it differs
    workflow = again / json.loads(failure.read_text())["workflow"] / "workflow.json"
    workflow.write_text(workflow.read_text() + "\n")
    inputs = [runs["shard_1"], again, runs["shard_2"], runs["shard_3"]]
    done = _gap(project, "merge", *inputs, "--out", tmp_path / "m")
    assert done.returncode in (0, 1), done.stdout + done.stderr
    assert "workflow differs between the inputs" in done.stderr
    assert f"kept the first copy, from {runs['shard_1']}" in done.stderr
    assert "duplicates: 8 trials recorded in more than one input" in done.stdout
    manifest = json.loads((tmp_path / "m" / "run_manifest.json").read_text())
    rules = {d["trial"]: (d["kept"], d["rule"]) for d in manifest["merged_from"]["duplicates"]}
    assert rules[keys[0]] == (str(runs["shard_1"]), "scored over errored")
    assert rules[keys[1]] == (str(again), "later finished_at")
    merged = json.loads((tmp_path / "m" / keys[1] / "result.json").read_text())
    assert merged["success"] is record["success"]
    assert len(_trials(tmp_path / "m")) == 24


def test_a_workflow_two_shards_produced_alike_is_not_said_to_differ(project, runs, tmp_path):
    """A (cell, task) whose seeds are split across shards has its workflow produced in each;
    the copies differ only in what describes each production (produced.json's `produce_s`, an
    LLM production's `calls` and `cached`, its agents' transcripts): the merge keeps one and
    does not warn. The same workflow.json written anew still does (above). Shard 1 is cut here
    into its even and its odd seeds, the odd ones' workflows produced again (slower, from the
    LLM cache)."""
    halves = {parity: tmp_path / f"seeds_{parity}" for parity in ("even", "odd")}
    for parity, half in halves.items():
        shutil.copytree(runs["shard_1"], half)
        for result in sorted(half.rglob("result.json")):
            if json.loads(result.read_text())["seed"] % 2 != (parity == "odd"):
                shutil.rmtree(result.parent)
    produced = sorted(halves["odd"].rglob("produced.json"))
    assert produced
    for path in produced:
        meta = json.loads(path.read_text())
        again = {**meta, "produce_s": meta["produce_s"] + 1.5, "calls": 0, "cached": True}
        path.write_text(json.dumps(again, indent=1))
        (path.parent / "agent_traces").mkdir(exist_ok=True)
        (path.parent / "agent_traces" / "01_planner.json").write_text('{"cached": true}')
    inputs = [halves["even"], halves["odd"], runs["shard_2"], runs["shard_3"]]
    done = _gap(project, "merge", *inputs, "--out", tmp_path / "m")
    assert done.returncode in (0, 1), done.stdout + done.stderr
    assert "24 of 24 planned" in done.stdout, done.stdout + done.stderr
    assert "differs between the inputs" not in done.stderr, done.stderr


def test_run_dirs_of_different_plans_are_refused(project, runs, tmp_path):
    other = tmp_path / "other"
    other.mkdir()
    shutil.copy(project / "conftest.py", other / "conftest.py")
    shutil.copytree(project / "wf", other / "wf")
    (other / "bench.yaml").write_text(yaml.safe_dump(_grid(seeds=(0, 1, 2))))
    done = _pytest(other, "bench.yaml", "--gap-shard=2/3", "--gap-output-dir", other / "out")
    assert done.returncode in (0, 1), done.stdout + done.stderr
    inputs = [runs["shard_1"], _run_dir(other / "out"), runs["shard_3"]]
    done = _gap(project, "merge", *inputs, "--out", tmp_path / "m")
    assert done.returncode == 2 and not (tmp_path / "m").exists()
    [line] = done.stderr.strip().splitlines()
    assert "the inputs come from different plans" in line and "shard 2/3" in line


# -- the cluster examples --------------------------------------------------------------------------
def test_the_slurm_array_and_its_merge_run_as_slurm_would_run_them(project, runs, tmp_path):
    script = (CLUSTER / "slurm_array.sh").read_text()
    [array] = [line for line in script.splitlines() if line.startswith("#SBATCH --array=")]
    first, last = (int(v) for v in array.split("=", 1)[1].split("-"))
    assert first == 1  # --gap-shard is 1-based, as SLURM_ARRAY_TASK_ID is here
    shared = {"GAP_CONFIG": "bench.yaml", "GAP_OUT": tmp_path / "campaign"}
    for k in range(first, last + 1):
        done = _run(
            project,
            "bash",
            CLUSTER / "slurm_array.sh",
            SLURM_ARRAY_TASK_ID=k,
            SLURM_ARRAY_TASK_COUNT=last,
            SLURM_CPUS_PER_TASK=1,
            **shared,
        )
        assert done.returncode == 0, done.stdout + done.stderr
    done = _run(project, "bash", CLUSTER / "slurm_merge.sh", **shared)
    assert done.returncode == 0, done.stdout + done.stderr
    assert f"shards {', '.join(f'{k}/{last}' for k in range(1, last + 1))}" in done.stdout
    assert _counts(tmp_path / "campaign" / "merged") == _counts(runs["full"])


def _container(path: Path) -> tuple[dict, dict]:
    job = yaml.safe_load(path.read_text())
    assert job["kind"] == "Job"
    [container] = job["spec"]["template"]["spec"]["containers"]
    return job, container


def test_the_k8s_indexed_job_and_its_merge_run_as_kubernetes_would_run_them(
    project, runs, tmp_path
):
    job, shard = _container(CLUSTER / "k8s_indexed_job.yaml")
    assert job["spec"]["completionMode"] == "Indexed"
    env = {e["name"]: e["value"] for e in shard["env"]}
    n = job["spec"]["completions"]
    assert int(env["SHARDS"]) == n
    # the same volume path in the merge job: it reads what the shards wrote
    _, merge = _container(CLUSTER / "k8s_merge_job.yaml")
    merge_env = {e["name"]: e["value"] for e in merge["env"]}
    assert merge_env["GAP_OUT"] == env["GAP_OUT"] and merge_env["GAP_CONFIG"] == env["GAP_CONFIG"]
    here = {"GAP_CONFIG": "bench.yaml", "GAP_OUT": tmp_path / "runs", "GAP_WORKERS": 0}
    for index in range(n):  # JOB_COMPLETION_INDEX is 0-based
        done = _run(
            project,
            *shard["command"],
            *shard["args"],
            **{**env, **here},
            JOB_COMPLETION_INDEX=index,
        )
        assert done.returncode == 0, done.stdout + done.stderr
    assert sorted(p.name for p in (tmp_path / "runs").iterdir()) == [
        f"shard_{k}" for k in range(1, n + 1)
    ]
    done = _run(project, *merge["command"], *merge["args"], **{**merge_env, **here})
    assert done.returncode == 0, done.stdout + done.stderr
    assert _counts(tmp_path / "runs" / "merged") == _counts(runs["full"])
