"""What a token holder may make a `gap serve` hold (issue 48, sections 1 and 2), against real
`gap serve` processes on loopback.

Work: a few hundred bytes of config may ask for millions of trials (each axis bounded, their
product not); the server counts trials x steps from the config alone and refuses past its
`--max-trials-per-run` / `--max-steps-per-run` before anything is planned or written, at every
door (a submission, the operator's `--config`, a run found on disk). Every count, step limit
and timeout of a config has a finite bound.

Attachments: the clients one run and one server hold (`--max-attachments-per-run`, worker ids
below it; `--max-attachments`), what an idle attachment costs (no thread, one socket), a client
that closes while it waits (detached at once), the relay's reply limit (the policy entry's own),
and how often one trial goes out again and one worker may fail (`--max-trial-handouts`,
`--max-worker-failures`).

The attachment tests run the operator's config on the fake backend (tests/fake_backend.py, on
the server's PYTHONPATH): its trials build no simulator. Clients are raw websockets, so a test
decides when one answers, stays silent or closes.
"""

from __future__ import annotations

import contextlib
import json
import math
import os
import subprocess
from pathlib import Path

import pytest
import yaml
from websockets.sync.client import connect

from pytest_gap.policies.builtin import HoldPolicy
from pytest_gap.policies.wire import packb, unpackb
from tests.attacks.test_submitted_configs import (
    TIMEOUT,
    Serve,
    _refused,
    _set,
    fresh,
    honest,
)
from tests.fake_session import BACKEND, TESTS
from tests.test_service import GAP, _free_port, _wait

SECRET = "operator-chosen-run-secret-0123456789"
RSS_GROWTH_KB = 50_000  # a refusal counts; it builds nothing (13 M trials were 4 GiB)


# -- section 1: the work a submission may ask for ---------------------------------------------
def _grid(*drop: str, **benchmark) -> dict:
    """The honest config with `benchmark` keys set and `drop` keys removed."""
    data = honest()
    data["benchmark"].update(benchmark)
    for key in drop:
        del data["benchmark"][key]
    return data


# (case, config, the option the refusal names). Each axis alone is within its own bound.
HUGE = [
    (
        "every_variation_all_tasks_many_seeds",
        _grid("variations", "task_ids", families=["posvar"], n_tasks=90, n_seeds=90_000),
        "--max-trials-per-run",
    ),
    ("seed_list", _grid("n_seeds", seeds=list(range(25_000))), "--max-trials-per-run"),
    (
        "steps_not_trials",
        {**_grid(task_ids=list(range(10)), n_seeds=50), "trials": {"max_steps": 90_000}},
        "--max-steps-per-run",
    ),
    (
        "many_variations",
        _grid("variations", "task_ids", families=["libero_pro"], n_tasks=10, n_seeds=50),
        "--max-trials-per-run",
    ),
    (  # 18,000 trials, and the control arm it adds: 22,500
        "control_arms",
        _grid(
            "variations", families=["posvar"], task_ids=list(range(10)), n_seeds=450, controls=True
        ),
        "--max-trials-per-run",
    ),
]


@pytest.fixture(scope="module")
def _started(tmp_path_factory):
    started: list[Serve] = []
    yield started
    for server in started:
        server.stop()


@pytest.fixture
def served(_started, tmp_path_factory) -> Serve:
    """The module's server, or a new one where an earlier test's input stopped it (that test
    has failed already; this one is judged on its own)."""
    if not _started or _started[-1].process.poll() is not None:
        _started.append(Serve(tmp_path_factory.mktemp("limits")))
    return _started[-1]


@pytest.mark.parametrize("data, option", [c[1:] for c in HUGE], ids=[c[0] for c in HUGE])
def test_a_submission_past_the_work_limit_is_refused_before_anything_is_made(served, data, option):
    text = yaml.safe_dump(data)
    rss = served.rss_kb()
    run_id = fresh("work")
    (line,) = _refused(served.submit(text, run_id), option)
    assert "attack.yaml" in line and "per run" in line
    assert not (served.runs / run_id).exists()  # nothing written, not even its directory
    assert served.rss_kb() - rss < RSS_GROWTH_KB  # nothing planned
    served.serves_an_honest_client()


