"""Real pytest sessions (subprocesses) over benchmark YAMLs: collection, trials, xdist workers
and device pinning, the watchdog, crashes, the gate, resume and --lf.

The harness logic runs on the fake backend (tests/fake_session.py): the sessions are real, only
the simulator is a double, so a timing test's margins do not depend on LIBERO's env creation
under load. One session runs end to end on real LIBERO."""

from __future__ import annotations

import fcntl
import json
import os
import subprocess
import sys
import threading
import time
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest
import yaml

from tests.fake_session import BACKEND, TESTS, FakeSession, workflow

pytest_plugins = ["pytester"]

ROOT = Path(__file__).resolve().parent.parent
PICK_PLACE = ROOT / "examples/workflows/pick_place"
TIMEOUT = 300


def _workflow(pytester, name: str, nodes: dict, start: str) -> str:
    path = pytester.path / "workflows" / name
    path.mkdir(parents=True, exist_ok=True)
    data = {"version": 1, "name": name, "start": start, "nodes": nodes}
    (path / "workflow.json").write_text(json.dumps(data))
    return str(path)


def _give_up(pytester) -> str:
    """A workflow that homes the arm and gives up: a fast, honest failure."""
    return _workflow(
        pytester,
        "give_up",
        {
            "home": {"type": "tool", "skill": "home", "next": "failed"},
            "failed": {"type": "end", "status": "failure"},
        },
        "home",
    )


def _one_skill(pytester, skill: str, inputs: dict) -> str:
    return _workflow(
        pytester,
        skill,
        {
            "act": {"type": "tool", "skill": skill, "inputs": inputs, "next": "failed"},
            "failed": {"type": "end", "status": "failure"},
        },
        "act",
    )


def _config(pytester, name: str, data: dict) -> Path:
    path = pytester.path / name
    path.write_text(yaml.safe_dump(data))
    return path


def _run(pytester, *args, **env):
    for key, value in env.items():
        pytester._monkeypatch.setenv(key, value)
    return pytester.runpytest_subprocess(*args, timeout=TIMEOUT)


def _collect(pytester, *args):
    """A session that stops at collection or at its config: in-process (nothing of it is
    process-level, and a fresh interpreter per session cost ~1 s each)."""
    return pytester.runpytest_inprocess(*args)


def _results(run_dir: Path) -> dict[str, dict]:
    return {
        p.parent.relative_to(run_dir).as_posix(): json.loads(p.read_text())
        for p in run_dir.rglob("result.json")
    }


def _run_dir(output: Path) -> Path:
    dirs = sorted(p for p in output.iterdir() if p.is_dir())
    assert len(dirs) == 1, dirs
    return dirs[0]


@pytest.fixture
def fake(pytester) -> FakeSession:
    return FakeSession(pytester)


# -- collection ------------------------------------------------------------------------------------
def test_collection_ids_keywords_and_markers(pytester):
    _config(
        pytester,
        "grid.yaml",
        {
            "benchmark": {
                "families": ["libero", "posvar"],
                "variations": ["object", "pos_var"],
                "modes": ["workflow", "policy_only"],
                "policies": ["pi05-libero"],
                "task_ids": [3],
                "n_seeds": 2,
                "mode_overrides": {"workflow": {"workflow_dir": str(PICK_PLACE)}},
            },
            "policies": {"pi05-libero": {"url": "ws://127.0.0.1:9"}},
        },
    )
    result = _collect(pytester, "grid.yaml", "--collect-only", "-q")
    ids = [line for line in result.outlines if line.startswith("grid.yaml::")]
    assert ids == [
        f"grid.yaml::{mode}::{fv}::task03::seed00{s}"
        for mode in ("workflow", "policy_only@pi05-libero")
        for fv in ("libero/object", "posvar/pos_var")
        for s in (0, 1)
    ]
    picked = _collect(pytester, "grid.yaml", "--collect-only", "-q", "-k", "posvar and policy_only")
    assert [x for x in picked.outlines if x.startswith("grid.yaml::")] == ids[6:]
    marked = _collect(
        pytester, "grid.yaml", "--collect-only", "-q", "-m", "gap_mode(name='workflow')"
    )
    assert [x for x in marked.outlines if x.startswith("grid.yaml::")] == ids[:4]
    by_family = _collect(pytester, "grid.yaml", "--collect-only", "-q", "--gap-families=libero")
    assert len([x for x in by_family.outlines if x.startswith("grid.yaml::")]) == 4


