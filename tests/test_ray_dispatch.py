"""The Ray executor's scheduling (pytest_gap/scale/dispatch.py) on fake actors, no Ray: which
actor gets which trial (scene reuse, num_workers), and what an actor's death or a stuck trial
does to the trials (re-run once, recorded lost, never waited on forever)."""

from __future__ import annotations

import itertools
import socket
from dataclasses import dataclass, field

import pytest

from pytest_gap import cli
from pytest_gap.scale.dispatch import ActorGone, Delivery, Dispatcher, Job, Slot, TrialBroke
from tests.fake_session import BACKEND, FakeSession

pytest_plugins = ["pytester"]


@dataclass
class Call:
    slot: Slot
    request: dict
    seq: int


@dataclass
class FakeCluster:
    """Every call finishes at the next wait, except those of `hang` (job keys); an actor named
    in `dies` dies on its n-th call (1-based); `broken` job keys fail on a live actor."""

    dies: dict[str, int] = field(default_factory=dict)
    hang: set[str] = field(default_factory=set)
    broken: set[str] = field(default_factory=set)
    calls: list[Call] = field(default_factory=list)
    killed: list[str] = field(default_factory=list)
    replaced: list[str] = field(default_factory=list)
    in_flight: dict[str, int] = field(default_factory=dict)
    most_in_flight: dict[str, int] = field(default_factory=dict)
    _seq = itertools.count()

    def submit(self, slot: Slot, request: dict) -> Call:
        call = Call(slot, request, next(self._seq))
        self.calls.append(call)
        mode = request["mode"]
        self.in_flight[mode] = self.in_flight.get(mode, 0) + 1
        self.most_in_flight[mode] = max(self.most_in_flight.get(mode, 0), self.in_flight[mode])
        return call

    def wait(self, handles: list[Call], timeout: float) -> list[Call]:
        return [h for h in handles if h.request["nodeid"] not in self.hang]

    def outcome(self, handle: Call) -> dict:
        self.in_flight[handle.request["mode"]] -= 1
        name = handle.slot.name
        n = sum(1 for c in self.calls if c.slot.name == name and c.seq <= handle.seq)
        if self.dies.get(name) == n:
            raise ActorGone(f"{name} died")
        if handle.request["nodeid"] in self.broken:
            raise TrialBroke("harness raised")
        return {"nodeid": handle.request["nodeid"], "by": name, "req": handle.request}

    def kill(self, slot: Slot) -> None:
        self.killed.append(slot.name)

    def replace(self, slot: Slot) -> Slot | None:
        self.replaced.append(slot.name)
        return Slot(name=slot.name + "'", actor=None, node=slot.node)


def job(task: int, seed: int, *, mode: str = "m", limit: int = 8, timeout_s: float = 0) -> Job:
    key = f"b.yaml::{mode}::task{task:02d}::seed{seed:03d}"
    return Job(
        key=key,
        scene=("b.yaml", "libero", "s", task),
        throttle=("b.yaml", mode),
        limit=limit,
        timeout_s=timeout_s,
        request={"nodeid": key, "mode": mode},
    )


def run(cluster: FakeCluster, n_slots: int, jobs: list[Job], **kwargs):
    slots = [Slot(name=f"a{i}", actor=None, node=f"n{i}") for i in range(n_slots)]
    delivered: list[Delivery] = []
    broken: list[tuple[str, str]] = []

    def on_broken(job: Job, why: str, slot: Slot) -> dict:
        broken.append((job.key, slot.name))
        return {"error": why}

    Dispatcher(cluster, slots, jobs, delivered.append, on_broken, poll_s=0, **kwargs).run()
    return delivered, broken


def ran_by(cluster: FakeCluster) -> dict[str, list[str]]:
    by: dict[str, list[str]] = {}
    for call in cluster.calls:
        by.setdefault(call.slot.name, []).append(call.request["nodeid"].split("::", 2)[2])
    return by


