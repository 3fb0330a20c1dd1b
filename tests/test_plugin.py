"""Real pytest sessions (subprocesses) over benchmark YAMLs: collection, trials on real LIBERO,
xdist workers and device pinning, the watchdog, crashes, the gate, resume and --lf."""

from __future__ import annotations

import json
import os
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest
import yaml

pytest_plugins = ["pytester"]

ROOT = Path(__file__).resolve().parent.parent
PICK_PLACE = ROOT / "examples/workflows/pick_place"
DOUBLES = Path(__file__).with_name("gap_doubles.py")
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
def doubles(pytester):
    pytester.makeconftest(DOUBLES.read_text())


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
    result = _run(pytester, "grid.yaml", "--collect-only", "-q")
    ids = [line for line in result.outlines if line.startswith("grid.yaml::")]
    assert ids == [
        f"grid.yaml::{mode}::{fv}::task03::seed00{s}"
        for mode in ("workflow", "policy_only@pi05-libero")
        for fv in ("libero/object", "posvar/pos_var")
        for s in (0, 1)
    ]
    picked = _run(pytester, "grid.yaml", "--collect-only", "-q", "-k", "posvar and policy_only")
    assert [x for x in picked.outlines if x.startswith("grid.yaml::")] == ids[6:]
    marked = _run(pytester, "grid.yaml", "--collect-only", "-q", "-m", "gap_mode(name='workflow')")
    assert [x for x in marked.outlines if x.startswith("grid.yaml::")] == ids[:4]
    by_family = _run(pytester, "grid.yaml", "--collect-only", "-q", "--gap-families=libero")
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
    ],
)
def test_config_errors_exit_2_with_the_message(pytester, data, args, message):
    _config(pytester, "bad.yaml", data)
    result = _run(pytester, "bad.yaml", *args)
    assert result.ret == 2
    assert message in result.stdout.str()
    assert "Traceback" not in result.stdout.str()


def test_two_configs_sharing_a_run_dir_is_a_config_error(pytester):
    for name in ("a.yaml", "b.yaml"):
        _config(pytester, name, {"benchmark": {"families": ["libero"], "variations": ["object"]}})
    result = _run(pytester, "a.yaml", "b.yaml", "--collect-only", "-q")
    assert result.ret == 2
    assert "a.yaml writes to the same run dir" in result.stdout.str()


# -- trials, reports, the gate, --lf and resume ---------------------------------------------------
def test_trials_results_junit_gate_lf_and_resume(pytester):
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

    # --lf re-runs only the failed trial, into the same run dir; the summary keeps both.
    second = _run(pytester, "bench.yaml", "--lf")
    second.assert_outcomes(failed=1, deselected=1)
    assert _run_dir(pytester.path / "runs") == run_dir
    again = _results(run_dir)
    assert again["suites/libero_object/task_00/seed_000"] == ok
    assert again["suites/libero_object_02/task_00/seed_001"]["started_at"] >= failed["started_at"]
    assert "gate PASS: success_rate=0.500" in second.stdout.str()

    # Resume with a stricter gate: nothing valid is re-run, a corrupt record is, and the gate
    # now fails the session.
    corrupt = run_dir / "suites/libero_object_02/task_00/seed_001/result.json"
    corrupt.write_text('{"version": 1, "nodeid": ')
    _config(pytester, "bench.yaml", {**base, "gate_threshold": 0.9})
    third = _run(pytester, "bench.yaml", "--gap-resume")
    out = third.stdout.str()
    assert third.ret == 1
    assert "gate FAIL: success_rate=0.500 threshold=0.900" in out
    assert "corrupt" in out and "the trial was re-run" in out
    assert "recorded by an earlier session, not re-run" not in out  # the failed one re-ran
    final = _results(run_dir)
    assert final["suites/libero_object/task_00/seed_000"] == ok  # not re-run
    assert json.loads(corrupt.read_text())["seed"] == 1
    fourth = _run(pytester, "bench.yaml", "--gap-resume", "--gap-no-gate")
    assert fourth.ret == 1  # pytest's own status: a trial failed
    assert "recorded by an earlier session, not re-run" in fourth.stdout.str()
    assert "[--gap-no-gate: not deciding the exit status]" in fourth.stdout.str()
    manifest = json.loads((run_dir / "run_manifest.json").read_text())
    assert manifest["config"].endswith("bench.yaml") and len(manifest["sessions"]) == 4
    assert manifest["sessions"][2]["resume"] is True