@pytest.mark.parametrize(
    ("data", "args", "message"),
    [
        ({"benchmark": {"familys": []}}, [], "benchmark.familys: unknown key"),
        ({"base": "x.yaml", "benchmark": {}}, [], "base: benchmark YAMLs are standalone"),
        ({"trials": {}}, [], "neither a benchmark: block"),
        (
            {"suites": [{"suite_name": "libero_object", "task_ids": [0]}]},
            ["--gap-families=posvar"],
            "--families/--modes restrict a grid",
        ),
        (
            {"skills": {"planner": "curobo"}, "benchmark": {"families": ["libero"]}},
            [],
            "skills.planner: cuRobo motion planning is not supported by this version",
        ),
        (
            {"skills": {"perception": "wrist"}, "benchmark": {"families": ["libero"]}},
            [],
            "skills.perception: Input should be 'privileged' or 'policy_cameras'",
        ),
    ],
)
def test_config_errors_exit_2_with_the_message(pytester, data, args, message):
    _config(pytester, "bad.yaml", data)
    result = _collect(pytester, "bad.yaml", *args)
    assert result.ret == 2
    assert message in result.stdout.str()
    assert "Traceback" not in result.stdout.str()


def test_two_configs_sharing_a_run_dir_is_a_config_error(pytester):
    for name in ("a.yaml", "b.yaml"):
        _config(pytester, name, {"benchmark": {"families": ["libero"], "variations": ["object"]}})
    result = _collect(pytester, "a.yaml", "b.yaml", "--collect-only", "-q")
    assert result.ret == 2
    assert "a.yaml writes to the same run dir" in result.stdout.str()


# -- trials, reports, the gate, --lf and resume ---------------------------------------------------
def test_a_real_libero_session_records_results_junit_and_the_gate(pytester):
    """The main path end to end on real LIBERO: a pick-and-place that succeeds, a give-up that
    fails with a prompt of its own, result.json, the filled workflow, the trace, summary.tsv,
    JUnit properties and the gate."""
    give_up = _give_up(pytester)
    base = {
        "trials": {"output_dir": "runs"},
        "suites": [
            {"suite_name": "libero_object", "task_ids": [0], "workflow_dir": str(PICK_PLACE)},
            {
                "suite_name": "libero_object",
                "task_ids": [0],
                "seeds": [1],
                "workflow_dir": give_up,
                "task_prompts": {0: "pick up the milk and place it in the basket"},
            },
        ],
        "gate_threshold": 0.5,
    }
    _config(pytester, "bench.yaml", base)
    first = _run(pytester, "bench.yaml", "--junitxml=junit.xml", "-rf")
    out = first.stdout.str()
    assert first.ret == 0, out  # one trial failed, but 1/2 clears the 0.5 gate
    first.assert_outcomes(passed=1, failed=1)
    assert "gate PASS: success_rate=0.500 threshold=0.500" in out
    assert "task not completed: task 0 seed 1 (init state 1)" in out
    assert "reason: workflow ended with end_failure at failed" in out
    # task_prompts: the message names the prompt the workflow was given, then LIBERO's.
    assert (
        "prompt: 'pick up the milk and place it in the basket'; "
        "env prompt: 'pick up the alphabet soup and place it in the basket'"
    ) in out
    run_dir = _run_dir(pytester.path / "runs")
    results = _results(run_dir)
    ok = results["suites/libero_object/task_00/seed_000"]
    assert ok["success"] and ok["completion"] == 1.0 and ok["exit_code"] == 0
    assert ok["prompt"] == "pick up the alphabet soup and place it in the basket"
    assert (run_dir / ok["trace"]).is_file()
    filled = json.loads(
        (run_dir / "suites/libero_object/task_00/workflow/workflow.json").read_text()
    )
    assert filled["nodes"]["pick"]["inputs"]["name"] == "alphabet soup"
    failed = results["suites/libero_object_02/task_00/seed_001"]
    assert not failed["success"] and failed["init_state"] == 1 and failed["steps"] > 0
    assert failed["prompt"] == "pick up the milk and place it in the basket"
    assert failed["env_prompt"] == "pick up the alphabet soup and place it in the basket"
    produced = json.loads((run_dir / failed["workflow"] / "produced.json").read_text())
    assert produced["prompt"] == failed["prompt"]
    tsv = (run_dir / "summary.tsv").read_text().splitlines()
    assert tsv[1].startswith(
        "workflow\t\tlibero\tobject\tlibero_object\t1.000\t1.000\t1.000\t1\t1\t0"
    )
    assert tsv[2].startswith("workflow\t\tlibero\tobject\tlibero_object_02\t0.000\t")
    assert (run_dir / "aaa_done_flag.txt").is_file()
    cases = {c.get("name"): c for c in ET.parse(pytester.path / "junit.xml").iter("testcase")}
    props = {p.get("name"): p.get("value") for p in cases["seed000"].iter("property")}
    assert set(props) == {
        "success",
        "completion",
        "reward",
        "steps",
        "seed",
        "init_state",
        "exit_code",
        "wall_s",
        "infra_failure",
        "video",
        "prompt",
        "env_prompt",
        "workflow",
    }
    assert props["success"] == "True" and props["exit_code"] == "0"
    given = {p.get("name"): p.get("value") for p in cases["seed001"].iter("property")}
    assert given["prompt"] == "pick up the milk and place it in the basket"
    assert given["env_prompt"] == "pick up the alphabet soup and place it in the basket"


