"""The evaluation service end to end on loopback: a real `gap serve` process, real `gap submit`,
`gap eval` and `gap status` processes, real LIBERO episodes (20 control steps) and a real policy
server (the built-in `hold`, served in this process, slowed down where a test must catch an
episode in the middle). Faults are real too: SIGKILL of a client mid-episode and of the server.
Secrets as a user has them: the token `gap serve` made and the run secrets `gap submit` kept, in
a state directory of the test's own (XDG_STATE_HOME)."""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path

import pytest
import yaml
from websockets.exceptions import ConnectionClosed
from websockets.sync.client import connect

from pytest_gap.doors import server_token_path
from pytest_gap.policies.builtin import HoldPolicy
from pytest_gap.policies.server import PolicyServer
from pytest_gap.policies.wire import packb, unpackb
from pytest_gap.service.client import stored_run_secret

GAP = shutil.which("gap", path=str(Path(sys.executable).parent)) or "gap"
TIMEOUT = 240
STEPS = 20
LONG_STEPS = 120  # with SlowHold, about 10 s of episode: long enough to interrupt


class SlowHold(HoldPolicy):
    """Holds still, taking its time: an episode lasts long enough to be interrupted. With
    `once`, only once it says so (quick until then: the episodes before need no time)."""

    def __init__(self, once=None):
        super().__init__()
        self.once = once

    def infer(self, obs: dict) -> dict:
        if self.once is None or self.once():
            time.sleep(0.4)
        return super().infer(obs)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _config(path: Path, tasks=(0, 1), steps: int = STEPS) -> Path:
    path.write_text(
        yaml.safe_dump(
            {
                "policies": {"remote": {"url": "ws://127.0.0.1:1", "obs_format": "gap"}},
                "trials": {"max_steps": steps},
                "benchmark": {
                    "families": ["libero"],
                    "variations": ["object"],
                    "modes": ["policy_only"],
                    "policies": ["remote"],
                    "task_ids": list(tasks),
                    "n_seeds": 1,
                    "gate_threshold": 0.0,
                    "mode_overrides": {"policy_only": {"template": "policy_only"}},
                },
            }
        )
    )
    return path


class Server:
    """A `gap serve` process on a free loopback port."""

    def __init__(
        self,
        home: Path,
        token: str | None = None,
        port: int | None = None,
        splits: Path | None = None,
    ):
        self.home, self.port = home, port or _free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        argv = [GAP, "serve", "--port", str(self.port), "--runs-dir", str(home / "runs")]
        argv += ["--splits", str(splits)] if splits else []
        self.given_token = bool(token)
        if token:
            (home / "token").write_text(token + "\n")
            argv += ["--token-file", str(home / "token")]
        self.log = open(home / f"serve_{self.port}.log", "a")  # noqa: SIM115 (closed in stop)
        self.process = subprocess.Popen(argv, stdout=self.log, stderr=subprocess.STDOUT)
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline and self.process.poll() is None:
            try:
                urllib.request.urlopen(f"{self.url}/healthz", timeout=1)
                if token or server_token_path(self.port).is_file():  # written once it listens
                    return
            except OSError:
                pass
            time.sleep(0.2)
        self.stop(signal.SIGKILL)  # a server that never came up is not left behind, nor its log
        log = (home / f"serve_{self.port}.log").read_text()
        raise AssertionError(f"gap serve did not come up on port {self.port}: {log}")

    def gap(self, *args: str, timeout: float = TIMEOUT) -> subprocess.CompletedProcess:
        return subprocess.run(
            [GAP, *args], capture_output=True, text=True, timeout=timeout, cwd=self.home
        )

    def submit(self, config: Path, run_id: str, *extra: str):
        return self.gap("submit", str(config), "--run-id", run_id, "--port", str(self.port), *extra)

    @property
    def token(self) -> str:
        """The server's token: the one it was given, else the one it wrote for its port."""
        given = self.home / "token"
        path = given if self.given_token else server_token_path(self.port)
        return path.read_text().strip()

    def headers(self) -> dict[str, str]:
        return {"Authorization": f"Bearer {self.token}"}

    def status(self, run_id: str) -> dict:
        """GET /runs/<run id> (what `gap status --json` prints), without a process per poll."""
        request = urllib.request.Request(f"{self.url}/runs/{run_id}", headers=self.headers())
        with urllib.request.urlopen(request, timeout=30) as answer:
            return json.loads(answer.read())

    def eval(self, run_id: str, policy: str, *extra: str) -> subprocess.Popen:
        argv = [GAP, "eval", "--url", self.url, "--run-id", run_id, "--policy", policy, *extra]
        return subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)

    def stop(self, sig=signal.SIGTERM) -> None:
        try:
            if self.process.poll() is None:
                self.process.send_signal(sig)
                self.process.wait(timeout=30)
        finally:
            self.log.close()


