"""Whose failure an exception is (pytest_gap/faults.py), and what a trial does with a harness
fault: re-run once on a fresh env, both attempts recorded, the faults counted (issue 48).

The classification is tested on real tracebacks: exceptions raised by real code (a skill of
tests/, numpy, the standard library's threads, the host's file table, MuJoCo's renderer, a NaN
action refused by LiberoEnv), never on hand-built frames. The sessions run in this process on
the fake backend; the LIBERO tests share one env, and the re-run on LIBERO builds two.
"""

from __future__ import annotations

import errno
import json
import os
import resource
import threading

import numpy as np
import pyarrow.parquet as pq
import pytest
from pydantic import BaseModel

from pytest_gap.faults import harness_fault
from pytest_gap.report import FAULT_COLUMNS
from pytest_gap.sim.backend import EnvOptions
from pytest_gap.sim.render import CameraFrame
from pytest_gap.skills.catalogue import load_builtin_skills
from pytest_gap.skills.context import SkillContext
from pytest_gap.skills.registry import skill
from pytest_gap.workflow.executor import run_workflow
from pytest_gap.workflow.schema import validate_workflow
from tests.fake_backend import FakeEnv
from tests.fake_session import BACKEND, FakeSession, workflow

pytest_plugins = ["pytester"]

# The built-in skills are imported on the first lookup. An in-process session that made that
# first lookup would drop their modules with the rest of what it imported (pytester restores
# sys.modules), and a later lookup here would import them anew: `locate` then met a Box class
# of the new module against its output model's Box of the old one. So they are imported now.
load_builtin_skills()


def _raised(fn, *args) -> BaseException:
    try:
        fn(*args)
    except BaseException as exc:  # the test inspects whatever was raised
        return exc
    raise AssertionError(f"{fn.__name__} raised nothing")


def _skill_bug():
    return 1 / 0


def _singular_inverse():
    return np.linalg.inv(np.zeros((2, 2)))


def _out_of_memory():
    return np.empty(2**52)  # 32 PiB: the allocation fails at once, a real MemoryError


# -- the classification, on real tracebacks -------------------------------------------------------
def test_a_skills_own_bug_stays_the_graphs_even_through_numpy():
    assert harness_fault(_raised(_skill_bug)) is None
    # raised inside numpy, called by the skill: numpy's frames say nothing, the skill's decide
    exc = _raised(_singular_inverse)
    assert type(exc).__module__.startswith("numpy") and harness_fault(exc) is None


def test_the_hosts_resource_failures_are_faults_wherever_raised(monkeypatch):
    fault = harness_fault(_raised(_out_of_memory))
    assert fault.kind == "host" and fault.error.startswith("MemoryError: Unable to allocate")
    assert fault.where.startswith("tests.test_faults:") and "_out_of_memory" in fault.where

    # no file descriptor left: the process's table filled for real, under a lowered limit
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    opened = []
    resource.setrlimit(resource.RLIMIT_NOFILE, (len(os.listdir("/proc/self/fd")) + 4, hard))
    try:
        exc = _raised(lambda: [opened.append(os.open(os.devnull, os.O_RDONLY)) for _ in range(64)])
    finally:
        for fd in opened:
            os.close(fd)
        resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))
    assert isinstance(exc, OSError) and exc.errno == errno.EMFILE
    assert harness_fault(exc).kind == "host"

    # no thread: CPython's own message, from threading.Thread.start (the clone refused)
    def refuse(*_):
        raise RuntimeError("can't start new thread")

    monkeypatch.setattr(threading, "_start_new_thread", refuse)
    exc = _raised(threading.Thread(target=print).start)
    assert (
        harness_fault(exc).kind == "host" and "can't start new thread" in harness_fault(exc).error
    )

    # a resource failure a skill wrapped in its own error is still the host's
    def wrapped():
        try:
            _out_of_memory()
        except MemoryError as cause:
            raise RuntimeError("could not build the grasp map") from cause

    assert harness_fault(_raised(wrapped)).kind == "host"


def test_the_simulator_layer_refusing_its_caller_is_the_callers_its_own_errors_are_not():
    frame = CameraFrame(camera="agentview", rgb=None)
    refusal = _raised(frame.mask, "bowl")  # SimInputError: rendered without segmentation
    assert refusal.__traceback__ is not None and harness_fault(refusal) is None
    broken = CameraFrame(camera="agentview", rgb=None, depth=np.ones((2, 2)), intrinsics=None)
    fault = harness_fault(_raised(broken.points))  # a TypeError raised in sim/render.py itself
    assert fault.kind == "renderer" and fault.where.startswith("pytest_gap.sim.render:")
    assert "in points" in fault.where and fault.error.startswith("TypeError:")


