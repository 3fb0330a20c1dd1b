"""The controller's side of `pytest --gap-ray auto|ADDRESS`: trials run on a Ray cluster.

After collection the session's lead connects to the cluster, starts one long-lived actor
(scale/ray_actor.py) per slot of each live node (a node's CPUs, GPUs and memory divided by the
config's `trials.ray`), and a dispatcher thread (scale/dispatch.py) feeds them the selected
trials that have no record yet. Each pytest item then waits for its own trial's record instead
of running it, so pytest reports in collection order while the cluster runs trials in
parallel. Records and files come back to the controller, which writes the run dir (no shared
filesystem needed); the summary is folded from the run dir as in any session.

A node or actor that dies mid-trial: the trial is recorded as an infrastructure failure and
re-run once on another actor (the final record lists the broken attempt); every wait has a
bound, so a dead node never hangs the session. `close()` (the session's end, Ctrl-C) kills the
actors this session started and disconnects; the cluster itself is the user's.

Policy servers: URL entries work as before (each node must reach the URL); managed servers run
where the controller runs, on loopback, so only actors on the controller's machine reach them.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import socket
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from pytest_gap.devices import DEVICES_VAR
from pytest_gap.errors import GapError, one_line
from pytest_gap.provenance import record_fields
from pytest_gap.results import (
    EXIT_CRASH,
    EXIT_TIMEOUT,
    RESULT_FILE,
    EarlierAttempt,
    TrialIdentity,
    TrialResult,
    now_iso,
    write_result,
)
from pytest_gap.scale.dispatch import ActorGone, Delivery, Dispatcher, Job, Slot, TrialBroke
from pytest_gap.scale.ray_actor import ActorSetup, TrialActor, TrialOutcome, read_files

if TYPE_CHECKING:
    from pytest_gap.config import RayResources
    from pytest_gap.plan import Trial

STARTUP_TIMEOUT_S = 180.0  # an actor's start: a worker process, its runtime env, its imports
GET_TIMEOUT_S = 120.0  # fetching a finished trial's outcome (its files) from a node
# What a node's actors inherit from the controller besides their node's environment: the
# import path (pytest-gap, a config's backend), the harness's GAP_* knobs (not the xdist GPU
# list: Ray assigns GPUs) and the renderer's choice.
FORWARDED = ("PYTHONPATH", "MUJOCO_GL", "PYOPENGL_PLATFORM")


PROBE_TIMEOUT_S = 5.0


def resolve_address(address: str) -> str:
    """The cluster's host:port (or ray://host:port) for `--gap-ray`, checked to answer: `auto`
    is RAY_ADDRESS or the cluster `ray start` last started on this machine. A cluster that is
    not there is a one-line GapError now, not a connection that Ray retries for minutes."""
    given = address
    if address == "auto":
        address = os.environ.get("RAY_ADDRESS", "")
        if not address:
            try:
                from ray._private.utils import read_ray_address

                address = read_ray_address() or ""
            except Exception:  # a Ray without the helper: its default file
                path = Path("/tmp/ray/ray_current_cluster")
                address = path.read_text().strip() if path.is_file() else ""
        if not address:
            raise GapError(
                "--gap-ray auto: no Ray cluster runs on this machine (no RAY_ADDRESS, no "
                "`ray start`); start one with `ray start --head` or give its address host:port"
            )
    host, _, port = address.removeprefix("ray://").rpartition(":")
    if not host or not port.isdigit():
        raise GapError(
            f"--gap-ray {given}: expected auto, host:port or ray://host:port (the cluster's "
            "head, as `ray start --head` prints it)"
        )
    try:
        socket.create_connection((host, int(port)), timeout=PROBE_TIMEOUT_S).close()
    except OSError as exc:
        raise GapError(
            f"--gap-ray {given}: no Ray cluster answers at {host}:{port} ({exc.strerror or exc});"
            " start one with `ray start --head` or check the address"
        ) from None
    return address


def forwarded_env(environ=os.environ) -> dict[str, str]:
    return {
        k: v
        for k, v in environ.items()
        if (k in FORWARDED or k.startswith("GAP_")) and k != DEVICES_VAR
    }


@dataclass
class Planned:
    """One selected trial as the controller knows it (plugin.TrialItem, without pytest)."""

    nodeid: str
    trial: Trial
    config: Path  # the YAML
    run_dir: Path
    plan_digest: str | None
    resources: RayResources
    policies: dict  # policy id -> PolicyEndpoint
    llm: Any  # LLMConfig
    max_validation_retries: int


def slots_of(node: dict[str, float], want: RayResources) -> int:
    """How many actors of `want` a node with resources `node` holds."""
    counts = []
    for key, need in (("CPU", want.num_cpus), ("GPU", want.num_gpus), ("memory", want.memory)):
        if need:
            counts.append(int(node.get(key, 0.0) // need))
    return min(counts) if counts else 0


def spread(nodes: list[tuple[str, int]], limit: int) -> list[tuple[str, int]]:
    """(node, slot index) for at most `limit` actors, taking nodes in turn so that a small
    session still spreads over the cluster."""
    order, index = [], 0
    while len(order) < limit and any(index < n for _, n in nodes):
        order += [(node, index) for node, n in nodes if index < n]
        index += 1
    return order[:limit]


class RayCluster:
    """dispatch.Cluster over Ray: actors made from TrialActor, calls as object refs."""

    def __init__(self, ray, resources: RayResources, setup: dict[str, Any], planned: dict):
        from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

        self.ray, self.resources, self.setup = ray, resources, setup
        self._affinity = NodeAffinitySchedulingStrategy
        self._remote = ray.remote(TrialActor)
        self.planned = planned  # nodeid -> Planned: reads what a request carries at submit
        self.started: list[Any] = []  # every actor this session made, for close()

    def start(self, nodes: list[tuple[str, int]], limit: int) -> list[Slot]:
        """Actors on `nodes` ((node id, slots)), at most `limit`; those that start in time."""
        pending = []
        for node, index in spread(nodes, limit):
            name = f"ray-{node[:8]}-{index}"
            pending.append((name, node, self._actor(name, node)))
        slots = []
        for name, node, actor in pending:
            try:
                self.ray.get(actor.where.remote(), timeout=STARTUP_TIMEOUT_S)
            except Exception:  # an actor that does not start is one slot less
                self.ray.kill(actor, no_restart=True)
                continue
            slots.append(Slot(name=name, actor=actor, node=node))
        return slots

    def _actor(self, name: str, node: str):
        r = self.resources
        options: dict[str, Any] = {
            "num_cpus": r.num_cpus,
            "num_gpus": r.num_gpus,
            "max_restarts": 0,
            "scheduling_strategy": self._affinity(node_id=node, soft=False),
        }
        if r.memory:
            options["memory"] = r.memory
        actor = self._remote.options(**options).remote(name, self.setup)
        self.started.append(actor)
        return actor

    def submit(self, slot: Slot, request: dict[str, Any]) -> Any:
        planned: Planned = self.planned[request["nodeid"]]
        # The task's workflows produced so far (by any actor): produced once per cell x task.
        task_dir = planned.run_dir / planned.trial.task_dir
        run_files = {}
        if task_dir.is_dir():
            for path in task_dir.iterdir():
                if path.is_dir() and path.name.startswith("workflow"):
                    for rel, data in read_files(path).items():
                        run_files[f"{planned.trial.task_dir}/{path.name}/{rel}"] = data
        return slot.actor.run.remote({**request, "run_files": run_files})

    def wait(self, handles: list[Any], timeout: float) -> list[Any]:
        self.ray.wait(handles, num_returns=1, timeout=timeout)
        ready, _ = self.ray.wait(handles, num_returns=len(handles), timeout=0)
        return ready

    def outcome(self, handle: Any) -> dict[str, Any]:
        from ray import exceptions as rx

        try:
            return self.ray.get(handle, timeout=GET_TIMEOUT_S)
        except (
            rx.RayActorError,
            rx.NodeDiedError,
            rx.WorkerCrashedError,
            rx.ObjectLostError,
            rx.GetTimeoutError,
        ) as exc:
            raise ActorGone(one_line(str(exc), 300)) from None
        except rx.RayError as exc:
            raise TrialBroke(one_line(str(exc), 300)) from None

    def kill(self, slot: Slot) -> None:
        self.ray.kill(slot.actor, no_restart=True)

    def replace(self, slot: Slot) -> Slot | None:
        actor = self._actor(slot.name, slot.node)
        try:
            self.ray.get(actor.where.remote(), timeout=STARTUP_TIMEOUT_S)
        except Exception:  # its node is gone too: one slot less
            self.ray.kill(actor, no_restart=True)
            return None
        return Slot(name=slot.name, actor=actor, node=slot.node)

    def close(self) -> None:
        for actor in self.started:
            with contextlib.suppress(Exception):  # already gone with its node
                self.ray.kill(actor, no_restart=True)


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
        self._thread: threading.Thread | None = None
        self._crash: str | None = None

    # -- start --------------------------------------------------------------------------------
    def start(self, planned: list[Planned], setup: ActorSetup) -> str:
        """Connect, start the actors, hand the trials to the dispatcher; returns a line for the
        terminal. GapError (one line) when the cluster cannot be used."""
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
        try:
            import ray
        except ImportError:
            raise GapError(
                "--gap-ray needs Ray on this machine and every node: pip install 'pytest-gap[ray]'"
            ) from None
        address = resolve_address(self.address)
        try:
            ray.init(
                address=address,
                namespace=self.namespace,
                runtime_env={"env_vars": forwarded_env()},
                log_to_driver=False,
                logging_level="WARNING",
            )
        except Exception as exc:  # ConnectionError, a bad address, a version skew
            raise GapError(
                f"--gap-ray {self.address}: cannot connect to the Ray cluster at {address} "
                f"({one_line(str(exc), 200)}); check that this machine runs the same Ray "
                "and Python as the cluster"
            ) from None
        self.ray = ray
        resources = next(iter(shapes.values()))
        nodes = [
            (n["NodeID"], slots_of(n["Resources"], resources))
            for n in ray.nodes()
            if n.get("Alive")
        ]
        self.cluster = RayCluster(ray, resources, setup.model_dump(), self._planned)
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
        return (
            f"ray: {len(planned)} trial{'s' if len(planned) != 1 else ''} on {len(self.slots)} "
            f"actor{'s' if len(self.slots) != 1 else ''} over {n_nodes} "
            f"node{'s' if n_nodes != 1 else ''} ({self.address})"
        )

    def _job(self, p: Planned) -> Job:
        cell = p.trial.cell
        source = read_files(Path(cell.workflow_dir)) if cell.workflow_dir else {}
        request = {
            "trial": p.trial.model_dump(),
            "nodeid": p.nodeid,
            "config": str(p.config),
            "run_dir": str(p.run_dir),
            "plan_digest": p.plan_digest,
            "policies": {k: v.model_dump() for k, v in p.policies.items()},
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
        endpoint = p.policies.get(p.trial.cell.policy_id or "")
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
        trial_dir = p.run_dir / p.trial.key
        shutil.rmtree(trial_dir, ignore_errors=True)
        trial_dir.mkdir(parents=True, exist_ok=True)
        write_result(trial_dir, result)
        self._notes.setdefault(job.key, []).append(
            f"{job.key}: re-run on another Ray actor; the broken attempt: {why}"
        )
        return EarlierAttempt.of(result, "its Ray actor died; re-run on another actor").model_dump()

    def _deliver(self, delivery: Delivery) -> None:
        job = delivery.job
        p = self._planned[job.key]
        earlier = [EarlierAttempt.model_validate(b) for b in job.broken]
        if delivery.outcome is not None:
            outcome = TrialOutcome.model_validate(delivery.outcome)
            result = outcome.result
            self._write_files(p.run_dir, p.trial.key, outcome.files)
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
        if delivery.outcome is None:
            trial_dir = p.run_dir / p.trial.key
            shutil.rmtree(trial_dir, ignore_errors=True)
            trial_dir.mkdir(parents=True, exist_ok=True)
            write_result(trial_dir, result)
        self._results[job.key] = result
        self._done[job.key].set()

    @staticmethod
    def _write_files(run_dir: Path, trial_key: str, files: dict[str, bytes]) -> None:
        """The trial's files under the run dir, each atomically; its result.json last, so a
        record never points at a file not written yet."""
        shutil.rmtree(run_dir / trial_key, ignore_errors=True)  # a broken attempt's leftovers
        last = f"{trial_key}/{RESULT_FILE}"
        for rel in sorted(files, key=lambda r: r == last):
            path = run_dir / rel
            path.parent.mkdir(parents=True, exist_ok=True)
            tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
            tmp.write_bytes(files[rel])
            os.replace(tmp, path)

    # -- the items' side ----------------------------------------------------------------------
    def planned(self, nodeid: str) -> bool:
        return nodeid in self._done

    def result_of(self, nodeid: str) -> tuple[TrialResult, list[str]]:
        """The trial's record once the cluster ran it (blocks); its notes (a re-run)."""
        self._done[nodeid].wait()
        result = self._results.get(nodeid)
        if result is None:
            why = self._crash or "the session is ending"
            raise GapError(f"--gap-ray: the trial was not run: {why}")
        return result, self._notes.get(nodeid, [])

    def close(self) -> None:
        """Stop handing out trials, kill this session's actors, disconnect."""
        if self.dispatcher is not None:
            self.dispatcher.stopping.set()
        if self._thread is not None:
            self._thread.join(timeout=5)
        if self.cluster is not None:
            self.cluster.close()
        if self.ray is not None:
            self.ray.shutdown()
            self.ray = None
        for event in self._done.values():
            event.set()


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


def start_items(address: str, lead, items: list) -> tuple[RayExecution, str]:
    """Start `items` (the session's collected items; its trials among them) on the cluster at
    `address` for `lead` (the plugin's SingleProcess): every trial item but those --gap-resume
    replays. Returns the execution and a line for the terminal; GapError when it cannot start."""
    planned = []
    for item in items:
        trial, loaded = getattr(item, "trial", None), getattr(item, "loaded", None)
        if trial is None or loaded is None:
            continue
        if lead.resume and item._recorded(loaded.run_dir) is not None:
            continue  # the item replays its record
        config = loaded.config
        planned.append(
            Planned(
                nodeid=item.nodeid,
                trial=trial,
                config=loaded.path,
                run_dir=loaded.run_dir,
                plan_digest=loaded.plan_digest,
                resources=config.trials.ray,
                policies=lead.endpoints(loaded),
                llm=config.llm,
                max_validation_retries=config.composition.max_validation_retries,
            )
        )
    execution = RayExecution(address, namespace=f"gap-{lead.stamp}-{os.getpid()}")
    setup = session_setup(lead.config.pluginmanager.get_plugins(), lead.mode_table)
    line = execution.start(planned, setup)
    return execution, line
