"""Managed policy servers: start on a free port, wait, stop (even when the harness dies),
fail together; preflight of external servers; presets that say what is missing."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from pytest_gap.config import PolicyEntry, PolicyManagerConfig
from pytest_gap.policies.client import PolicyClient
from pytest_gap.servers.manager import (
    OPENPI_DIR_VAR,
    PolicyConfigError,
    PolicyManager,
    PolicyStartError,
    PolicyUnreachable,
    command_for,
    free_port,
    port_open,
    preflight,
)

GAP = shutil.which("gap", path=str(Path(sys.executable).parent)) or "gap"
SERVE_HOLD = PolicyEntry(command=[GAP, "policy", "serve", "hold", "--port", "{port}"])


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


def test_managed_servers_start_answer_and_stop(tmp_path):
    manager = PolicyManager(log_dir=tmp_path)
    urls = manager.start_all({"hold": SERVE_HOLD, "external": PolicyEntry(url="ws://h:1")})
    assert list(urls) == ["hold"]  # url: entries are never started
    server = manager.servers["hold"]
    with PolicyClient(urls["hold"]) as client:
        assert client.metadata == {"policy": "hold"}
        assert client.infer({"state": [0.0]})["actions"].shape == (10, 7)
    manager.stop_all()
    assert server.process.poll() is not None and not port_open(server.port)
    assert "serving hold" in (tmp_path / "policy_hold.log").read_text()


def test_gap_commands_start_without_the_venv_on_path(tmp_path, monkeypatch):
    """A new user runs `.venv/bin/python -m pytest`: the venv's bin/ (and `gap`) is not on PATH."""
    monkeypatch.setenv("PATH", "/usr/bin:/bin")
    assert shutil.which("gap") is None
    manager = PolicyManager(log_dir=tmp_path)
    entry = PolicyEntry(command="gap policy serve hold --port {port}")
    try:
        urls = manager.start_all({"hold": entry})
        with PolicyClient(urls["hold"]) as client:
            assert client.metadata == {"policy": "hold"}
    finally:
        manager.stop_all()


def test_a_program_that_is_not_there_is_a_config_error_and_starts_nothing(tmp_path):
    manager = PolicyManager(log_dir=tmp_path)
    entries = {
        "hold": SERVE_HOLD,
        "typo": PolicyEntry(command=["serve-polcy", "--port", "{port}"]),
    }
    with pytest.raises(PolicyConfigError, match=r"policies\.typo: the program 'serve-polcy' is "):
        manager.start_all(entries)
    assert manager.servers == {} and not (tmp_path / "policy_hold.log").exists()
    with pytest.raises(PolicyConfigError, match=r"'\./serve\.sh' does not exist"):
        manager.start_all({"rel": PolicyEntry(command="./serve.sh {port}")})


def test_one_failing_server_stops_the_others(tmp_path):
    manager = PolicyManager(PolicyManagerConfig(startup_timeout_s=20), log_dir=tmp_path)
    entries = {
        "hold": SERVE_HOLD,
        "broken": PolicyEntry(command=[sys.executable, "-c", "import sys; sys.exit(3)"]),
    }
    with pytest.raises(PolicyStartError, match=r"broken: the server exited with status 3"):
        manager.start_all(entries)
    assert manager.servers == {}


def test_a_server_that_never_listens_times_out_and_is_killed():
    manager = PolicyManager(PolicyManagerConfig(startup_timeout_s=1, evict_grace_s=1))
    sleeper = PolicyEntry(
        command=[
            sys.executable,
            "-c",
            "import signal,time; signal.signal(15, signal.SIG_IGN); time.sleep(60)",
        ]
    )
    t0 = time.monotonic()
    with pytest.raises(PolicyStartError, match=r"not listening on port \d+ after 1 s"):
        manager.start_all({"sleepy": sleeper})
    assert time.monotonic() - t0 < 15  # SIGTERM ignored: SIGKILL after the grace


def test_a_killed_harness_takes_its_servers_with_it(tmp_path):
    script = (
        "import sys, time\n"
        "from pytest_gap.config import PolicyEntry\n"
        "from pytest_gap.servers.manager import PolicyManager\n"
        f"m = PolicyManager()\n"
        f"m.start_all({{'hold': PolicyEntry(command={SERVE_HOLD.command!r})}})\n"
        "print(m.servers['hold'].process.pid, flush=True)\n"
        "time.sleep(60)\n"
    )
    harness = subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE, text=True)
    child = int(harness.stdout.readline())
    assert _alive(child)
    harness.send_signal(signal.SIGKILL)
    harness.wait()
    harness.stdout.close()
    deadline = time.monotonic() + 10
    while _alive(child) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not _alive(child)


def test_preflight_names_the_unreachable_policy():
    manager = PolicyManager()
    urls = manager.start_all({"hold": SERVE_HOLD})
    try:
        live = {pid: (url, "openpi", {}) for pid, url in urls.items()}
        preflight(live)  # a live server passes
        dead = f"ws://127.0.0.1:{free_port()}"
        with pytest.raises(PolicyUnreachable, match=r"preflight: policy pi05 at ws://127\.0\.0\.1"):
            preflight({**live, "pi05": (dead, "openpi", {})}, timeout_s=2)
    finally:
        manager.stop_all()


def test_presets_say_exactly_what_is_missing(monkeypatch, tmp_path):
    monkeypatch.delenv(OPENPI_DIR_VAR, raising=False)
    with pytest.raises(PolicyStartError, match="set GAP_OPENPI_DIR to an openpi checkout"):
        command_for("pi05", PolicyEntry(preset="pi05-libero"), 9000)
    monkeypatch.setenv(OPENPI_DIR_VAR, str(tmp_path))
    with pytest.raises(PolicyStartError, match=r"has no scripts/serve_policy\.py"):
        command_for("pi05", PolicyEntry(preset="pi05-libero"), 9000)
    (tmp_path / "scripts").mkdir()
    (tmp_path / "scripts/serve_policy.py").write_text("")
    argv, cwd = command_for("pi05", PolicyEntry(preset="pi05-libero"), 9000)
    assert cwd == tmp_path and argv[:4] == ["uv", "run", "scripts/serve_policy.py", "--port"]
    assert argv[4] == "9000" and "--policy.config=pi05_libero" in argv
    with pytest.raises(PolicyStartError, match="unknown preset 'pi0'"):
        command_for("x", PolicyEntry(preset="pi0"), 1)
    argv, _ = command_for("mine", PolicyEntry(command="serve --port={port} --x 'a b'"), 7)
    assert argv == ["serve", "--port=7", "--x", "a b"]
