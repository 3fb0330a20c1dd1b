"""The simulator-backend seam (sim/backend.py): the registry, config and plan asking the chosen
backend's catalogue, and whole pytest sessions on the fake backend (tests/fake_backend.py),
which lands by import string without an edit of pytest_gap and never imports a simulator."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from pytest_gap.config import ConfigError, parse_config
from pytest_gap.plan import plan
from pytest_gap.sim import backend as sim
from pytest_gap.sim.pool import EnvPool
from pytest_gap.workflow.executor import run_workflow
from pytest_gap.workflow.schema import Workflow
from tests.fake_session import IDLE_THEN_CHECK, FakeSession
from tests.fake_session import workflow as _workflow

pytest_plugins = ["pytester"]

TESTS = Path(__file__).resolve().parent
ROOT = TESTS.parent
FAKE = "tests.fake_backend:FakeBackend"  # in this process; sessions use fake_backend:FakeBackend


# -- the registry ---------------------------------------------------------------------------------
def test_registry_finds_builtins_entry_points_and_import_strings(tmp_path, monkeypatch, request):
    request.addfinalizer(sim.get_backend.cache_clear)  # forget the entry point's "fake"
    libero = sim.get_backend("libero")
    assert libero.name == "libero" and isinstance(libero, sim.Backend)
    fake = sim.get_backend(FAKE)
    assert fake.name == "fake" and sim.get_backend(FAKE) is fake  # one instance per process

    with pytest.raises(sim.SimInputError) as exc:
        sim.get_backend("liber")
    assert str(exc.value) == (
        "unknown backend 'liber'; did you mean 'libero'? known backends: libero, vla-eval, or an "
        "import string module:Class"
    )
    with pytest.raises(sim.SimInputError, match=r"cannot import nowhere:Sim \(ModuleNotFound"):
        sim.get_backend("nowhere:Sim")
    with pytest.raises(sim.SimInputError, match="is not a Backend"):
        sim.get_backend("pytest_gap.sim.backend:EnvOptions")

    # A distribution that declares the entry point (as a third-party package's metadata does).
    dist = tmp_path / "gap_fake_sim-0.1.dist-info"
    dist.mkdir()
    (dist / "METADATA").write_text("Metadata-Version: 2.1\nName: gap-fake-sim\nVersion: 0.1\n")
    (dist / "entry_points.txt").write_text(f"[pytest_gap.backends]\nfake = {FAKE}\n")
    monkeypatch.syspath_prepend(tmp_path)
    assert sim.known_backends() == ["fake", "libero", "vla-eval"]
    assert sim.get_backend("fake").name == "fake"


def test_families_and_suites_come_from_the_backend_catalogue(tmp_path):
    workflow = tmp_path / "wf"
    workflow.mkdir()
    (workflow / "workflow.json").write_text(json.dumps(IDLE_THEN_CHECK))
    grid = {
        "benchmark": {
            "backend": FAKE,
            "families": ["fake"],
            "modes": ["workflow"],
            "task_ids": [1],
            "n_seeds": 2,
            "mode_overrides": {"workflow": {"workflow_dir": str(workflow)}},
        }
    }
    cells = plan(parse_config(grid, "grid.yaml", tmp_path))
    assert [(c.backend, c.family, c.variation, c.suite) for c in cells] == [
        (FAKE, "fake", "easy", "fake_easy"),
        (FAKE, "fake", "hard", "fake_hard"),
    ]
    suites = {
        "backend": FAKE,
        "suites": [{"suite_name": "fake_easy", "workflow_dir": str(workflow)}],
    }
    (cell,) = plan(parse_config(suites, "suites.yaml", tmp_path))
    assert (cell.backend, cell.column, cell.suite, cell.task_ids) == (
        FAKE,
        "fake_easy",
        "fake_easy",
        (0, 1, 2, 3),
    )

    # Validation asks the chosen backend: LIBERO's families are unknown to the fake one.
    wrong = {"benchmark": {**grid["benchmark"], "families": ["posvar"]}}
    with pytest.raises(ConfigError) as exc:
        parse_config(wrong, "grid.yaml", tmp_path)
    assert exc.value.problems == ["benchmark.families: unknown family 'posvar'; use one of fake"]
    bad = {"suites": [{"suite_name": "fake_broken"}, {"suite_name": "fake/nope"}], "backend": FAKE}
    with pytest.raises(ConfigError) as exc:
        parse_config(bad, "suites.yaml", tmp_path)
    assert exc.value.problems == [
        "suites.0.suite_name: fake suite 'fake_broken' is not usable: it is broken on purpose",
        "suites.1.suite_name: unknown variation 'nope' of family fake: use one of ['easy', 'hard']",
    ]
    unknown = {"benchmark": {"backend": "vla_eval", "families": ["whatever"]}}
    with pytest.raises(ConfigError) as exc:
        parse_config(unknown, "grid.yaml", tmp_path)
    assert exc.value.problems == [
        "benchmark.backend: unknown backend 'vla_eval'; did you mean 'vla-eval'? known backends: "
        "libero, vla-eval, or an import string module:Class"
    ]
    misplaced = {"backend": "libero", **grid}
    with pytest.raises(ConfigError, match="backend: a grid config names its simulator in bench"):
        parse_config(misplaced, "grid.yaml", tmp_path)


def test_libero_catalogue_validates_without_a_physics_engine():
    """Checking and planning a LIBERO config reads the catalogue only: no MuJoCo, no robosuite."""
    code = (
        "import sys, pytest_gap.sim.libero_backend as lb\n"
        "from pytest_gap.config import parse_config\n"
        "from pytest_gap.plan import plan\n"
        "c = parse_config({'benchmark': {'families': ['posvar', 'libero_pro'], 'n_seeds': 1}})\n"
        "assert len(plan(c)) > 10\n"
        "assert lb.LiberoBackend().n_init_states('libero_object', 3) == 50\n"
        "print(sorted(m for m in ('mujoco', 'robosuite') if m in sys.modules))\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True, cwd=ROOT
    )
    assert out.stdout.strip() == "[]"


def test_gap_lists_a_backends_suites_and_families():
    path = [str(TESTS), str(ROOT), os.environ.get("PYTHONPATH")]  # inherited: tests/tiers.py
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in path if p)}
    gap = [sys.executable, "-m", "pytest_gap.cli"]
    args = ["--backend", "fake_backend:FakeBackend"]
    families = subprocess.run([*gap, "families", *args], capture_output=True, text=True, env=env)
    assert families.returncode == 0, families.stderr
    assert families.stdout.split() == [
        "fake/easy",
        "->",
        "fake_easy",
        "fake/hard",
        "->",
        "fake_hard",
    ]
    suites = subprocess.run([*gap, "suites", *args], capture_output=True, text=True, env=env)
    assert "fake_easy" in suites.stdout and "fake_broken" in suites.stdout
    assert "not usable: it is broken on purpose" in suites.stdout
    one = subprocess.run(
        [*gap, "suites", "fake_hard", *args], capture_output=True, text=True, env=env
    )
    assert one.stdout.splitlines()[:2] == [
        "fake_hard: 4 tasks, max_steps 20",
        "    0    5 init states  pick up the block 0 and place it in the bin",
    ]
    wrong = subprocess.run([*gap, "families", "--backend", "fake"], capture_output=True, text=True)
    assert wrong.returncode == 2 and wrong.stderr.count("\n") == 1
    assert "unknown backend 'fake'; known backends: libero" in wrong.stderr


def test_a_skill_that_needs_a_scene_fails_clearly_on_a_sceneless_env():
    pool = EnvPool(max_envs=2)
    env = pool.get("fake_easy", 0, backend=FAKE)
    assert pool.get("fake_easy", 0, backend=sim.get_backend(FAKE)) is env
    with pytest.raises(sim.SimInputError, match="unknown LIBERO suite 'fake_easy'"):
        pool.get("fake_easy", 0)  # the key names the backend: LIBERO has no such suite
    env.reset(4)
    assert isinstance(env, sim.Env) and env.scene is None
    homing = Workflow.model_validate(
        _workflow(
            {
                "home": {"type": "tool", "skill": "home", "next": "done"},
                "done": {"type": "end", "status": "success"},
            },
            "home",
        )
    )
    result = run_workflow(homing, env)
    assert result.exit_status == "error" and not result.success
    prefix = (
        "home: skill home queries the scene (poses, gripper, cameras), which this backend's "
        "envs do not offer; only scene-free skills run here ("
    )
    assert result.error.startswith(prefix) and result.error.endswith(")")
    # the built-in scene-free skills, and any a conftest of an earlier in-process session added
    named = result.error.removeprefix(prefix)[:-1].split(", ")
    assert {"check_success", "read_task", "run_policy"} <= set(named) and "home" not in named


# -- whole sessions -------------------------------------------------------------------------------
@pytest.fixture
def fake_session(pytester):
    """A runner of sessions on the fake backend (tests/fake_session.py), config first."""
    session = FakeSession(pytester)

    def run(config: dict, *args, **env):
        session.config(config)
        return session.run("bench.yaml", *args, **env)

    run.modules = session.modules
    run.loaded_simulators = session.loaded_simulators
    return run


def _run_dir(output: Path) -> Path:
    (run_dir,) = [p for p in output.iterdir() if p.is_dir()]
    return run_dir


def test_grid_session_on_the_fake_backend(fake_session, pytester):
    grid = {
        "benchmark": {
            "backend": "fake_backend:FakeBackend",
            "families": ["fake"],
            "modes": ["workflow"],
            "task_ids": [0, 2],
            "n_seeds": 3,
            "gate_threshold": 0.3,
            "output_dir": "runs",
            "mode_overrides": {"workflow": {"workflow_dir": "wf"}},
        }
    }
    collected = fake_session(grid, "--collect-only", "-q", "-k", "easy and task02")
    assert [x for x in collected.outlines if x.startswith("bench.yaml::")] == [
        f"bench.yaml::workflow::fake/easy::task02::seed00{s}" for s in range(3)
    ]
    result = fake_session(grid, "-rf")
    out = result.stdout.str()
    # fake_easy succeeds on seeds 1 and 2 of each task, fake_hard never: 4 of 12.
    result.assert_outcomes(passed=4, failed=8)
    assert result.ret == 0, out
    assert "gate PASS: success_rate=0.333 threshold=0.300" in out
    assert "task not completed: task 0 seed 0 (init state 0)" in out
    run_dir = _run_dir(pytester.path / "runs")
    tsv = (run_dir / "summary.tsv").read_text().splitlines()
    assert tsv[1].startswith("workflow\t\tfake\teasy\t\t0.667\t0.833\t0.667\t4\t6\t0")
    assert tsv[2].startswith("workflow\t\tfake\thard\t\t0.000\t0.500\t0.000\t0\t6\t0")
    ok = json.loads((run_dir / "workflow/fake/easy/task_02/seed_001/result.json").read_text())
    assert ok["success"] and ok["steps"] == 3 and ok["exit_status"] == "task_success"
    assert ok["suite"] == "fake_easy" and ok["prompt"] == (
        "pick up the block 2 and place it in the bin"
    )
    failed = json.loads((run_dir / "workflow/fake/hard/task_00/seed_002/result.json").read_text())
    assert failed["steps"] == 4 and failed["completion"] == 0.5 and failed["init_state"] == 2
    assert fake_session.loaded_simulators() == []


def test_xdist_session_with_a_crash_on_the_fake_backend(fake_session, pytester):
    suites = {
        "backend": "fake_backend:FakeBackend",
        "trials": {"output_dir": "runs", "trials_per_generation": 3},
        "suites": [
            {"suite_name": "fake_easy", "task_ids": [0, 1], "workflow_dir": "wf"},
            {"suite_name": "fake/hard", "task_ids": [3], "seeds": [7], "workflow_dir": "wf"},
        ],
        "gate_threshold": 0.0,
    }
    result = fake_session(suites, "-n", "2", GAP_TEST_FAKE_CRASH="1:2", GAP_TEST_FAKE_STEP_S="0.01")
    out = result.stdout.str()
    result.assert_outcomes(passed=3, failed=4)
    assert result.ret == 1, out  # the crashed trial errors its cell: the gate fails
    assert "gate FAIL: success_rate=0.500 threshold=0.000 (errored cells: fake_easy)" in out
    run_dir = _run_dir(pytester.path / "runs")
    crashed = json.loads((run_dir / "suites/fake_easy/task_01/seed_002/result.json").read_text())
    assert crashed["exit_code"] == 137 and crashed["infra_failure"]
    workers = {
        json.loads(p.read_text())["worker"]
        for p in run_dir.rglob("result.json")
        if json.loads(p.read_text()).get("worker")
    }
    assert len(workers) >= 2  # two workers ran trials (one replaced after the crash)
    hard = json.loads((run_dir / "suites/fake__hard/task_03/seed_007/result.json").read_text())
    assert hard["init_state"] == 2 and not hard["success"]
    records = [json.loads(x) for x in fake_session.modules.read_text().splitlines()]
    assert len(records) >= 3  # the controller and its workers
    assert fake_session.loaded_simulators() == []
