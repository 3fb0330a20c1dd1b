"""One (suite, task) of vla-eval's LIBERO adapter as an `Env`: its trials are calls of
vla-eval's own episode loop (`run_episode`, after a `warm_up` per server and process), and it
steps the adapter directly for workflows of scene-free skills.

How an episode is chosen, seeded and recorded is the backend's contract (backend.py's module
docstring). vla-eval and anyio are imported where they are used: vla-eval is an optional
dependency, and backend.py (whose `make_env` builds these) is read to check configs, which
must stay cheap.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np

from pytest_gap.errors import EpisodeError, InfraFailure, SimInputError
from pytest_gap.sim.backend import (
    DatasetFrames,
    EnvOptions,
    EpisodeInfo,
    EpisodeOutcome,
    FrameStrip,
    Observation,
    StepResult,
    Variation,
    WarmUp,
    jitter_seed,
    scene_digest,
    state_digest,
)
from pytest_gap.sim.gl import close_at_exit, ensure_gl_backend, import_robosuite_quietly
from pytest_gap.sim.libero import fresh_property_samplers
from pytest_gap.sim.scene import SceneView
from pytest_gap.sim.step_log import StepLog, goal_objects
from pytest_gap.sim.vla_eval.catalogue import LIBERO, NAME, vla_eval_version

CONNECT_RETRIES = 1  # the session's preflight already found the server up; fail fast after
ACT_TIMEOUT_S = 30.0  # vla-eval's own default per-reply timeout (ServerConfig.timeout)
WARM_UP_TIMEOUT_S = 300.0  # the warm-up's (policies.<id>.warmup_timeout_s, by the runner)
# LIBEROBenchmark's default seed, passed explicitly as vla-eval advises; the env is reseeded
# from each trial's seed before its reset (see backend.py's module docstring).
VLA_EVAL_SEED = 7
FRAMES_REFUSED = (
    "trials.frames_every / --gap-frames: the vla-eval backend records no frames yet; set "
    "frames_every: 0 or drop --gap-frames"
)
DATASET_REFUSED = (
    "trials.dataset: the vla-eval backend records no dataset frames (its loop renders its own "
    "observations); record datasets on backend: libero, or drop trials.dataset"
)


def init_state_digest(bench, task_id: int, episode_idx: int) -> str:
    """The digest of the init state vector vla-eval's adapter sets (`set_init_state` of its
    task suite's `get_task_init_states(task_id)[episode_idx]`). Its env's own state is not
    reachable between that reset and the loop's first action (both happen inside vla-eval's
    `run_episode`), and this is that state: LIBERO's `set_init_state` copies the vector into the
    sim as is (time, qpos, qvel), so it equals the libero backend's digest of the same seed."""
    states = bench._task_suite.get_task_init_states(task_id)
    return state_digest(states[episode_idx])


def step_recorder():
    """A recorder for vla-eval's loop that keeps each step's evidence in a StepLog
    (sim/step_log.py), through vla-eval's own recording interface: its LIBERO adapter hands
    `record_step` the reward, done, executed action (gripper snapped) and the state after each
    step (claim steps-reach-the-recorder). It is inactive (`is_active` False, as vla-eval's
    NullEpisodeRecorder), so the loop's EPISODE_START carries nothing more; the gripper command
    as executed, what is held and how near the hand is come from a SceneView of the adapter's
    env, read only. Each step is one reply of the server."""
    from vla_eval.recording import NullEpisodeRecorder

    class StepRecorder(NullEpisodeRecorder):
        log: StepLog | None = None

        def begin(self, bench) -> None:
            scene = SceneView(bench._env.env)
            self.log = StepLog(scene, goal_objects(scene.goal_state()))
            self.log.start(bench._proprio_state(bench._last_result.obs))

        def record_step(self, **fields: Any) -> None:
            log = self.log
            if log is None:
                return
            log.record(
                step=len(log) + 1,
                action=fields.get("action", np.full(7, np.nan)),
                state_after=fields.get("state", np.full(8, np.nan)),
                reward=float(fields.get("reward", 0.0)),
                done=bool(fields.get("done", False)),
                reply=len(log),
            )

    return StepRecorder()


