"""The online platform end to end on loopback: a real `gap online serve` process with capacity 1,
two tasks (the second waits in the queue, then runs), real `gap serve` processes it starts, real
`gap eval` clients on real LIBERO, and its tokens (wrong, missing, another owner's)."""

from __future__ import annotations

import json
import os
import subprocess
import time
import urllib.error
import urllib.request
from pathlib import Path

import pytest

from pytest_gap.policies.builtin import HoldPolicy
from pytest_gap.policies.server import PolicyServer
from tests.test_service import GAP, TIMEOUT, _config, _free_port, _wait

ALICE, BOB = "alice-token-0123456789", "bob-token-9876543210"


@pytest.fixture
def platform(tmp_path, monkeypatch):
    monkeypatch.setenv("XDG_STATE_HOME", str(tmp_path / "state"))  # no user's secrets here
    (tmp_path / "tokens").write_text(f"# token owner\n{ALICE} alice\n{BOB} bob\n")
    _config(tmp_path / "smoke.yaml", tasks=(0,))
    (tmp_path / "sets.yaml").write_text("libero_smoke: smoke.yaml\n")
    port = _free_port()
    log = open(tmp_path / "online.log", "w")  # noqa: SIM115 (closed below)
    process = subprocess.Popen(
        [
            GAP,
            "online",
            "serve",
            "--port",
            str(port),
            "--capacity",
            "1",
            "--runs-dir",
            str(tmp_path / "online_runs"),
            "--sets",
            str(tmp_path / "sets.yaml"),
            "--tokens",
            str(tmp_path / "tokens"),
        ],
        stdout=log,
        stderr=subprocess.STDOUT,
    )
    url = f"http://127.0.0.1:{port}"

    def up():
        try:
            urllib.request.urlopen(urllib.request.Request(f"{url}/tasks"), timeout=1)
        except urllib.error.HTTPError:
            return True  # 401 without a token: it answers
        except OSError:
            return False
        return True

    _wait(up, "gap online serve", timeout=60)
    yield tmp_path, url
    process.terminate()
    process.wait(timeout=60)
    log.close()


def _gap(
    *args, timeout=TIMEOUT, token: str | None = None, secret: str | None = None
) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if k not in ("GAP_TOKEN", "GAP_RUN_SECRET")}
    if token:
        env["GAP_TOKEN"] = token  # as a user would export it: not on the command line
    if secret:
        env["GAP_RUN_SECRET"] = secret
    return subprocess.run([GAP, *args], capture_output=True, text=True, timeout=timeout, env=env)


def _online(url: str, command: str, token: str, *args, timeout=TIMEOUT):
    return _gap("online", command, "--base-url", url, "--token", token, *args, timeout=timeout)


def _submit(url: str, model: str, timeout: str, *extra: str) -> subprocess.CompletedProcess:
    """`gap online submit` of ALICE's model on the one benchmark set."""
    args = ["--model-name", model, "--benchmark-set", "libero_smoke", "--timeout", timeout]
    return _online(url, "submit", ALICE, *args, *extra)


def test_capacity_one_queues_the_second_task_until_the_first_finishes(platform):
    home, url = platform
    first = _submit(url, "m1", "60", "--print-endpoint")
    assert first.returncode == 0, first.stderr
    ready = json.loads(first.stdout)
    assert set(ready) == {"task_id", "endpoint", "run_secret", "client_token"}
    assert ready["endpoint"].startswith("http://127.0.0.1:")
    assert len(ready["run_secret"]) >= 32 and len(ready["client_token"]) >= 32
    retried = _submit(url, "m1", "5", "--print-endpoint")
    assert json.loads(retried.stdout) == ready  # the same task, not a second one

    second = _submit(url, "m2", "1")  # the first holds the one place: no wait can end it
    assert second.returncode == 1 and "is still queued after 1 s" in second.stderr
    queued_id = second.stderr.split()[1]
    waiting = _online(url, "ready", ALICE, "--task-id", queued_id)
    assert waiting.returncode == 1 and waiting.stdout.strip() == f"task {queued_id}: queued"

    with PolicyServer(HoldPolicy()).start() as hold:
        attach = ["eval", "--url", ready["endpoint"], "--run-id", ready["task_id"]]
        secret, client = ready["run_secret"], ready["client_token"]
        # the task's server takes the token the platform gave for it: no platform token opens
        # it, the owner's included
        for platform_token in (BOB, ALICE, None):
            refused = _gap(*attach, "--policy", hold.url, token=platform_token, secret=secret)
            assert refused.returncode == 2 and "missing or wrong token" in refused.stderr
        no_secret = _gap(*attach, "--policy", hold.url, token=client)
        assert no_secret.returncode == 2 and "missing or wrong run secret" in no_secret.stderr
        _the_client_token_opens_its_run_only(home, ready)
        done = _gap(*attach, "--policy", hold.url, token=client, secret=secret)
        assert done.returncode == 0, done.stdout + done.stderr
        # the first task finished: its place goes to the queued one
        became = _wait(
            lambda: (
                (r := _online(url, "ready", ALICE, "--task-id", queued_id)).returncode == 0 and r
            ),
            "the queued task to start",
        )
        second_ready = json.loads(became.stdout)
        endpoint, second_secret = second_ready["endpoint"], second_ready["run_secret"]
        assert second_secret != secret  # each run its own
        again = _gap(
            *("eval", "--url", endpoint, "--run-id", queued_id, "--policy", hold.url),
            token=second_ready["client_token"],
            secret=second_secret,
        )
        assert again.returncode == 0, again.stdout + again.stderr

    listing = _online(url, "status", ALICE).stdout.splitlines()
    states = {line.split()[0]: line.split()[1] for line in listing}
    assert states[ready["task_id"]] == "finished"
    _wait(
        lambda: "finished" in _online(url, "status", ALICE).stdout.split(queued_id)[1][:12],
        "the second task to finish",
    )
    records = list((home / "online_runs").rglob("result.json"))
    assert len(records) == 2 and all(json.loads(r.read_text())["error"] is None for r in records)


