"""Issue 33, doors: crafted requests against real servers on loopback.

- `gap serve` with no token makes one: a 0600 file in a 0700 directory of the user's, its path
  printed; local `gap submit/status/eval` find it; a request without it, with a wrong one or
  with a non-ASCII one is refused; `--no-token` is an explicit opt-out that warns.
- Every websocket server (gap serve, gap policy serve in both protocols, the relay a trial of
  gap serve talks to) refuses a browser's request (Origin, Sec-Fetch-Site) and serves a client
  without one; the relay refuses a connection without its url token (what another local user,
  who can find its port, would try).
- Attaching to a run needs that run's secret: another run's is refused, and nothing of the run
  changes.
- A managed policy server sees the allow-listed environment and its entry's `env:`, never the
  operator's API keys; GAP_TOKEN leaves the environment once read.
Secrets live in the test's own state directory (XDG_STATE_HOME).
"""

from __future__ import annotations

import json
import os
import re
import socket
import stat
import subprocess
import sys
import textwrap
import time
import urllib.error
import urllib.request
from pathlib import Path

import pytest
import yaml
from websockets.exceptions import InvalidStatus
from websockets.sync.client import connect

from pytest_gap.doors import run_secret_path, server_token_path
from pytest_gap.policies.builtin import HoldPolicy
from pytest_gap.policies.client import connect_policy
from pytest_gap.policies.wire import packb, unpackb
from pytest_gap.service.client import EvalClient, local_token, stored_run_secret
from tests.service_configs import remote_policy_config

GAP = [sys.executable, "-m", "pytest_gap.cli"]
TIMEOUT = 240
EVIL = "https://evil.example"
API_KEYS = {
    "OPENAI_API_KEY": "sk-door-0x1",
    "OPENROUTER_API_KEY": "sk-or-door-0x2",
    "AWS_SECRET_ACCESS_KEY": "aws-door-0x3",
    "GAP_TOKEN": "gap-token-door-0x4",
    "GAP_EXTRA_HEADERS": "Authorization: Bearer door-0x5",
}


pytestmark = pytest.mark.usefixtures("own_state")


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _wait(predicate, what: str, timeout: float = 60):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(0.2)
    raise AssertionError(f"timed out waiting for {what}")


def _answers(url: str) -> bool:
    try:
        urllib.request.urlopen(url, timeout=1)
    except urllib.error.HTTPError:
        return True  # it answers, if not with 200
    except OSError:
        return False
    return True


class Process:
    """A `gap ...` server process, its output in a file."""

    def __init__(self, home: Path, name: str, *args: str, env: dict | None = None):
        self.out = home / f"{name}.log"
        with self.out.open("w") as log:
            self.process = subprocess.Popen(
                [*GAP, *args], stdout=log, stderr=subprocess.STDOUT, cwd=home, env=env
            )

    def output(self) -> str:
        return self.out.read_text()

    def stop(self) -> str:
        if self.process.poll() is None:
            self.process.terminate()
            self.process.wait(timeout=30)
        return self.output()


@pytest.fixture
def procs():
    started: list[Process] = []
    yield started
    for proc in started:
        if proc.process.poll() is None:
            proc.process.kill()
            proc.process.wait(timeout=30)


def _serve(home: Path, procs: list, *extra: str) -> tuple[Process, int]:
    """`gap serve` on a free port in `home`, up (and its token written, unless given one)."""
    port = _free_port()
    args = ("serve", "--port", str(port), "--runs-dir", str(home / "runs"), *extra)
    procs.append(Process(home, f"serve_{port}", *args))
    _wait(lambda: _answers(f"http://127.0.0.1:{port}/healthz"), "gap serve")
    if "--no-token" not in extra:
        _wait(lambda: server_token_path(port).is_file(), "the token file")
    return procs[-1], port


def _config(path: Path, steps: int = 20) -> Path:
    path.write_text(yaml.safe_dump(remote_policy_config(max_steps=steps)))
    return path


def _gap(home: Path, *args: str, env: dict | None = None) -> subprocess.CompletedProcess:
    return subprocess.run(
        [*GAP, *args], capture_output=True, text=True, timeout=TIMEOUT, cwd=home, env=env
    )