@pytest.mark.parametrize(
    "key, value",
    [
        ("trials.max_steps", 10**7),
        ("trials.task_timeout_secs", math.inf),
        ("trials.frames_every", 10**9),
        ("benchmark.seeds", [2**40]),
        ("benchmark.n_tasks", 10**9),
        ("benchmark.sequential.block_seeds", 10**9),
        ("benchmark.sequential.max_trials", 10**12),
        ("gate.block_seeds", 10**9),
        ("llm.temperature", math.nan),
        ("llm.max_retries", 10**9),
        ("llm.timeout_s", math.inf),
        ("composition.max_validation_retries", 10**9),
    ],
)
def test_every_count_step_limit_and_timeout_of_a_submission_is_bounded(served, key, value):
    data = _set(honest(), key, value)  # PyYAML writes inf and nan as .inf and .nan
    run_id = fresh("bounds")
    (line,) = _refused(served.submit(yaml.safe_dump(data), run_id), key)
    assert "bounds" not in line or "attack.yaml" in line  # one line, naming the key
    assert not (served.runs / run_id).exists()


@pytest.mark.parametrize(
    "key, value",
    [
        ("policy_manager.restart_backoff_s", math.inf),
        ("policy_manager.max_restarts", 10**6),
        ("policy_manager.startup_timeout_s", math.inf),
        ("policy_manager.evict_grace_s", math.inf),
        ("trials.ray.num_cpus", math.inf),
        ("trials.ray.num_gpus", math.inf),
        ("trials.ray.memory", 2**70),
        ("llm.max_tokens", 10**12),
        ("llm.max_concurrent_requests", 10**9),
        ("suites.0.timeout_secs", math.inf),
    ],
)
def test_every_count_and_timeout_of_a_config_file_is_bounded(tmp_path, key, value):
    """Keys a submission may not hold (or a suites config): the file's reader bounds them."""
    from pytest_gap.config import ConfigError, load_config

    if key.startswith("suites.0."):
        data = {"suites": [{"suite_name": "libero_object", key.removeprefix("suites.0."): value}]}
    else:
        data = _set(honest(), key, value)
    (tmp_path / "bounds.yaml").write_text(yaml.safe_dump(data))
    with pytest.raises(ConfigError) as info:
        load_config(tmp_path / "bounds.yaml")
    (line,) = info.value.problems
    assert key in line, line


def _serve_exits(tmp_path: Path, *args: str) -> str:
    import subprocess

    out = subprocess.run(
        [GAP, "serve", "--port", str(_free_port()), "--runs-dir", str(tmp_path / "runs"), *args],
        capture_output=True,
        text=True,
        timeout=TIMEOUT,
        env={**os.environ, "PYTHONPATH": str(TESTS)},
    )
    assert out.returncode == 2, out.stdout + out.stderr
    (line,) = out.stderr.strip().splitlines()
    return line


def test_the_runs_a_server_keeps_are_bounded_and_the_operators_own_is_not_counted(tmp_path):
    """Each submitted run keeps its records on the server's disk: past --max-runs a new run id
    is refused (nothing written), an existing one resubmitted still answers, and the
    operator's own `--config` run takes no tenant's place."""
    served = _operator(tmp_path, "--max-runs", "2")
    try:
        text = yaml.safe_dump(honest())
        kept = [fresh("kept") for _ in range(2)]
        for run_id in kept:
            assert served.submit(text, run_id)["ok"] is True
        run_id = fresh("third")
        (line,) = _refused(served.submit(text, run_id), "--max-runs (2)")
        assert "holds 2 submitted runs" in line
        assert not (served.runs / run_id).exists()
        again = served.submit(text, kept[0])
        assert again["ok"] is True and again["created"] is False
    finally:
        served.stop()


def test_an_operator_config_past_the_limits_stops_gap_serve_and_writes_nothing(tmp_path):
    huge = _grid(seeds=list(range(30_000)))
    del huge["benchmark"]["n_seeds"]
    (tmp_path / "op.yaml").write_text(yaml.safe_dump(huge))
    line = _serve_exits(tmp_path, "--config", str(tmp_path / "op.yaml"), "--run-id", "op")
    assert "op.yaml" in line and "--max-trials-per-run" in line
    assert not (tmp_path / "runs" / "op").exists()
    line = _serve_exits(tmp_path, "--max-trials-per-run", str(10**9))
    assert line.endswith("--max-trials-per-run 1000000000: give a whole number from 1 to 200000")