@pytest.fixture
def home(tmp_path) -> Path:
    return tmp_path


@pytest.fixture
def start(home):
    """Start a `gap serve` in `home`; every one started is killed at the end of the test."""
    # Every server is stopped and its log closed even if one outlives its wait: left open,
    # they would fail whichever later test on this worker collects them.
    with contextlib.ExitStack() as stops:

        def _start(**kwargs) -> Server:
            server = Server(home, **kwargs)
            stops.callback(server.stop, signal.SIGKILL)
            return server

        yield _start


@pytest.fixture
def hold():
    with PolicyServer(HoldPolicy(), metadata={"name": "hold"}).start() as running:
        yield running.url


def _wait(predicate, what: str, timeout: float = TIMEOUT):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(0.3)
    raise AssertionError(f"timed out waiting for {what}")


def _records(home: Path, run_id: str) -> dict[str, dict]:
    run = home / "runs" / run_id
    return {
        p.parent.relative_to(run).as_posix(): json.loads(p.read_text())
        for p in run.rglob("result.json")
    }


def test_two_clients_with_disjoint_worker_ids_finish_a_run(home, start, hold):
    server = start()
    config = _config(home / "run.yaml")
    first = server.submit(config, "r1")
    assert first.returncode == 0 and first.stdout.startswith("run r1: 2 trials scheduled; run ")
    again = server.submit(config, "r1")
    assert again.returncode == 0 and "already submitted" in again.stdout
    assert "nothing added" in again.stdout and "run secret in" in again.stdout  # still here
    other = _config(home / "other.yaml", tasks=(2,))
    taken = server.submit(other, "r1")
    assert taken.returncode == 2 and "run id r1 is taken by another config" in taken.stderr
    waiting = server.gap("status", "--url", server.url, "--run-id", "r1")
    assert waiting.stdout.startswith(
        "run r1: waiting for clients; 0/2 episodes saved, 0 in progress, 2 remaining"
    )
    assert not (home / "runs/r1/policy_only").exists()  # submitting ran nothing

    client = server.eval("r1", hold, "--worker-ids", "0,1")
    out, err = client.communicate(timeout=TIMEOUT)
    assert client.returncode == 0, out + err
    assert out.count("run r1 finished, 2/2 episodes saved") == 2
    status = server.status("r1")
    assert status["state"] == "finished" and status["saved"] == status["expected"] == 2
    assert sorted(w["worker_id"] for w in status["workers"]) == [0, 1]
    assert status["gate"].startswith("gate PASS: success_rate=0.000")
    records = _records(home, "r1")
    assert sorted(records) == [
        "policy_only/remote/libero/object/task_00/seed_000",
        "policy_only/remote/libero/object/task_01/seed_000",
    ]
    for record in records.values():
        assert record["error"] is None
        assert record["steps"] == STEPS
        assert record["exit_status"] == "step_limit"  # holding still, to the last step
    assert {r["worker"] for r in records.values()} <= {"service-0", "service-1"}
    summary = json.loads((home / "runs/r1/summary.json").read_text())
    assert summary["n_trials"] == 2 and summary["gate"]["verdict"] == "PASS"
    card = json.loads((home / "runs/r1/service.json").read_text())  # the run's own record
    assert card["run_id"] == "r1" and card["config_name"] == "run.yaml"
    assert card["endpoint"] == server.url
    assert sorted(w["worker_id"] for w in card["workers"]) == [0, 1]
    assert all(w["host"] == socket.gethostname() for w in card["workers"])
    assert card["coverage"] == {
        "expected": 2,
        "saved": 2,
        "infra_failures": 0,
        "given_up": 0,
        "smoke_episodes": 0,
    }