def _get(url: str, headers: dict | None = None) -> tuple[int, str]:
    request = urllib.request.Request(url, headers=headers or {})
    try:
        with urllib.request.urlopen(request, timeout=30) as answer:
            return answer.status, answer.read().decode()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read().decode()


def _raw_get(port: int, path: str, header: bytes) -> bytes:
    """One HTTP request with a header of raw bytes (a non-ASCII token urllib would refuse)."""
    with socket.create_connection(("127.0.0.1", port), timeout=30) as sock:
        sock.sendall(b"GET " + path.encode() + b" HTTP/1.1\r\nHost: 127.0.0.1\r\n" + header)
        sock.sendall(b"\r\nConnection: close\r\n\r\n")
        chunks = []
        while chunk := sock.recv(65536):
            chunks.append(chunk)
    return b"".join(chunks)


def _refused_handshake(url: str, **kwargs) -> int:
    """The HTTP status a websocket handshake to `url` is refused with (0: accepted)."""
    try:
        with connect(url, open_timeout=10, **kwargs):
            return 0
    except InvalidStatus as exc:
        return exc.response.status_code


# -- the token -----------------------------------------------------------------------------------
def test_gap_serve_makes_a_private_token_file_that_local_clients_find(tmp_path, procs):
    server, port = _serve(tmp_path, procs)
    path = server_token_path(port)
    assert f"token in {path}" in server.output()
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    assert stat.S_IMODE(path.parent.stat().st_mode) == 0o700
    token = path.read_text().strip()
    assert len(token) >= 32
    url = f"http://127.0.0.1:{port}"
    config = _config(tmp_path / "run.yaml")

    # without the token, with a wrong one, with a non-ASCII one: refused, nothing made
    assert _get(f"{url}/runs/r")[0] == 401
    assert _get(f"{url}/runs/r", {"Authorization": "Bearer wrong"})[0] == 401
    assert _get(f"{url}/runs/r", {"Authorization": f"Bearer {token[:-1]}"})[0] == 401
    assert b" 401 " in _raw_get(port, "/runs/r", b"Authorization: Bearer \xff\xfe" + b"a" * 40)
    (tmp_path / "bad").write_text("wrong\n")
    submit = ("submit", str(config), "--run-id", "r", "--port", str(port))
    bad = _gap(tmp_path, *submit, "--token-file", str(tmp_path / "bad"))
    assert bad.returncode == 2 and "missing or wrong token" in bad.stderr
    assert len(bad.stderr.strip().splitlines()) == 1
    assert not (tmp_path / "runs" / "r").exists()

    # local clients with no flag: the token file; the run secret kept 0600 beside it
    done = _gap(tmp_path, *submit)
    assert done.returncode == 0, done.stderr
    kept = run_secret_path("127.0.0.1", port, "r")
    assert f"run secret in {kept}" in done.stdout
    assert stat.S_IMODE(kept.stat().st_mode) == 0o600
    status = _gap(tmp_path, "status", "--url", f"http://localhost:{port}", "--run-id", "r")
    assert status.returncode == 0 and status.stdout.startswith("run r: waiting for clients")
    # the run dir keeps the secret's digest, never the secret or the token
    secret = kept.read_text().strip()
    for file in (tmp_path / "runs").rglob("*"):
        if file.is_file():
            text = file.read_text(errors="replace")
            assert secret not in text and token not in text, file
    # a token file is for this machine's server only: never sent to another host
    assert local_token(f"http://localhost:{port}") == token
    assert local_token(f"http://10.1.2.3:{port}") is None

    server.stop()
    assert not path.exists()  # a stopped server's token opens nothing


def test_no_token_is_an_explicit_opt_out_that_warns(tmp_path, procs):
    server, port = _serve(tmp_path, procs, "--no-token")
    assert not server_token_path(port).exists()
    assert _get(f"http://127.0.0.1:{port}/runs/r")[0] == 404  # open: no token asked
    warnings = [line for line in server.output().splitlines() if "--no-token" in line]
    assert len(warnings) == 1 and f"anyone who can reach port {port}" in warnings[0]
    both = _gap(
        tmp_path,
        *("serve", "--no-token", "--port", str(_free_port())),
        env={**os.environ, "GAP_TOKEN": "t0k3n"},
    )
    assert both.returncode == 2 and both.stderr.startswith("gap: error: --no-token: drop")