# -- the executor: a fault ends the run as an infrastructure failure, a bug as the graph's -------
class _Stepped(BaseModel):
    steps: int


# seed -> the env each attempt of `_test_faulty` on it ran on, and whether the envs of the
# attempts before it were closed by then
ATTEMPTS: dict[int, list] = {}
CLOSED_BEFORE: dict[int, list[bool]] = {}


@skill(scene=False)
def _test_faulty(ctx: SkillContext) -> _Stepped:
    """Fault injection by seed (tests/test_faults.py): seed 0 has a bug of the skill; seed 1
    finds the host out of memory on its first attempt only, seed 2 on every attempt; then three
    control steps (the fake's seeds 1 and 2 succeed on the third)."""
    seed = ctx.env.episode.seed
    earlier = ATTEMPTS.setdefault(seed, [])
    CLOSED_BEFORE.setdefault(seed, []).append(all(env.closed for env in earlier))
    earlier.append(ctx.env)
    if seed == 0:
        _skill_bug()
    if seed == 2 or (seed == 1 and len(ATTEMPTS[seed]) == 1):
        _out_of_memory()
    for _ in range(3):
        ctx.act([0.0] * 6 + [-1.0])
    return _Stepped(steps=3)


FAULTY = workflow(
    {
        "act": {"type": "tool", "skill": "_test_faulty", "next": "done"},
        "done": {"type": "end", "status": "success"},
    },
    "act",
    "faulty",
)


def test_the_executor_ends_a_fault_as_infrastructure_and_a_bug_as_the_graphs():
    ATTEMPTS.clear()
    graph = validate_workflow(FAULTY)
    env = FakeEnv("fake_easy", 0, EnvOptions(), None)
    env.reset(0)
    bug = run_workflow(graph, env)
    assert (bug.exit_status, bug.infra_failure, bug.fault) == ("error", False, None)
    assert bug.error == "act: ZeroDivisionError: division by zero"
    env.reset(2)
    oom = run_workflow(graph, env)
    assert (oom.exit_status, oom.infra_failure) == ("infra_error", True)
    assert oom.fault.kind == "host" and oom.error.startswith("act: MemoryError: Unable")


# -- a session: the re-run, the records, the counts, the terminal line ----------------------------
def test_a_faulted_trial_is_rerun_once_on_a_fresh_env_and_counted(pytester):
    ATTEMPTS.clear()
    CLOSED_BEFORE.clear()
    fake = FakeSession(pytester)
    fake.config(
        {
            "benchmark": {
                "backend": BACKEND,
                "families": ["fake"],
                "variations": ["easy"],
                "modes": ["workflow"],
                "task_ids": [0],
                "n_seeds": 3,
                "output_dir": "runs",
                "mode_overrides": {"workflow": {"workflow_dir": fake.workflow("w", FAULTY)}},
            }
        }
    )
    out = fake.run_inprocess("bench.yaml").stdout.str()
    run_dir = fake.run_dir()
    records = {k.rsplit("/", 1)[1]: v for k, v in fake.results(run_dir).items()}
    bug, once, twice = records["seed_000"], records["seed_001"], records["seed_002"]
    # seed 0: the skill's bug is the graph's failure, scored, never re-run
    assert bug["error"] is None and bug["exit_status"] == "error" and not bug["earlier_attempts"]
    assert len(ATTEMPTS[0]) == 1 and bug["fault"] is None
    # seed 1: faulted, re-run on a fresh env (the faulted one closed), scored on the re-run
    (first,) = once["earlier_attempts"]
    assert first["fault"]["kind"] == "host" and "Unable to allocate" in first["error"]
    assert first["rerun_because"].endswith("re-run once on a fresh env")
    assert once["success"] and once["error"] is None and once["fault"] is None
    faulted, fresh = ATTEMPTS[1]
    assert faulted is not fresh and CLOSED_BEFORE[1] == [True, True]  # closed before the re-run
    # seed 2: faulted again on the fresh env: an infrastructure failure, out of every rate
    assert twice["infra_failure"] and twice["fault"]["kind"] == "host"
    assert twice["error"].endswith("the re-run on a fresh env faulted again")
    assert len(twice["earlier_attempts"]) == 1 and len(ATTEMPTS[2]) == 2
    # the counts, per cell and in all
    summary = json.loads((run_dir / "summary.json").read_text())
    (cell,) = summary["cells"]
    counts = {name: cell[name] for name in FAULT_COLUMNS}
    assert counts == {
        "harness_faults": 3,
        "rerun_after_fault": 2,
        "rerun_scored": 1,
        "rerun_success": 1,
    }
    assert {name: summary[name] for name in FAULT_COLUMNS} == counts
    assert (cell["n_trials"], cell["n_success"], cell["n_infra"]) == (2, 1, 1)
    header, row = (run_dir / "summary.tsv").read_text().splitlines()[:2]
    assert header.split("\t")[-4:] == list(FAULT_COLUMNS) and row.split("\t")[-4:] == [
        "3",
        "2",
        "1",
        "1",
    ]
    table = pq.read_table(run_dir / "episodes.parquet").to_pydict()
    assert table["harness_faults"] == [0, 1, 2]
    assert table["is_rerun_after_fault"] == [False, True, True]
    assert (
        "harness faults (simulator, renderer, host): 3; 2 trial(s) re-run once on a fresh env: "
        "1 scored (1 succeeded), 1 faulted again (infrastructure failures)"
    ) in out