def test_an_actor_keeps_to_its_task_so_seeds_reuse_its_scene():
    cluster = FakeCluster()
    jobs = [job(t, s) for t in (0, 1) for s in range(3)]
    delivered, _ = run(cluster, 2, jobs)
    assert ran_by(cluster) == {
        "a0": ["task00::seed000", "task00::seed001", "task00::seed002"],
        "a1": ["task01::seed000", "task01::seed001", "task01::seed002"],
    }
    assert sorted(d.job.key for d in delivered) == sorted(j.key for j in jobs)
    assert all(d.outcome is not None for d in delivered)


def test_an_idle_actor_helps_with_another_task_once_its_own_is_done():
    cluster = FakeCluster()
    jobs = [job(0, s) for s in range(4)] + [job(1, 0)]
    run(cluster, 2, jobs)
    by = ran_by(cluster)
    assert by["a0"][0] == "task00::seed000" and by["a1"][0] == "task01::seed000"
    assert len(by["a1"]) > 1  # then seeds of task 0, instead of idling


def test_num_workers_bounds_a_cells_trials_in_flight():
    cluster = FakeCluster()
    jobs = [job(t, 0, mode="one", limit=1) for t in range(3)]
    jobs += [job(t, 1, mode="two", limit=2) for t in range(3)]
    run(cluster, 3, jobs)
    assert cluster.most_in_flight == {"one": 1, "two": 2}


def test_a_dead_actors_trial_is_rerun_once_elsewhere_listing_the_broken_attempt():
    cluster = FakeCluster(dies={"a0": 1})
    jobs = [job(0, s) for s in range(2)] + [job(1, s) for s in range(2)]
    delivered, broken = run(cluster, 2, jobs)
    assert broken == [(jobs[0].key, "a0")]
    assert sorted(d.job.key for d in delivered) == sorted(j.key for j in jobs)  # none lost
    rerun = next(d for d in delivered if d.job.key == jobs[0].key)
    assert rerun.outcome["by"] == "a1"
    assert rerun.outcome["req"]["earlier_attempts"] == [
        {"error": "its Ray actor a0 (node n0) died: a0 died"}
    ]
    assert "a0" not in ran_by(cluster) or ran_by(cluster)["a0"] == ["task00::seed000"]


def test_a_trial_whose_actor_dies_twice_is_recorded_lost_not_run_a_third_time():
    cluster = FakeCluster(dies={"a0": 1, "a1": 1})
    delivered, broken = run(cluster, 3, [job(0, 0)])
    assert len(broken) == 1 and len(cluster.calls) == 2  # a2 never gets it
    (only,) = delivered
    assert only.outcome is None and "its Ray actor a1 (node n1) died" in only.lost
    assert len(only.job.broken) == 1  # the first death's attempt, for the record


def test_when_every_actor_is_dead_the_trials_left_are_recorded_lost_at_once():
    cluster = FakeCluster(dies={"a0": 1, "a1": 1})
    jobs = [job(0, s) for s in range(4)]
    delivered, _ = run(cluster, 2, jobs)
    assert sorted(d.job.key for d in delivered) == sorted(j.key for j in jobs)
    lost = {d.job.key: d.lost for d in delivered}
    assert all("no Ray actor is left" in why or "died" in why for why in lost.values())
    twice = [d for d in delivered if d.job.broken and "died" in d.lost]
    assert twice  # a broken attempt's re-run whose actor died too: lost, its attempt listed


def test_a_trial_stuck_past_its_limit_has_its_actor_killed_and_replaced():
    stuck = job(0, 0, timeout_s=0.01)
    cluster = FakeCluster(hang={stuck.key})
    delivered, _ = run(cluster, 1, [stuck, job(0, 1)], grace_s=0.0)
    timed_out = next(d for d in delivered if d.job.key == stuck.key)
    assert timed_out.timed_out_s is not None and timed_out.worker == "a0"
    assert cluster.killed == ["a0"] and cluster.replaced == ["a0"]
    other = next(d for d in delivered if d.job.key != stuck.key)
    assert other.outcome["by"] == "a0'"  # the replacement ran the next trial