def test_a_run_on_disk_past_the_limits_is_refused_at_once_and_health_answers(tmp_path):
    """A run an older server took (or one written before a limit was lowered) is refused with
    its reason, every time, without being planned: the health check answers meanwhile."""
    import urllib.error
    import urllib.request

    runs = tmp_path / "runs"
    big = _grid(task_ids=[0, 1], n_seeds=3)  # 6 trials, over the limit below
    (runs / "big").mkdir(parents=True)
    (runs / "big" / "config.yaml").write_text(yaml.safe_dump(big))
    card = {"run_id": "big", "config_name": "big.yaml", "split": None}
    (runs / "big" / "service.json").write_text(json.dumps(card))
    served = Serve(tmp_path, "--max-trials-per-run", "5")
    try:
        for _ in range(2):  # the second answer is the kept refusal
            with pytest.raises(urllib.error.HTTPError) as refused:
                served.status("big")
            assert refused.value.code == 409
            error = json.loads(refused.value.read())["error"]
            refused.value.close()
            assert "big.yaml" in error and "6 trials" in error
            assert "--max-trials-per-run" in error
            urllib.request.urlopen(f"{served.url}/healthz", timeout=TIMEOUT).close()
        assert sorted(p.name for p in (runs / "big").iterdir()) == ["config.yaml", "service.json"]
    finally:
        served.stop()


# -- section 2: attachments and slots ---------------------------------------------------------
def _operator(home: Path, *args: str, tasks=(0,), n_seeds=1, timeout_s=120, warmup_s=120):
    """A `gap serve` whose operator's run `op` runs on the fake backend; its secret SECRET."""
    data = honest()
    data["benchmark"].update(
        backend=BACKEND, families=["fake"], variations=["easy"], task_ids=list(tasks)
    )
    data["benchmark"]["n_seeds"] = n_seeds
    data["trials"]["max_steps"] = 4
    data["policies"]["remote"].update(timeout_s=timeout_s, warmup_timeout_s=warmup_s)
    (home / "op.yaml").write_text(yaml.safe_dump(data))
    config = ("--config", str(home / "op.yaml"), "--run-id", "op")
    return Serve(home, *config, *args, pythonpath=TESTS, env={"GAP_RUN_SECRET": SECRET})


@contextlib.contextmanager
def _client(served: Serve, worker: int, run_id: str = "op", secret: str = SECRET):
    """A raw client: its hello sent; the test reads, answers and closes it."""
    with connect(
        f"ws://127.0.0.1:{served.port}/episodes",
        additional_headers=served.headers,
        open_timeout=TIMEOUT,
        max_size=None,
    ) as ws:
        hello = {"run_id": run_id, "worker_id": worker, "run_secret": secret, "host": "t"}
        ws.send(packb(hello))
        yield ws


def _frame(ws) -> dict:
    return unpackb(ws.recv(timeout=TIMEOUT))


def _answer(ws, frame: dict) -> None:
    ws.send(packb({"type": "reply", "reply": HoldPolicy().infer(frame["obs"])}))


def _worker_states(served: Serve, run_id: str = "op") -> dict[int, str]:
    return {w["worker_id"]: w["state"] for w in served.status(run_id)["workers"]}


def _held(pid: int) -> tuple[int, int]:
    """(threads, file descriptors) of process `pid`."""
    status = Path(f"/proc/{pid}/status").read_text()
    (threads,) = (int(line.split()[1]) for line in status.splitlines() if line[:8] == "Threads:")
    return threads, len(os.listdir(f"/proc/{pid}/fd"))


def test_idle_attachments_cost_a_socket_each_and_the_limits_hold(tmp_path):
    """One client holds the run's one trial (its warm-up unanswered); six more wait for it,
    idle: they add no thread, one socket each. Past the limits, attaching is refused naming
    the option, before anything is made; a client that closes while it waits is detached at
    once (not when the trial it waits on ends) and its worker id taken again."""
    limits = ("--max-attachments-per-run", "8", "--max-attachments", "8")
    served = _operator(tmp_path, *limits)
    try:
        with contextlib.ExitStack() as stack:
            runner = stack.enter_context(_client(served, 0))
            assert _frame(runner)["type"] == "obs"  # the warm-up: left unanswered
            before = _held(served.process.pid)
            idle = {w: stack.enter_context(_client(served, w)) for w in range(1, 7)}
            _wait(lambda: list(_worker_states(served).values()).count("attached") == 7, "7")
            threads, fds = _held(served.process.pid)
            assert threads - before[0] <= 2, (before, threads)
            assert fds - before[1] <= len(idle) + 2, (before, fds)

            with _client(served, 8) as far:
                (error,) = _frame(far)["error"].splitlines()
            assert "worker id 8:" in error and "--max-attachments-per-run 8" in error
            with _client(served, 7):
                _wait(lambda: _worker_states(served).get(7) == "attached", "the eighth")
                secret = served.submit(yaml.safe_dump(honest()), "other")["run_secret"]
                with _client(served, 0, "other", secret) as over:  # another run: the server's
                    error = _frame(over)["error"]
                assert "--max-attachments (8)" in error and "attach later" in error

            idle.pop(3).close()
            _wait(lambda: _worker_states(served)[3] == "detached", "the closed client", 30)
            assert _worker_states(served)[0] == "attached"  # its trial still holds
            with _client(served, 3):
                _wait(lambda: _worker_states(served)[3] == "attached", "worker id 3 again", 30)
    finally:
        served.stop()


