"""The controller's side of `pytest --gap-ray auto|ADDRESS`: trials run on a Ray cluster.

After collection the session's lead (the plugin's single-process role: it hands over the
selected trials as `Planned`, the actors' `session_setup` and what its policy servers hold)
connects to the cluster (scale/ray_cluster.py), starts one long-lived actor
(scale/ray_actor.py) per slot of each live node (a node's CPUs, GPUs and memory divided by the
config's `trials.ray`), and a dispatcher thread (scale/dispatch.py) feeds them the selected
trials that have no record yet. Each pytest item then waits for its
own trial's record instead of running it, so pytest reports in collection order while the
cluster runs trials in parallel. Records and files come back to the controller, which writes
the run dir (no shared filesystem needed); the summary is folded from the run dir as in any
session.

A node or actor that dies mid-trial: the trial is recorded as an infrastructure failure and
re-run once on another actor (the final record lists the broken attempt); every wait has a
bound, so a dead node never hangs the session. `close()` (the session's end, Ctrl-C) kills the
actors this session started and disconnects; the cluster itself is the user's.

Policy servers: URL entries work as before (each node must reach the URL); managed servers run
where the controller runs, on loopback, so a session whose trials need one places its actors on
the controller's machine only (ray_cluster.usable_nodes).
"""

from __future__ import annotations

import contextlib
import os
import shutil
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any
from urllib.parse import urlsplit

from pytest_gap.bind import is_loopback
from pytest_gap.errors import GapError, one_line
from pytest_gap.layout import RESULT_FILE, inside
from pytest_gap.provenance import record_fields
from pytest_gap.results import (
    EXIT_CRASH,
    EXIT_TIMEOUT,
    EarlierAttempt,
    TrialIdentity,
    TrialResult,
    now_iso,
    write_result,
)
from pytest_gap.scale.dispatch import Delivery, Dispatcher, Job, Slot
from pytest_gap.scale.ray_actor import ActorSetup, TrialOutcome, read_files
from pytest_gap.scale.ray_cluster import (
    STARTUP_TIMEOUT_S,
    RayCluster,
    forwarded_env,
    resolve_address,
    slots_of,
    usable_nodes,
)

if TYPE_CHECKING:
    from pytest_gap.cells import Trial
    from pytest_gap.config.policies import RayResources


@dataclass
class Planned:
    """One selected trial as the controller knows it (the plugin's TrialItem, without pytest:
    the plugin's single-process role makes one per trial it hands the cluster)."""

    nodeid: str
    trial: Trial
    config: Path  # the YAML
    run_dir: Path
    plan_digest: str | None
    resources: RayResources
    # policy id -> PolicyEndpoint, as of now: a managed server restarted on a new port is
    # where the next trial sent is told to look (the plugin's GapSession.endpoints)
    endpoints: Callable[[], dict]
    benchmark: Any  # the config (BenchmarkConfig): its managed servers' supervision
    llm: Any  # LLMConfig
    max_validation_retries: int
    # False once the sequential gate has stopped the trial's cell (read from the run dir)
    needed: Callable[[], bool] | None = None


