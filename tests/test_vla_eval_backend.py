"""vla-eval as the second backend (pytest_gap/sim/vla_eval/): its catalogue, whole pytest sessions
whose trials run vla-eval's own LIBERO adapter and episode loop against a model server built from
vla-eval's own classes, the same first observation as the libero backend for the same seed,
Refractal's rules (one server per checkpoint, warm-up charged to no trial, version recorded),
and `gap verify-harness` against the installed vla-eval, a tampered copy, and none."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any, NamedTuple

import numpy as np
import pytest
import vla_eval
import yaml
from vla_eval.model_servers.predict import PredictModelServer

from bench.twin import MessageLog, first_difference
from pytest_gap.cli import main as gap_main
from pytest_gap.config import parse_config
from pytest_gap.plan import plan
from pytest_gap.sim.backend import EnvOptions, get_backend
from pytest_gap.sim.vla_eval.backend import VlaEvalBackend
from pytest_gap.sim.vla_eval.claims import CLAIMS
from tests.test_vla_eval import Served

pytest_plugins = ["pytester"]

TESTS = Path(__file__).resolve().parent
ROOT = TESTS.parent
# Episodes cut short by the config (trials.max_steps): a whole 280-step vla-eval LIBERO episode
# renders two cameras per step, about a minute here.
SHORT_STEPS = 12
SEEDS = [3, 7]  # init states 3 and 7 of libero_object task 0
SLOW_FIRST_INFERENCE_S = 2.0  # the server's first inference, as a model load or JIT would be
PROMPT = "pick up the alphabet soup and place it in the basket"


class FirstObservations(MessageLog, PredictModelServer):
    """Zero motion with the gripper open, one 7-D action per observation. Asks for the wrist
    image and the state (as vla-eval's pi0 server does); remembers each episode's start payload
    and first observation, and logs every message it receives (bench/twin.py MessageLog). Its
    very first inference is slow."""

    def __init__(self):
        super().__init__()
        self.episodes: list[dict] = []  # {"start": payload, "first": obs, "n_obs": int}
        self._lock = threading.Lock()
        self._first_done = False

    def get_observation_params(self):
        return {"send_wrist_image": True, "send_state": True}

    async def on_episode_start(self, config, ctx):
        with self._lock:
            self.episodes.append({"start": config, "first": None, "n_obs": 0})
        await super().on_episode_start(config, ctx)

    def predict(self, obs, ctx):
        if not self._first_done:
            time.sleep(SLOW_FIRST_INFERENCE_S)
            self._first_done = True
        with self._lock:
            episode = self.episodes[-1]
            episode["n_obs"] += 1
            if episode["first"] is None:
                episode["first"] = obs
        action = np.zeros(7, np.float32)
        action[6] = -1.0
        return {"actions": action}


@pytest.fixture(scope="module")
def server():
    model = FirstObservations()
    with Served(model) as served:
        model.url = f"ws://127.0.0.1:{served.port}"
        yield model


def _grid(backend: str, url: str, **benchmark) -> dict:
    return {
        "policies": {"vla": {"url": url, "protocol": "vla-eval"}},
        "trials": {"max_steps": SHORT_STEPS},
        "benchmark": {
            "backend": backend,
            "families": ["libero"],
            "variations": ["object"],
            "modes": ["policy_only"],
            "policies": ["vla"],
            "task_ids": [0],
            "seeds": SEEDS,
            "gate_threshold": 0.0,
            "output_dir": "runs",
            **benchmark,
        },
    }


def _session(path: Path, config: dict, *args) -> subprocess.CompletedProcess:
    """A pytest session over `config` in `path` (a subprocess: vla-eval's env vars and GL
    state stay out of this process), with tests/ on the path for the short backends."""
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([str(TESTS), str(ROOT), env.get("PYTHONPATH", "")])
    env.pop("PYTEST_ADDOPTS", None)
    (path / "bench.yaml").write_text(yaml.safe_dump(config))
    return subprocess.run(
        [sys.executable, "-m", "pytest", "bench.yaml", *args],
        cwd=path,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )


def _results(run_dir: Path) -> dict[int, dict]:
    return {
        (r := json.loads(p.read_text()))["seed"]: r for p in sorted(run_dir.rglob("result.json"))
    }


# -- the catalogue --------------------------------------------------------------------------------
def test_vla_eval_is_a_builtin_backend_with_vla_evals_libero_catalogue():
    from vla_eval.benchmarks.libero.benchmark import MAX_STEP_MAPPING

    backend = get_backend("vla-eval")
    assert isinstance(backend, VlaEvalBackend)
    assert {s: backend.max_steps(s) for s in backend.suites()} == MAX_STEP_MAPPING
    assert backend.task_prompt("libero_object", 0) == PROMPT
    assert backend.n_init_states("libero_object", 0) == 50
    assert list(backend.families()) == ["libero"]
    why = backend.unavailable()
    assert why["calvin"] == "its simulator is not installed (module calvin_env)"
    assert why["libero_pro"].startswith("not wired yet")
    with pytest.raises(Exception, match="vla-eval benchmark 'calvin' is not usable here: its sim"):
        backend.n_tasks("calvin")
    with pytest.raises(Exception, match="record_video: the vla-eval backend records no videos"):
        backend.make_env("libero_object", 0, EnvOptions(cameras=("agentview",)))


def test_a_vla_eval_env_steps_vla_evals_adapter_directly():
    """As an Env (for scene-free skills): vla-eval's own reset, observation and step."""
    from pytest_gap.errors import SimInputError
    from pytest_gap.sim.backend import Env, EpisodeLoopEnv

    env = get_backend("vla-eval").make_env("libero_object", 0)
    try:
        obs = env.reset(53)
        # (after the reset: the protocol check reads `episode`, which raises before one)
        assert isinstance(env, Env) and isinstance(env, EpisodeLoopEnv) and env.scene is None
        assert env.episode.init_state == 3 and env.max_steps == 280
        assert obs.prompt == PROMPT and obs.state.shape == (8,)
        assert {k: v.shape for k, v in obs.images.items()} == {
            "agentview": (256, 256, 3),
            "wrist": (256, 256, 3),
        }
        step = env.step([0.0, 0.0, 0.5, 0.0, 0.0, 0.0, -1.0])
        assert (step.steps, step.success, step.done) == (1, False, False)
        assert step.obs.state[2] > obs.state[2]  # it moved up
        with pytest.raises(SimInputError, match="expected 7 finite numbers"):
            env.step([0.0] * 6)
        with pytest.raises(SimInputError, match="run the policy_only mode"):
            env.libero_obs()
    finally:
        env.close()


def test_gap_suites_lists_what_vla_eval_can_and_cannot_run_here():
    out = subprocess.run(
        [sys.executable, "-m", "pytest_gap.cli", "suites", "--backend", "vla-eval"],
        capture_output=True,
        text=True,
        check=True,
    )
    lines = out.stdout.splitlines()
    assert any(
        line.split()[:5] == ["libero_object", "10", "tasks", "max_steps", "280"] for line in lines
    )
    assert any(
        line.startswith("simpler ") and "not usable: its simulator is not installed" in line
        for line in lines
    )


def test_a_vla_eval_config_validates_without_a_simulator_or_torch():
    code = (
        "import sys\n"
        "from pytest_gap.config import parse_config\n"
        "from pytest_gap.plan import plan\n"
        "c = parse_config({'policies': {'v': {'url': 'ws://h:1', 'protocol': 'vla-eval'}},"
        " 'benchmark': {'backend': 'vla-eval', 'families': ['libero'], 'modes': ['policy_only'],"
        " 'policies': ['v'], 'n_seeds': 1}})\n"
        "assert len(plan(c)) == 5\n"
        "print(sorted(m for m in ('mujoco', 'robosuite', 'torch', 'vla_eval.benchmarks.libero')"
        " if m in sys.modules))\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True, cwd=ROOT
    )
    assert out.stdout.strip() == "[]"


def test_item_ids_are_the_same_in_both_backends_and_policy_only_needs_no_template(tmp_path):
    def trial_ids(backend: str, **extra):
        config = parse_config(_grid(backend, "ws://h:1", **extra), "grid.yaml", tmp_path)
        return [(t.id, t.key, c.error) for c in plan(config) for t in c.trials()]

    template = {"mode_overrides": {"policy_only": {"template": "policy_only_bare"}}}
    ours = trial_ids("vla-eval")
    assert ours == [(i, k, None) for i, k, _ in trial_ids("libero", **template)]
    assert ours[0][0] == "policy_only@vla::libero/object::task00::seed003"
    # The libero backend still needs the workflow its policy_only trials run.
    assert "template is not set" in trial_ids("libero")[0][2]


# -- Refractal's rules ----------------------------------------------------------------------------
def test_two_compared_policies_on_one_server_are_a_config_error(tmp_path):
    config = _grid("vla-eval", "ws://localhost:8000")
    config["policies"]["cand"] = {"url": "ws://127.0.0.1:8000/", "protocol": "vla-eval"}
    config["benchmark"]["policies"] = ["vla", "cand"]
    config["benchmark"]["output_dir"] = str(tmp_path / "runs")
    (tmp_path / "bench.yaml").write_text(yaml.safe_dump(config))
    out = subprocess.run(
        [sys.executable, "-m", "pytest_gap.cli", "benchmark", str(tmp_path / "bench.yaml")],
        capture_output=True,
        text=True,
    )
    assert out.returncode == 2, out.stdout + out.stderr
    assert out.stderr.strip().count("\n") == 0
    assert (
        "benchmark.policies: 'vla' and 'cand' point at the same server (ws://127.0.0.1:8000/); "
        "a comparison needs one server per checkpoint: give each its own url" in out.stderr
    )
    assert not (tmp_path / "runs").exists()


def test_a_vla_eval_cell_needs_a_vla_eval_protocol_server(tmp_path):
    from pytest_gap.run.trial import TrialRun
    from pytest_gap.servers.registry import endpoints_for
    from pytest_gap.sim.pool import EnvPool

    config = _grid("vla-eval", "ws://127.0.0.1:9")
    config["policies"]["vla"]["protocol"] = "openpi"
    parsed = parse_config(config, "grid.yaml", tmp_path)
    trial = plan(parsed)[0].trials()[0]
    pool = EnvPool()
    try:
        run = TrialRun(
            trial,
            tmp_path,
            nodeid="n",
            config="grid.yaml",
            pool=pool,
            policies=endpoints_for(parsed),
        )
        result = run.execute()
    finally:
        pool.close()
    assert result.errored and not result.infra_failure
    assert result.error == (
        "policies.vla: backend vla-eval talks vla-eval's protocol; set protocol: vla-eval"
    )


# -- whole sessions -------------------------------------------------------------------------------
# A vla-eval episode costs about 10 s here (vla-eval's LIBERO adapter hard-resets, which rebuilds
# the scene, and renders two cameras per step), its first warm-up about 20 s: one session is run
# and every test below reads it.
class VlaSession(NamedTuple):
    result: Any
    run_dir: Path
    episodes: list[dict]  # what the server saw during the session, warm-up included
    seconds: float
    streams: list[list[tuple]]  # the messages of each of the session's connections, in order


@pytest.fixture(scope="module")
def vla_session(server, tmp_path_factory) -> VlaSession:
    path = tmp_path_factory.mktemp("vla_session")
    before, opened = len(server.episodes), len(server.streams())
    t0 = time.perf_counter()
    result = _session(path, _grid("vla-eval", server.url), "--junitxml=junit.xml")
    seconds = time.perf_counter() - t0
    (run_dir,) = (path / "runs").iterdir()
    # a warm-up connection, then one per trial
    streams = server.streams(opened + 1 + len(SEEDS))[opened:]
    return VlaSession(result, run_dir, server.episodes[before:], seconds, streams)


def _measured(episodes: list[dict]) -> list[dict]:
    return [e for e in episodes if not e["start"].get("task", {}).get("warm_up")]


def _trial_streams(streams: list[list[tuple]]) -> list[list[tuple]]:
    """The streams of trials: a warm-up's connection starts its own episode, named so."""
    warm = ("episode_start", {"task": {"warm_up": True}})
    return [s for s in streams if s[:1] != [warm]]


def test_a_vla_eval_session_runs_vla_evals_loop_and_records_it(vla_session, server):
    result, run_dir, episodes, session_s, _ = vla_session
    out = result.stdout
    assert result.returncode == 0, out
    # Same items as the libero backend, failed (zero motion never succeeds), gate 0.0 passes.
    for seed in SEEDS:
        assert f"FAILED bench.yaml::policy_only@vla::libero/object::task00::seed{seed:03d}" in out
    assert "2 failed" in out
    records = _results(run_dir)
    assert sorted(records) == SEEDS
    # Provenance: the HELLO vla-eval's server sends, the init states vla-eval's adapter sets.
    from libero.libero.benchmark import get_benchmark_dict

    from pytest_gap.policies.client import VlaEvalClient
    from pytest_gap.policies.wire import metadata_digest
    from pytest_gap.sim.backend import state_digest

    with VlaEvalClient(server.url) as client:
        hello = metadata_digest(client.metadata)
    states = get_benchmark_dict()["libero_object"]().get_task_init_states(0)
    for seed, record in records.items():
        assert record["policy_digest"] == hello and record["backend"] == "vla-eval"
        assert record["init_state_digest"] == state_digest(states[seed])
        assert record["packages"]["vla-eval"] == "0.8.0"
        assert record["error"] is None and record["exit_code"] == 0, record
        assert (record["init_state"], record["steps"], record["success"]) == (
            seed,
            SHORT_STEPS,
            False,
        )
        assert record["exit_status"] == "step_limit" and record["env_prompt"] == PROMPT
        assert record["workflow"] is None  # no workflow: vla-eval's loop is the trial
        info = record["backend_info"]
        assert info["vla_eval_version"] == vla_eval.__version__ == "0.8.0"
        assert info["server_url"] == server.url and info["episode_idx"] == seed
        assert info["benchmark"] == "vla_eval.benchmarks.libero.benchmark:LIBEROBenchmark"
    # vla-eval's loop ran: per trial one EPISODE_START with the task, one observation per step.
    trials = _measured(episodes)
    assert [e["start"]["task"]["episode_idx"] for e in trials] == SEEDS
    assert all(e["n_obs"] == SHORT_STEPS for e in trials)
    assert set(trials[0]["first"]) == {"images", "task_description", "states", "controller_states"}
    # One warm-up before the first measured trial, recorded apart and charged to no trial (a
    # warm-up charged to the first trial would add its ~20 s of scene building to that trial).
    (warm_file,) = (run_dir / "warmup").iterdir()
    warm = json.loads(warm_file.read_text())
    assert episodes[0]["start"]["task"] == {"warm_up": True}
    assert warm["url"] == server.url and warm["vla_eval_version"] == "0.8.0"
    assert warm["inference_s"] >= SLOW_FIRST_INFERENCE_S
    walls = [records[s]["wall_s"] for s in SEEDS]
    # Charged to the first trial, the warm-up would add its whole time to it; the margin is half
    # of it, as measured this run, so a loaded machine (every wall longer) does not fail this.
    assert walls[0] < walls[1] + warm["seconds"] / 2, (walls, warm)
    assert sum(walls) + warm["seconds"] < session_s
    # Summary, gate and JUnit as for any backend.
    summary = json.loads((run_dir / "summary.json").read_text())
    assert (summary["n_trials"], summary["n_success"], summary["gate"]["passed"]) == (2, 0, True)
    junit = (run_dir.parent.parent / "junit.xml").read_text()
    assert 'name="init_state" value="3"' in junit and 'name="steps" value="12"' in junit


def test_a_resumed_vla_eval_session_replays_its_records_without_the_server(vla_session, server):
    """--lf --gap-resume over the recorded run: both failed items are reported again from their
    records; nothing reaches the server (not even a warm-up)."""
    before = len(server.episodes)
    again = _session(
        vla_session.run_dir.parent.parent,
        _grid("vla-eval", server.url),
        "--lf",
        "--gap-resume",
    )
    assert again.returncode == 0, again.stdout
    assert "2 failed" in again.stdout and "recorded by an earlier session" in again.stdout
    assert server.episodes[before:] == []
    assert sorted(_results(vla_session.run_dir)) == SEEDS


def test_the_same_seed_sends_a_vla_eval_server_the_same_messages_in_both_backends(
    vla_session, server, pytester
):
    """policy_only through vla-eval's loop (the shared session, seeds 3 and 7), and
    policy_only_bare (run_policy from the settled init state) on the libero backend with the
    same vla-eval server, seed 3: the server sees the same first observation for the same seed,
    and a different one for another seed; and the same messages from both loops (issue 48
    section 6), the warm-ups' own episodes aside: EPISODE_START with the task, one observation
    per step of the budget (not one more), EPISODE_END with the result (its wall time aside)."""
    before, opened = len(server.episodes), len(server.streams())
    bare = {"mode_overrides": {"policy_only": {"template": "policy_only_bare"}}}
    # The libero backend's session runs in-process (no vla-eval code runs in it, and this
    # process's LIBERO is warm); the server sees it over loopback as any other client.
    (pytester.path / "bench.yaml").write_text(
        yaml.safe_dump(_grid("libero", server.url, seeds=[3], **bare))
    )
    result = pytester.runpytest_inprocess("bench.yaml")
    assert result.ret == 0, result.stdout.str()
    records = _results(next((pytester.path / "runs").iterdir()))
    assert sorted(records) == [3] and records[3]["error"] is None
    assert (records[3]["init_state"], records[3]["steps"]) == (3, SHORT_STEPS)  # trials.max_steps
    (ours,) = _measured(server.episodes[before:])
    ours = ours["first"]
    theirs, other = (e["first"] for e in _measured(vla_session.episodes))
    assert ours["task_description"] == theirs["task_description"] == PROMPT
    assert list(ours["images"]) == list(theirs["images"]) == ["agentview", "wrist"]
    for camera in ("agentview", "wrist"):
        diff = np.abs(ours["images"][camera].astype(float) - theirs["images"][camera]).mean()
        print(f"{camera}: mean grey-level difference {diff:.4f}")
        assert diff < 1.0, (camera, diff)
    for key in ("states", "controller_states"):
        diff = np.abs(ours[key] - theirs[key]).max()
        print(f"{key}: max difference {diff:.2e}")
        assert diff < 1e-5, key
    # Another seed is another scene: the comparison can tell them apart.
    assert np.abs(other["states"] - theirs["states"]).max() > 1e-3
    assert (
        np.abs(other["images"]["agentview"].astype(float) - theirs["images"]["agentview"]).mean()
        > 1.0
    )
    # Message for message: ours (a warm-up connection, then the trial's) and vla-eval's seed 3.
    (mine,) = _trial_streams(server.streams(opened + 2)[opened:])
    theirs_3, theirs_7 = _trial_streams(vla_session.streams)
    assert first_difference(mine, theirs_3) is None
    assert first_difference(theirs_7, theirs_3) is not None  # the log tells seeds apart
    assert [kind for kind, _ in theirs_3] == [
        "episode_start",
        *["observation"] * SHORT_STEPS,
        "episode_end",
    ]
    task = {"name": PROMPT, "suite": "libero_object", "task_id": 0, "episode_idx": 3}
    assert theirs_3[0] == ("episode_start", {"task": task})
    _, end = theirs_3[-1]
    assert end["metrics"] == {"success": False} and end["steps"] == SHORT_STEPS


# -- gap verify-harness ---------------------------------------------------------------------------
def test_verify_harness_passes_on_the_installed_vla_eval(capsys):
    assert gap_main(["verify-harness"]) == 0
    out = capsys.readouterr().out
    assert "installed vla-eval 0.8.0" in out
    assert out.count("[ok  ]") == len(CLAIMS) >= 9 and "[FAIL]" not in out
    for claim in CLAIMS:
        assert f"[ok  ] {claim.name}" in out
    assert "found in runners/sync_runner.py:" in out
    assert f"All {len(CLAIMS)} claims hold." in out


def _copy_of_vla_eval(tmp_path: Path) -> Path:
    src = Path(vla_eval.__file__).parent
    dst = tmp_path / "checkout" / "src" / "vla_eval"
    shutil.copytree(src, dst, ignore=shutil.ignore_patterns("__pycache__"))
    return dst


def test_verify_harness_names_the_claim_a_tampered_checkout_breaks(tmp_path, capsys):
    package = _copy_of_vla_eval(tmp_path)
    checkout = tmp_path / "checkout"
    assert gap_main(["verify-harness", str(checkout)]) == 0  # an intact copy holds
    capsys.readouterr()
    libero = package / "benchmarks" / "libero" / "benchmark.py"
    text = libero.read_text()
    assert "initial_states[episode_idx]" in text
    libero.write_text(text.replace("initial_states[episode_idx]", "initial_states[0]"))
    assert gap_main(["verify-harness", str(checkout)]) == 1
    out = capsys.readouterr().out
    assert "source checkout vla-eval 0.8.0" in out
    assert "[FAIL] episode-idx-is-init-state" in out
    assert "reset no longer indexes initial_states with task['episode_idx']" in out
    assert "holds up: seed s starts from init state s mod n" in out
    assert out.count("[ok  ]") == len(CLAIMS) - 1
    assert f"1 of {len(CLAIMS)} claims broke" in out


def test_verify_harness_exits_2_without_a_vla_eval(tmp_path, monkeypatch, capsys):
    assert gap_main(["verify-harness", str(tmp_path)]) == 2
    assert "holds no vla_eval package" in capsys.readouterr().err
    monkeypatch.setitem(sys.modules, "vla_eval", None)  # `import vla_eval` now raises ImportError
    assert gap_main(["verify-harness"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("gap verify-harness: vla-eval is not importable") and err.count("\n") == 1


# An env whose adapter rendered, left unclosed and collected after the process's atexit
# functions ran (robosuite's eglTerminate among them): interpreter teardown may do that, and a
# GL context freed then printed an "Exception ignored in ... __del__" traceback.
_DROPPED_ENV = """
import atexit, gc
atexit.register(gc.collect)  # registered first, so it runs last: after the displays' ends
from pytest_gap.sim.backend import get_backend
env = get_backend("vla-eval").make_env("libero_object", 0)
print(sorted(env.reset(0).images))
holder = [env]
holder.append(holder)  # garbage only a collection frees
del env, holder
"""


def test_a_process_that_rendered_through_vla_eval_exits_quietly():
    """robosuite's EGL contexts (the adapter's OffScreenRenderEnv) are freed before robosuite
    terminates their display: the env is closed at exit (sim/gl.py close_at_exit)."""
    env = {**os.environ, "MUJOCO_GL": "egl"}
    env.pop("PYOPENGL_PLATFORM", None)
    proc = subprocess.run(
        [sys.executable, "-c", _DROPPED_ENV],
        capture_output=True,
        text=True,
        timeout=300,
        cwd=ROOT,
        env=env,
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert proc.stdout.split("\n")[-2] == "['agentview', 'wrist']", proc.stdout
    out = proc.stdout + proc.stderr
    noisy = [ln for ln in out.splitlines() if "Traceback" in ln or "Exception ignored in" in ln]
    assert noisy == [], out