def _lf_then_resume_in_process(fake) -> Path:
    """--lf, then --gap-resume over a corrupt record with a stricter gate: three sessions in
    this process (it may have loaded a simulator, so they record no modules); the run dir."""
    fake.setenv(GAP_TEST_FAKE_MODULES=None)
    base = {
        "backend": BACKEND,
        "trials": {"output_dir": "runs"},
        "suites": [  # the fake succeeds on fake_easy seed 1, fails on seed 0
            {"suite_name": "fake_easy", "task_ids": [0], "seeds": [1], "workflow_dir": "wf"},
            {"suite_name": "fake_easy", "task_ids": [0], "seeds": [0], "workflow_dir": "wf"},
        ],
        "gate_threshold": 0.5,
    }
    fake.config(base)
    first = fake.run_inprocess("bench.yaml")
    first.assert_outcomes(passed=1, failed=1)
    assert first.ret == 0 and "gate PASS: success_rate=0.500" in first.stdout.str()
    run_dir = fake.run_dir()
    ok = fake.results(run_dir)["suites/fake_easy/task_00/seed_001"]
    failed = fake.results(run_dir)["suites/fake_easy_02/task_00/seed_000"]
    assert ok["success"] and not failed["success"]

    # --lf re-runs only the failed trial, into the same run dir; the summary keeps both.
    failed_record = run_dir / "suites/fake_easy_02/task_00/seed_000/result.json"
    os.utime(failed_record, (1, 1))  # an old record: sessions here are well under 1 s apart
    second = fake.run_inprocess("bench.yaml", "--lf")
    second.assert_outcomes(failed=1, deselected=1)
    assert fake.run_dir() == run_dir
    again = fake.results(run_dir)
    assert again["suites/fake_easy/task_00/seed_001"] == ok
    assert failed_record.stat().st_mtime > 1  # re-run (written anew)
    assert "gate PASS: success_rate=0.500" in second.stdout.str()
    tsv = (run_dir / "summary.tsv").read_text().splitlines()
    assert [row.split("\t")[4:6] for row in tsv[1:3]] == [
        ["fake_easy", "1.000"],
        ["fake_easy_02", "0.000"],
    ]

    # Resume with a stricter gate: nothing valid is re-run, a corrupt record is, and the gate
    # now fails the session.
    corrupt = run_dir / "suites/fake_easy_02/task_00/seed_000/result.json"
    corrupt.write_text('{"version": 1, "nodeid": ')
    fake.config({**base, "gate_threshold": 0.9})
    third = fake.run_inprocess("bench.yaml", "--gap-resume")
    out = third.stdout.str()
    assert third.ret == 1
    assert "gate FAIL: success_rate=0.500 threshold=0.900" in out
    assert "corrupt" in out and "the trial was re-run" in out
    assert "recorded by an earlier session, not re-run" not in out  # the failed one re-ran
    assert fake.results(run_dir)["suites/fake_easy/task_00/seed_001"] == ok  # not re-run
    assert json.loads(corrupt.read_text())["seed"] == 0
    return run_dir


