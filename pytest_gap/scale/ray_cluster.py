"""A Ray cluster as the dispatcher sees it (scale/dispatch.py `Cluster`): where it is, how many
actors each node holds, the actors' calls and deaths.

`resolve_address` checks the address answers before Ray is asked to connect (Ray retries a
missing cluster for minutes); `forwarded_env` is what the actors inherit from the controller.
"""

from __future__ import annotations

import contextlib
import os
import socket
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from pytest_gap.doors import holds_secret, is_harness_setting
from pytest_gap.errors import GapError, one_line
from pytest_gap.run.devices import DEVICES_VAR
from pytest_gap.scale.dispatch import ActorGone, Slot, TrialBroke
from pytest_gap.scale.ray_actor import TrialActor

if TYPE_CHECKING:
    from pytest_gap.config.policies import RayResources

STARTUP_TIMEOUT_S = 180.0  # an actor's start: a worker process, its runtime env, its imports
GET_TIMEOUT_S = 120.0  # fetching a finished trial's outcome (its files) from a node
# What a node's actors inherit from the controller besides their node's environment: the
# import path (pytest-gap, a config's backend), the harness's settings by name
# (doors.is_harness_setting; not the xdist GPU list: Ray assigns GPUs) and the renderer's choice.
FORWARDED = frozenset({"PYTHONPATH", "MUJOCO_GL", "PYOPENGL_PLATFORM"})


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
    """What the actors inherit: PYTHONPATH, the GL choice and the harness's own settings, by
    name; never a secret (GAP_TOKEN, GAP_RUN_SECRET: doors.holds_secret) or another `GAP_*` name
    of the operator's (a GAP_DB_URL), which a Ray runtime env would carry to every node."""
    return {
        k: v
        for k, v in environ.items()
        if (k in FORWARDED or is_harness_setting(k)) and k != DEVICES_VAR and not holds_secret(k)
    }


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

    def __init__(
        self,
        ray,
        resources: RayResources,
        setup: dict[str, Any],
        prepare: Callable[[dict[str, Any]], dict[str, Any]],
    ):
        from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

        self.ray, self.resources, self.setup = ray, resources, setup
        self._affinity = NodeAffinitySchedulingStrategy
        self._remote = ray.remote(TrialActor)
        self.prepare = prepare  # completes a request when it is sent (what the run dir has then)
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
        return slot.actor.run.remote(self.prepare(request))

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


def usable_nodes(
    nodes: list[dict[str, Any]], here: str, loopback_policies: list[str]
) -> tuple[list[dict[str, Any]], str | None]:
    """The live nodes (ray.nodes() entries) actors may go to, and a line saying why fewer: a
    policy server on loopback (a managed server, or a url: on 127.0.0.1) is reachable only from
    this machine, so its trials' actors stay on the nodes at this machine's address `here`."""
    alive = [n for n in nodes if n.get("Alive")]
    if not loopback_policies:
        return alive, None
    local = [n for n in alive if n.get("NodeManagerAddress") == here]
    if len(local) == len(alive):
        return alive, None
    names = ", ".join(sorted(loopback_policies))
    return local, (
        f"policy servers on loopback ({names}) are reachable from this machine only: actors "
        f"run on its {len(local)} node{'s' if len(local) != 1 else ''} of {len(alive)}; serve "
        "them on an address the nodes reach (a url: entry) to use the whole cluster"
    )