def test_a_failed_call_on_a_live_actor_is_recorded_and_the_actor_kept():
    bad = job(0, 0)
    cluster = FakeCluster(broken={bad.key})
    delivered, broken = run(cluster, 1, [bad, job(0, 1)])
    assert not broken
    first = next(d for d in delivered if d.job.key == bad.key)
    assert "harness raised" in first.lost
    assert next(d for d in delivered if d.job.key != bad.key).outcome["by"] == "a0"


# -- the option's errors: one line, a usage error, before anything runs ---------------------------
@pytest.fixture
def fake(pytester) -> FakeSession:
    return FakeSession(pytester)


def _bench(fake: FakeSession) -> None:
    fake.config(
        {
            "backend": BACKEND,
            "trials": {"output_dir": "runs"},
            "suites": [{"suite_name": "fake_easy", "task_ids": [0], "workflow_dir": "wf"}],
        }
    )


def test_gap_ray_with_xdist_is_a_usage_error(fake):
    _bench(fake)
    result = fake.run("bench.yaml", "--gap-ray=auto", "-n", "2")
    assert result.ret == 2
    assert "--gap-ray runs trials on Ray actors, -n on xdist workers: drop one of them" in (
        result.stderr.str()
    )
    assert not (fake.path / "runs").exists()


def test_gap_benchmark_refuses_ray_with_n(fake, capsys):
    _bench(fake)
    assert cli.main(["benchmark", "bench.yaml", "--ray", "auto", "-n", "2"]) == 2
    err = capsys.readouterr().err.strip()
    assert err == (
        "gap: error: --ray runs the trials on Ray actors, -n on xdist workers: drop one of them"
    )


def test_no_cluster_at_the_address_is_one_line_not_a_hang(fake):
    pytest.importorskip("ray")
    _bench(fake)
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]  # closed again: nothing listens there
    result = fake.run_inprocess("bench.yaml", f"--gap-ray=127.0.0.1:{port}")
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    out = result.stdout.str() + result.stderr.str()
    assert f"gap: --gap-ray 127.0.0.1:{port}: no Ray cluster answers at 127.0.0.1:{port}" in out
    assert "Traceback" not in out


# -- how many actors, where, on which devices ---------------------------------------------------
def test_a_node_holds_as_many_actors_as_its_scarcest_resource_allows():
    from pytest_gap.config import RayResources
    from pytest_gap.scale.ray_cluster import slots_of, spread

    node = {"CPU": 16.0, "GPU": 2.0, "memory": 64e9}
    assert slots_of(node, RayResources(num_cpus=1)) == 16
    assert slots_of(node, RayResources(num_cpus=1, num_gpus=0.5)) == 4
    assert slots_of(node, RayResources(num_cpus=2, memory=20_000_000_000)) == 3
    assert slots_of({"CPU": 8.0}, RayResources(num_gpus=1)) == 0  # no GPU: no GPU trial
    # a small session still spreads over the nodes: node by node, slot by slot
    assert spread([("a", 3), ("b", 1), ("c", 0)], 3) == [("a", 0), ("b", 0), ("a", 1)]
    assert spread([("a", 1)], 5) == [("a", 0)]


def test_an_actor_renders_on_the_gpu_ray_assigned_it():
    from pytest_gap.run.devices import egl_device_for_cell
    from pytest_gap.scale.ray_actor import pin_ray_devices

    environ = {"GAP_MUJOCO_EGL_DEVICES": "0,1,2,3"}  # the xdist list, forwarded by mistake
    assert pin_ray_devices(environ, [2, 3]) == {
        "CUDA_VISIBLE_DEVICES": "2,3",
        "MUJOCO_EGL_DEVICE_ID": "2",
    }
    assert egl_device_for_cell(0, environ) == 2 and egl_device_for_cell(1, environ) == 3
    cpu_only = {"GAP_MUJOCO_EGL_DEVICES": "0,1"}
    assert pin_ray_devices(cpu_only, []) == {} and egl_device_for_cell(0, cpu_only) is None