def test_lf_and_resume_rerun_only_failed_or_corrupt_trials_and_regate_in_process(fake):
    """The fast tier's --lf and --gap-resume: the in-process sessions of the test below."""
    run_dir = _lf_then_resume_in_process(fake)
    manifest = json.loads((run_dir / "run_manifest.json").read_text())
    assert [s["resume"] for s in manifest["sessions"]] == [False, False, True]


def test_lf_and_resume_rerun_only_failed_or_corrupt_trials_and_regate(fake):
    """The first three sessions run in-process (_lf_then_resume_in_process); the last, a resume
    that replays every record, is a process of its own and shows that no simulator was imported
    for it."""
    run_dir = _lf_then_resume_in_process(fake)
    fourth = fake.run(
        "bench.yaml", "--gap-resume", "--gap-no-gate", GAP_TEST_FAKE_MODULES=fake.modules
    )
    assert fourth.ret == 1  # pytest's own status: a trial failed
    assert "recorded by an earlier session, not re-run" in fourth.stdout.str()
    assert "[--gap-no-gate: not deciding the exit status]" in fourth.stdout.str()
    manifest = json.loads((run_dir / "run_manifest.json").read_text())
    assert manifest["config"].endswith("bench.yaml") and len(manifest["sessions"]) == 4
    assert manifest["sessions"][2]["resume"] is True
    assert fake.loaded_simulators() == []


def test_cells_without_their_producer_fail_as_errored(fake):
    fake.config(
        {
            "benchmark": {
                "backend": BACKEND,
                "families": ["fake"],
                "variations": ["easy"],
                "modes": ["llm_generation"],
                "task_ids": [0],
                "n_seeds": 1,
                "gate_threshold": 0.0,
                "output_dir": "runs",
            }
        },
        "grid.yaml",
    )
    result = fake.run_inprocess("grid.yaml")
    assert result.ret == 1
    out = result.stdout.str()
    assert "not run: task 0 seed 0" in out and "llm.model is not set" in out
    assert "gate FAIL: success_rate=0.000 threshold=0.000" in out
    assert "errored cells: llm_generation fake/easy" in out
    tsv = (fake.run_dir() / "summary.tsv").read_text()
    assert "1 of 1 trials errored: " in tsv and "llm.model is not set" in tsv
    assert "llm_generation\tERR" in tsv


# -- xdist, the watchdog and crashes --------------------------------------------------------------
def test_xdist_workers_are_pinned_round_robin(fake):
    fake.config(
        {
            "benchmark": {
                "backend": BACKEND,
                "families": ["fake"],
                "variations": ["hard"],
                "modes": ["workflow"],
                "task_ids": [0, 1],
                "n_seeds": 2,
                "gate_threshold": 0.0,
                "output_dir": "runs",
                "record_video": True,
                "mode_overrides": {"workflow": {"workflow_dir": "wf"}},
            }
        }
    )
    result = fake.run("bench.yaml", "-n", "2", GAP_MUJOCO_EGL_DEVICES="3,5")
    assert result.ret == 0, result.stdout.str()
    run_dir = fake.run_dir()
    results = fake.results(run_dir)
    assert len(results) == 4
    workers = set()
    for record in results.values():
        device = {"gw0": "3", "gw1": "5"}[record["worker"]]
        assert record["devices"] == {
            "CUDA_VISIBLE_DEVICES": device,
            "MUJOCO_EGL_DEVICE_ID": device,
            "env_egl_device": device,
        }
        workers.add(record["worker"])
    assert workers == {"gw0", "gw1"}
    # Each worker exported its device before it built an env, and built its envs for it.
    made = {
        (
            r["environ"]["CUDA_VISIBLE_DEVICES"],
            r["environ"]["MUJOCO_EGL_DEVICE_ID"],
            r["egl_device"],
        )
        for r in fake.env_records()
    }
    assert made == {("3", "3", 3), ("5", "5", 5)}
    videos = sorted(p.name for p in (run_dir / "videos").iterdir())
    assert videos == [
        f"workflow__fake__hard__task0{t}__seed00{s}__fail.mp4" for t in (0, 1) for s in (0, 1)
    ]
    record = results["workflow/fake/hard/task_01/seed_001"]
    linked = run_dir / "videos" / videos[-1]
    assert linked.stat().st_ino == (run_dir / record["video"]).stat().st_ino  # a hard link
    assert fake.loaded_simulators() == []