def test_gap_eval_bridges_a_vla_eval_model_server(home, start):
    """A model behind vla-eval's own server classes, reached with --protocol vla-eval; the run's
    obs_format is vla-eval-libero, whose observation depends on the server's metadata (it asks
    for the wrist image and the state): the relay hands the client's metadata on."""
    from tests.test_vla_eval import RecordingServer, Served

    server = start()
    config = yaml.safe_load(_config(home / "run.yaml", tasks=(0,)).read_text())
    config["policies"]["remote"]["obs_format"] = "vla-eval-libero"
    (home / "vla.yaml").write_text(yaml.safe_dump(config))
    assert server.submit(home / "vla.yaml", "vla").returncode == 0
    model = RecordingServer(chunk_size=4)  # buffers its chunks: one action per observation
    with Served(model) as served:
        policy = f"ws://127.0.0.1:{served.port}"
        client = server.eval("vla", policy, "--protocol", "vla-eval")
        out, err = client.communicate(timeout=TIMEOUT)
    assert client.returncode == 0, out + err
    (record,) = _records(home, "vla").values()
    assert record["error"] is None
    assert record["steps"] == STEPS
    assert model.seen, "the model was never asked"
    first = model.seen[0]
    assert set(first["images"]) == {"agentview", "wrist"} and len(first["states"]) == 8
    assert first["task_description"] == record["prompt"]


def test_a_client_killed_mid_episode_has_its_episode_handed_out_again(home, start):
    server = start()
    long = _config(home / "run.yaml", tasks=(0,), steps=LONG_STEPS)
    assert server.submit(long, "r2").returncode == 0
    with PolicyServer(SlowHold()).start() as slow:
        client = server.eval("r2", slow.url, "--worker-ids", "3")
        _wait(lambda: server.status("r2")["state"] == "active", "the first reply")
        client.send_signal(signal.SIGKILL)
        client.communicate(timeout=30)  # closes its pipes too
        broken = _wait(
            lambda: (s := server.status("r2"))["infra_failures"] == 1 and s, "the infra record"
        )
        assert broken["saved"] == 0 and broken["remaining"] == 1
        (record,) = _records(home, "r2").values()
        assert record["infra_failure"] and record["error"]
    # the same worker id again, now that the first is gone (no episode to interrupt: no hurry)
    with PolicyServer(HoldPolicy()).start() as quick:
        again = server.eval("r2", quick.url, "--worker-ids", "3")
        out, err = again.communicate(timeout=TIMEOUT)
    assert again.returncode == 0, out + err
    (record,) = _records(home, "r2").values()
    assert record["error"] is None and not record["infra_failure"]
    assert record["steps"] == LONG_STEPS
    assert server.status("r2")["saved"] == 1


def test_a_killed_server_restarted_on_its_runs_dir_loses_nothing(home, start, hold):
    server = start()
    long = _config(home / "run.yaml", tasks=(0, 1), steps=LONG_STEPS)
    assert server.submit(long, "r3").returncode == 0
    # slow once the first episode is recorded: the server dies in the middle of the second
    recorded = lambda: any((home / "runs/r3").rglob("result.json"))  # noqa: E731
    with PolicyServer(SlowHold(once=recorded)).start() as slow:
        client = server.eval("r3", slow.url)
        _wait(lambda: server.status("r3")["saved"] == 1, "one saved episode")
        saved = {k: v for k, v in _records(home, "r3").items() if v["error"] is None}
        (key,) = saved
        stamp = (home / "runs/r3" / key / "result.json").stat().st_mtime_ns
        server.stop(signal.SIGKILL)
        client.communicate(timeout=60)
        assert client.returncode != 0  # its server vanished before the run finished

    restarted = start(port=server.port)
    status = restarted.status("r3")
    assert status["saved"] == 1 and status["remaining"] == 1 and status["state"] != "finished"
    client = restarted.eval("r3", hold)
    out, err = client.communicate(timeout=TIMEOUT)
    assert client.returncode == 0, out + err
    assert restarted.status("r3")["saved"] == 2
    assert (home / "runs/r3" / key / "result.json").stat().st_mtime_ns == stamp  # untouched