class RayExecution:
    """The session's trials on a Ray cluster: `start` after collection, `result_of` per item,
    `close` at the end."""

    def __init__(self, address: str, namespace: str):
        self.address, self.namespace = address, namespace
        self.ray = None
        self.cluster: RayCluster | None = None
        self.dispatcher: Dispatcher | None = None
        self.slots: list[Slot] = []
        self._planned: dict[str, Planned] = {}
        self._done: dict[str, threading.Event] = {}
        self._results: dict[str, TrialResult] = {}
        self._notes: dict[str, list[str]] = {}
        self._unrecorded: dict[str, OSError] = {}
        self._not_needed: set[str] = set()  # the sequential gate stopped their cells
        # Trials of a managed server: its state when each was sent (ServerWatch.before_trial),
        # and those re-run once already because it died under them.
        self._before: dict[str, Any] = {}
        self._server_reruns: set[str] = set()
        self._thread: threading.Thread | None = None
        self._crash: str | None = None

    # -- start --------------------------------------------------------------------------------
    def start(
        self,
        planned: list[Planned],
        setup: ActorSetup,
        held: dict[str, dict[str, float]] | None = None,
    ) -> str:
        """Connect, start the actors, hand the trials to the dispatcher; returns a line for the
        terminal. GapError (one line) when the cluster cannot be used. `held`: node id ->
        resources this session's policy servers hold there (scale/ray_policy.py)."""
        shapes = {p.resources.model_dump_json(): p.resources for p in planned}
        if len(shapes) > 1:
            configs = sorted({str(p.config) for p in planned})
            raise GapError(
                f"--gap-ray: the configs of this session ({', '.join(configs)}) set different "
                "trials.ray resources; run them in separate sessions or give them the same"
            )
        self._planned = {p.nodeid: p for p in planned}
        self._done = {p.nodeid: threading.Event() for p in planned}
        if not planned:
            return "ray: no trial left to run (every selected trial has a record)"
        ray = connect(self.address, self.namespace)
        self.ray = ray
        resources = next(iter(shapes.values()))
        loopback = sorted(
            {
                policy_id
                for p in planned
                for policy_id, endpoint in p.endpoints().items()
                if policy_id == p.trial.cell.policy_id
                and is_loopback(urlsplit(endpoint.url).hostname or "")
            }
        )
        usable, notice = usable_nodes(ray.nodes(), ray.util.get_node_ip_address(), loopback)
        nodes = [
            (
                n["NodeID"],
                slots_of(_less(n["Resources"], (held or {}).get(n["NodeID"], {})), resources),
            )
            for n in usable
        ]
        self.cluster = RayCluster(ray, resources, setup.model_dump(), self._prepare)
        self.slots = self.cluster.start([n for n in nodes if n[1]], len(planned))
        if not self.slots:
            self.close()
            raise GapError(
                f"--gap-ray {self.address}: no node of the cluster has room for a trial's "
                f"trials.ray ({resources.model_dump(exclude_none=True)}), or no actor started "
                f"within {STARTUP_TIMEOUT_S:g} s; lower trials.ray or add nodes"
            )
        jobs = [self._job(p) for p in planned]
        self.dispatcher = Dispatcher(self.cluster, self.slots, jobs, self._deliver, self._broken)
        self._thread = threading.Thread(target=self._dispatch, name="gap-ray", daemon=True)
        self._thread.start()
        n_nodes = len({s.node for s in self.slots})
        notice = f"; {notice}" if notice else ""
        return (
            f"ray: {len(planned)} trial{'s' if len(planned) != 1 else ''} on {len(self.slots)} "
            f"actor{'s' if len(self.slots) != 1 else ''} over {n_nodes} "
            f"node{'s' if n_nodes != 1 else ''} ({self.address}){notice}"
        )

    def _prepare(self, request: dict[str, Any]) -> dict[str, Any]:
        """The request as sent: with the task's workflows produced so far (by any actor), so a
        cell x task's workflow is produced once, as in a shared run dir."""
        p = self._planned[request["nodeid"]]
        watch = self._watch(p)
        if watch is not None:  # waits out a restart in progress: the trial gets the new port
            self._before[p.nodeid] = watch.before_trial()
        task_dir = p.run_dir / p.trial.task_dir
        run_files = {}
        if task_dir.is_dir():
            for path in task_dir.iterdir():
                if path.is_dir() and path.name.startswith("workflow"):
                    for rel, data in read_files(path).items():
                        run_files[f"{p.trial.task_dir}/{path.name}/{rel}"] = data
        policies = {k: v.model_dump() for k, v in p.endpoints().items()}
        return {**request, "run_files": run_files, "policies": policies}

    @staticmethod
    def _watch(p: Planned):
        from pytest_gap.servers.supervisor import ServerWatch

        return ServerWatch.for_cell(p.run_dir, p.trial.cell, p.benchmark)

    def _server_died(self, job: Job, p: Planned, result: TrialResult) -> TrialResult | None:
        """After an infrastructure failure of a managed server's trial, as run_supervised
        judges it on one machine: the server died and is back -> re-run it once (returns None;
        the attempt is kept for the re-run's record); it cannot be kept up -> its record says
        why; otherwise the record as it is."""
        before = self._before.get(job.key)
        if not result.infra_failure or before is None or job.key in self._server_reruns:
            return result
        verdict = self._watch(p).after_failure(before)
        if verdict.reason:
            return result.model_copy(update={"error": f"{result.error}; {verdict.reason}"})
        if not verdict.rerun:
            return result
        because = verdict.because or "its policy server died"
        self._server_reruns.add(job.key)
        job.broken.append(EarlierAttempt.of(result, because).model_dump())
        self._notes.setdefault(job.key, []).append(
            f"{job.key}: re-run, {because}; the broken attempt: {result.error}"
        )
        self.dispatcher.requeue(job)
        return None

    def _job(self, p: Planned) -> Job:
        cell = p.trial.cell
        source = read_files(Path(cell.workflow_dir)) if cell.workflow_dir else {}
        request = {
            "trial": p.trial.model_dump(),
            "nodeid": p.nodeid,
            "config": str(p.config),
            "run_dir": str(p.run_dir),
            "plan_digest": p.plan_digest,
            "llm": p.llm.model_dump() if p.llm is not None else None,
            "max_validation_retries": p.max_validation_retries,
            "workflow_source": source,
        }
        return Job(
            key=p.nodeid,
            scene=(str(p.config), cell.backend, cell.suite, p.trial.task_id),
            throttle=(str(p.config), cell.throttle_key),
            limit=cell.num_workers,
            timeout_s=cell.timeout_s,
            request=request,
            turn=((str(p.config), cell.turn_key), cell.block_of(p.trial.seed))
            if cell.block_seeds
            else None,
            needed=p.needed,
        )

    def _dispatch(self) -> None:
        try:
            self.dispatcher.run()
        except BaseException as exc:  # every waiting item must hear of it
            self._crash = f"{type(exc).__name__}: {one_line(str(exc), 300)}"
        finally:
            for event in self._done.values():
                event.set()

    # -- records ------------------------------------------------------------------------------
    def _record(self, p: Planned, **fields) -> TrialResult:
        """A record the controller makes (the actor sent none): identity and provenance."""
        endpoint = p.endpoints().get(p.trial.cell.policy_id or "")
        return TrialResult(
            **TrialIdentity.of(p.trial, nodeid=p.nodeid, config=str(p.config)).model_dump(),
            **record_fields(
                p.trial.cell.backend,
                plan_digest=p.plan_digest,
                policy_url=endpoint.url if endpoint is not None else None,
            ),
            finished_at=now_iso(),
            **fields,
        )

    def _broken(self, job: Job, why: str, slot: Slot) -> dict[str, Any]:
        """Record the attempt an actor's death broke (an infrastructure failure, so a session
        that ends now re-runs it on --gap-resume); the re-run's record will list it."""
        p = self._planned[job.key]
        result = self._record(
            p,
            exit_code=EXIT_CRASH,
            error=why,
            infra_failure=True,
            worker=slot.name,
            started_at=slot.started_at,
            wall_s=time.monotonic() - slot.started,
        )
        with contextlib.suppress(OSError):  # a full disk: the re-run's record says it all
            self._write_record(p, result)
        self._notes.setdefault(job.key, []).append(
            f"{job.key}: re-run on another Ray actor; the broken attempt: {why}"
        )
        return EarlierAttempt.of(result, "its Ray actor died; re-run on another actor").model_dump()

    def _deliver(self, delivery: Delivery) -> None:
        job = delivery.job
        if delivery.not_needed:  # its item skips, saying why (TrialItem.skip_if_not_needed)
            self._not_needed.add(job.key)
            self._done[job.key].set()
            return
        p = self._planned[job.key]
        earlier = [EarlierAttempt.model_validate(b) for b in job.broken]
        files: dict[str, bytes] | None = None
        if delivery.outcome is not None:
            outcome = TrialOutcome.model_validate(delivery.outcome)
            result, files = outcome.result, outcome.files
            checked = self._server_died(job, p, result)
            if checked is None:  # re-run: the broken attempt stays recorded until then
                with contextlib.suppress(OSError):
                    self._write_files(p.run_dir, p.trial.key, files)
                return
            if checked is not result:  # the server could not be kept up: the record says so
                files = {**files, f"{p.trial.key}/{RESULT_FILE}": _record_bytes(checked)}
                result = checked
        elif delivery.timed_out_s is not None:
            limit = p.trial.cell.timeout_s
            result = self._record(
                p,
                exit_code=EXIT_TIMEOUT,
                reason=f"the watchdog killed its Ray actor after {delivery.timed_out_s:.0f} s "
                f"(limit {limit:g} s; stuck where signals do not reach)",
                wall_s=delivery.timed_out_s,
                worker=delivery.worker,
                earlier_attempts=earlier,
            )
        else:
            again = "; it was re-run once already" if earlier else ""
            result = self._record(
                p,
                exit_code=EXIT_CRASH,
                error=f"{delivery.lost}{again}",
                infra_failure=True,
                worker=delivery.worker,
                earlier_attempts=earlier,
            )
        try:
            if files is not None:
                self._write_files(p.run_dir, p.trial.key, files)
            else:
                self._write_record(p, result)
        except OSError as exc:  # a full disk, a read-only dir: that item says so; the rest go on
            self._unrecorded[job.key] = exc
        self._results[job.key] = result
        self._done[job.key].set()

    @staticmethod
    def _write_record(p: Planned, result: TrialResult) -> None:
        trial_dir = inside(p.run_dir, p.trial.key)
        shutil.rmtree(trial_dir, ignore_errors=True)
        trial_dir.mkdir(parents=True, exist_ok=True)
        write_result(trial_dir, result)

    @staticmethod
    def _write_files(run_dir: Path, trial_key: str, files: dict[str, bytes]) -> None:
        """The trial's files under the run dir, each atomically; its result.json last, so a
        record never points at a file not written yet."""
        # a broken attempt's leftovers; every path checked first: they come from another node
        shutil.rmtree(inside(run_dir, trial_key), ignore_errors=True)
        last = f"{trial_key}/{RESULT_FILE}"
        for rel in sorted(files, key=lambda r: r == last):
            path = inside(run_dir, rel)
            path.parent.mkdir(parents=True, exist_ok=True)
            tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
            tmp.write_bytes(files[rel])
            os.replace(tmp, path)

    # -- the items' side ----------------------------------------------------------------------
    def planned(self, nodeid: str) -> bool:
        return nodeid in self._done

    def result_of(self, nodeid: str) -> tuple[TrialResult, list[str]] | None:
        """The trial's record once the cluster ran it (blocks); its notes (a re-run). None:
        it was not sent, its cell stopped by the sequential gate. Raises the OSError that kept
        the controller from writing it into the run dir."""
        while not self._done[nodeid].wait(1.0):  # a timed wait: Ctrl-C gets through
            pass
        if nodeid in self._not_needed:
            return None
        if nodeid in self._unrecorded:
            raise self._unrecorded[nodeid]
        result = self._results.get(nodeid)
        if result is None:
            why = self._crash or "the session is ending"
            raise GapError(f"--gap-ray: the trial was not run: {why}")
        return result, self._notes.get(nodeid, [])

    def close(self, shutdown: bool = True) -> None:
        """Stop handing out trials, kill this session's actors, disconnect (`shutdown`; the
        session disconnects itself when its policy servers run on Ray too)."""
        if self.dispatcher is not None:
            self.dispatcher.stopping.set()
        if self._thread is not None:
            self._thread.join(timeout=5)
        if self.cluster is not None:
            self.cluster.close()
        if self.ray is not None and shutdown:
            self.ray.shutdown()
        self.ray = None
        for event in self._done.values():
            event.set()


