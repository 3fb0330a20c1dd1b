"""The evaluation service's protocol on the fake backend, in this process: the fast-tier
counterpart of tests/test_service.py (real `gap` processes over real LIBERO). An EvalServer on a
loopback port of its own thread, the operator's config registered as `gap serve --config` does,
and EvalClients (what `gap eval` runs) answering observations with the built-in `hold` policy:
attach with the run secret, obs/reply frames until `finished`, the status document, the records
and the summary a finished run leaves, and the refusals of a wrong secret, an unknown run and a
missing token."""

from __future__ import annotations

import asyncio
import contextlib
import json
import threading
import urllib.error
import urllib.request
from collections.abc import Iterator
from concurrent.futures import Future
from contextlib import contextmanager
from pathlib import Path

import pyarrow.parquet as pq
import pytest
import yaml

from pytest_gap.outputs import plots
from pytest_gap.policies.builtin import HoldPolicy
from pytest_gap.report import RunSummary
from pytest_gap.results import write_json
from pytest_gap.service.client import EvalClient, ServiceError, run_status
from pytest_gap.service.runs import register
from pytest_gap.service.server import EvalServer
from tests.fake_session import BACKEND, TESTS

TOKEN = "service-protocol-test-token"


def _config(path: Path, tasks=(0, 1), n_seeds: int = 2) -> Path:
    path.write_text(
        yaml.safe_dump(
            {
                "policies": {"remote": {"url": "ws://127.0.0.1:1", "obs_format": "gap"}},
                "trials": {"max_steps": 8},
                "benchmark": {
                    "backend": BACKEND,
                    "families": ["fake"],
                    "variations": ["easy"],
                    "modes": ["policy_only"],
                    "policies": ["remote"],
                    "task_ids": list(tasks),
                    "n_seeds": n_seeds,
                    "gate_threshold": 0.0,
                    "mode_overrides": {"policy_only": {"template": "policy_only"}},
                },
            }
        )
    )
    return path


