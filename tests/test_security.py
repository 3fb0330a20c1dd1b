"""Security checks that stay in the suite.

- No API key, token or Authorization header value reaches any file a session writes (the run
  dir, the policy server logs in it, the manifest, the JUnit XML with every captured output, the
  log file), whether it came on the command line, in the config, or in the environment.
- Policy and evaluation servers bind to loopback unless told otherwise, and say so on one line
  when they are bound to another address.
(tests/test_provenance.py checks the run dir of a session with signed urls and url passwords.)
"""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml

from pytest_gap.bind import outside_address
from tests.fake_session import CONFTEST, TESTS, write_workflow
from tests.test_provenance import RUN_POLICY, SECRET_OPTIONS

CLI_KEY, CLI_BEARER = "sk-cli-0x7a1", "bearer-cli-0x7a2"
CONFIG_KEY, CONFIG_ENV_TOKEN, URL_PASSWORD, URL_TOKEN = (
    "sk-cfg-0x7b1",
    "hf-cfg-0x7b2",
    "pw-cfg-0x7b3",
    "tok-cfg-0x7b4",
)
ENV_KEY, ENV_TOKEN, ENV_BEARER = "sk-env-0x7c1", "hf-env-0x7c2", "bearer-env-0x7c3"
SECRETS = (
    CLI_KEY,
    CLI_BEARER,
    CONFIG_KEY,
    CONFIG_ENV_TOKEN,
    URL_PASSWORD,
    URL_TOKEN,
    ENV_KEY,
    ENV_TOKEN,
    ENV_BEARER,
)


def _session(
    here: Path, name: str, policies: dict, mode_policies: list[str], cli_secrets: bool = True
):
    """`pytest NAME.yaml` in `here` with every secret around it; writes NAME.xml, NAME.log."""
    config = {
        "llm": {"provider": "openai", "api_key": CONFIG_KEY, "model": "m"},
        "policies": policies,
        "benchmark": {
            "backend": "fake_backend:FakeBackend",
            "families": ["fake"],
            "variations": ["easy"],
            "modes": ["policy_only"],
            "policies": mode_policies,
            "task_ids": [0],
            "seeds": [1],
            "num_workers": 1,
            "gate_threshold": 0.0,
            "output_dir": f"runs_{name}",
            "mode_overrides": {"policy_only": {"workflow_dir": str(here / "act")}},
        },
    }
    (here / f"{name}.yaml").write_text(yaml.safe_dump(config))
    args = ["--api-key", CLI_KEY, "--header", f"Authorization: Bearer {CLI_BEARER}"]
    args = args if cli_secrets else []
    args += [f"--junitxml={name}.xml", "-o", "junit_logging=all", "-p", "no:cacheprovider"]
    args += [f"--log-file={name}.log", "--log-file-level=DEBUG"]
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join(p for p in (str(TESTS), os.environ.get("PYTHONPATH")) if p),
        "OPENAI_API_KEY": ENV_KEY,
        "HF_TOKEN": ENV_TOKEN,
        "GAP_EXTRA_HEADERS": f"Authorization: Bearer {ENV_BEARER}",
    }
    return subprocess.run(
        [sys.executable, "-m", "pytest", f"{name}.yaml", *args],
        cwd=here,
        capture_output=True,
        text=True,
        timeout=300,
        env=env,
    )


@pytest.fixture(scope="module")
def sessions(tmp_path_factory):
    """Two pytest sessions on the fake backend with secrets in all three places: an LLM key in
    the config, a key and a bearer header on the command line, keys, a token and a bearer header
    in the environment. `up`: a managed policy server given a token in its env runs the trial;
    `down`: an external server behind a url with a password and a token does not answer (its
    cell errors: the url is in the failure's message). JUnit XML keeps every test's output."""
    here = tmp_path_factory.mktemp("secrets")
    (here / "conftest.py").write_text(CONFTEST.read_text() + SECRET_OPTIONS)
    write_workflow(here / "act", RUN_POLICY)
    managed = {
        "command": ["gap", "policy", "serve", "hold", "--port", "{port}"],
        "env": {"HF_TOKEN": CONFIG_ENV_TOKEN},
        "obs_format": "gap",
    }
    up = _session(here, "up", {"managed": managed}, ["managed"])
    assert up.returncode == 0, up.stdout + up.stderr
    down_url = f"ws://bob:{URL_PASSWORD}@127.0.0.1:9/?token={URL_TOKEN}"
    down = _session(here, "down", {"down": {"url": down_url}}, ["down"])
    assert down.returncode == 1, down.stdout + down.stderr  # the errored cell fails the gate
    return {"dir": here, "out": up.stdout + up.stderr + down.stdout + down.stderr}


def test_no_secret_reaches_any_file_the_sessions_write(sessions):
    here = sessions["dir"]
    files = [p for p in here.rglob("*") if p.is_file() and p.suffix != ".yaml"]
    files = [p for p in files if p.name != "conftest.py" and "act" not in p.parts]
    names = {p.name for p in files}
    assert {"run_manifest.json", "summary.json", "result.json", "policy_managed.log"} <= names
    assert {"up.xml", "up.log", "down.xml", "down.log"} <= names
    assert "infrastructure failure" in (here / "down.xml").read_text()  # the url's message
    leaks = [(s, str(p)) for p in files for s in SECRETS if s.encode() in p.read_bytes()]
    assert leaks == []
    # ... nor the terminal
    assert [s for s in SECRETS if s in sessions["out"]] == []
    # and they were there to be leaked: the configs carried their own
    config = (here / "up.yaml").read_text() + (here / "down.yaml").read_text()
    assert all(s in config for s in (CONFIG_KEY, CONFIG_ENV_TOKEN, URL_PASSWORD, URL_TOKEN))