_ROBOSUITE_CHECK = """
import importlib, json, os, sys
out = []
for cuda, egl in json.loads(sys.argv[1]):
    os.environ.update(CUDA_VISIBLE_DEVICES=cuda, MUJOCO_EGL_DEVICE_ID=egl)
    try:  # robosuite checks the two variables when binding_utils is imported
        if "robosuite.utils.binding_utils" in sys.modules:
            importlib.reload(sys.modules["robosuite.utils.binding_utils"])
        else:
            import robosuite.utils.binding_utils
        out.append(True)
    except AssertionError as exc:
        assert "MUJOCO_EGL_DEVICE_ID needs to be set" in str(exc), exc
        out.append(False)
print(json.dumps(out))
"""


def _robosuite_accepts(pairs: list[tuple[str, str]]) -> list[bool]:
    """robosuite's own import-time check of MUJOCO_EGL_DEVICE_ID against CUDA_VISIBLE_DEVICES,
    for each (CUDA_VISIBLE_DEVICES, MUJOCO_EGL_DEVICE_ID) in turn (an accepted one first)."""
    env = dict(os.environ, MUJOCO_GL="osmesa", PYOPENGL_PLATFORM="osmesa")
    proc = subprocess.run(
        [sys.executable, "-c", _ROBOSUITE_CHECK, json.dumps(pairs)],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])


def test_suites_cells_stagger_over_each_workers_own_devices(fake):
    """Four suites cells (offsets 0..3) on two workers over four (fake) GPUs: each worker owns
    two, exported before the simulator loads, and builds each cell's env for one of its own."""
    fake.config(
        {
            "backend": BACKEND,
            "trials": {"output_dir": "runs"},
            "suites": [
                {"suite_name": "fake_easy", "task_ids": [0], "workflow_dir": "wf"} for _ in range(4)
            ],
            "gate_threshold": 0.0,
        }
    )
    result = fake.run("bench.yaml", "-n", "2", GAP_MUJOCO_EGL_DEVICES="3,5,7,9")
    assert result.ret == 0, result.stdout.str()
    results = fake.results(fake.run_dir())
    own = {"gw0": ["3", "7"], "gw1": ["5", "9"]}
    offsets = {"fake_easy": 0, "fake_easy_02": 1, "fake_easy_03": 2, "fake_easy_04": 3}
    built = set()
    for key, record in results.items():
        assert record["exit_code"] == 0 and record["error"] is None, record
        mine = own[record["worker"]]
        devices = record["devices"]
        assert devices["CUDA_VISIBLE_DEVICES"] == ",".join(mine)
        assert devices["MUJOCO_EGL_DEVICE_ID"] == mine[0]  # never changed after pinning
        assert devices["env_egl_device"] == mine[offsets[key.split("/")[1]] % 2], key
        built.add((devices["CUDA_VISIBLE_DEVICES"], devices["env_egl_device"]))
    assert {egl for _, egl in built} == {"3", "5", "7", "9"}  # every GPU got a cell
    for made in fake.env_records():  # what the process had exported when it built the env
        cuda = made["environ"]["CUDA_VISIBLE_DEVICES"]
        assert str(made["egl_device"]) in cuda.split(",")
        assert made["environ"]["MUJOCO_EGL_DEVICE_ID"] == cuda.split(",")[0]
    # each env's device would pass robosuite's own check; the old stagger (a device outside
    # the worker's own) would not
    pairs = [*sorted(built), ("5", "7")]
    assert _robosuite_accepts(pairs) == [True] * len(built) + [False]