@contextmanager
def _serving(runs_dir: Path) -> Iterator[str]:
    """An EvalServer with a token, served by `asyncio.run` on a thread of its own (as `gap
    serve` serves it, until its task is cancelled); yields its url."""
    server = EvalServer(runs_dir, token=TOKEN)
    port: Future[int] = Future()
    cancel: Future = Future()

    async def main() -> None:
        loop = asyncio.get_running_loop()
        started = loop.create_future()
        task = asyncio.create_task(server.serve(started))
        cancel.set_result(lambda: loop.call_soon_threadsafe(task.cancel))
        port.set_result(await started)
        with contextlib.suppress(asyncio.CancelledError):
            await task

    thread = threading.Thread(target=asyncio.run, args=(main(),), daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{port.result(30)}"
    finally:
        cancel.result(30)()
        thread.join(30)


@pytest.fixture
def fake_backend_on_path(monkeypatch):
    monkeypatch.syspath_prepend(str(TESTS))  # the config names fake_backend:FakeBackend


def test_two_clients_finish_a_run_and_it_leaves_its_records_and_summary(
    tmp_path, fake_backend_on_path, monkeypatch
):
    monkeypatch.delenv("GAP_NO_PLOTS", raising=False)  # the run's plots are checked below
    runs = tmp_path / "runs"
    registered = register(runs, "r1", _config(tmp_path / "run.yaml"))
    assert registered.created and registered.trials == 4 and registered.run_secret
    with _serving(runs) as url:
        waiting = run_status(url, "r1", TOKEN)
        assert (waiting.state, waiting.expected, waiting.saved) == ("waiting for clients", 4, 0)
        finished: dict[int, dict] = {}
        clients = [
            EvalClient(url, "r1", worker, token=TOKEN, run_secret=registered.run_secret)
            for worker in (0, 1)
        ]

        def attach(client: EvalClient) -> None:
            finished[client.hello.worker_id] = client.run(HoldPolicy().infer)

        threads = [threading.Thread(target=attach, args=(c,)) for c in clients]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(120)
        assert set(finished) == {0, 1}, "a client did not get its finished frame"
        for frame in finished.values():
            assert frame["type"] == "finished" and not frame["smoke"]
            assert (frame["expected"], frame["saved"]) == (4, 4)
        assert sum(c.answered for c in clients) > 0  # the policy was asked, through the relay
        done = run_status(url, "r1", TOKEN)
    assert (done.state, done.saved, done.remaining, done.infra_failures) == ("finished", 4, 0, 0)
    assert {w.worker_id for w in done.workers} == {0, 1}
    assert all(w.state == "detached" for w in done.workers)
    # the fake succeeds on fake_easy iff seed % 3 != 0: seeds 0 and 1 of each task
    assert done.gate is not None and done.gate.startswith("gate PASS: success_rate=0.500")
    records = {
        p.parent.relative_to(runs / "r1").as_posix(): json.loads(p.read_text())
        for p in (runs / "r1").rglob("result.json")
    }
    assert sorted(records) == [
        f"policy_only/remote/fake/easy/task_0{t}/seed_00{s}" for t in (0, 1) for s in (0, 1)
    ]
    assert {k: r["success"] for k, r in records.items()} == {
        k: k.endswith("seed_001") for k in records
    }
    assert {r["worker"] for r in records.values()} <= {"service-0", "service-1"}
    # the run dir's outputs, by the writers a pytest session calls (pytest_gap/outputs/)
    assert (runs / "r1/summary.tsv").read_text().count("policy_only") >= 1
    summary = json.loads((runs / "r1/summary.json").read_text())
    assert (summary["n_trials"], summary["n_success"]) == (4, 2)
    episodes = pq.read_table(runs / "r1/episodes.parquet").to_pylist()
    assert sorted((e["task_id"], e["seed"], e["success"]) for e in episodes) == [
        (t, s, s == 1) for t in (0, 1) for s in (0, 1)
    ]
    assert (runs / "r1/plots/success.png").stat().st_size > 0
    assert (runs / "r1/aaa_done_flag.txt").read_text().startswith("done ")
    card = json.loads((runs / "r1/service.json").read_text())
    assert card["coverage"]["expected"] == card["coverage"]["saved"] == 4
    assert card["gate"] == done.gate


def test_a_wrong_secret_an_unknown_run_and_a_missing_token_are_refused(
    tmp_path, fake_backend_on_path
):
    runs = tmp_path / "runs"
    register(runs, "r1", _config(tmp_path / "run.yaml", tasks=(0,), n_seeds=1))
    with _serving(runs) as url:
        wrong = EvalClient(url, "r1", 0, token=TOKEN, run_secret="not-the-secret")
        with pytest.raises(ServiceError, match="r1: missing or wrong run secret"):
            wrong.run(HoldPolicy().infer)
        unknown = EvalClient(url, "nope", 0, token=TOKEN, run_secret="x")
        with pytest.raises(ServiceError, match="no run nope on this server"):
            unknown.run(HoldPolicy().infer)
        with pytest.raises(urllib.error.HTTPError) as refused:
            urllib.request.urlopen(f"{url}/runs/r1", timeout=30)
        assert refused.value.code == 401
        refused.value.close()
        assert run_status(url, "r1", TOKEN).saved == 0  # nothing ran for any of them


def test_two_slots_writing_one_record_at_once_both_succeed(tmp_path):
    """What the two-client run above caught: the service's slots are threads of one process,
    and both write the same warm-up record; a temporary name shared between them lost one
    writer's file to the other (FileNotFoundError, the trial recorded as failed)."""
    path = tmp_path / "warmup" / "remote.1.json"
    errors: list[OSError] = []
    barrier = threading.Barrier(2)

    def writer(n: int) -> None:
        for i in range(100):
            barrier.wait(30)
            try:
                write_json(path, {"writer": n, "i": i})
            except OSError as exc:
                errors.append(exc)

    threads = [threading.Thread(target=writer, args=(n,)) for n in (0, 1)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(60)
    assert errors == []
    assert json.loads(path.read_text())["i"] == 99


@pytest.mark.parametrize(("value", "drawn"), [("1", False), ("0", True), ("", True)])
def test_a_service_run_draws_its_plots_unless_gap_no_plots_says_not(
    tmp_path, monkeypatch, value, drawn
):
    """Outside a pytest session (a service run: no pytest config) the environment decides."""
    calls = []
    monkeypatch.setattr(plots, "write_plots", lambda run_dir, cells: calls.append(run_dir))
    monkeypatch.setenv("GAP_NO_PLOTS", value)
    plots.pytest_gap_write_outputs(None, tmp_path, RunSummary.model_construct(cells=[]))
    assert calls == ([tmp_path] if drawn else [])


def test_the_health_check_answers_while_a_run_loads(tmp_path, fake_backend_on_path, monkeypatch):
    """Reading a run (its config, plan and records) runs off the event loop: a run whose load
    is held (a double of ServiceRun waiting on an event) leaves /healthz answering."""
    from pytest_gap.service import server as served

    runs = tmp_path / "runs"
    register(runs, "r1", _config(tmp_path / "run.yaml", tasks=(0,), n_seeds=1))
    entered, release = threading.Event(), threading.Event()

    class HeldRun(served.ServiceRun):
        def __init__(self, *args, **kwargs):
            entered.set()
            release.wait(120)
            super().__init__(*args, **kwargs)

    monkeypatch.setattr(served, "ServiceRun", HeldRun)
    with _serving(runs) as url:
        answer: Future = Future()
        asking = threading.Thread(target=lambda: answer.set_result(run_status(url, "r1", TOKEN)))
        asking.start()
        try:
            assert entered.wait(60), "the run was never loaded"
            with urllib.request.urlopen(f"{url}/healthz", timeout=30) as health:
                assert health.status == 200
        finally:
            release.set()
            asking.join(60)
        assert answer.result(0).expected == 1


def test_a_slot_the_server_cannot_start_is_never_a_scored_trial(
    tmp_path, fake_backend_on_path, monkeypatch
):
    """The server's own resource failure (no thread for a slot) makes no record of the trial:
    it goes out again, the client is told why, and the next attach runs it."""
    from concurrent.futures import ThreadPoolExecutor

    runs = tmp_path / "runs"
    registered = register(runs, "r1", _config(tmp_path / "run.yaml", tasks=(0,), n_seeds=1))
    submit = ThreadPoolExecutor.submit
    failing = [True]

    def no_thread(self, *args, **kwargs):
        if failing[0] and self._thread_name_prefix.startswith("gap-slot"):
            raise RuntimeError("can't start new thread")
        return submit(self, *args, **kwargs)

    monkeypatch.setattr(ThreadPoolExecutor, "submit", no_thread)
    with _serving(runs) as url:
        client = EvalClient(url, "r1", 0, token=TOKEN, run_secret=registered.run_secret)
        with pytest.raises(ServiceError, match="could not start a trial: RuntimeError"):
            client.run(HoldPolicy().infer)
        status = run_status(url, "r1", TOKEN)
        assert (status.saved, status.in_progress, status.given_up) == (0, 0, 0)
        assert status.infra_failures == 1 and status.remaining == 1
        assert not list(runs.rglob("result.json"))  # no record, let alone a scored one
        failing[0] = False
        EvalClient(url, "r1", 0, token=TOKEN, run_secret=registered.run_secret).run(
            HoldPolicy().infer
        )
        assert run_status(url, "r1", TOKEN).saved == 1