def _the_client_token_opens_its_run_only(home: Path, ready: dict) -> None:
    """The owner's way into the task's server is the client token: its run's status and
    episodes; never `/control` (no run the platform did not give it), nor with the platform
    token; and nothing a refused submission names is written."""
    port = ready["endpoint"].rsplit(":", 1)[1]
    (home / "more.yaml").write_text((home / "smoke.yaml").read_text())
    for token, why in (
        (ready["client_token"], "this token opens run"),
        (ALICE, "missing or wrong token"),
    ):
        extra = _gap(
            "submit", str(home / "more.yaml"), "--run-id", "more", "--port", port, token=token
        )
        assert extra.returncode == 2 and why in extra.stderr + extra.stdout, extra.stderr
    own = ("status", "--url", ready["endpoint"], "--run-id", ready["task_id"])
    watched = _gap(*own, token=ready["client_token"])
    assert watched.returncode == 0 and "waiting for clients" in watched.stdout, watched.stderr
    other = _gap(
        "status", "--url", ready["endpoint"], "--run-id", "more", token=ready["client_token"]
    )
    assert other.returncode == 2 and "this token opens run" in other.stderr
    assert not list((home / "online_runs").rglob("more"))


def test_a_token_sees_only_its_own_tasks_and_never_lands_on_disk(platform):
    home, url = platform
    mine = _submit(url, "m", "60", "--print-endpoint")
    ready = json.loads(mine.stdout)
    task_id, secret, client = ready["task_id"], ready["run_secret"], ready["client_token"]
    # the platform and the task's evaluation server run with no token on their command lines
    for cmdline in Path("/proc").glob("[0-9]*/cmdline"):
        try:
            argv = cmdline.read_bytes().decode(errors="replace")
        except OSError:
            continue  # the process ended
        assert not [t for t in (ALICE, BOB, secret, client) if t in argv], argv
    theirs = _online(url, "ready", BOB, "--task-id", task_id)
    assert theirs.returncode == 2 and "no such task (HTTP 404)" in theirs.stderr
    assert _online(url, "status", BOB).stdout == ""
    wrong = _online(url, "status", "not-a-token")
    assert wrong.returncode == 2 and "missing or wrong bearer token (HTTP 401)" in wrong.stderr
    missing = _gap("online", "status", "--base-url", url)
    assert missing.returncode == 2 and "give the platform token" in missing.stderr
    unknown = _online(url, "submit", ALICE, "--model-name", "m", "--benchmark-set", "nope")
    assert unknown.returncode == 2 and "no benchmark set 'nope' here (it has: libero_smoke)" in (
        unknown.stderr
    )
    time.sleep(1)
    for path in [*(home / "online_runs").rglob("*"), home / "online.log"]:
        if path.is_file():
            text = path.read_text(errors="replace")
            assert ALICE not in text and BOB not in text and secret not in text, path
            assert client not in text, path


def test_bad_platform_inputs_are_one_line_errors(tmp_path):
    (tmp_path / "tokens").write_text("just-one-word\n")
    (tmp_path / "sets.yaml").write_text("s: missing.yaml\n")
    args = ["online", "serve", "--port", str(_free_port()), "--sets", str(tmp_path / "sets.yaml")]
    bad_tokens = _gap(*args, "--tokens", str(tmp_path / "tokens"), timeout=60)
    assert bad_tokens.returncode == 2
    assert "no config at" in bad_tokens.stderr or "TOKEN OWNER" in bad_tokens.stderr
    assert len(bad_tokens.stderr.strip().splitlines()) == 1
    # every limit of the platform is finite: past its bound, one line naming the option
    _config(tmp_path / "smoke.yaml", tasks=(0,))
    (tmp_path / "sets.yaml").write_text("s: smoke.yaml\n")
    (tmp_path / "tokens").write_text(f"{ALICE} alice\n")
    args += ["--tokens", str(tmp_path / "tokens"), "--runs-dir", str(tmp_path / "runs")]
    for option, value in (("--attach-timeout-s", "1e9"), ("--max-queued", "1000000000")):
        over = _gap(*args, option, value, timeout=60)
        assert over.returncode == 2, over.stdout + over.stderr
        (line,) = over.stderr.strip().splitlines()
        assert option in line and "less than or equal to" in line
    over = _gap(*args, "--capacity", "100000", timeout=60)
    assert over.returncode == 2
    assert "--capacity 100000: give a whole number from 1 to" in over.stderr