def _hold_slot_until(lock: Path, started: Path, hold_s: float) -> threading.Thread:
    """Hold `lock` (a num_workers slot) from this process until `hold_s` after `started` (a
    trial's running.json) appears, as another trial holding the slot would."""
    lock.parent.mkdir(parents=True)
    held = lock.open("w")
    fcntl.flock(held, fcntl.LOCK_EX)

    def release():
        deadline = time.monotonic() + TIMEOUT
        while not started.exists() and time.monotonic() < deadline:
            time.sleep(0.05)
        time.sleep(hold_s)
        held.close()  # closing the file releases the flock

    thread = threading.Thread(target=release, daemon=True)
    thread.start()
    return thread


def _slotted(timeout_s: float, workflow_dir: str = "wf", seed: int = 1) -> dict:
    """One fake_easy trial of task 1 whose suite has a single slot."""
    suite = {"suite_name": "fake_easy", "task_ids": [1], "seeds": [seed], "num_workers": 1}
    return {
        "backend": BACKEND,
        "trials": {"output_dir": "runs", "task_timeout_secs": timeout_s},
        "suites": [{**suite, "workflow_dir": workflow_dir}],
        "gate_threshold": 0.0,
    }


FIXED_RUN = "runs/20200101_000000"  # a run dir --gap-resume adopts: its slots exist beforehand
SLOT = ".slots/suites__fake_easy/slot_0.lock"
IDLE_20 = workflow(
    {
        "idle": {"type": "tool", "skill": "idle", "inputs": {"steps": 20}, "next": "end"},
        "end": {"type": "end", "status": "success"},
    },
    "idle",
)


@pytest.mark.parametrize("method", ["signal", "thread"])
def test_waiting_for_a_num_workers_slot_is_not_charged_to_the_watchdog(fake, method):
    """A 7 s watchdog; the suite's only slot is held for 6.5 s after the trial starts, and the
    trial's own work takes 1.5 s (20 steps of 0.075 s) once it has the slot: 8 s in all, yet
    only its own time counts towards the watchdog (the wait is bounded by the budget on its
    own). Charging the wait would time the trial out (124) at 7 s, before its last steps.
    The trial's own time (1.5 s, and what it does before asking for the slot: 0.6-1.3 s on a
    loaded 2-core machine) stays seconds under the watchdog, so load does not time it out."""
    fake.config(_slotted(7, fake.workflow("idle_20", IDLE_20), seed=0))  # seed 0: no success
    trial = fake.path / FIXED_RUN / "suites/fake_easy/task_01/seed_000"
    holder = _hold_slot_until(fake.path / FIXED_RUN / SLOT, trial / "running.json", 6.5)
    result = fake.run(
        "bench.yaml",
        "-n",
        "2",
        f"--timeout-method={method}",
        "--gap-resume",
        GAP_TEST_FAKE_STEP_S="0.075",
    )
    holder.join(timeout=TIMEOUT)
    record = json.loads((trial / "result.json").read_text())
    assert record["exit_code"] == 0 and record["exit_status"] == "end_success", record
    assert record["steps"] == 20
    # It really queued behind the holder: 6.5 s from running.json, less what the trial did
    # before asking for the slot
    assert record["slot_wait_s"] > 2, record
    assert record["wall_s"] > 7, record  # longer than the watchdog, counting the wait
    assert result.ret == 0, result.stdout.str()


def test_a_trial_that_gets_no_slot_within_its_budget_is_an_errored_trial(fake):
    """Another process holds the suite's only slot for the whole session: the trial waits its
    2 s budget, then is recorded as an infrastructure failure, not as a 124 timeout."""
    fake.config(_slotted(2))
    slot = fake.path / FIXED_RUN / SLOT
    slot.parent.mkdir(parents=True)
    with slot.open("w") as held:
        fcntl.flock(held, fcntl.LOCK_EX)
        result = fake.run("bench.yaml", "--gap-resume")
    record = fake.results(fake.path / FIXED_RUN)["suites/fake_easy/task_01/seed_001"]
    assert record["exit_code"] == 1 and record["infra_failure"], record
    assert record["error"].startswith(
        "no num_workers slot of suite fake_easy came free within the trial's 2 s budget "
        "(num_workers 1"
    )
    assert record["slot_wait_s"] >= 2
    assert result.ret == 1  # an errored trial errors its cell: the gate fails
    assert "infrastructure failure: task 1 seed 1" in result.stdout.str()