def _less(total: dict[str, float], held: dict[str, float]) -> dict[str, float]:
    return {k: v - held.get(k, 0.0) for k, v in total.items()}


def session_namespace(stamp: str) -> str:
    """The Ray namespace of a session's actors (trials and policy servers): the session's run
    dir stamp and its lead's process."""
    return f"gap-{stamp}-{os.getpid()}"


def connect(address: str, namespace: str):
    """Ray, connected to the cluster at `address` (once per session: policy servers placed on
    Ray connect first); a one-line GapError when it cannot be."""
    try:
        import ray
    except ImportError:
        raise GapError(
            "--gap-ray needs Ray on this machine and every node: pip install 'pytest-gap[ray]'"
        ) from None
    if ray.is_initialized():
        return ray
    resolved = resolve_address(address)
    try:
        ray.init(
            address=resolved,
            namespace=namespace,
            runtime_env={"env_vars": forwarded_env()},
            log_to_driver=False,
            logging_level="WARNING",
        )
    except Exception as exc:  # ConnectionError, a bad address, a version skew
        raise GapError(
            f"--gap-ray {address}: cannot connect to the Ray cluster at {resolved} "
            f"({one_line(str(exc), 200)}); check that this machine runs the same Ray "
            "and Python as the cluster"
        ) from None
    return ray


def session_setup(plugins: list, mode_table) -> ActorSetup:
    """What every actor loads: the conftest modules among `plugins` (as sources) and the mode
    table (pickled; its conftest-defined producers unpickle once those modules are loaded)."""
    from ray import cloudpickle

    sources = []
    for plugin in plugins:
        path = getattr(plugin, "__file__", None)
        if path and Path(path).name == "conftest.py" and Path(path).is_file():
            sources.append((plugin.__name__, Path(path).read_text()))
    table = cloudpickle.dumps(mode_table) if mode_table is not None else None
    return ActorSetup(plugins=sources, mode_table=table)


def _record_bytes(result: TrialResult) -> bytes:
    """result.json's content for `result`, as write_result writes it (secrets masked)."""
    import json

    from pytest_gap.redaction import redact_tree

    return (
        json.dumps(redact_tree(result.model_dump(mode="json")), indent=1, default=str) + "\n"
    ).encode()