class VlaEvalEnv:
    """One (suite, task) of vla-eval's LIBERO adapter.

    Its trials are `run_episode` calls (vla-eval's loop). As an `Env` it also steps the adapter
    directly (reset / step / observe / success), for workflows of scene-free skills; it has no
    `scene`, so skills that plan on the scene fail with a clear error."""

    scene = None

    def __init__(
        self,
        suite: str,
        task_id: int,
        options: EnvOptions,
        egl_device: int | None,
        *,
        n_init_states: int,
        max_steps: int,
    ):
        # Our GL choice first: the adapter only setdefault()s its own (claim gl-env-setdefault).
        ensure_gl_backend()
        import_robosuite_quietly()
        self.suite, self.task_id, self.options = suite, task_id, options
        self.egl_device = egl_device
        self.n_init_states = n_init_states
        self.max_steps = options.max_steps or max_steps
        self._benchmarks: dict[tuple, Any] = {}  # server observation_params -> adapter
        self._bench = None  # the adapter of the running episode (direct stepping)
        self._episode: EpisodeInfo | None = None
        self._last: dict | None = None
        self._steps = 0

    # -- vla-eval's objects -------------------------------------------------------------------
    def _benchmark(self, observation_params: Mapping[str, Any]):
        """The adapter for a server's HELLO observation_params, configured as vla-eval's
        orchestrator configures it (claim merge-observation-params)."""
        from vla_eval.orchestrator import _merge_observation_params
        from vla_eval.registry import resolve_import_string

        cls = resolve_import_string(LIBERO.import_string)
        configured = {"suite": self.suite, "seed": VLA_EVAL_SEED}
        if self.options.max_steps is not None:
            configured["max_steps"] = self.options.max_steps
        params = _merge_observation_params(cls, configured, dict(observation_params))
        key = tuple(sorted((k, repr(v)) for k, v in params.items()))
        bench = self._benchmarks.get(key)
        if bench is None:
            bench = cls(**params)
            # Set up as _init_libero does, minus its torch.load patch (claim
            # libero-setup-without-torch): the installed LIBERO loads init states without torch.
            from libero.libero import benchmark as libero_benchmark

            bench._task_suite = libero_benchmark.get_benchmark_dict()[self.suite]()
            self._benchmarks[key] = bench
        return bench

    def _task(self, bench, seed: int) -> dict:
        if seed < 0:
            raise SimInputError(f"seed {seed}: seeds are integers >= 0")
        task = bench.get_tasks()[self.task_id]  # claim task-list-is-task-ids
        return {**task, "episode_idx": seed % self.n_init_states}  # claim episode-idx-is-...

    @staticmethod
    def _seed_env(bench, seed: int) -> None:
        """Seed the adapter's env for the episode about to start: LIBEROBenchmark seeds an env
        it builds with `env_seed`, and an env it reuses keeps its stream unless seeded here."""
        bench.env_seed = jitter_seed(seed)
        if bench._env is not None:
            bench._env.seed(bench.env_seed)

    @contextlib.contextmanager
    def _seeded_starts(self, bench, seed: int):
        """While vla-eval's loop runs: every `start_episode` of `bench` seeds its env from `seed`
        first and digests the settled scene after (into the yielded list). The adapter's own
        method runs in between, unchanged, with LIBERO's hard reset kept from piling up its
        object-state samplers (`fresh_property_samplers`); the wrapper lives on this instance.
        A `StepRecorder` handed to it starts its episode's log on the settled scene."""
        digests: list[str] = []
        original = bench.start_episode

        async def start_episode(task, recorder=None):
            self._seed_env(bench, seed)
            with fresh_property_samplers():  # LIBERO's hard resets leak samplers otherwise
                await original(task, recorder=recorder)
            close_at_exit(self)  # the adapter's env (robosuite's GL contexts) exists now
            digests.append(scene_digest(bench._env.env.sim.data._data))
            if hasattr(recorder, "begin"):
                recorder.begin(bench)

        bench.start_episode = start_episode
        try:
            yield digests
        finally:
            del bench.start_episode

    async def _connect(self, url: str, timeout_s: float):
        from vla_eval.connection import Connection

        conn = Connection(url, timeout=timeout_s, max_retries=CONNECT_RETRIES)
        await conn.connect(benchmark=LIBERO.import_string)
        return conn

    # -- the episode loop ---------------------------------------------------------------------
    def warm_up(self, url: str, seed: int, *, timeout_s: float = WARM_UP_TIMEOUT_S) -> WarmUp:
        """One inference on `url` with this task's real first observation, `timeout_s` to
        answer. Its time is the caller's to record apart from any trial (the runner sends one
        per server and process)."""
        import anyio

        t0 = time.perf_counter()
        try:
            inference_s = anyio.run(self._warm_up, url, seed, timeout_s)
        except Exception as exc:
            raise InfraFailure(
                f"the warm-up inference on vla-eval server {url} failed "
                f"({type(exc).__name__}: {exc})"
            ) from None
        return WarmUp(
            url=url,
            seconds=time.perf_counter() - t0,
            inference_s=inference_s,
            info={"vla_eval_version": vla_eval_version()},
        )

    async def _warm_up(self, url: str, seed: int, timeout_s: float) -> float:
        conn = await self._connect(url, timeout_s)
        try:
            bench = self._benchmark(conn.server_info.get("observation_params") or {})
            task = self._task(bench, seed)
            await bench.start_episode(task)
            close_at_exit(self)  # the adapter's env (robosuite's GL contexts) exists now
            obs = await bench.get_observation()
            await conn.start_episode({"task": {"warm_up": True}})
            t0 = time.perf_counter()
            await conn.act(obs)
            inference_s = time.perf_counter() - t0
            await conn.end_episode({"warm_up": True})
            return inference_s
        finally:
            await conn.close()

    def run_episode(
        self,
        seed: int,
        *,
        url: str,
        timeout_s: float = ACT_TIMEOUT_S,
        frames: FrameStrip | None = None,
        dataset: DatasetFrames | None = None,
    ) -> EpisodeOutcome:
        """One episode through vla-eval's SyncEpisodeRunner against the server at `url`, each
        reply within `timeout_s` (vla-eval's Connection timeout). `frames` is refused
        (SimInputError): vla-eval's loop renders its own observations."""
        import anyio

        if frames is not None:
            raise SimInputError(FRAMES_REFUSED)
        if dataset is not None:
            raise SimInputError(DATASET_REFUSED)

        try:
            return anyio.run(self._run_episode, seed, url, timeout_s)
        except SimInputError:
            raise
        except Exception as exc:
            from vla_eval.runners.base import EpisodeError as VlaEpisodeError

            where = f" in {exc.phase}" if isinstance(exc, VlaEpisodeError) else ""
            raise InfraFailure(
                f"vla-eval's episode loop failed{where} against {url} ({type(exc).__name__}: {exc})"
            ) from None

    async def _run_episode(self, seed: int, url: str, timeout_s: float) -> EpisodeOutcome:
        from vla_eval.runners.sync_runner import SyncEpisodeRunner

        self._episode, self._bench, self._steps = None, None, 0  # no stale episode on abort
        conn = await self._connect(url, timeout_s)
        try:
            bench = self._benchmark(conn.server_info.get("observation_params") or {})
            task = self._task(bench, seed)
            recorder = step_recorder()
            with self._seeded_starts(bench, seed) as digests:
                result = await SyncEpisodeRunner().run_episode(
                    bench, task, conn, max_steps=self.max_steps, recorder=recorder
                )
        finally:
            await conn.close()
        success = bool((result.get("metrics") or {}).get("success"))
        steps = int(result.get("steps", 0))
        digest = init_state_digest(bench, self.task_id, task["episode_idx"])
        scene = digests[0] if digests else None
        self._episode = EpisodeInfo(
            seed=seed,
            init_state=task["episode_idx"],
            prompt=task["name"],
            goal=(),
            init_state_digest=digest,
            scene_digest=scene,
        )
        self._bench, self._steps = bench, steps
        return EpisodeOutcome(
            init_state=task["episode_idx"],
            prompt=task["name"],
            success=success,
            steps=steps,
            completion=1.0 if success else 0.0,
            init_state_digest=digest,
            scene_digest=scene,
            server_metadata=dict(conn.server_info or {}),
            reason=None
            if success
            else f"vla-eval's episode ended unsuccessful after {steps} steps",
            step_log=recorder.log,
            info={
                "backend": NAME,
                "vla_eval_version": vla_eval_version(),
                "server_url": url,
                "benchmark": LIBERO.import_string,
                "episode_idx": task["episode_idx"],
                "max_steps": self.max_steps,
                "elapsed_sec": result.get("elapsed_sec"),
            },
        )

    # -- Env: stepping the adapter directly ---------------------------------------------------
    @property
    def episode(self) -> EpisodeInfo:
        if self._episode is None:
            raise EpisodeError(f"vla-eval {self.suite} task {self.task_id}: call reset(seed) first")
        return self._episode

    @property
    def steps(self) -> int:
        return self._steps

    def reset(
        self,
        seed: int,
        *,
        variation: Variation | None = None,
        video: str | Path | None = None,
        frames: FrameStrip | None = None,
        dataset: DatasetFrames | None = None,
    ) -> Observation:
        import anyio

        if variation is not None and variation.suite != self.suite:
            raise SimInputError(
                f"variation {variation.family}/{variation.variation} runs on suite "
                f"{variation.suite}, but this env is {self.suite}"
            )
        if video is not None:
            raise SimInputError(
                "record_video: the vla-eval backend does not record videos yet; turn it off"
            )
        if frames is not None:
            raise SimInputError(FRAMES_REFUSED)
        if dataset is not None:
            raise SimInputError(DATASET_REFUSED)
        # Direct stepping: the adapter with vla-eval's defaults plus the wrist image and state.
        bench = self._benchmark({"send_wrist_image": True, "send_state": True})
        task = self._task(bench, seed)
        with self._seeded_starts(bench, seed) as digests:
            anyio.run(bench.start_episode, task)
        self._bench, self._steps = bench, 0
        self._episode = EpisodeInfo(
            seed=seed,
            init_state=task["episode_idx"],
            prompt=task["name"],
            goal=(),
            init_state_digest=init_state_digest(bench, self.task_id, task["episode_idx"]),
            scene_digest=digests[0],
        )
        return self.observe()

    def _require_bench(self):
        if self._bench is None:
            raise EpisodeError(f"vla-eval {self.suite} task {self.task_id}: call reset(seed) first")
        return self._bench

    def step(self, action: Any) -> StepResult:
        import anyio

        bench = self._require_bench()
        action = np.asarray(action, dtype=np.float64).reshape(-1)
        if action.shape != (7,) or not np.all(np.isfinite(action)):
            raise SimInputError(f"action {action.tolist()}: expected 7 finite numbers")
        anyio.run(bench.apply_action, {"actions": action})
        self._steps += 1
        success = self.success()
        return StepResult(
            obs=self.observe(),
            success=success,
            completion=1.0 if success else 0.0,
            steps=self._steps,
            truncated=not success and self._steps >= self.max_steps,
        )

    def observe(self, cameras: tuple[str, ...] | None = None) -> Observation:
        """vla-eval's observation: its images (turned upright by its adapter) and 8-D state."""
        import anyio

        obs = anyio.run(self._require_bench().get_observation)
        images = obs.get("images", {})
        if cameras is not None:
            images = {k: v for k, v in images.items() if k in cameras}
        return Observation(images=images, state=obs.get("states"), prompt=obs["task_description"])

    def success(self) -> bool:
        import anyio

        return bool(anyio.run(self._require_bench().is_done))

    def completion(self) -> float:
        return 1.0 if self.success() else 0.0

    def goal_status(self) -> list[bool]:
        return [self.success()]

    def finish_video(self) -> int:
        return 0

    def libero_obs(self, size: int = 256, wrist: bool = True):
        """What run_policy's observation formats read; not offered here (see the class doc)."""
        raise SimInputError(
            "run_policy inside a workflow needs the libero backend; on backend vla-eval, run "
            "the policy_only mode, whose trial is vla-eval's own episode loop"
        )

    def close(self) -> None:
        for bench in self._benchmarks.values():
            bench.cleanup()
        self._benchmarks.clear()
        self._bench = None