def test_fake_actions_are_a_smoke_that_is_never_scored(home, start):
    server = start()
    assert server.submit(_config(home / "run.yaml", tasks=(0,)), "r4").returncode == 0
    smoke = server.gap("eval", "--url", server.url, "--run-id", "r4", "--fake-actions")
    assert smoke.returncode == 0 and "not scored" in smoke.stdout
    status = server.status("r4")
    assert status["smoke_episodes"] == 1 and status["saved"] == 0 and status["remaining"] == 1
    assert status["state"] != "finished"
    assert not (home / "runs/r4/summary.json").exists()
    assert len(list((home / "runs/r4/smoke").rglob("result.json"))) == 1  # kept apart


def test_tokens_guard_every_door_and_stay_out_of_the_records(home, start, hold):
    secret = "s3cr3t-token-value"
    server = start(token=secret)
    config = _config(home / "run.yaml", tasks=(0,))
    (home / "bad").write_text("wrong\n")
    refused = server.submit(config, "r5", "--token-file", str(home / "bad"))
    assert refused.returncode == 2 and "missing or wrong token" in refused.stderr
    assert server.submit(config, "r5").returncode == 2  # no token at all
    assert server.submit(config, "r5", "--token-file", str(home / "token")).returncode == 0
    with pytest.raises(urllib.error.HTTPError) as unauthorized:
        urllib.request.urlopen(f"{server.url}/runs/r5")
    assert unauthorized.value.code == 401
    denied = server.eval("r5", hold)
    _, err = denied.communicate(timeout=60)
    assert denied.returncode == 2 and "missing or wrong token" in err
    client = server.eval("r5", hold, "--token-file", str(home / "token"))
    out, err = client.communicate(timeout=TIMEOUT)
    assert client.returncode == 0, out + err
    for path in (home / "runs").rglob("*"):
        if path.is_file() and path.name != "token":
            assert secret not in path.read_text(errors="replace"), path


# websockets' sync client leaves its socket to the collector after the server's 1009 close
@pytest.mark.filterwarnings("ignore::pytest.PytestUnraisableExceptionWarning")
def test_bad_frames_get_a_clear_error_and_the_server_serves_on(home, start, hold):
    server = start()
    assert server.submit(_config(home / "run.yaml", tasks=(0,)), "r6").returncode == 0
    ws_url = f"ws://127.0.0.1:{server.port}/episodes"
    auth = {"additional_headers": server.headers()}
    secret = stored_run_secret(server.url, "r6")
    with connect(ws_url, **auth) as ws:
        ws.send(b"\x00garbage")
        answer = unpackb(ws.recv())
    assert answer["type"] == "error" and "the first frame must be a hello" in answer["error"]
    with connect(ws_url, **auth) as ws:
        ws.send(packb({"run_id": "nope", "worker_id": 0}))
        answer = unpackb(ws.recv())
    assert "no run nope on this server" in answer["error"]
    with connect(ws_url, max_size=None, **auth) as ws:
        ws.send(b"\x00" * (65 * 2**20))  # over the server's frame limit: closed with 1009
        with pytest.raises(ConnectionClosed) as closed:
            ws.recv()
    assert closed.value.rcvd.code == 1009
    # A second client with a live client's worker id is refused; the first, gone mid-episode,
    # leaves its episode to be handed out again.
    with connect(ws_url, max_size=None, **auth) as first:
        first.send(packb({"run_id": "r6", "worker_id": 5, "run_secret": secret}))
        assert unpackb(first.recv())["type"] == "obs"  # its episode is under way
        with connect(ws_url, **auth) as twin:
            twin.send(packb({"run_id": "r6", "worker_id": 5, "run_secret": secret}))
            refused = unpackb(twin.recv())
        assert "worker id 5 of run r6 is already attached" in refused["error"]
    _wait(lambda: server.status("r6")["infra_failures"] == 1, "the dropped episode")
    client = server.eval("r6", hold, "--worker-ids", "5")  # others are still served
    out, err = client.communicate(timeout=TIMEOUT)
    assert client.returncode == 0, out + err
    assert server.status("r6")["saved"] == 1