def test_the_relay_waits_as_long_as_the_trials_own_limits(tmp_path):
    """A silent client is let go after the policy entry's warmup_timeout_s (its first
    inference) or timeout_s (later ones), with the limit named; its trial is an
    infrastructure failure, handed out again."""
    served = _operator(tmp_path, timeout_s=2, warmup_s=3)
    try:
        with _client(served, 0) as silent:
            assert _frame(silent)["type"] == "obs"
            frame = _frame(silent)
        assert frame["type"] == "error", frame
        assert "3 s" in frame["error"] and "warmup_timeout_s" in frame["error"]
        with _client(served, 1) as slow:
            _answer(slow, _frame(slow))  # the warm-up
            assert _frame(slow)["type"] == "obs"  # the first measured step: unanswered
            frame = _frame(slow)
        assert frame["type"] == "error", frame
        assert "2 s" in frame["error"] and "timeout_s" in frame["error"]
        assert "warmup" not in frame["error"]
        status = served.status("op")
        assert status["saved"] == 0 and status["infra_failures"] == 2 and not status["given_up"]
        (record,) = (served.runs / "op").rglob("result.json")
        assert json.loads(record.read_text())["infra_failure"] is True
    finally:
        served.stop()


def test_a_trial_goes_out_a_bounded_number_of_times_and_a_failing_worker_is_refused(tmp_path):
    """A client that drops each trial it is handed: the trial is given up after
    --max-trial-handouts unscored ends (missing, never a failure of the policy), the worker
    id refused after --max-worker-failures in a row; an honest worker finishes the rest."""
    limits = ("--max-trial-handouts", "2", "--max-worker-failures", "3")
    served = _operator(tmp_path, *limits, tasks=(0, 1))
    try:
        for _ in range(3):  # trial A twice (given up), then trial B once (the third in a row)
            with _client(served, 0) as dropping:
                assert _frame(dropping)["type"] == "obs"
            _wait(lambda: not served.status("op")["in_progress"], "the dropped trial back")
        with _client(served, 0) as refused:
            error = _frame(refused)["error"]
        assert "worker id 0 of run op is refused" in error
        assert "--max-worker-failures 3" in error and "new worker id" in error
        status = served.status("op")
        assert status["given_up"] == 1 and status["infra_failures"] == 3
        (reason,) = status["given_up_reasons"]
        assert "ended unscored 2 times" in reason and "--max-trial-handouts 2" in reason
        assert {w["worker_id"]: w["state"] for w in status["workers"]} == {0: "refused"}
        shown = subprocess.run(  # what an operator reads: the worker's reason, the trial's
            [GAP, "status", "--url", served.url, "--run-id", "op"],
            capture_output=True,
            text=True,
            timeout=TIMEOUT,
            env={**os.environ, "GAP_TOKEN": served.token_file.read_text().strip()},
        )
        assert shown.returncode == 0, shown.stderr
        worker_line, given_up_line = shown.stdout.splitlines()[1:3]
        assert (
            worker_line.startswith("  worker 0: refused (t), 0 done: ")
            and "--max-worker" in worker_line
        )
        assert (
            given_up_line.startswith("  given up: ") and "ended unscored 2 times" in given_up_line
        )

        with _client(served, 1) as honest_client:
            while (frame := _frame(honest_client))["type"] == "obs":
                _answer(honest_client, frame)
        assert frame["type"] == "finished" and (frame["expected"], frame["saved"]) == (2, 1)
        card = json.loads((served.runs / "op" / "service.json").read_text())
        assert card["coverage"]["given_up"] == 1
        (why,) = card["given_up"]
        assert "task_00/seed_000: ended unscored 2 times" in why and "last: " in why
    finally:
        served.stop()


def test_worker_ids_are_bounded_by_the_attachment_limit(served):
    for worker in (10**6, 1024):  # the protocol's bound (HEAD took up to 1,000,000)
        with _client(served, worker, "nope", "x") as ws:
            (error,) = _frame(ws)["error"].splitlines()
        assert error.startswith("the first frame must be a hello: worker_id:"), error
    secret = served.submit(yaml.safe_dump(honest()), "ids")["run_secret"]
    with _client(served, 16, "ids", secret) as ws:  # the default: 16 per run
        (error,) = _frame(ws)["error"].splitlines()
    assert "worker id 16:" in error and "--max-attachments-per-run 16" in error