def test_gap_token_leaves_the_environment_once_read(tmp_path, procs, monkeypatch, capsys):
    from pytest_gap.cli import main

    _, port = _serve(tmp_path, procs)
    _config(tmp_path / "run.yaml")
    token = server_token_path(port).read_text().strip()
    monkeypatch.setenv("GAP_TOKEN", token)
    monkeypatch.setenv("XDG_STATE_HOME", str(tmp_path / "elsewhere"))  # no token file to find
    assert main(["submit", str(tmp_path / "run.yaml"), "--run-id", "e", "--port", str(port)]) == 0
    assert "GAP_TOKEN" not in os.environ  # the token worked, and nothing started now gets it
    assert "run e: 1 trials scheduled" in capsys.readouterr().out


# -- browsers --------------------------------------------------------------------------------------
def _policy_serve(home: Path, procs: list, protocol: str) -> int:
    port = _free_port()
    args = ("policy", "serve", "hold", "--port", str(port), "--protocol", protocol)
    procs.append(Process(home, f"policy_{protocol}", *args))
    health = "/health" if protocol == "vla-eval" else "/healthz"
    _wait(lambda: _answers(f"http://127.0.0.1:{port}{health}"), "gap policy serve")
    return port


@pytest.mark.parametrize("protocol", ["openpi", "vla-eval"])
def test_gap_policy_serve_refuses_a_browser_and_serves_a_client(tmp_path, procs, protocol):
    port = _policy_serve(tmp_path, procs, protocol)
    url = f"ws://127.0.0.1:{port}"
    assert _refused_handshake(url, origin=EVIL) == 403
    assert _refused_handshake(url, additional_headers={"Sec-Fetch-Site": "cross-site"}) == 403
    client = connect_policy(url, protocol, connect_timeout_s=10, timeout_s=10)  # no Origin
    try:
        assert client.metadata
    finally:
        client.close()
    if protocol == "vla-eval":  # its GET /config changes the server: a page must not reach it
        code, body = _get(f"http://127.0.0.1:{port}/config?max_batch_size=7", {"Origin": EVIL})
        assert code == 403 and "refused a browser's request (Origin: https://evil.example)" in body
        sent = {"Sec-Fetch-Site": "cross-site"}
        assert _get(f"http://127.0.0.1:{port}/config?max_batch_size=7", sent)[0] == 403
        code, body = _get(f"http://127.0.0.1:{port}/config")
        assert code == 200 and json.loads(body)["config"]["max_batch_size"] == 1


def _listening_ports(pid: int) -> set[int]:
    """The TCP ports process `pid` listens on (its socket inodes in /proc/net/tcp)."""
    inodes = set()
    for fd in Path(f"/proc/{pid}/fd").iterdir():
        try:
            target = os.readlink(fd)
        except OSError:
            continue
        if target.startswith("socket:["):
            inodes.add(target[len("socket:[") : -1])
    ports = set()
    for line in Path("/proc/net/tcp").read_text().splitlines()[1:]:
        fields = line.split()
        if fields[3] == "0A" and fields[9] in inodes:  # LISTEN
            ports.add(int(fields[1].rsplit(":", 1)[1], 16))
    return ports