def _hang_and_control(timeout_s: float) -> dict:
    """Task 0 seed 0 (hangs on request) under a `timeout_s` watchdog; task 1 seed 1, which
    succeeds, with room to spare."""
    return {
        "backend": BACKEND,
        "trials": {"output_dir": "runs", "task_timeout_secs": timeout_s},
        "suites": [
            {"suite_name": "fake_easy", "task_ids": [0], "workflow_dir": "wf"},
            {
                "suite_name": "fake_easy",
                "task_ids": [1],
                "seeds": [1],
                "workflow_dir": "wf",
                "timeout_secs": 60,
            },
        ],
        "gate_threshold": 0.0,
    }


def test_watchdog_timeout_is_recorded_as_124_and_the_run_goes_on(fake):
    fake.config(_hang_and_control(2))
    result = fake.run("bench.yaml", GAP_TEST_FAKE_HANG="0:0")
    result.assert_outcomes(passed=1, failed=1)
    results = fake.results(fake.run_dir())
    stalled = results["suites/fake_easy/task_00/seed_000"]
    assert stalled["exit_code"] == 124 and not stalled["infra_failure"]
    assert "timed out after 2 s" in stalled["reason"]
    assert stalled["init_state"] == 0
    assert results["suites/fake_easy_02/task_01/seed_001"]["exit_code"] == 0
    assert result.ret == 0  # timeouts are failed trials, not errored cells; 0.0 gate passes


def test_a_worker_killed_by_the_thread_watchdog_is_recorded_as_124(fake):
    """The watchdog counts the item's setup too (here 1 s of a 2 s limit): the controller
    judges the dead worker by the same clock, so the kill is a timeout, not a crash."""
    fake.config(_hang_and_control(2))
    result = fake.run(
        "bench.yaml",
        "-n",
        "2",
        "--timeout-method=thread",
        GAP_TEST_FAKE_HANG="0:0",
        GAP_TEST_FAKE_SETUP_S="1",
    )
    results = fake.results(fake.run_dir())
    stalled = results["suites/fake_easy/task_00/seed_000"]
    assert stalled["exit_code"] == 124 and not stalled["infra_failure"], stalled
    assert "the watchdog killed its worker" in stalled["reason"]
    assert results["suites/fake_easy_02/task_01/seed_001"]["exit_code"] == 0
    assert result.ret == 0, result.stdout.str()  # a timeout is a failed trial, not an error


def test_a_killed_worker_is_recorded_as_137_and_the_run_goes_on(fake):
    fake.config(
        {
            "backend": BACKEND,
            "trials": {"output_dir": "runs"},
            "suites": [
                {
                    "suite_name": "fake_easy",
                    "task_ids": [0],
                    "seeds": [0, 1],
                    "trials_per_generation": 2,
                    "workflow_dir": "wf",
                },
                {"suite_name": "fake_easy", "task_ids": [1, 2], "workflow_dir": "wf"},
            ],
            "gate_threshold": 0.0,
        }
    )
    result = fake.run("bench.yaml", "-n", "2", GAP_TEST_FAKE_KILL="0:0,0:1")
    out = result.stdout.str()
    assert result.ret == 1, out  # the crashed trial errors its cell: the gate fails
    run_dir = fake.run_dir()
    results = fake.results(run_dir)
    for seed in (0, 1):  # the second trial of the crashed scope still ran (and was killed)
        crashed = results[f"suites/fake_easy/task_00/seed_00{seed}"]
        assert crashed["exit_code"] == 137 and crashed["infra_failure"]
        assert "worker process died" in crashed["error"]
    assert {k for k in results} >= {
        "suites/fake_easy_02/task_01/seed_000",
        "suites/fake_easy_02/task_02/seed_000",
    }
    tsv = (run_dir / "summary.tsv").read_text().splitlines()
    assert tsv[1].split("\t")[9:11] == ["0", "2"]  # n_trials 0, n_infra 2
    assert "errored cells: fake_easy" in out