# -- where servers listen --------------------------------------------------------------------------
def _listening(port: int, host: str) -> bool:
    try:
        with socket.create_connection((host, port), timeout=1):
            return True
    except OSError:
        return False


def test_servers_bind_to_loopback_by_default():
    from pytest_gap.cli import build_parser
    from pytest_gap.policies.builtin import load_policy
    from pytest_gap.policies.client import connect_policy
    from pytest_gap.policies.server import PolicyServer

    parser = build_parser()
    assert parser.parse_args(["serve"]).host == "127.0.0.1"
    assert parser.parse_args(["policy", "serve", "hold", "--port", "1"]).host == "127.0.0.1"
    online = ["online", "serve", "--sets", "s.yaml", "--tokens", "t"]
    assert parser.parse_args(online).host == "127.0.0.1"
    server = PolicyServer(load_policy("hold")).start()
    try:
        assert server.server.host == "127.0.0.1"
        outside = outside_address()
        # up on loopback (a whole handshake: a bare TCP connect leaves a handler behind)
        connect_policy(server.url, "openpi", connect_timeout_s=5, timeout_s=5).close()
        if outside is not None:  # not reachable from another interface
            assert not _listening(server.port, outside)
    finally:
        server.stop()


def test_managed_policy_servers_listen_on_loopback_only(tmp_path):
    from pytest_gap.config import PolicyEntry
    from pytest_gap.servers.manager import PolicyManager

    manager = PolicyManager(log_dir=tmp_path)
    entry = PolicyEntry(command=["gap", "policy", "serve", "hold", "--port", "{port}"])
    urls = manager.start_all({"hold": entry})
    try:
        port = int(urls["hold"].rsplit(":", 1)[1])
        assert urls["hold"].startswith("ws://127.0.0.1:")
        outside = outside_address()
        if outside is not None:
            assert not _listening(port, outside)
    finally:
        manager.stop_all()


@pytest.mark.parametrize(
    "argv",
    [
        ["policy", "serve", "hold", "--host", "0.0.0.0"],
        ["policy", "serve", "hold", "--protocol", "vla-eval", "--host", "0.0.0.0"],
        ["serve", "--host", "0.0.0.0", "--runs-dir", "runs"],
        ["online", "serve", "--host", "0.0.0.0", "--sets", "sets.yaml", "--tokens", "tokens"],
    ],
    ids=["gap policy serve", "gap policy serve vla-eval", "gap serve", "gap online serve"],
)
def test_a_server_bound_beyond_loopback_says_so_in_one_line(argv, tmp_path):
    from pytest_gap.servers.manager import free_port

    (tmp_path / "bench.yaml").write_text("benchmark: {}\n")
    (tmp_path / "sets.yaml").write_text("smoke: bench.yaml\n")
    (tmp_path / "tokens").write_text("t0k3n alice\n")
    port = free_port()
    command = [str(Path(sys.executable).with_name("gap")), *argv, "--port", str(port)]
    process = subprocess.Popen(
        command, cwd=tmp_path, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True
    )
    try:
        deadline = time.monotonic() + 60
        while not _listening(port, "127.0.0.1") and process.poll() is None:
            assert time.monotonic() < deadline, "the server did not come up"
            time.sleep(0.1)
    finally:
        process.terminate()
        output = process.communicate(timeout=30)[0]
    notices = [line for line in output.splitlines() if "not only loopback" in line]
    assert len(notices) == 1, output
    assert "0.0.0.0 (every interface)" in notices[0] and "--host 127.0.0.1" in notices[0]
    assert "Traceback" not in output


def test_a_server_on_loopback_says_nothing_of_it():
    from pytest_gap.bind import exposure_notice

    assert exposure_notice("x", "127.0.0.1") is None and exposure_notice("x", "::1") is None
    assert exposure_notice("x", "localhost") is None
    assert "10.1.2.3 (an outside address)" in exposure_notice("x", "10.1.2.3")


@pytest.mark.skipif(outside_address() is None, reason="no address beyond loopback here")
def test_a_managed_server_bound_beyond_loopback_is_named_in_one_line(tmp_path):
    """The harness cannot choose where a managed command binds (openpi's serve_policy.py binds
    0.0.0.0): the session finds out by knocking on the outside address, and says so."""
    (tmp_path / "conftest.py").write_text(CONFTEST.read_text())
    write_workflow(tmp_path / "act", RUN_POLICY)
    serve = ["gap", "policy", "serve", "hold", "--port", "{port}"]
    policies = {
        "wide": {"command": [*serve, "--host", "0.0.0.0"], "obs_format": "gap"},
        "local": {"command": serve, "obs_format": "gap"},
    }
    done = _session(tmp_path, "bind", policies, ["wide", "local"], cli_secrets=False)
    out = done.stdout + done.stderr
    assert done.returncode == 0, out
    notices = [line for line in out.splitlines() if "listens beyond loopback" in line]
    assert len(notices) == 1, out
    assert notices[0].startswith("gap: policies.wide: the managed server listens beyond")