def test_gap_serve_and_its_relay_refuse_a_browser_and_a_stranger(tmp_path, procs):
    server, port = _serve(tmp_path, procs)
    url = f"http://127.0.0.1:{port}"
    token = server_token_path(port).read_text().strip()
    auth = {"Authorization": f"Bearer {token}"}
    ws = f"ws://127.0.0.1:{port}"
    for path in ("/episodes", "/control"):  # even with the token: a page could hold it
        assert _refused_handshake(ws + path, origin=EVIL, additional_headers=auth) == 403
    assert _get(f"{url}/runs/r", {**auth, "Sec-Fetch-Site": "same-origin"})[0] == 403
    assert _get(f"{url}/healthz", {"Origin": EVIL})[0] == 403
    submit = ("submit", str(_config(tmp_path / "run.yaml")), "--run-id", "r")
    assert _gap(tmp_path, *submit, "--port", str(port)).returncode == 0

    seen: dict = {}
    hold = HoldPolicy()

    def act(obs: dict) -> dict:
        if not seen:  # mid-episode: the trial waits on this answer, its relay is up
            (relay,) = _listening_ports(server.process.pid) - {port}
            relay_url = f"ws://127.0.0.1:{relay}"
            seen["stranger"] = _refused_handshake(relay_url)  # another local user's try
            seen["guess"] = _refused_handshake(relay_url + "/?token=guess")
            seen["browser"] = _refused_handshake(relay_url, origin=EVIL)
        seen["answered"] = seen.get("answered", 0) + 1
        return hold.infer(obs)

    client = EvalClient(url, "r", 0, token=token, run_secret=stored_run_secret(url, "r"))
    finished = client.run(act)
    assert (seen["stranger"], seen["guess"], seen["browser"]) == (403, 403, 403)
    assert finished["saved"] == finished["expected"] == 1  # the honest episode went on
    (record,) = (tmp_path / "runs" / "r").rglob("result.json")
    result = json.loads(record.read_text())
    assert result["error"] is None and result["steps"] == 20
    # the relay's token is nowhere on disk: records mask a url's token=
    assert "/?token=***" in record.read_text()  # the relay's url, recorded masked
    leaks = re.compile(r"token=(?!\*\*\*)[A-Za-z0-9_-]{16,}")
    for file in [*(tmp_path / "runs").rglob("*"), server.out]:
        if file.is_file():
            assert not leaks.search(file.read_text(errors="replace")), file


# -- run secrets ---------------------------------------------------------------------------------
def test_another_runs_secret_cannot_attach_and_leaves_the_run_untouched(tmp_path, procs):
    _, port = _serve(tmp_path, procs)
    url = f"http://127.0.0.1:{port}"
    token = server_token_path(port).read_text().strip()
    for run_id in ("mine", "theirs"):
        submit = ("submit", str(_config(tmp_path / "run.yaml")), "--run-id", run_id)
        done = _gap(tmp_path, *submit, "--port", str(port))
        assert done.returncode == 0, done.stderr
    mine, theirs = (stored_run_secret(url, r) for r in ("mine", "theirs"))
    assert mine and theirs and mine != theirs
    card = (tmp_path / "runs/mine/service.json").read_text()

    auth = {"additional_headers": {"Authorization": f"Bearer {token}"}}
    for given in (theirs, "", mine[:-1], mine + "x", "é" * 40):
        with connect(f"ws://127.0.0.1:{port}/episodes", **auth) as ws:
            ws.send(packb({"run_id": "mine", "worker_id": 0, "run_secret": given}))
            answer = unpackb(ws.recv())
        assert answer == {
            "type": "error",
            "error": "run mine: missing or wrong run secret; give the one `gap submit` returned "
            "(gap eval reads it from where gap submit wrote it, --run-secret-file or "
            "GAP_RUN_SECRET)",
        }
    status = json.loads(_get(f"{url}/runs/mine", {"Authorization": f"Bearer {token}"})[1])
    assert status["workers"] == [] and status["in_progress"] == 0 and status["saved"] == 0
    assert not list((tmp_path / "runs/mine").rglob("result.json"))  # no episode ran
    assert (tmp_path / "runs/mine/service.json").read_text() == card
    # theirs, by file: refused the same way
    (tmp_path / "theirs.secret").write_text(theirs + "\n")
    attach = ("eval", "--url", url, "--run-id", "mine")
    wrong = _gap(
        tmp_path, *attach, "--fake-actions", "--run-secret-file", str(tmp_path / "theirs.secret")
    )
    assert wrong.returncode == 2 and "run mine: missing or wrong run secret" in wrong.stderr
    assert not (tmp_path / "runs/mine/smoke").exists()

    # the honest client: gap eval with no flag finds the token and the run secret
    with_hold = _policy_serve(tmp_path, procs, "openpi")
    honest = _gap(tmp_path, *attach, "--policy", f"ws://127.0.0.1:{with_hold}")
    assert honest.returncode == 0, honest.stdout + honest.stderr
    assert "run mine finished, 1/1 episodes saved" in honest.stdout
    assert not list((tmp_path / "runs/theirs").rglob("result.json"))  # theirs untouched