def test_a_session_killed_with_sigkill_resumes_without_losing_trials(fake):
    fake.config(
        {
            "backend": BACKEND,
            "trials": {"output_dir": "runs"},
            "suites": [
                {"suite_name": "fake_easy", "task_ids": [0], "workflow_dir": "wf"},
                {"suite_name": "fake_easy", "task_ids": [0], "seeds": [1], "workflow_dir": "wf"},
            ],
            "gate_threshold": 0.0,
        }
    )
    killed = fake.run("bench.yaml", GAP_TEST_FAKE_KILL="0:1")  # the session itself is SIGKILLed
    assert killed.ret == -9, killed.stdout.str()
    run_dir = fake.run_dir()
    before = fake.results(run_dir)
    assert list(before) == ["suites/fake_easy/task_00/seed_000"]
    assert not (run_dir / "summary.tsv").exists()
    resumed = fake.run("bench.yaml", "--gap-resume", GAP_TEST_FAKE_KILL=None)
    assert resumed.ret == 0, resumed.stdout.str()
    after = fake.results(run_dir)
    assert after["suites/fake_easy/task_00/seed_000"] == before["suites/fake_easy/task_00/seed_000"]
    assert after["suites/fake_easy_02/task_00/seed_001"]["success"]
    assert len((run_dir / "summary.tsv").read_text().split("\n\n")[0].splitlines()) == 3


# -- the command line and the Python API -----------------------------------------------------------
def test_gap_benchmark_exit_codes_and_api(fake, monkeypatch):
    from pytest_gap.benchmark import run

    monkeypatch.chdir(fake.path)  # run()'s pytest inherits the fake session's PYTHONPATH
    monkeypatch.syspath_prepend(TESTS)  # run() checks the config here first
    grid = fake.config(
        {
            "benchmark": {
                "backend": BACKEND,
                "families": ["fake"],
                "variations": ["hard"],
                "modes": ["workflow"],
                "task_ids": [0],
                "n_seeds": 1,
                "num_workers": 1,
                "gate_threshold": 0.5,
                "output_dir": "runs",
                "mode_overrides": {"workflow": {"workflow_dir": "wf"}},
            }
        },
        "grid.yaml",
    )
    summary = run(grid, quiet=True)
    assert summary.ok and not summary.gated and summary.n_trials == 1
    assert summary.success_rate == 0.0 and summary.run_dir.parent == fake.path / "runs"
    assert summary.cells[0].key == "workflow/fake/hard"
    assert summary.gate_line == (
        "gate FAIL: success_rate=0.000 threshold=0.500 (success rate below threshold (0/1)); "
        "recorded 1/1 planned"
    )
    gap = [str(Path(os.sys.executable).with_name("gap"))]
    ungated = fake.pytester.run(*gap, "benchmark", str(grid), "--resume", timeout=TIMEOUT)
    assert ungated.ret == 0
    # its progress line, for the one (replayed) trial: no trial ran, so no time to go by
    assert "gap progress grid.yaml: 1/1 trials, 0 succeeded (0.00), 0 errored" in (
        ungated.stdout.str()
    )
    gated = fake.pytester.run(*gap, "benchmark", str(grid), "--resume", "--gate", timeout=TIMEOUT)
    assert gated.ret == 1
    assert "gate FAIL: success_rate=0.000 threshold=0.500" in gated.stdout.str()
    suites = _config(fake.pytester, "suites.yaml", {"suites": [{"suite_name": "libero_object"}]})
    wrong = fake.pytester.run(*gap, "benchmark", str(suites), "--families", "posvar", timeout=60)
    assert wrong.ret == 2 and "restrict a grid" in wrong.stderr.str()
    bad = _config(fake.pytester, "bad.yaml", {"benchmark": {"n_seeds": 0}})
    broken = fake.pytester.run(*gap, "benchmark", str(bad), timeout=60)
    assert broken.ret == 2 and "benchmark.n_seeds" in broken.stderr.str()