def test_a_split_takes_its_seeds_from_the_server_and_is_never_substituted(home, start, hold):
    """A split decides what its runs measure (seeds, tasks, step limit, template): the
    submission names the policy and the suite."""
    split = {"task_ids": [0], "max_steps": STEPS}
    (home / "splits.yaml").write_text(
        yaml.safe_dump({"val_train": {"seeds": [0], **split}, "test": {"seeds": [7], **split}})
    )
    server = start(splits=home / "splits.yaml")
    config = yaml.safe_load(_config(home / "run.yaml", tasks=(0,)).read_text())
    for key in ("n_seeds", "task_ids", "mode_overrides"):
        del config["benchmark"][key]
    del config["trials"]
    (home / "test.yaml").write_text(yaml.safe_dump({**config, "split": "test"}))
    assert server.submit(home / "test.yaml", "held").returncode == 0
    client = server.eval("held", hold)
    out, err = client.communicate(timeout=TIMEOUT)
    assert client.returncode == 0, out + err
    assert list(_records(home, "held")) == ["policy_only/remote/libero/object/task_00/seed_007"]
    (record,) = _records(home, "held").values()
    assert record["steps"] == STEPS  # the split's step limit
    assert "seed" not in out + err  # the client learns no seed
    status = server.status("held")
    assert status["split"] == "test" and all(w["current"] is None for w in status["workers"])

    (home / "unseen.yaml").write_text(yaml.safe_dump({**config, "split": "val_unseen"}))
    refused = server.submit(home / "unseen.yaml", "unseen")
    assert refused.returncode == 2
    assert "split: val_unseen is not a split of this server (it has: test, val_train)" in (
        refused.stderr
    )
    seeded = {**config, "split": "val_train", "benchmark": {**config["benchmark"], "seeds": [3]}}
    (home / "seeded.yaml").write_text(yaml.safe_dump(seeded))
    both = server.submit(home / "seeded.yaml", "seeded")
    assert both.returncode == 2
    assert "benchmark.seeds: split: val_train decides it on this server; remove it" in both.stderr
    plain = start()  # a server without splits refuses any
    assert "(it has: none)" in plain.submit(home / "test.yaml", "x").stderr


def test_gap_eval_and_submit_name_what_is_wrong(home, start):
    server = start()
    suites = home / "suites.yaml"
    suites.write_text(yaml.safe_dump({"suites": [{"suite_name": "libero_object"}]}))
    wrong = server.submit(suites, "r7")
    assert wrong.returncode == 2
    assert "a service run evaluates one remote policy: set benchmark.modes: [policy_only]" in (
        wrong.stderr
    )
    bad_id = server.submit(_config(home / "run.yaml"), "../escape")
    assert bad_id.returncode == 2 and "run id '../escape': use letters" in bad_id.stderr
    nothing = server.gap("eval", "--url", server.url, "--run-id", "r7")
    assert nothing.returncode == 2 and "give --policy" in nothing.stderr
    ids = server.gap("eval", "--url", server.url, "--run-id", "r7", "--worker-ids", "1,1")
    assert ids.returncode == 2 and "distinct worker ids" in ids.stderr
    missing = server.gap("status", "--url", server.url, "--run-id", "r7")
    assert missing.returncode == 2 and "no run r7 on this server" in missing.stderr