# -- real LIBERO ---------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def libero_env():
    from pytest_gap.sim.libero import make_env

    with make_env("libero_object", 0) as env:
        yield env


def _break_the_renderer(env) -> None:
    """Close another renderer of this scene's model with the env's own renderer current, as
    mujoco.Renderer.close does it (in whatever GL context is current): issue 48's fault, which
    leaves every later render of the env reading freed GL objects."""
    import mujoco

    model = env.raw.sim.model._model
    other = mujoco.Renderer(model, 64, 64)
    env.scene.render("agentview", height=256, width=256)
    other.close()


def test_a_fault_in_mujocos_renderer_is_the_renderers_a_nan_action_the_policys(libero_env):
    import mujoco

    libero_env.reset(0)
    _break_the_renderer(libero_env)
    exc = _raised(lambda: libero_env.scene.render("agentview", depth=False))
    libero_env.scene.close()  # its broken renderers go; the next render makes new ones
    assert isinstance(exc, IndexError) and "out of bounds for axis 0" in str(exc)
    fault = harness_fault(exc)
    assert fault.kind == "renderer", fault
    assert (
        fault.where.startswith("mujoco.rendering.classic.renderer:") and "in render" in fault.where
    )
    assert "IndexError" in fault.traceback and "sim/render.py" in fault.traceback

    # MuJoCo's C core reports its fatal errors (mju_error) as mujoco.FatalError: a simulator
    # fault, whoever called it (robosuite in bring_up, under a memory cap)
    def fatal():
        raise mujoco.FatalError("Could not allocate memory")

    assert harness_fault(_raised(fatal)).kind == "simulator"
    # a NaN action: LiberoEnv refuses it inside pytest_gap.sim, and it is the policy's
    nan = _raised(libero_env.step, [float("nan")] * 7)
    assert "expected 7 finite numbers" in str(nan) and harness_fault(nan) is None


@skill
def _test_nan_policy(ctx: SkillContext) -> _Stepped:
    """Fault injection (tests/test_faults.py): a policy that answers NaN."""
    ctx.act([float("nan")] * 7)
    return _Stepped(steps=1)


def test_a_nan_action_ends_the_run_as_the_graphs_failure(libero_env):
    libero_env.reset(0)
    graph = validate_workflow(
        workflow(
            {
                "act": {"type": "tool", "skill": "_test_nan_policy", "next": "done"},
                "done": {"type": "end", "status": "success"},
            },
            "act",
        )
    )
    run = run_workflow(graph, libero_env)
    assert (run.exit_status, run.infra_failure, run.fault) == ("error", False, None)
    assert run.error.startswith("act: SimInputError: action [nan, nan")


BROKEN: list = []  # the envs `_test_break_renderer` broke


@skill
def _test_break_renderer(ctx: SkillContext) -> _Stepped:
    """Fault injection (tests/test_faults.py): issue 48's renderer fault, on the first env it
    runs on only."""
    if not BROKEN:
        BROKEN.append(ctx.env)
        _break_the_renderer(ctx.env)
    return _Stepped(steps=0)


