"""Run one trial: produce the cell x task workflow, reset a pooled env to the seed, execute.

Knows nothing of pytest. `TrialRun.execute()` always writes a result.json for its trial: a
workflow that fails is a failed trial, and anything the harness could not do (a broken
workflow, a simulator fault) is an errored one. An interruption from outside (the pytest-timeout
watchdog) is recorded afterwards with `abort()`, keeping the steps and partial completion
reached so far.

Time spent waiting for a `num_workers` slot is not the trial's: the watchdog is paused while
it waits (`Watchdog`), and running.json's start moves forward by the wait, so a crash is judged
on the time charged too. A trial that gets no slot within its budget is an errored
(infrastructure) trial. Producing its workflow (an LLM's answers, or the lock of another
worker producing it) is not charged either: the LLM client's own timeout and retries bound it.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import time
import traceback
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Protocol

from pytest_gap.devices import egl_device_for_cell
from pytest_gap.errors import GapError, InfraFailure, VideoError
from pytest_gap.layout import FRAMES_DIR, RUNNING_FILE, WARMUP_DIR, inside
from pytest_gap.plan import Trial
from pytest_gap.producers.base import PRODUCED_FILE
from pytest_gap.provenance import record_fields
from pytest_gap.redaction import redact_text
from pytest_gap.results import (
    EXIT_CRASH,
    EXIT_ERROR,
    EXIT_TIMEOUT,
    EarlierAttempt,
    TrialIdentity,
    TrialResult,
    now_iso,
    read_result,
    write_json,
    write_result,
)
from pytest_gap.run.produce import produce_for_trial, trial_workflow
from pytest_gap.throttle import Slot, SlotTimeout
from pytest_gap.workflow.schema import WORKFLOW_FILE

if TYPE_CHECKING:
    from pytest_gap.modes import ModeTable
    from pytest_gap.policies.endpoint import PolicyEndpoint
    from pytest_gap.policies.supervisor import ServerWatch
    from pytest_gap.workflow.executor import RunResult

VIDEO_FILE = "video.mp4"


class Watchdog(Protocol):
    """The trial's time limit, as whoever enforces it (pytest-timeout, in the plugin) sees it."""

    # When (epoch seconds) the limit began counting, None if it never did: before the trial
    # executes (pytest-timeout counts the item's setup), so the controller that judges a
    # killed worker by running.json must count from here, not from `execute`.
    started: float | None

    def pause(self) -> None:
        """Stop charging time to the trial (it is about to wait for a slot)."""

    def resume(self) -> None:
        """Charge time again, with the budget that was left at `pause`."""

    def restart(self) -> None:
        """A full budget again, counted from now: the trial is re-run (run_supervised)."""


class _NoWatchdog:
    started = None

    def pause(self) -> None:
        pass

    def resume(self) -> None:
        pass

    def restart(self) -> None:
        pass


def _start_state(episode) -> dict:
    """What a record says of the state its episode started from."""
    return {
        "init_state": episode.init_state,
        "init_state_digest": getattr(episode, "init_state_digest", None),
        "scene_digest": getattr(episode, "scene_digest", None),
    }