def test_cells_without_their_producer_fail_as_errored(pytester):
    _config(
        pytester,
        "grid.yaml",
        {
            "benchmark": {
                "families": ["libero"],
                "variations": ["object"],
                "modes": ["llm_generation"],
                "task_ids": [0],
                "n_seeds": 1,
                "gate_threshold": 0.0,
                "output_dir": "runs",
            }
        },
    )
    result = _run(pytester, "grid.yaml")
    assert result.ret == 1
    out = result.stdout.str()
    assert "not run: task 0 seed 0" in out and "llm.model is not set" in out
    assert "gate FAIL: success_rate=0.000 threshold=0.000" in out
    assert "errored cells: llm_generation libero/object" in out
    tsv = (_run_dir(pytester.path / "runs") / "summary.tsv").read_text()
    assert "1 of 1 trials errored: " in tsv and "llm.model is not set" in tsv
    assert "llm_generation\tERR" in tsv


# -- xdist, the watchdog and crashes --------------------------------------------------------------
def test_xdist_workers_are_pinned_round_robin(pytester):
    _config(
        pytester,
        "grid.yaml",
        {
            "benchmark": {
                "families": ["libero"],
                "variations": ["object"],
                "modes": ["workflow"],
                "task_ids": [0, 1],
                "n_seeds": 2,
                "gate_threshold": 0.0,
                "output_dir": "runs",
                "record_video": True,
                "mode_overrides": {"workflow": {"workflow_dir": _give_up(pytester)}},
            }
        },
    )
    # The ids are fake (this machine has one EGL device): videos render with OSMesa.
    result = _run(
        pytester, "grid.yaml", "-n", "2", GAP_MUJOCO_EGL_DEVICES="3,5", MUJOCO_GL="osmesa"
    )
    assert result.ret == 0, result.stdout.str()
    results = _results(_run_dir(pytester.path / "runs"))
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
    run_dir = _run_dir(pytester.path / "runs")
    videos = sorted(p.name for p in (run_dir / "videos").iterdir())
    assert videos == [
        f"workflow__libero__object__task0{t}__seed00{s}__fail.mp4" for t in (0, 1) for s in (0, 1)
    ]
    record = results["workflow/libero/object/task_01/seed_001"]
    linked = run_dir / "videos" / videos[-1]
    assert linked.stat().st_ino == (run_dir / record["video"]).stat().st_ino  # a hard link


