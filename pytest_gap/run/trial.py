"""Run one trial: produce the cell x task workflow, reset a pooled env to the seed, execute.

Knows nothing of pytest. `TrialRun.execute()` always writes a result.json for its trial: a
workflow that fails is a failed trial, and anything the harness could not do (a broken
workflow, a simulator fault) is an errored one. An attempt that a harness fault broke (an
exception raised in the simulator, its renderer or the host: faults.py) is re-run once on a
fresh env, both attempts recorded. An interruption from outside (the pytest-timeout
watchdog) is recorded afterwards with `abort()`, keeping the steps and partial completion
reached so far.

Time spent waiting for a `num_workers` slot is not the trial's: the watchdog is paused while
it waits (`Watchdog`, watchdog.py), and running.json's start moves forward by the wait, so a
crash is judged on the time charged too. A trial that gets no slot within its budget is an errored
(infrastructure) trial. Producing its workflow (an LLM's answers, or the lock of another
worker producing it) is not charged either: the LLM client's own timeout and retries bound it.

What a record holds beyond the trial's own timing is spelled out in record.py; a trial whose
policy server the session supervises runs through supervised.py's `run_supervised`.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import time
from pathlib import Path
from typing import TYPE_CHECKING

from pytest_gap.cells import Trial
from pytest_gap.errors import GapError, InfraFailure
from pytest_gap.faults import HarnessFault
from pytest_gap.layout import FRAMES_DIR, RUNNING_FILE, SLOTS_DIR, inside
from pytest_gap.policies.warmup import warm_up, warmed_servers
from pytest_gap.results import (
    EXIT_ERROR,
    EarlierAttempt,
    TrialIdentity,
    TrialResult,
    now_iso,
    write_json,
    write_result,
)
from pytest_gap.run.devices import egl_device_for_cell
from pytest_gap.run.produce import produce_for_trial, trial_workflow
from pytest_gap.run.record import (
    episode_loop_fields,
    evidence_fields,
    exception_fields,
    frames_link,
    frames_receipt,
    no_workflow_fields,
    opening_fields,
    relative_path,
    start_state,
    workflow_run_fields,
    write_warmup,
)
from pytest_gap.run.watchdog import NoWatchdog, Watchdog
from pytest_gap.sim.backend import (
    DatasetFrames,
    EnvOptions,
    FrameStrip,
    episode_modes,
    get_backend,
    resolve_variation,
)
from pytest_gap.sim.step_log import StepLog
from pytest_gap.skills.policy import privileged_state
from pytest_gap.throttle import Slot, SlotTimeout
from pytest_gap.workflow.executor import RunResult, run_workflow
from pytest_gap.workflow.schema import WORKFLOW_FILE, load_workflow

if TYPE_CHECKING:
    from pytest_gap.modes import ModeTable
    from pytest_gap.policies.endpoint import PolicyEndpoint

VIDEO_FILE = "video.mp4"


class TrialRun:
    """One trial, start to result.json. The plugin runs every benchmark trial through it and
    `gap run` runs its one trial through it too, so the two cannot drift: env from the backend
    (through `pool`), workflow from the mode's producer, execution, the recorded result.

    `trace_dir` and `video` put the trace and the video elsewhere than the trial dir (result.json
    then records absolute paths); `keep_images` keeps perception images in the trace;
    `reset_options` are extra keyword arguments of the backend env's `reset` (LIBERO's
    `video_wrist`); `plan_digest` is the config's (provenance.plan_digest), recorded. After
    `execute`, `workflow_run` is the executor's result (None when no workflow ran) and
    `video_frames` the recorded video's frame count.

    A cell with `frames_every` N records a strip of every N-th agentview frame to `frames_path`
    (FrameStrip; asked for and missing: errored), with `dataset_size` its dataset frames."""

    def __init__(
        self,
        trial: Trial,
        run_dir: Path,
        *,
        nodeid: str,
        config: str,
        pool,
        worker: str | None = None,
        policies: dict[str, PolicyEndpoint] | None = None,
        llm=None,
        max_validation_retries: int = 2,
        watchdog: Watchdog | None = None,
        mode_table: ModeTable | None = None,
        trace_dir: Path | None = None,
        video: Path | None = None,
        keep_images: bool = False,
        reset_options: dict | None = None,
        plan_digest: str | None = None,
        earlier_attempts: list[EarlierAttempt] | None = None,
    ):
        self.trial, self.run_dir, self.pool = trial, run_dir, pool
        self.watchdog = watchdog or NoWatchdog()
        self.policies = policies or {}
        self.llm, self.max_validation_retries = llm, max_validation_retries
        self.mode_table = mode_table  # None: the built-in modes
        self._trace_dir, self._video = trace_dir, video
        self.keep_images, self.reset_options = keep_images, reset_options or {}
        self.workflow_run: RunResult | None = None
        self.video_frames, self.config_source = 0, config
        # Checked here, before execute deletes and rewrites it: a trial dir never lies outside
        # its run dir, whatever names its key was made of.
        self.dir = inside(run_dir, trial.key)
        self.env = None
        self.result: TrialResult | None = None
        self._fault: HarnessFault | None = None  # the last attempt's (faults.py)
        self._t0 = time.perf_counter()
        self._produce_s = self._slot_wait_s = 0.0
        self._started = time.time()
        self._eval_t0: float | None = None
        # prompt (what the workflow was given), env_prompt (the env's instruction), workflow
        self._prompts: dict[str, str] = {}
        identity = TrialIdentity.of(trial, nodeid=nodeid, config=config)
        self.frames_path = inside(run_dir, f"{FRAMES_DIR}/{identity.slug}.webp")
        endpoint = self.policies.get(trial.cell.policy_id or "")
        self._base = opening_fields(
            identity,
            trial.cell.backend,
            worker=worker,
            earlier_attempts=list(earlier_attempts or []),
            plan_digest=plan_digest,
            policy_url=endpoint.url if endpoint is not None else None,
        )

    # -- the trial ---------------------------------------------------------------------------
    def execute(self) -> TrialResult:
        """Run the trial and record it. An attempt a harness fault broke is re-run once on a
        fresh env (the pooled one thrown away, renderers and all), with a full watchdog budget;
        the record lists the broken attempt and its fault (`earlier_attempts`). A re-run that
        faults again is an infrastructure failure, left out of every rate."""
        result = self._attempt()
        if self._fault is None:
            return result
        self._discard_env()
        broken = EarlierAttempt.of(result, f"{self._fault.line()}; re-run once on a fresh env")
        self._base["earlier_attempts"] = [*self._base["earlier_attempts"], broken]
        self._start_over()
        result = self._attempt()
        if self._fault is not None:
            self._discard_env()
        return result

    def _attempt(self) -> TrialResult:
        """One attempt, recorded; `_fault` is its harness fault (None if it had none)."""
        self._fault = None
        shutil.rmtree(self.dir, ignore_errors=True)  # a re-run starts from a clean trial dir
        self.frames_path.unlink(missing_ok=True)  # nor may an earlier attempt's strip stand in
        self.dir.mkdir(parents=True)
        self._started = time.time()
        self._write_running()
        cell = self.trial.cell
        if cell.error:
            return self._finish(
                exit_code=EXIT_ERROR, error=cell.error, infra_failure=cell.infra_error
            )
        try:
            fields = self._run()
        except InfraFailure as exc:  # an LLM endpoint or policy server that kept failing
            return self._finish(exit_code=EXIT_ERROR, error=str(exc), infra_failure=True)
        except Exception as exc:
            return self._finish(**exception_fields(exc, self.dir, self.trial.key))
        return self._finish(**fields)

    def _discard_env(self) -> None:
        """Throw the env of a faulted attempt out of the pool (sim/pool.py `discard`)."""
        env, self.env = self.env, None
        if env is not None:
            self.pool.discard(env)

    def _start_over(self) -> None:
        """Before a re-run: a full watchdog budget from now; clocks and outputs of its own."""
        self.watchdog.restart()
        self._t0 = time.perf_counter()
        self._produce_s = self._slot_wait_s = 0.0
        self._eval_t0 = None
        self._prompts = {}
        self.workflow_run, self.video_frames = None, 0
        self._base["started_at"] = now_iso()

    def _run(self) -> dict:
        """The trial on its env, by the backend's own episode loop or by the mode's workflow;
        returns the fields of its record."""
        cell = self.trial.cell
        backend = get_backend(cell.backend)
        variation = resolve_variation(backend, cell.family, cell.variation)
        env = self._open_env(backend)
        # Only a trial that asks for frames (a dataset) passes `frames` (`dataset`): backends
        # written before them keep working for every other trial.
        recording = {}
        if cell.frames_every:
            recording["frames"] = FrameStrip(path=self.frames_path, every=cell.frames_every)
        if cell.dataset_size:
            recording["dataset"] = DatasetFrames(
                dir=self.dir, size=cell.dataset_size, every=cell.dataset_every
            )
        if cell.mode in episode_modes(backend):
            return self._run_own_loop(env, recording)
        return self._run_workflow(env, variation, recording)

    def _open_env(self, backend):
        """The trial's env from the pool, built for one of this worker's own devices."""
        cell, trial = self.trial.cell, self.trial
        device = egl_device_for_cell(cell.device_offset)  # one of this worker's own devices
        cameras = ("agentview",) if cell.record_video else ()
        options = EnvOptions(cameras=cameras, max_steps=cell.max_steps)
        self.env = env = self.pool.get(
            cell.suite, trial.task_id, options, egl_device=device, backend=backend
        )
        if env.egl_device is not None:
            self._base["devices"]["env_egl_device"] = str(env.egl_device)
        return env

    def _run_workflow(self, env, variation, recording: dict) -> dict:
        """Reset the env to the seed, produce the workflow its instruction asks for, run it."""
        cell, trial = self.trial.cell, self.trial
        video = (self._video or self.dir / VIDEO_FILE) if cell.record_video else None
        t_reset = time.perf_counter()
        obs = env.reset(
            trial.seed, variation=variation, video=video, **recording, **self.reset_options
        )
        reset_s = time.perf_counter() - t_reset
        try:  # the seed's instruction decides which workflow it runs (see _produce)
            workflow_dir = self._produce(variation, obs.prompt)
        except BaseException:
            with contextlib.suppress(GapError):
                env.finish_video()
            raise
        self._eval_t0 = time.perf_counter() - reset_s  # evaluation: reset + run, not production
        prompts = self._prompts
        if not (workflow_dir / WORKFLOW_FILE).is_file():  # the producer wrote no valid graph
            return self._no_workflow(env, workflow_dir)
        trace_dir = (self._trace_dir or self.dir / "trace") if cell.enable_tracing else None
        step_log = StepLog.of(env)
        with self._throttled():
            self.workflow_run = run = run_workflow(
                load_workflow(workflow_dir),
                env,
                trace_dir=trace_dir,
                policies=self.policies,
                task_prompt=prompts["prompt"],
                keep_images=self.keep_images,
                perception=cell.perception,
                before_connect=self._warm_policy,
                step_log=step_log,
            )
        self.video_frames = env.finish_video()
        if run.infra_failure:
            return {
                **evidence_fields(step_log, self.dir, self.run_dir),
                "exit_code": EXIT_ERROR,
                "error": run.error,
                "infra_failure": True,
                "fault": run.fault,
                "steps": run.steps - run.bringup_steps,
                "bringup_steps": run.bringup_steps,
                **start_state(env.episode),
                **prompts,
                "policy_digest": run.policy_digests.get(cell.policy_id or ""),
                "frames": self._frames_link(),
            }
        return self._workflow_fields(env, run, video, trace_dir, step_log)

    def _no_workflow(self, env, workflow_dir: Path) -> dict:
        """The record of a trial whose producer wrote no valid graph: the problems it found."""
        self.video_frames = env.finish_video()
        return {
            **start_state(env.episode),
            **self._prompts,
            "frames": self._frames_receipt(),
            **no_workflow_fields(workflow_dir),
        }

    def _workflow_fields(
        self, env, run: RunResult, video: Path | None, trace_dir: Path | None, log: StepLog
    ) -> dict:
        """The record of a workflow that ran to its end (success or not)."""
        return {
            **start_state(env.episode),
            **self._prompts,
            **workflow_run_fields(run, self.trial.cell.policy_id, log, self.dir, self.run_dir),
            "video": self._relative(video) if video else None,
            "frames": self._frames_receipt(),
            "trace": self._relative(trace_dir / "dag_trace.json") if trace_dir else None,
        }

    def _relative(self, path: Path) -> str:
        return relative_path(path, self.run_dir)

    def _frames_link(self) -> str | None:
        return frames_link(self.frames_path, self.run_dir)

    def _frames_receipt(self) -> str | None:
        return frames_receipt(self.frames_path, self.run_dir, self.trial.cell.frames_every)

    def _run_own_loop(self, env, recording: dict) -> dict:
        """The trial of a backend that runs bare-policy trials itself (sim/backend.py
        EpisodeLoopEnv, e.g. vla-eval): its episode loop against the cell's policy server, no
        workflow. The server's warm-up inference (once per server and process) is charged to no
        trial: not to the watchdog, wall_s or eval_s; it is recorded in the run dir's warmup/."""
        cell, trial = self.trial.cell, self.trial
        endpoint = self.policies.get(cell.policy_id or "")
        if endpoint is None:
            raise GapError(
                f"mode {cell.mode} on backend {cell.backend} needs a policy server: list a "
                "policies: entry in benchmark.policies"
            )
        if endpoint.protocol != "vla-eval":
            raise GapError(
                f"policies.{cell.policy_id}: backend {cell.backend} talks vla-eval's protocol; "
                "set protocol: vla-eval"
            )
        self._warm_once(
            cell.policy_id,
            endpoint,
            lambda: env.warm_up(endpoint.url, trial.seed, timeout_s=endpoint.warmup_timeout_s),
        )
        self._eval_t0 = time.perf_counter()
        with self._throttled():
            outcome = env.run_episode(
                trial.seed, url=endpoint.url, timeout_s=endpoint.timeout_s, **recording
            )
        fields = episode_loop_fields(outcome, self.dir, self.run_dir)
        return {**fields, "frames": self._frames_receipt()}

    def _warm_policy(self, policy_id: str) -> None:
        """Before this trial first talks to `policy_id`'s server: warm it, once per process
        (policies/warmup.py), with the trial's real observation."""
        endpoint, env = self.policies[policy_id], self.env
        extra = {"privileged": privileged_state(env)} if endpoint.privileged else None
        prompt = self._prompts.get("prompt") or env.episode.prompt
        self._warm_once(policy_id, endpoint, lambda: warm_up(endpoint, env, prompt, extra=extra))

    def _warm_once(self, policy_id: str | None, endpoint: PolicyEndpoint, warm) -> None:
        """Run `warm()` (-> WarmUp) unless this process warmed `endpoint`'s server already,
        charged to no trial: the watchdog is paused, and the time it took is taken off this
        trial's wall, eval and start times. Recorded in the run dir's warmup/, one file per
        server and process. A server that does not answer it is an infrastructure failure."""
        if endpoint.url in warmed_servers():
            return
        self.watchdog.pause()
        try:
            done = warm()
        except InfraFailure as exc:
            raise InfraFailure(
                f"the warm-up inference of policy {policy_id} at {endpoint.url} failed "
                f"(warmup_timeout_s {endpoint.warmup_timeout_s:g}): {exc}"
            ) from None
        finally:
            self.watchdog.resume()
        warmed_servers().add(endpoint.url)
        self._t0 += done.seconds
        self._started += done.seconds
        if self._eval_t0 is not None:
            self._eval_t0 += done.seconds
        self._write_running()
        write_warmup(
            self.run_dir,
            policy_id,
            done,
            timeout_s=endpoint.warmup_timeout_s,
            worker=self._base["worker"],
            before_trial=self.trial.key,
        )

    def _write_running(self) -> None:
        """running.json: who runs the trial, and since when its watchdog time counts (the
        controller judges a dead worker's trial by it)."""
        write_json(
            self.dir / RUNNING_FILE,
            {
                "pid": os.getpid(),
                "started": (self.watchdog.started or self._started) + self._slot_wait_s,
                "slot_wait_s": self._slot_wait_s,
                "timeout_s": self.trial.cell.timeout_s,
            },
        )

    @contextlib.contextmanager
    def _throttled(self):
        """Hold one of the cell's `num_workers` slots; the wait is not charged to the watchdog
        and is bounded by the trial's budget (`timeout_s`; 0 waits as long as it takes)."""
        cell = self.trial.cell
        held = Slot(self.run_dir / SLOTS_DIR / cell.throttle_key, cell.num_workers)
        budget = cell.timeout_s or None
        t0 = time.perf_counter()
        self.watchdog.pause()
        try:
            held.acquire(budget)
        except SlotTimeout:
            whose = f"suite {cell.suite_name}" if cell.suite_name else f"mode {cell.mode}"
            if cell.policy_id:
                whose = f"policy {cell.policy_id} ({cell.mode})"
            raise InfraFailure(
                f"no num_workers slot of {whose} came free within the trial's {budget:g} s "
                f"budget (num_workers {cell.num_workers}, all held by other trials); raise "
                "num_workers or the timeout, or run fewer workers"
            ) from None
        finally:
            self._slot_wait_s += time.perf_counter() - t0
            self._write_running()
            self.watchdog.resume()
        try:
            yield
        finally:
            held.release()

    def _produce(self, variation, instruction: str) -> Path:
        """The workflow for this trial's instruction, from the mode's producer, once per
        distinct instruction of a cell x task (run/produce.py `trial_workflow`)."""
        workflow = trial_workflow(
            self.trial, instruction, self.run_dir, generated=variation.generated
        )
        self._prompts = {
            "prompt": workflow.prompt,
            "env_prompt": instruction,
            "workflow": workflow.name,
        }
        # Not the trial's time either: an LLM that hangs is bounded by llm.timeout_s and
        # llm.max_retries and ends as an infrastructure failure, not as the policy's 124.
        self.watchdog.pause()
        try:
            self._produce_s = produce_for_trial(
                self.trial,
                workflow,
                llm=self.llm,
                config_source=self.config_source,
                max_validation_retries=self.max_validation_retries,
                mode_table=self.mode_table,
            )
        finally:
            self.watchdog.resume()
        return workflow.dir

    # -- recording ---------------------------------------------------------------------------
    def _finish(self, **fields) -> TrialResult:
        self._fault = fields.get("fault")
        if self._fault is not None and any(a.fault for a in self._base["earlier_attempts"]):
            fields["error"] += "; the re-run on a fresh env faulted again"
        wall = time.perf_counter() - self._t0
        eval_s = time.perf_counter() - self._eval_t0 if self._eval_t0 is not None else 0.0
        eval_s = max(eval_s - self._slot_wait_s, 0.0)
        self.result = TrialResult(
            **self._base,
            **fields,
            wall_s=wall,
            slot_wait_s=self._slot_wait_s,
            produce_s=self._produce_s,
            eval_s=eval_s,
            finished_at=now_iso(),
        )
        write_result(self.dir, self.result)
        return self.result

    def abort(self, exit_code: int, reason: str) -> TrialResult:
        """Record a trial stopped from outside, with the steps and completion reached so far."""
        if self._slot_wait_s >= 1:
            reason += f" (not counting {self._slot_wait_s:.0f} s waiting for a num_workers slot)"
        fields: dict = {"exit_code": exit_code, "reason": reason}
        env = self.env
        try:
            episode = env.episode if env is not None else None
        except GapError:  # stopped before its episode began
            episode = None
        if episode is not None and episode.seed == self.trial.seed:
            fields |= {
                **start_state(episode),
                "prompt": episode.prompt,
                **self._prompts,
                "steps": env.steps,
                "completion": env.completion(),
            }
            with contextlib.suppress(GapError):
                env.finish_video()
            fields["frames"] = self._frames_link()
        return self._finish(**fields)
