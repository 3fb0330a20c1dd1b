"""`pytest --gap-ray` on a real Ray cluster of two nodes, both on this machine: a head started by
the test (`ray start --head`) and a second node process (`ray start --address`), one CPU each
(the second also declares one GPU, for the pinning test and a policy server placed on it).
Trials run on the fake backend (tests/fake_backend.py), which the nodes import from tests/ on
their PYTHONPATH as any node imports a config's backend; its skills come from the session's
conftest, which the actors load from the controller.

One module, one cluster, a few sessions: a Ray run scores the same as an xdist run of the same
plan; a GPU trial is pinned to the GPU Ray assigned; killing the second node mid-run loses no
finished trial and re-runs the killed ones (their records list the broken attempt); --lf and
--gap-resume then run on what is left; Ctrl-C ends a session and the actors it started.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from pytest_gap import cli
from tests.fake_session import BACKEND, TESTS, FakeSession

pytest.importorskip("ray")
pytest_plugins = ["pytester"]

ROOT = TESTS.parent
RAY = Path(sys.executable).with_name("ray")
GAP = shutil.which("gap", path=str(Path(sys.executable).parent)) or "gap"
UP_TIMEOUT_S = 90


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class LocalCluster:
    """A head and a second node, each `ray start --block` in a process group of its own, so the
    test ends exactly what it started (a node is its group: raylet, workers, agents)."""

    def __init__(self, tmp: Path):
        self.port = _free_port()
        self.address = f"127.0.0.1:{self.port}"
        path = os.pathsep.join(
            p for p in (str(ROOT), str(TESTS), os.environ.get("PYTHONPATH")) if p
        )
        self.env = {
            **os.environ,
            "PYTHONPATH": path,
            "RAY_USAGE_STATS_ENABLED": "0",
            # No token auth, whatever ~/.ray holds: the test's cluster is its own, on loopback.
            "RAY_AUTH_MODE": "disabled",
            # A dead node is noticed in about 2 s, not Ray's default half minute.
            "RAY_health_check_period_ms": "500",
            "RAY_health_check_timeout_ms": "500",
            "RAY_health_check_failure_threshold": "4",
        }
        self.log = tmp / "ray.log"
        small = ["--num-cpus=1", "--object-store-memory=80000000", "--disable-usage-stats"]
        self.head = self.node = None
        try:
            self.head = self._start(
                "--head", f"--port={self.port}", "--include-dashboard=false", *small
            )
            self._wait_nodes(1)
            # The second node declares a GPU (Ray assigns it; nothing here uses CUDA).
            self.node = self._start(f"--address={self.address}", "--num-gpus=1", *small)
            self._wait_nodes(2)
        except BaseException:
            self.stop()
            raise

    def _start(self, *args: str) -> subprocess.Popen:
        with self.log.open("a") as log:
            return subprocess.Popen(
                [str(RAY), "start", "--block", *args],
                env=self.env,
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )

    def _wait_nodes(self, n: int) -> None:
        probe = (
            "import ray, sys, time\n"
            f"deadline = time.time() + {UP_TIMEOUT_S}\n"
            "while time.time() < deadline:\n"
            "    try:\n"
            f"        ray.init(address={self.address!r}, logging_level='ERROR')\n"
            "        break\n"
            "    except Exception:\n"
            "        time.sleep(1)\n"
            "while time.time() < deadline:\n"
            f"    if sum(x['Alive'] for x in ray.nodes()) >= {n}:\n"
            "        sys.exit(0)\n"
            "    time.sleep(0.5)\n"
            "sys.exit(1)\n"
        )
        done = subprocess.run(
            [sys.executable, "-c", probe],
            env=self.env,
            capture_output=True,
            timeout=2 * UP_TIMEOUT_S,
        )
        assert done.returncode == 0, self.log.read_text()[-3000:]

    def kill_node(self) -> None:
        """The second node dies at once (SIGKILL to its raylet, workers and agents)."""
        os.killpg(self.node.pid, signal.SIGKILL)
        self.node.wait()

    def stop(self) -> None:
        for process in (self.node, self.head):
            if process is not None and process.poll() is None:
                os.killpg(process.pid, signal.SIGKILL)
                process.wait()


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    with pytest.MonkeyPatch.context() as env:
        env.setenv("RAY_AUTH_MODE", "disabled")  # the sessions' side of it
        started = LocalCluster(tmp_path_factory.mktemp("ray"))
        try:
            yield started
        finally:
            started.stop()


@pytest.fixture
def fake(pytester) -> FakeSession:
    return FakeSession(pytester)


def _grid(n_seeds: int) -> dict:
    return {
        "benchmark": {
            "backend": BACKEND,
            "families": ["fake"],
            "variations": ["easy"],  # succeeds iff seed % 3 != 0
            "modes": ["workflow"],
            "task_ids": [0, 1],
            "n_seeds": n_seeds,
            "output_dir": "runs",
            "gate_threshold": 0.5,
            "mode_overrides": {"workflow": {"workflow_dir": "wf"}},
        }
    }


SUMMARY_KEYS = ("n_trials", "n_success", "success_rate", "completion_rate", "matrix")
CELL_KEYS = ("key", "n_success", "n_trials", "n_infra", "n_errored", "success_rate")


def _scored(run_dir: Path) -> tuple[dict, dict]:
    summary = json.loads((run_dir / "summary.json").read_text())
    pooled = {k: summary[k] for k in SUMMARY_KEYS}
    pooled["gate"] = summary["gate"]["verdict"]
    pooled["cells"] = [{k: c[k] for k in CELL_KEYS} for c in summary["cells"]]
    trials = {
        key: (r["success"], r["steps"], r["init_state"], r["error"])
        for key, r in FakeSession.results(run_dir).items()
    }
    return pooled, trials


def test_a_ray_run_scores_as_an_xdist_run_of_the_same_plan(fake, cluster):
    fake.config(_grid(3))
    xdist = fake.run("bench.yaml", "-n", "2", "--gap-output-dir=xdist")
    xdist.assert_outcomes(passed=4, failed=2)
    n_envs = len(fake.env_records())
    on_ray = fake.run("bench.yaml", f"--gap-ray={cluster.address}", "--gap-output-dir=ray")
    out = on_ray.stdout.str()
    on_ray.assert_outcomes(passed=4, failed=2)
    assert on_ray.ret == 0, out
    assert f"gap: ray: 6 trials on 2 actors over 2 nodes ({cluster.address})" in out
    ray_dir = fake.run_dir("ray")
    assert _scored(ray_dir) == _scored(fake.run_dir("xdist"))
    records = FakeSession.results(ray_dir)
    assert {r["worker"].rsplit("-", 2)[0] for r in records.values()} == {"ray"}
    # the actors kept their envs: a task's seeds reused its scene (an env per trial would be 6)
    made = fake.env_records()[n_envs:]
    assert 2 <= len(made) < 6, made
    # the trial files came back: traces and the produced workflow, written by the controller
    assert (ray_dir / "workflow/fake/easy/task_00/seed_001/trace/dag_trace.json").is_file()
    assert (ray_dir / "workflow/fake/easy/task_01/workflow/workflow.json").is_file()


def test_a_gpu_trial_is_pinned_to_the_gpu_ray_assigned_its_actor(fake, cluster, capfd, monkeypatch):
    """CUDA_VISIBLE_DEVICES (Ray's assignment) and the EGL device the env is built for agree,
    as on a pinned xdist worker; only the node with a GPU takes such trials. Through
    `gap benchmark --ray`, which runs the same pytest session."""
    path = fake.config({**_grid(1), "trials": {"ray": {"num_cpus": 0.5, "num_gpus": 1}}})
    monkeypatch.syspath_prepend(str(TESTS))  # `gap benchmark` checks the backend here first
    assert cli.main(["benchmark", str(path), "--ray", cluster.address]) == 0
    out = capfd.readouterr().out
    assert "gap: ray: 2 trials on 1 actor over 1 node" in out
    assert "gate FAIL: success_rate=0.000" in out  # seed 0 fails on fake_easy
    pinned = {"CUDA_VISIBLE_DEVICES": "0", "MUJOCO_EGL_DEVICE_ID": "0"}
    made = fake.env_records()
    assert made and all(e["egl_device"] == 0 and e["environ"] == pinned for e in made), made
    for record in FakeSession.results(fake.run_dir()).values():
        assert record["devices"] == {**pinned, "env_egl_device": "0"}


def test_a_trial_past_its_limit_is_stopped_by_its_actors_watchdog(fake, cluster):
    """The actor keeps the trial's time as pytest-timeout would: 124, with the steps reached,
    and the actor goes on to the next trial."""
    fake.config({**_grid(1), "trials": {"task_timeout_secs": 3}})
    result = fake.run("bench.yaml", f"--gap-ray={cluster.address}", GAP_TEST_FAKE_HANG="0:0")
    result.assert_outcomes(failed=2)
    records = FakeSession.results(fake.run_dir())
    hung = records["workflow/fake/easy/task_00/seed_000"]
    assert hung["exit_code"] == 124 and hung["reason"].startswith("timed out after 3 s")
    assert hung["init_state"] == 0 and hung["steps"] == 0
    assert records["workflow/fake/easy/task_01/seed_000"]["exit_code"] == 0


def test_a_managed_policy_server_answers_the_actors(fake, cluster):
    """The server the session starts (on loopback) serves trials run by actors on this
    machine's nodes; the records name it as they do without Ray."""
    fake.config(
        {
            "policies": {"hold": {"command": [GAP, "policy", "serve", "hold", "--port", "{port}"]}},
            "trials": {"max_steps": 10},
            "benchmark": {
                **_grid(2)["benchmark"],
                "task_ids": [0],
                "modes": ["policy_only"],
                "policies": ["hold"],
                "mode_overrides": {"policy_only": {"template": "policy_only_bare"}},
            },
        }
    )
    result = fake.run("bench.yaml", f"--gap-ray={cluster.address}")
    result.assert_outcomes(passed=1, failed=1)  # holding still succeeds on seed 1 only
    for record in FakeSession.results(fake.run_dir()).values():
        assert record["policy_url"].startswith("ws://127.0.0.1:") and record["error"] is None
        assert record["worker"].startswith("ray-") and record["steps"] > 0


WHERE_AM_I = """
import os
from pathlib import Path
import numpy as np


class HoldAndSayWhere:
    \"\"\"Zero motion, gripper open; says which GPU it was given and which process it is.\"\"\"

    def __init__(self):
        Path(os.environ["WHERE_FILE"]).write_text(
            f"{os.environ.get('CUDA_VISIBLE_DEVICES')} {os.getpid()}"
        )

    def infer(self, obs):
        return {"actions": np.tile([0, 0, 0, 0, 0, 0, -1.0], (5, 1))}
"""


def _placed_server_config(fake, host_args: list[str]) -> None:
    (fake.path / "where.py").write_text(WHERE_AM_I)
    serve = [GAP, "policy", "serve", "where:HoldAndSayWhere", "--port", "{port}", *host_args]
    env = {"PYTHONPATH": str(fake.path), "WHERE_FILE": str(fake.path / "where")}
    fake.config(
        {
            "policies": {
                "gpu": {"command": serve, "env": env, "ray": {"num_cpus": 0, "num_gpus": 1}}
            },
            "trials": {"max_steps": 10},
            "benchmark": {
                **_grid(2)["benchmark"],
                "task_ids": [0],
                "modes": ["policy_only"],
                "policies": ["gpu"],
                "mode_overrides": {"policy_only": {"template": "policy_only_bare"}},
            },
        }
    )


def test_a_managed_server_with_ray_resources_runs_on_the_node_that_has_them(fake, cluster):
    """`policies.gpu.ray: {num_gpus: 1}`: Ray starts the server on the node with the GPU, which
    it is given; the trial actors on both nodes reach it at that node's address, and it ends
    with the session."""
    _placed_server_config(fake, ["--host", "0.0.0.0"])
    result = fake.run("bench.yaml", f"--gap-ray={cluster.address}")
    out = result.stdout.str()
    result.assert_outcomes(passed=1, failed=1)  # holding still succeeds on seed 1 only
    gpus, pid = (fake.path / "where").read_text().split()
    assert gpus == "0", out  # Ray's assignment is the server's environment
    records = FakeSession.results(fake.run_dir())
    (url,) = {r["policy_url"] for r in records.values()}
    assert not url.startswith("ws://127.0.0.1:") and all(
        r["error"] is None for r in records.values()
    )
    assert f"gap: policies.gpu: started by Ray at {url}" in out
    assert "gap: ray: 2 trials on 2 actors over 2 nodes" in out  # the GPU held is no CPU
    log = (fake.run_dir() / "policy_logs" / "policy_gpu.log").read_text()
    assert "gap: started by Ray on node" in log and "CUDA_VISIBLE_DEVICES=0" in log, log
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline and _alive(int(pid)):
        time.sleep(0.2)
    assert not _alive(int(pid)), "the server outlived its session"


def test_a_placed_server_that_listens_on_loopback_only_is_a_start_error_that_says_so(fake, cluster):
    _placed_server_config(fake, [])  # gap policy serve binds 127.0.0.1 unless told
    result = fake.run("bench.yaml", f"--gap-ray={cluster.address}")
    out = result.stdout.str() + result.stderr.str()
    assert result.ret == 1, out  # the cells error and the gate fails, with the reason
    assert "listens on 127.0.0.1 only, so no other node reaches it; bind it to 0.0.0.0" in out


DIE_ONCE = """
import os, signal
from pathlib import Path
import numpy as np


class DieOnceOnThirdCall:
    \"\"\"Zero motion; the first server's process is killed at its third call (an OOM kill).\"\"\"

    calls = 0

    def infer(self, obs):
        DieOnceOnThirdCall.calls += 1
        marker = Path(os.environ["DIED_MARKER"])
        if DieOnceOnThirdCall.calls == 3 and not marker.exists():
            marker.write_text("died")
            os.kill(os.getpid(), signal.SIGKILL)
        return {"actions": np.tile([0, 0, 0, 0, 0, 0, -1.0], (5, 1))}
"""


@pytest.mark.parametrize("placed", [False, True], ids=["on-the-controller", "placed-by-ray"])
def test_a_trial_whose_managed_server_died_is_rerun_after_the_restart(fake, cluster, placed):
    """Also for a server Ray placed on the GPU node: the restart needs the GPU the dead one's
    actor held."""
    (fake.path / "die_once.py").write_text(DIE_ONCE)
    serve = [GAP, "policy", "serve", "die_once:DieOnceOnThirdCall", "--port", "{port}"]
    env = {"PYTHONPATH": str(fake.path), "DIED_MARKER": str(fake.path / "died")}
    entry = {"command": serve, "env": env}
    if placed:
        entry = {"command": [*serve, "--host", "0.0.0.0"], "env": env, "ray": {"num_gpus": 1}}
    fake.config(
        {
            "policies": {"once": entry},
            "trials": {"max_steps": 20},
            "benchmark": {
                **_grid(1)["benchmark"],
                "task_ids": [0],  # seed 0: never succeeds, so the policy is asked 4 times
                "modes": ["policy_only"],
                "policies": ["once"],
                "mode_overrides": {"policy_only": {"template": "policy_only_bare"}},
            },
        }
    )
    result = fake.run("bench.yaml", f"--gap-ray={cluster.address}")
    out = result.stdout.str()
    result.assert_outcomes(failed=1)
    assert (fake.path / "died").is_file()
    (record,) = FakeSession.results(fake.run_dir()).values()
    assert record["error"] is None and record["steps"] == 20, record
    (broken,) = record["earlier_attempts"]
    assert (
        "closed the connection" in broken["error"] and broken["policy_url"] != record["policy_url"]
    )
    assert "re-run" in out


def test_a_killed_node_loses_no_finished_trial_and_its_trials_rerun_then_lf_and_resume(
    fake, cluster
):
    fake.config(_grid(4))  # 8 trials of 2 s each, on 2 actors
    fake.setenv(GAP_TEST_FAKE_STEP_S="0.5")
    session = subprocess.Popen(  # a session of its own, so the test can kill a node under it
        [sys.executable, "-m", "pytest", "bench.yaml", f"--gap-ray={cluster.address}"],
        cwd=fake.path,
        env=os.environ.copy(),  # pytester's: tests/ on PYTHONPATH, GAP_TEST_FAKE_STEP_S
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    runs = fake.path / "runs"
    finished: dict[str, str] = {}
    deadline = time.monotonic() + 120
    while len(finished) < 2 and time.monotonic() < deadline and session.poll() is None:
        time.sleep(0.2)
        finished = {str(p): p.read_text() for p in runs.rglob("result.json")}
    assert len(finished) >= 2, "no trial finished"
    cluster.kill_node()
    out, _ = session.communicate(timeout=180)
    assert session.returncode == 0, out  # the gate (0.5) passes: 4 of 8 succeed
    assert "4 failed, 4 passed" in out
    run_dir = fake.run_dir()
    for path, text in finished.items():  # what had finished before the kill is kept as it was
        assert Path(path).read_text() == text
    records = FakeSession.results(run_dir)
    assert len(records) == 8 and not [r for r in records.values() if r["error"]]
    rerun = [r for r in records.values() if r["earlier_attempts"]]
    assert rerun, "no trial was running on the killed node"
    for r in rerun:
        (broken,) = r["earlier_attempts"]
        assert broken["exit_code"] == 137 and "died" in broken["error"]
        assert broken["rerun_because"].startswith("its Ray actor died")
    assert "re-run on another Ray actor" in out

    # --lf: the failed trials only, on the head alone, into the same run dir; no node is
    # killed under these sessions, so their trials need no step cost (4 trials of 2 s saved)
    last = fake.run("bench.yaml", f"--gap-ray={cluster.address}", "--lf", GAP_TEST_FAKE_STEP_S=None)
    last.assert_outcomes(failed=4, deselected=4)
    assert "gap: ray: 4 trials on 1 actor over 1 node" in last.stdout.str()
    assert fake.run_dir() == run_dir
    pooled, _ = _scored(run_dir)
    assert (pooled["n_trials"], pooled["n_success"]) == (8, 4)

    # --gap-resume: a corrupt record is re-run on the cluster, the others replayed
    corrupt = run_dir / "workflow/fake/easy/task_01/seed_002/result.json"
    corrupt.write_text('{"version": 1, "nodeid": ')
    resumed = fake.run("bench.yaml", f"--gap-ray={cluster.address}", "--gap-resume")
    resumed.assert_outcomes(passed=4, failed=4)
    assert "gap: ray: 1 trial on 1 actor over 1 node" in resumed.stdout.str()
    again = json.loads(corrupt.read_text())
    assert again["success"] and again["worker"].startswith("ray-")
    assert _scored(run_dir)[0]["n_success"] == 4


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    stat = Path(f"/proc/{pid}/stat")
    return not (stat.is_file() and stat.read_text().split(") ")[-1].startswith("Z"))


def test_ctrl_c_ends_the_session_and_the_actors_it_started(fake, cluster):
    fake.config(_grid(4))
    fake.setenv(GAP_TEST_FAKE_STEP_S="1")  # 4 s a trial: the session is mid-trial when interrupted
    session = subprocess.Popen(
        [sys.executable, "-m", "pytest", "bench.yaml", f"--gap-ray={cluster.address}"],
        cwd=fake.path,
        env=os.environ.copy(),
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        # A job started in the background by a shell ignores SIGINT, and so would its children:
        # Python then never raises KeyboardInterrupt. Ctrl-C reaches a terminal's session.
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL),
    )
    deadline = time.monotonic() + 90
    while time.monotonic() < deadline and not (fake.envs.is_file() and fake.env_records()):
        time.sleep(0.2)
    actors = {e["pid"] for e in fake.env_records()}
    assert actors, "no actor made an env"
    session.send_signal(signal.SIGINT)
    out, _ = session.communicate(timeout=60)
    assert session.returncode == pytest.ExitCode.INTERRUPTED, out
    assert "KeyboardInterrupt" in out
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline and any(_alive(pid) for pid in actors):
        time.sleep(0.2)
    assert not [pid for pid in actors if _alive(pid)], "an actor outlived its session"