def test_a_renderer_fault_on_libero_is_rerun_on_a_fresh_env(tmp_path):
    """The trial of issue 48: its pooled env's renderer broken, `locate` raises inside
    MuJoCo's segmentation render; the trial is re-run on a fresh env and scored there."""
    from pytest_gap.config.document import parse_config
    from pytest_gap.plan import plan
    from pytest_gap.run.trial import TrialRun
    from pytest_gap.sim.pool import EnvPool

    BROKEN.clear()
    graph = workflow(
        {
            "break": {"type": "tool", "skill": "_test_break_renderer", "next": "find"},
            "find": {
                "type": "tool",
                "skill": "locate",
                "inputs": {"name": "basket"},
                "next": "end",
            },
            "end": {"type": "end", "status": "failure"},
        },
        "break",
    )
    (tmp_path / "wf").mkdir()
    (tmp_path / "wf/workflow.json").write_text(json.dumps(graph))
    config = {
        "benchmark": {
            "families": ["libero"],
            "variations": ["object"],
            "modes": ["workflow"],
            "task_ids": [0],
            "n_seeds": 1,
            "mode_overrides": {"workflow": {"workflow_dir": str(tmp_path / "wf")}},
        },
        "trials": {"max_steps": 5},
    }
    trial = plan(parse_config(config, "grid.yaml", tmp_path))[0].trials()[0]
    pool = EnvPool(max_envs=2)
    try:
        result = TrialRun(
            trial, tmp_path / "run", nodeid="n", config="grid.yaml", pool=pool
        ).execute()
    finally:
        pool.close()
    (first,) = result.earlier_attempts
    # depth decoded from freed buffers (a NaN cast warning, an error under this suite's
    # filterwarnings) or the segmentation ids (IndexError), both inside mujoco's render
    assert first.fault.kind == "renderer" and first.error.startswith("find: ")
    assert first.fault.where.startswith("mujoco.rendering.classic.renderer:")
    assert first.fault.error.split(":")[0] in ("IndexError", "RuntimeWarning"), first.fault
    assert not result.errored and result.exit_status == "end_failure", result.reason
    assert (pool.stats.created, pool.stats.discarded) == (2, 1) and BROKEN[0]._closed
    saved = json.loads((tmp_path / "run" / trial.key / "result.json").read_text())
    assert saved["earlier_attempts"][0]["fault"]["kind"] == "renderer"


class _OutOfMemoryOnce:
    """Fault injection: an env pool whose first env build finds the host out of memory."""

    def __init__(self, pool):
        self.pool, self.builds = pool, 0

    def get(self, *args, **kwargs):
        self.builds += 1
        if self.builds == 1:
            _out_of_memory()
        return self.pool.get(*args, **kwargs)

    def __getattr__(self, name):
        return getattr(self.pool, name)


def test_a_fault_outside_the_workflow_is_rerun_too(tmp_path):
    """A harness fault before any node runs (the env build, as robosuite's MjSim allocation
    under a memory cap) is re-run like one in a node; its traceback stays in the record."""
    from pytest_gap.config.document import parse_config
    from pytest_gap.plan import plan
    from pytest_gap.run.trial import TrialRun
    from pytest_gap.sim.pool import EnvPool

    config = {
        "benchmark": {
            "backend": "tests.fake_backend:FakeBackend",
            "families": ["fake"],
            "variations": ["easy"],
            "modes": ["workflow"],
            "task_ids": [0],
            "seeds": [4],  # `_test_faulty` never faults on it; the fake succeeds on it
            "mode_overrides": {"workflow": {"workflow_dir": str(tmp_path / "wf")}},
        }
    }
    (tmp_path / "wf").mkdir()
    (tmp_path / "wf/workflow.json").write_text(json.dumps(FAULTY))
    trial = plan(parse_config(config, "grid.yaml", tmp_path))[0].trials()[0]
    pool = _OutOfMemoryOnce(EnvPool())
    try:
        result = TrialRun(trial, tmp_path / "run", nodeid="n", config="g", pool=pool).execute()
    finally:
        pool.close()
    (first,) = result.earlier_attempts
    assert first.fault.kind == "host" and first.error.startswith("MemoryError: Unable")
    assert (
        first.error.endswith("(traceback in this record's fault)")
        and "in get" in first.fault.traceback
    )
    assert result.success and not result.errored and pool.builds == 2