# -- children ------------------------------------------------------------------------------------
DUMP_ENV = textwrap.dedent(
    """
    import json, os, socket, sys, time
    json.dump(dict(os.environ), open(sys.argv[1], "w"))
    server = socket.socket()
    server.bind(("127.0.0.1", int(sys.argv[2])))
    server.listen()
    time.sleep(60)
    """
)


def _dumper(out: Path, port: str = "{port}") -> list[str]:
    return [sys.executable, "-c", DUMP_ENV, str(out), port]


# An operator's shell: a proxy login in every spelling programs read, settings of their own
# under the harness's prefix and a desktop session's, beside what a child does need.
PROXIES = {
    "https_proxy": "http://door-user:door-pass-0x7@proxy.example:3128",
    "HTTPS_PROXY": "http://door-user:door-pass-0x7@proxy.example:3128/",
    "http_proxy": "door-user:door-pass-0x7@proxy.example:3128",  # no scheme: curl takes it
    "ALL_PROXY": "socks5h://door-user:door%2Fpass-0x7@proxy.example:1080",
    "ftp_proxy": "http://door-user:door/pass#0x7@proxy.example:21",  # unencoded / and #
}
NOT_FOR_CHILDREN = {
    "GAP_DB_URL": "postgresql://ops:db-pass-0x8@db.internal/gap",
    "GAP_NOTES": "door-notes-0x9",
    "XDG_SESSION_COOKIE": "door-cookie-0xa",
}
SECRETS_SEEN_NOWHERE = ("door-pass-0x7", "door%2Fpass-0x7", "door-user", "0x8", "0x9", "0xa")


def _check_child_env(seen: dict) -> None:
    assert [k for k in API_KEYS if k in seen] == []
    assert not [v for v in API_KEYS.values() if v in json.dumps(seen)]
    assert seen["PATH"] == os.environ["PATH"]
    assert seen["GAP_ENV_POOL_SIZE"] == "1"  # the harness's own settings do pass, by name
    assert seen["XDG_CACHE_HOME"] == os.environ["XDG_CACHE_HOME"]
    assert seen["MY_SETTING"] == "from-entry" and seen["HF_TOKEN"] == "hf-entry"  # its env:
    _check_no_operator_setting(seen)


def _check_no_operator_setting(seen: dict) -> None:
    """The proxies pass with their host and without their login; the operator's own `GAP_*`
    and `XDG_*` names do not pass at all."""
    assert [k for k in NOT_FOR_CHILDREN if k in seen] == []
    assert {k: seen.get(k) for k in PROXIES} == {
        "https_proxy": "http://proxy.example:3128",
        "HTTPS_PROXY": "http://proxy.example:3128/",
        "http_proxy": "proxy.example:3128",
        "ALL_PROXY": "socks5h://proxy.example:1080",
        "ftp_proxy": "http://proxy.example:21",
    }
    assert not [x for x in SECRETS_SEEN_NOWHERE if x in json.dumps(seen)]


@pytest.fixture
def operator_env(monkeypatch, tmp_path):
    for name, value in {**API_KEYS, **PROXIES, **NOT_FOR_CHILDREN}.items():
        monkeypatch.setenv(name, value)
    monkeypatch.setenv("GAP_ENV_POOL_SIZE", "1")
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))


def test_a_managed_policy_server_sees_no_operator_key(tmp_path, operator_env):
    from pytest_gap.config import PolicyEntry
    from pytest_gap.servers.manager import PolicyManager

    out = tmp_path / "env.json"
    env = {"MY_SETTING": "from-entry", "HF_TOKEN": "hf-entry"}
    manager = PolicyManager(log_dir=tmp_path)
    try:
        manager.start_all({"dump": PolicyEntry(command=_dumper(out), env=env)})
        _wait(lambda: out.is_file() and out.stat().st_size, "the env dump")
    finally:
        manager.stop_all()
    _check_child_env(json.loads(out.read_text()))