def _reason(run) -> str | None:
    if run.success:
        return None
    if run.error:
        return f"workflow {run.exit_status}: {run.error}"
    where = f" at {run.end_node}" if run.end_node else ""
    return f"workflow ended with {run.exit_status}{where}"


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

    A cell with `frames_every` N records a sprite strip of every N-th agentview frame to
    `frames_path` (sim/backend.py FrameStrip); a trial that was asked for one and has none is
    errored, never recorded without it."""

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
        self.watchdog = watchdog or _NoWatchdog()
        self.policies = policies or {}
        self.llm, self.max_validation_retries = llm, max_validation_retries
        self.mode_table = mode_table  # None: the built-in modes
        self._trace_dir, self._video = trace_dir, video
        self.keep_images, self.reset_options = keep_images, reset_options or {}
        self.workflow_run: RunResult | None = None
        self.video_frames = 0
        self.config_source = config
        # Checked here, before execute deletes and rewrites it: a trial dir never lies outside
        # its run dir, whatever names its key was made of.
        self.dir = inside(run_dir, trial.key)
        self.env = None
        self.result: TrialResult | None = None
        self._t0 = time.perf_counter()
        self._produce_s = 0.0
        self._slot_wait_s = 0.0
        self._started = time.time()
        self._eval_t0: float | None = None
        # prompt (what the workflow was given), env_prompt (the env's instruction), workflow
        self._prompts: dict[str, str] = {}
        identity = TrialIdentity.of(trial, nodeid=nodeid, config=config)
        self.frames_path = inside(run_dir, f"{FRAMES_DIR}/{identity.slug}.webp")
        self._base = {
            **identity.model_dump(),
            "worker": worker,
            "devices": {
                k: os.environ[k]
                for k in ("CUDA_VISIBLE_DEVICES", "MUJOCO_EGL_DEVICE_ID")
                if k in os.environ
            },
            "started_at": now_iso(),
            "earlier_attempts": list(earlier_attempts or []),
        }
        endpoint = self.policies.get(trial.cell.policy_id or "")
        self._base |= record_fields(
            trial.cell.backend,
            plan_digest=plan_digest,
            policy_url=endpoint.url if endpoint is not None else None,
        )

    # -- the trial ---------------------------------------------------------------------------
    def execute(self) -> TrialResult:
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
        except GapError as exc:  # something a user can fix: one line, no traceback
            return self._finish(exit_code=EXIT_ERROR, error=str(exc))
        except Exception as exc:
            (self.dir / "error.txt").write_text(traceback.format_exc())
            return self._finish(
                exit_code=EXIT_ERROR,
                error=f"{type(exc).__name__}: {exc} (traceback in {self.trial.key}/error.txt)",
                infra_failure=True,
            )
        return self._finish(**fields)

    def _run(self) -> dict:
        from pytest_gap.sim.backend import (
            EnvOptions,
            FrameStrip,
            episode_modes,
            get_backend,
            resolve_variation,
        )
        from pytest_gap.workflow.executor import run_workflow
        from pytest_gap.workflow.schema import load_workflow

        cell, trial = self.trial.cell, self.trial
        backend = get_backend(cell.backend)
        variation = resolve_variation(backend, cell.family, cell.variation)
        device = egl_device_for_cell(cell.device_offset)  # one of this worker's own devices
        cameras = ("agentview",) if cell.record_video else ()
        options = EnvOptions(cameras=cameras, max_steps=cell.max_steps)
        self.env = env = self.pool.get(
            cell.suite, trial.task_id, options, egl_device=device, backend=backend
        )
        if env.egl_device is not None:
            self._base["devices"]["env_egl_device"] = str(env.egl_device)
        # Only a trial that asks for frames passes `frames`: backends written before it keep
        # working for every other trial.
        recording = (
            {"frames": FrameStrip(path=self.frames_path, every=cell.frames_every)}
            if cell.frames_every
            else {}
        )
        if cell.mode in episode_modes(backend):
            return self._run_own_loop(env, recording)
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
            self.video_frames = env.finish_video()
            produced = json.loads((workflow_dir / PRODUCED_FILE).read_text())
            return {
                **_start_state(env.episode),
                **prompts,
                "frames": self._frames_receipt(),
                "exit_status": "no_workflow",
                "reason": "the LLM produced no valid workflow: "
                + "; ".join(produced.get("problems", [])[:3]),
            }
        trace_dir = (self._trace_dir or self.dir / "trace") if cell.enable_tracing else None
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
            )
        self.video_frames = env.finish_video()
        if run.infra_failure:
            return {
                "exit_code": EXIT_ERROR,
                "error": run.error,
                "infra_failure": True,
                "steps": run.steps,
                **_start_state(env.episode),
                **prompts,
                "policy_digest": run.policy_digests.get(cell.policy_id or ""),
                "frames": self._frames_link(),
            }
        return {
            **_start_state(env.episode),
            **prompts,
            "policy_digest": run.policy_digests.get(cell.policy_id or ""),
            "success": run.success,
            "completion": run.completion,
            "reward": 1.0 if run.success else 0.0,
            "steps": run.steps,
            "bringup_steps": run.bringup_steps,
            "exit_status": run.exit_status,
            "reason": _reason(run),
            "video": self._relative(video) if video else None,
            "frames": self._frames_receipt(),
            "trace": self._relative(trace_dir / "dag_trace.json") if trace_dir else None,
        }

    def _relative(self, path: Path) -> str:
        """A path result.json records: relative to the run dir, or absolute outside it."""
        path = Path(path).absolute()
        if path.is_relative_to(self.run_dir.absolute()):
            return path.relative_to(self.run_dir.absolute()).as_posix()
        return str(path)

    def _frames_link(self) -> str | None:
        """The trial's strip as result.json records it, None if there is none."""
        path = self.frames_path
        return self._relative(path) if path.is_file() and path.stat().st_size else None

    def _frames_receipt(self) -> str | None:
        """`_frames_link`, and for a trial that was asked for frames, proof that it has them:
        a strip that is missing or empty errors the trial (VideoError)."""
        every = self.trial.cell.frames_every
        link = self._frames_link()
        if every and link is None:
            raise VideoError(
                f"frames: this trial was asked for a frame strip (frames_every {every}, from "
                "trials.frames_every or --gap-frames) but none was written to "
                f"{self._relative(self.frames_path)}"
            )
        return link

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
        from pytest_gap.policies.wire import metadata_digest

        served = outcome.server_metadata
        return {
            "init_state": outcome.init_state,
            "init_state_digest": outcome.init_state_digest,
            "scene_digest": outcome.scene_digest,
            "policy_digest": metadata_digest(served) if served is not None else None,
            "prompt": outcome.prompt,
            "env_prompt": outcome.prompt,
            "success": outcome.success,
            "completion": outcome.completion,
            "reward": 1.0 if outcome.success else 0.0,
            "steps": outcome.steps,
            # The executor's names: the simulator's goal check passed, or the step limit came.
            "exit_status": "task_success" if outcome.success else "step_limit",
            "reason": outcome.reason,
            "frames": self._frames_receipt(),
            "backend_info": outcome.info,
        }

    def _warm_policy(self, policy_id: str) -> None:
        """Before this trial first talks to `policy_id`'s server: warm it, once per process
        (policies/warmup.py), with the trial's real observation."""
        from pytest_gap.policies.warmup import warm_up
        from pytest_gap.skills.policy import privileged_state

        endpoint, env = self.policies[policy_id], self.env
        extra = {"privileged": privileged_state(env)} if endpoint.privileged else None
        prompt = self._prompts.get("prompt") or env.episode.prompt
        self._warm_once(policy_id, endpoint, lambda: warm_up(endpoint, env, prompt, extra=extra))

    def _warm_once(self, policy_id: str | None, endpoint: PolicyEndpoint, warm) -> None:
        """Run `warm()` (-> WarmUp) unless this process warmed `endpoint`'s server already,
        charged to no trial: the watchdog is paused, and the time it took is taken off this
        trial's wall, eval and start times. Recorded in the run dir's warmup/, one file per
        server and process. A server that does not answer it is an infrastructure failure."""
        from pytest_gap.policies.warmup import warmed_servers

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
        write_json(
            inside(self.run_dir, f"{WARMUP_DIR}/{policy_id}.{os.getpid()}.json"),
            {
                "policy_id": policy_id,
                "url": redact_text(done.url),  # a password or a signed query stays out
                "seconds": round(done.seconds, 3),
                "inference_s": round(done.inference_s, 3),
                "timeout_s": endpoint.warmup_timeout_s,
                "pid": os.getpid(),
                "worker": self._base["worker"],
                "before_trial": self.trial.key,
                **done.info,
            },
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
        held = Slot(self.run_dir / ".slots" / cell.throttle_key, cell.num_workers)
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
        distinct instruction of a cell x task (producers/base.py `trial_workflow`)."""
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
                **_start_state(episode),
                "prompt": episode.prompt,
                **self._prompts,
                "steps": env.steps,
                "completion": env.completion(),
            }
            with contextlib.suppress(GapError):
                env.finish_video()
            fields["frames"] = self._frames_link()
        return self._finish(**fields)


def record_crash(
    trial: Trial,
    run_dir: Path,
    *,
    nodeid: str,
    config: str,
    detail: str,
    plan_digest: str | None = None,
    policy_url: str | None = None,
):
    """The controller's record of a trial whose worker died (the worker wrote nothing).

    A trial that had run past its watchdog limit was killed by the watchdog (124); any other
    death (segfault, OOM kill) is a crash (137), an infrastructure failure. Its provenance is
    what the controller knows (no init state digest, no policy digest: the worker had them).
    """
    trial_dir = inside(run_dir, trial.key)
    existing = read_result(trial_dir)
    if isinstance(existing, TrialResult):
        return existing  # it finished; the worker died afterwards
    elapsed, timeout = 0.0, trial.cell.timeout_s
    try:
        running = json.loads((trial_dir / RUNNING_FILE).read_text())
        elapsed = time.time() - running["started"]
    except (OSError, ValueError, KeyError):
        pass
    base = {
        **TrialIdentity.of(trial, nodeid=nodeid, config=config).model_dump(),
        **record_fields(trial.cell.backend, plan_digest=plan_digest, policy_url=policy_url),
        "wall_s": elapsed,
        "finished_at": now_iso(),
    }
    if timeout and elapsed >= timeout:
        result = TrialResult(
            **base,
            exit_code=EXIT_TIMEOUT,
            reason=f"the watchdog killed its worker after {elapsed:.0f} s (limit {timeout:g} s)",
        )
    else:
        result = TrialResult(
            **base,
            exit_code=EXIT_CRASH,
            error=f"its worker process died after {elapsed:.0f} s: {detail}",
            infra_failure=True,
        )
    write_result(trial_dir, result)
    return result


def run_supervised(
    trial: Trial,
    attempt: Callable[[Trial, list[EarlierAttempt]], TrialResult],
    watch: ServerWatch,
    watchdog: Watchdog,
    run_dir: Path,
) -> tuple[TrialResult, list[str]]:
    """Run a trial whose policy server the session supervises (policies/supervisor.py).

    `attempt(trial, earlier_attempts)` runs it once and records it. Before it runs, a restart
    in progress is waited out; a server that is down records the trial as an infrastructure
    failure that says why, without running it. An infrastructure failure caused by the server
    dying is already recorded (result.json) when the restart is awaited: the trial is re-run
    once into the same trial dir, its record listing the broken attempt (`earlier_attempts`),
    so a trial is never lost nor counted twice. If the server cannot be kept up, the broken
    record's error says so. Waiting is not charged to the watchdog; a re-run gets a full budget.
    Returns the final record and notes for the session's output.
    """
    watchdog.pause()
    try:
        before = watch.before_trial()
    finally:
        watchdog.resume()
    if before.down:
        down = trial.model_copy(update={"cell": trial.cell.unavailable({"policies": before.down})})
        return attempt(down, []), []
    result = attempt(trial, [])
    notes: list[str] = []
    for may_rerun in (True, False):  # once at most: a server dying on every trial errors it
        if not result.infra_failure:
            break
        watchdog.pause()
        try:
            verdict = watch.after_failure(before)
        finally:
            watchdog.resume()
        if verdict.reason:  # the server cannot be kept up: the record says so
            result = result.model_copy(update={"error": f"{result.error}; {verdict.reason}"})
            write_result(inside(run_dir, trial.key), result)
            break
        if not (verdict.rerun and may_rerun):  # not a death, or re-run once already
            break
        broken = EarlierAttempt.of(result, verdict.because or "its policy server died")
        notes.append(
            f"{result.nodeid}: re-run, {verdict.because}; the broken attempt: {result.error}"
        )
        before = before.model_copy(update={"deaths": verdict.deaths})
        watchdog.restart()
        result = attempt(trial, [broken])
    return result, notes