@pytest.fixture(autouse=True)
def _no_proxy(monkeypatch, tmp_path):
    """urllib must reach loopback directly, whatever proxy the machine sets; the secrets of
    the test's servers and runs stay in its own state directory (not the user's)."""
    for name in ("http_proxy", "HTTP_PROXY", "https_proxy", "HTTPS_PROXY"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("NO_PROXY", "127.0.0.1,localhost")
    os.environ.setdefault("NO_PROXY", "127.0.0.1")
    monkeypatch.setenv("XDG_STATE_HOME", str(tmp_path / "state"))
    monkeypatch.delenv("GAP_TOKEN", raising=False)
    monkeypatch.delenv("GAP_RUN_SECRET", raising=False)


def test_a_trial_is_handed_out_again_within_bounds_and_a_failing_worker_is_refused(home):
    """The run's bookkeeping alone (no server, no simulator). An episode that ended unscored
    through no fault of the policy (a client gone, an infrastructure failure) goes out again
    until it has ended so `max_trial_handouts` times, then is given up with the reason (missing,
    never scored); one the harness cannot run for a reason of its own (an errored record that
    is not an infrastructure failure) is tried MAX_ATTEMPTS times. A worker whose client
    failed `max_worker_failures` trials in a row is refused; a scored trial resets the count."""
    from pytest_gap.results import TrialResult, write_result
    from pytest_gap.service.limits import ServiceLimits
    from pytest_gap.service.protocol import Submit
    from pytest_gap.service.runs import MAX_ATTEMPTS, ServiceRun, submit

    text = _config(home / "run.yaml", tasks=(0, 1)).read_text()
    submit(home / "runs", Submit(run_id="g", config_name="run.yaml", config_text=text))
    limits = ServiceLimits(max_trial_handouts=4, max_worker_failures=3)
    run = ServiceRun(home / "runs/g", limits=limits)
    first = run.claim(0)
    identity = {
        "nodeid": "n",
        "config": "run.yaml",
        "mode": "policy_only",
        "family": "libero",
        "variation": "object",
        "suite": "libero_object",
        "task_id": first.task_id,
        "seed": first.seed,
    }
    lost = TrialResult(**identity, error="client gone", infra_failure=True, exit_code=1)
    for handout in range(1, 5):  # a client lost mid-episode, on workers 1..4 (none refused)
        write_result(run.run_dir / first.key, lost)
        run.finish(first.key, handout, client="the evaluation client went away")
        assert (first.key in run.given_up) == (handout == 4)
        if handout < 4:
            assert run.claim(handout + 1).key == first.key  # handed out again
    assert "ended unscored 4 times" in run.given_up[first.key]
    assert "--max-trial-handouts 4" in run.given_up[first.key]
    assert not run.refused  # each worker failed once
    second = next(t for t in run.trials.values() if t.key != first.key)
    for attempt in range(MAX_ATTEMPTS):  # handed to a slot that ended with no record at all
        run.in_progress[second.key] = 9
        run.finish(second.key, 9)
        assert (second.key in run.given_up) == (attempt == MAX_ATTEMPTS - 1)
    assert run.ended and not run.complete and run.claim(1) is None

    fresh = ServiceRun(home / "runs/g", limits=limits)  # in memory only: a restart forgets
    for _ in range(2):  # worker 7's client fails twice; a scored trial in between resets it
        trial = fresh.claim(7)
        fresh.finish(trial.key, 7, harness_error=None, client="silent")
    write_result(fresh.run_dir / second.key, TrialResult(**{**identity, "task_id": 1}))
    fresh.in_progress[second.key] = 7
    fresh.finish(second.key, 7)
    assert fresh.saved == {second.key} and 7 not in fresh.failing
    for n in range(3):
        fresh.in_progress[first.key] = 7
        fresh.finish(first.key, 7, client="silent")
        assert (7 in fresh.refused) == (n == 2)
    assert "--max-worker-failures 3" in fresh.refused[7]
    fresh.in_progress[first.key] = 8
    fresh.finish(first.key, 8, harness_error="no thread")  # the server's fault: not worker 8's
    assert 8 not in fresh.failing