def test_gap_policy_serve_config_gives_its_command_the_same_environment(tmp_path, operator_env):
    out, port = tmp_path / "env.json", _free_port()
    entry = {"command": _dumper(out), "env": {"MY_SETTING": "from-entry", "HF_TOKEN": "hf-entry"}}
    config = yaml.safe_load(_config(tmp_path / "bench.yaml").read_text())
    config["policies"]["dump"] = entry
    (tmp_path / "bench.yaml").write_text(yaml.safe_dump(config))
    process = subprocess.Popen(
        [*GAP, "policy", "serve", "dump", "--config", "bench.yaml", "--port", str(port)],
        cwd=tmp_path,
        stdout=subprocess.DEVNULL,
    )
    try:
        _wait(lambda: (out.is_file() and out.stat().st_size) or process.poll(), "the env dump")
    finally:
        process.kill()
        process.wait(timeout=30)
    _check_child_env(json.loads(out.read_text()))


# -- the platform ---------------------------------------------------------------------------------
def test_a_non_ascii_platform_token_is_a_401_and_task_servers_get_no_operator_setting(
    tmp_path, procs, operator_env
):
    """The platform answers a token that decodes to non-ASCII text 401 and serves on; the task
    server it starts sees no proxy login and none of the operator's own `GAP_*` / `XDG_*`
    names (a GAP_DB_URL once reached it)."""
    (tmp_path / "tokens").write_text("t0k3n-alice-0123456789 alice\n")
    _config(tmp_path / "smoke.yaml")
    (tmp_path / "sets.yaml").write_text("smoke: smoke.yaml\n")
    port = _free_port()
    args = ("online", "serve", "--port", str(port), "--sets", "sets.yaml", "--tokens", "tokens")
    procs.append(Process(tmp_path, "online", *args))
    _wait(lambda: _answers(f"http://127.0.0.1:{port}/tasks"), "gap online serve")
    answer = _raw_get(port, "/tasks", b"Authorization: Bearer \xff\xfe-not-ascii")
    assert answer.startswith(b"HTTP/1.0 401") and b"missing or wrong bearer token" in answer
    url, auth = f"http://127.0.0.1:{port}", {"Authorization": "Bearer t0k3n-alice-0123456789"}
    code, body = _get(f"{url}/tasks", auth)
    assert code == 200 and json.loads(body) == []

    body = json.dumps({"model_name": "m", "benchmark_set": "smoke"}).encode()
    request = urllib.request.Request(
        f"{url}/tasks", data=body, headers={**auth, "Content-Type": "application/json"}
    )
    task = json.loads(urllib.request.urlopen(request, timeout=30).read())
    ready = _wait(
        lambda: (
            (t := json.loads(_get(f"{url}/tasks/{task['task_id']}", auth)[1]))["endpoint"] and t
        ),
        "the task server",
    )
    task_port = int(ready["endpoint"].rsplit(":", 1)[1])
    (pid,) = _children_listening(procs[-1].process.pid, task_port)
    environ = Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
    seen = dict(x.decode().split("=", 1) for x in environ if b"=" in x)
    _check_no_operator_setting(seen)
    assert seen["GAP_ENV_POOL_SIZE"] == "1"  # what it needs passes, by name
    assert "Traceback" not in procs[-1].stop()  # SIGTERM: its task server goes with it
    _wait(lambda: not Path(f"/proc/{pid}").exists(), "the task server to stop", 30)


def _children_listening(parent: int, port: int) -> list[int]:
    """The pids of `parent`'s child processes that listen on `port`."""
    found = []
    for stat_file in Path("/proc").glob("[0-9]*/stat"):
        try:
            ppid = int(stat_file.read_text().rsplit(")", 1)[1].split()[1])
            pid = int(stat_file.parent.name)
            if ppid == parent and port in _listening_ports(pid):
                found.append(pid)
        except (OSError, ValueError, IndexError):
            continue
    return found


def test_ray_actors_inherit_no_secret_of_the_harness():
    """The Ray runtime env carries the harness's settings to every node: none of its secrets
    go with them, nor an operator's own `GAP_*` name."""
    from pytest_gap.scale.ray_cluster import forwarded_env

    environ = {
        **API_KEYS,
        "GAP_RUN_SECRET": "rs-door-0x6",
        "GAP_ENV_POOL_SIZE": "1",
        "GAP_DB_URL": "postgres://ops:pw@db/prod",
    }
    assert forwarded_env({**environ, "PYTHONPATH": "/x"}) == {
        "GAP_ENV_POOL_SIZE": "1",
        "PYTHONPATH": "/x",
    }