def test_trials_of_a_loopback_policy_server_keep_their_actors_on_this_machine():
    from pytest_gap.scale.ray_cluster import usable_nodes

    nodes = [
        {"NodeID": "h", "Alive": True, "NodeManagerAddress": "10.0.0.1"},
        {"NodeID": "g", "Alive": True, "NodeManagerAddress": "10.0.0.2"},
        {"NodeID": "x", "Alive": False, "NodeManagerAddress": "10.0.0.1"},
    ]
    assert usable_nodes(nodes, "10.0.0.1", []) == (nodes[:2], None)
    local, why = usable_nodes(nodes, "10.0.0.1", ["pi0"])
    assert local == nodes[:1]
    assert why.startswith("policy servers on loopback (pi0) are reachable from this machine only")
    one_machine = [{**n, "NodeManagerAddress": "10.0.0.1"} for n in nodes]
    assert usable_nodes(one_machine, "10.0.0.1", ["pi0"]) == (one_machine[:2], None)


def test_trial_actors_are_not_planned_into_what_the_sessions_policy_servers_hold():
    from pytest_gap.config import RayResources
    from pytest_gap.scale.ray_cluster import slots_of
    from pytest_gap.scale.ray_executor import _less
    from pytest_gap.scale.ray_policy import RayServerProcess, held_by_servers
    from pytest_gap.servers.manager import ManagedServer

    def placed(node: str, resources: RayResources, returncode=None) -> ManagedServer:
        process = RayServerProcess(None, None, 11, None, node, resources)
        process.returncode = returncode
        return ManagedServer("p", 8000, process, None, host="10.0.0.2")

    held = held_by_servers(
        [
            placed("n2", RayResources(num_cpus=1, num_gpus=1)),
            placed("n2", RayResources(num_cpus=0.5, num_gpus=1, memory=2**30)),
            placed("n1", RayResources(num_cpus=1), returncode=-9),  # gone: holds nothing
        ]
    )
    assert held == {"n2": {"CPU": 1.5, "GPU": 2.0, "memory": 2**30}}
    node = {"CPU": 4.0, "GPU": 2.0, "memory": 8.0 * 2**30}
    assert slots_of(_less(node, held["n2"]), RayResources(num_cpus=1)) == 2
    assert slots_of(_less(node, held["n2"]), RayResources(num_cpus=1, num_gpus=1)) == 0


def test_a_sequential_cells_blocks_go_out_in_order_and_stop_when_it_is_decided():
    """Blocks of two seeds of each task: an actor keeps to its task within a block, and no
    trial of a later block starts while one of an earlier block waits. Once the cell needs no
    more (the gate decided after three blocks), its pending trials are delivered not needed,
    never sent."""
    cluster = FakeCluster()
    delivered: list[Delivery] = []

    def needed() -> bool:
        return sum(d.outcome is not None for d in delivered) < 12

    jobs = []
    for block in range(5):
        for task in (0, 1):
            for seed in (2 * block, 2 * block + 1):
                j = job(task, seed)
                j.turn, j.needed = (("b.yaml", "cell"), block), needed
                jobs.append(j)
    slots = [Slot(name=f"a{i}", actor=None, node=f"n{i}") for i in range(2)]
    Dispatcher(cluster, slots, jobs, delivered.append, lambda *a: {}, poll_s=0).run()
    sent = [int(c.request["nodeid"][-3:]) // 2 for c in cluster.calls]
    assert sent == sorted(sent)  # block by block
    assert len(cluster.calls) == 12 and len(delivered) == 20
    assert {d.job.key for d in delivered if d.not_needed} == {j.key for j in jobs[12:]}
    by = ran_by(cluster)
    assert by["a0"][:2] == ["task00::seed000", "task00::seed001"]  # its task, within a block