def _robosuite_accepts(cuda_visible_devices: str, egl_device: str) -> bool:
    """robosuite's own import-time check of MUJOCO_EGL_DEVICE_ID against CUDA_VISIBLE_DEVICES."""
    import subprocess
    import sys

    env = dict(os.environ, MUJOCO_GL="osmesa", PYOPENGL_PLATFORM="osmesa")
    env |= {"CUDA_VISIBLE_DEVICES": cuda_visible_devices, "MUJOCO_EGL_DEVICE_ID": egl_device}
    proc = subprocess.run(
        [sys.executable, "-c", "import robosuite.utils.binding_utils"],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 0 or "MUJOCO_EGL_DEVICE_ID needs to be set" in proc.stderr, (
        proc.stderr
    )
    return proc.returncode == 0


def test_suites_cells_stagger_over_each_workers_own_devices(pytester):
    """Four suites cells (offsets 0..3) on two workers over four (fake) GPUs: each worker owns
    two, exported before the simulator loads, and builds each cell's env for one of its own."""
    give_up = _give_up(pytester)
    _config(
        pytester,
        "bench.yaml",
        {
            "trials": {"output_dir": "runs"},
            "suites": [
                {"suite_name": "libero_object", "task_ids": [0], "workflow_dir": give_up}
                for _ in range(4)
            ],
            "gate_threshold": 0.0,
        },
    )
    result = _run(pytester, "bench.yaml", "-n", "2", GAP_MUJOCO_EGL_DEVICES="3,5,7,9")
    assert result.ret == 0, result.stdout.str()
    results = _results(_run_dir(pytester.path / "runs"))
    own = {"gw0": ["3", "7"], "gw1": ["5", "9"]}
    offsets = {"libero_object": 0, "libero_object_02": 1, "libero_object_03": 2}
    offsets["libero_object_04"] = 3
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
    for cuda, egl in built:  # each env's device would pass robosuite's own check
        assert _robosuite_accepts(cuda, egl), (cuda, egl)
    assert not _robosuite_accepts("5", "7")  # the old stagger: a device outside the worker's


def test_watchdog_timeout_is_recorded_as_124_and_the_run_goes_on(pytester, doubles):
    _config(
        pytester,
        "bench.yaml",
        {
            "trials": {"output_dir": "runs", "task_timeout_secs": 20},
            "suites": [
                {
                    "suite_name": "libero_object",
                    "task_ids": [0],
                    "workflow_dir": _one_skill(pytester, "stall", {"seconds": 120}),
                },
                {
                    "suite_name": "libero_object",
                    "task_ids": [0],
                    "workflow_dir": _give_up(pytester),
                },
            ],
            "gate_threshold": 0.0,
        },
    )
    result = _run(pytester, "bench.yaml")
    result.assert_outcomes(failed=2)
    results = _results(_run_dir(pytester.path / "runs"))
    stalled = results["suites/libero_object/task_00/seed_000"]
    assert stalled["exit_code"] == 124 and not stalled["infra_failure"]
    assert "timed out after 20 s" in stalled["reason"]
    assert stalled["init_state"] == 0
    assert results["suites/libero_object_02/task_00/seed_000"]["exit_code"] == 0
    assert result.ret == 0  # timeouts are failed trials, not errored cells; 0.0 gate passes


def _stall_then_end(pytester, seconds: float) -> str:
    return _workflow(
        pytester,
        "stall_then_end",
        {
            "stall": {
                "type": "tool",
                "skill": "stall",
                "inputs": {"seconds": seconds},
                "next": "end",
            },
            "end": {"type": "end", "status": "success"},
        },
        "stall",
    )


@pytest.mark.parametrize("method", ["signal", "thread"])
def test_waiting_for_a_num_workers_slot_is_not_charged_to_the_watchdog(pytester, doubles, method):
    """Two workers, one slot, a 40 s watchdog, trials that hold the slot 22 s each: the second
    trial's wait plus its own 22 s exceed 40 s, yet only its own time counts (env setup, up to
    18 s on a loaded machine, plus its 22 s)."""
    _config(
        pytester,
        "bench.yaml",
        {
            "trials": {"output_dir": "runs", "task_timeout_secs": 40},
            "suites": [
                {
                    "suite_name": "libero_object",
                    "task_ids": [0],
                    "seeds": [0, 1],
                    "num_workers": 1,
                    "workflow_dir": _stall_then_end(pytester, 22),
                }
            ],
            "gate_threshold": 0.0,
        },
    )
    result = _run(pytester, "bench.yaml", "-n", "2", f"--timeout-method={method}")
    results = _results(_run_dir(pytester.path / "runs"))
    assert {r["worker"] for r in results.values()} == {"gw0", "gw1"}, results
    for record in results.values():
        assert record["exit_code"] == 0 and record["exit_status"] == "end_success", record
    waited = max(results.values(), key=lambda r: r["slot_wait_s"])
    assert waited["slot_wait_s"] > 5, results  # it really queued behind the other trial
    assert waited["wall_s"] > 40, results  # longer than the watchdog, counting the wait
    assert result.ret == 0, result.stdout.str()


def test_a_trial_that_gets_no_slot_within_its_budget_is_an_errored_trial(pytester, doubles):
    """Another process holds the suite's only slot for the whole session: the trial waits its
    12 s budget, then is recorded as an infrastructure failure, not as a 124 timeout."""
    import fcntl

    _config(
        pytester,
        "bench.yaml",
        {
            "trials": {"output_dir": "runs", "task_timeout_secs": 12},
            "suites": [
                {
                    "suite_name": "libero_object",
                    "task_ids": [0],
                    "num_workers": 1,
                    "workflow_dir": _give_up(pytester),
                }
            ],
            "gate_threshold": 0.0,
        },
    )
    slots = pytester.path / "runs/20200101_000000/.slots/suites__libero_object"
    slots.mkdir(parents=True)
    with (slots / "slot_0.lock").open("w") as held:
        fcntl.flock(held, fcntl.LOCK_EX)
        result = _run(pytester, "bench.yaml", "--gap-resume")
    record = _results(pytester.path / "runs/20200101_000000")[
        "suites/libero_object/task_00/seed_000"
    ]
    assert record["exit_code"] == 1 and record["infra_failure"], record
    assert record["error"].startswith(
        "no num_workers slot of suite libero_object came free within the trial's 12 s budget "
        "(num_workers 1"
    )
    assert record["slot_wait_s"] >= 12
    assert result.ret == 1  # an errored trial errors its cell: the gate fails
    assert "infrastructure failure: task 0 seed 0" in result.stdout.str()


def test_a_killed_worker_is_recorded_as_137_and_the_run_goes_on(pytester, doubles):
    _config(
        pytester,
        "bench.yaml",
        {
            "trials": {"output_dir": "runs"},
            "suites": [
                {
                    "suite_name": "libero_object",
                    "task_ids": [0],
                    "trials_per_generation": 2,
                    "workflow_dir": _one_skill(pytester, "kill_process", {}),
                },
                {
                    "suite_name": "libero_object",
                    "task_ids": [1, 2],
                    "workflow_dir": _give_up(pytester),
                },
            ],
            "gate_threshold": 0.0,
        },
    )
    result = _run(pytester, "bench.yaml", "-n", "2")
    out = result.stdout.str()
    assert result.ret == 1, out  # the crashed trial errors its cell: the gate fails
    results = _results(_run_dir(pytester.path / "runs"))
    for seed in (0, 1):  # the second trial of the crashed scope still ran (and crashed)
        crashed = results[f"suites/libero_object/task_00/seed_00{seed}"]
        assert crashed["exit_code"] == 137 and crashed["infra_failure"]
        assert "worker process died" in crashed["error"]
    assert {k for k in results} >= {
        "suites/libero_object_02/task_01/seed_000",
        "suites/libero_object_02/task_02/seed_000",
    }
    tsv = (_run_dir(pytester.path / "runs") / "summary.tsv").read_text().splitlines()
    assert tsv[1].split("\t")[9:11] == ["0", "2"]  # n_trials 0, n_infra 2
    assert "errored cells: libero_object" in out


def test_a_worker_killed_by_the_thread_watchdog_is_recorded_as_124(pytester, doubles):
    _config(
        pytester,
        "bench.yaml",
        {
            "trials": {"output_dir": "runs", "task_timeout_secs": 20},
            "suites": [
                {
                    "suite_name": "libero_object",
                    "task_ids": [0],
                    "workflow_dir": _one_skill(pytester, "stall", {"seconds": 120}),
                },
                {
                    "suite_name": "libero_object",
                    "task_ids": [1],
                    "workflow_dir": _give_up(pytester),
                    "timeout_secs": 300,  # room for env creation on a loaded machine
                },
            ],
            "gate_threshold": 0.0,
        },
    )
    result = _run(pytester, "bench.yaml", "-n", "2", "--timeout-method=thread")
    results = _results(_run_dir(pytester.path / "runs"))
    stalled = results["suites/libero_object/task_00/seed_000"]
    assert stalled["exit_code"] == 124 and not stalled["infra_failure"], stalled
    assert "the watchdog killed its worker" in stalled["reason"]
    assert results["suites/libero_object_02/task_01/seed_000"]["exit_code"] == 0
    assert result.ret == 0, result.stdout.str()  # a timeout is a failed trial, not an error


def test_a_session_killed_with_sigkill_resumes_without_losing_trials(pytester, doubles):
    marker = pytester.path / "killed.txt"
    _config(
        pytester,
        "bench.yaml",
        {
            "trials": {"output_dir": "runs"},
            "suites": [
                {
                    "suite_name": "libero_object",
                    "task_ids": [0],
                    "workflow_dir": _give_up(pytester),
                },
                {
                    "suite_name": "libero_object",
                    "task_ids": [0],
                    "seeds": [1],
                    "workflow_dir": _one_skill(
                        pytester, "kill_process", {"once_marker": str(marker)}
                    ),
                },
            ],
            "gate_threshold": 0.0,
        },
    )
    killed = _run(pytester, "bench.yaml")
    assert killed.ret != 0 and marker.exists()
    run_dir = _run_dir(pytester.path / "runs")
    before = _results(run_dir)
    assert list(before) == ["suites/libero_object/task_00/seed_000"]
    assert not (run_dir / "summary.tsv").exists()
    resumed = _run(pytester, "bench.yaml", "--gap-resume")
    assert resumed.ret == 0, resumed.stdout.str()
    after = _results(run_dir)
    assert (
        after["suites/libero_object/task_00/seed_000"]
        == before["suites/libero_object/task_00/seed_000"]
    )
    assert "suites/libero_object_02/task_00/seed_001" in after
    assert len((run_dir / "summary.tsv").read_text().split("\n\n")[0].splitlines()) == 3


# -- the command line and the Python API -----------------------------------------------------------
def test_gap_benchmark_exit_codes_and_api(pytester, monkeypatch):
    from pytest_gap.benchmark import run

    monkeypatch.chdir(pytester.path)
    grid = _config(
        pytester,
        "grid.yaml",
        {
            "benchmark": {
                "families": ["libero"],
                "variations": ["object"],
                "modes": ["workflow"],
                "task_ids": [0],
                "n_seeds": 1,
                "num_workers": 1,
                "gate_threshold": 0.5,
                "output_dir": "runs",
                "mode_overrides": {"workflow": {"workflow_dir": _give_up(pytester)}},
            }
        },
    )
    summary = run(grid, quiet=True)
    assert summary.ok and not summary.gated and summary.n_trials == 1
    assert summary.success_rate == 0.0 and summary.run_dir.parent == pytester.path / "runs"
    assert summary.cells[0].key == "workflow/libero/object"
    assert summary.gate_line == (
        "gate FAIL: success_rate=0.000 threshold=0.500 (success rate below threshold (0/1))"
    )
    gap = [str(Path(os.sys.executable).with_name("gap"))]
    ungated = pytester.run(*gap, "benchmark", str(grid), "--resume", timeout=TIMEOUT)
    assert ungated.ret == 0
    gated = pytester.run(*gap, "benchmark", str(grid), "--resume", "--gate", timeout=TIMEOUT)
    assert gated.ret == 1
    assert "gate FAIL: success_rate=0.000 threshold=0.500" in gated.stdout.str()
    suites = _config(pytester, "suites.yaml", {"suites": [{"suite_name": "libero_object"}]})
    wrong = pytester.run(*gap, "benchmark", str(suites), "--families", "posvar", timeout=60)
    assert wrong.ret == 2 and "restrict a grid" in wrong.stderr.str()
    bad = _config(pytester, "bad.yaml", {"benchmark": {"n_seeds": 0}})
    broken = pytester.run(*gap, "benchmark", str(bad), timeout=60)
    assert broken.ret == 2 and "benchmark.n_seeds" in broken.stderr.str()
