"""Credentials for real policy servers (policies/credentials.py): a registry entry names the
environment variables holding a key or header values, a session sends them on every connection
of either protocol (preflight, warm-up, trials), and no record of the run holds a value.

The server here is the harness's own `PolicyServer` (hold) behind a door that wants the
headers, as a hosted openpi server behind an API gateway does: a test double only in what it
checks, run on loopback."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from http import HTTPStatus
from pathlib import Path

import pytest
import yaml

from pytest_gap.config import ConfigError, load_config
from pytest_gap.config.policies import PolicyEntry
from pytest_gap.policies.builtin import HoldPolicy
from pytest_gap.policies.client import PolicyTransportError, connect_policy
from pytest_gap.policies.server import PolicyServer

pytest_plugins = ["pytester"]

GAP = shutil.which("gap", path=str(Path(sys.executable).parent)) or "gap"

KEY = "sk-test-0123456789abcdef"
ORG = "org-42-secret-value"


class GatedServer(PolicyServer):
    """Answers only a handshake that carries `Authorization: Api-Key KEY` and `X-Org: ORG`
    (401 otherwise), and remembers every handshake's headers."""

    def __init__(self, **kwargs):
        super().__init__(HoldPolicy(), **kwargs)
        self.seen: list[dict[str, str]] = []

    def _http(self, connection, request):
        headers = {k.lower(): v for k, v in request.headers.raw_items()}
        if request.path.startswith("/healthz"):
            return super()._http(connection, request)
        self.seen.append(headers)
        if headers.get("authorization") != f"Api-Key {KEY}" or headers.get("x-org") != ORG:
            return connection.respond(HTTPStatus.UNAUTHORIZED, "unauthorized\n")
        return super()._http(connection, request)


@pytest.fixture
def gated():
    running = GatedServer().start()
    yield running
    running.stop()


def test_an_entry_names_variables_never_values():
    entry = PolicyEntry(url="ws://h:1", api_key_env="OPENPI_API_KEY", headers_env={"X-Org": "ORG"})
    assert (entry.api_key_env, entry.headers_env) == ("OPENPI_API_KEY", {"X-Org": "ORG"})
    for bad, said in [
        ({"api_key_env": KEY}, "not an environment variable's name"),
        ({"headers_env": {"Host": "H"}}, "set by the websocket handshake itself"),
        ({"headers_env": {"Authorization": "K"}}, "give api_key_env"),
        ({"headers_env": {"X Org": "K"}}, "is not a header name"),
    ]:
        with pytest.raises(ValueError, match=said):
            PolicyEntry(url="ws://h:1", **bad)
    # the key itself written where its variable's name goes: the config error does not echo it
    data = {"policies": {"p": {"url": "ws://h:1", "api_key_env": KEY}}, "benchmark": {}}
    with pytest.raises(ConfigError) as info:
        load_config("bench.yaml", text=yaml.safe_dump(data))
    assert "policies.p.api_key_env: not an environment variable's name" in str(info.value)
    assert KEY not in str(info.value)


@pytest.mark.parametrize("key", ["api_key_env", "headers_env"])
def test_a_submitted_config_may_not_name_a_credential(key):
    value = "OPENPI_API_KEY" if key == "api_key_env" else {"X-Org": "ORG"}
    data = {
        "policies": {"p": {"url": "ws://h:1", key: value}},
        "benchmark": {"families": ["libero"], "variations": ["object"]},
    }
    with pytest.raises(ConfigError) as info:
        load_config("run.yaml", text=yaml.safe_dump(data), profile="remote")
    assert f"policies.p.{key}: not allowed in a submitted config" in str(info.value)


@pytest.mark.parametrize("protocol", ["openpi", "vla-eval"])
def test_the_client_sends_the_headers_and_keeps_their_values_out_of_errors(gated, protocol):
    headers = {"Authorization": f"Api-Key {KEY}", "X-Org": ORG}
    if protocol == "openpi":
        connect_policy(gated.url, protocol, headers=headers).close()
        assert gated.server.seen[-1]["authorization"] == f"Api-Key {KEY}"
    with pytest.raises(PolicyTransportError) as info:  # a wrong key: the door says 401
        connect_policy(gated.url, protocol, headers={**headers, "X-Org": ORG + "-x"})
    assert "401" in str(info.value) and ORG not in str(info.value) and KEY not in str(info.value)
    assert gated.server.seen[-1]["x-org"] == ORG + "-x"  # sent, over this protocol too


def _config(pytester, url: str) -> None:
    entry = {
        "url": url,
        "obs_format": "gap",
        "api_key_env": "T_KEY",
        "headers_env": {"X-Org": "T_ORG"},
    }
    data = {
        "policies": {"gated": entry},
        "trials": {"max_steps": 10},
        "benchmark": {
            "families": ["libero"],
            "variations": ["object"],
            "modes": ["policy_only"],
            "policies": ["gated"],
            "task_ids": [0],
            "seeds": [0],
            "gate_threshold": 0.0,
            "output_dir": "runs",
            "mode_overrides": {"policy_only": {"template": "policy_only_bare"}},
        },
    }
    (pytester.path / "grid.yaml").write_text(yaml.safe_dump(data))


def test_a_session_sends_the_credentials_from_its_environment_and_records_none(
    pytester, gated, monkeypatch
):
    _config(pytester, gated.url)
    monkeypatch.setenv("T_KEY", KEY)
    monkeypatch.setenv("T_ORG", ORG)
    result = pytester.runpytest_subprocess("grid.yaml", "-p", "no:cacheprovider", timeout=300)
    out = result.stdout.str()
    assert result.ret in (0, 1), out  # holding still fails the task; the gate is 0
    (path,) = (pytester.path / "runs").rglob("result.json")
    record = json.loads(path.read_text())
    assert record["error"] is None and not record["infra_failure"], record
    assert record["steps"] == 10
    # preflight, warm-up and the trial: each connection carried both headers
    assert len(gated.server.seen) >= 3
    assert all(h.get("x-org") == ORG for h in gated.server.seen)
    run_dir = path.parents[6]
    for written in [p for p in run_dir.rglob("*") if p.is_file()]:
        data = written.read_bytes()
        assert KEY.encode() not in data and ORG.encode() not in data, written
    assert KEY not in out and ORG not in out


def test_an_unset_variable_stops_the_session_before_any_trial(pytester, gated, monkeypatch):
    _config(pytester, gated.url)
    monkeypatch.setenv("T_KEY", KEY)
    monkeypatch.delenv("T_ORG", raising=False)
    result = pytester.runpytest_subprocess("grid.yaml", "-p", "no:cacheprovider", timeout=300)
    out = result.stdout.str() + result.stderr.str()
    assert result.ret == pytest.ExitCode.USAGE_ERROR, out
    said = "policies.gated.headers_env.X-Org: the variable T_ORG is not set"
    assert said in out
    gap = subprocess.run(
        [GAP, "benchmark", "grid.yaml"], cwd=pytester.path, capture_output=True, text=True
    )
    assert gap.returncode == 2 and said in gap.stderr + gap.stdout, gap.stderr
    assert gated.server.seen == [] and not list(pytester.path.rglob("result.json"))


def test_gap_eval_sends_the_credentials_its_variables_hold(gated, monkeypatch):
    """The service's client side: `gap eval --policy URL` reaches a policy server that wants
    credentials, the values read from the variables its options name."""
    from pytest_gap.cli import build_parser
    from pytest_gap.cli.service import _policy_headers
    from pytest_gap.errors import GapError
    from pytest_gap.service.client import policy_act

    argv = ["eval", "--url", "http://127.0.0.1:1", "--run-id", "r1", "--policy", gated.url]
    argv += ["--policy-api-key-env", "T_KEY", "--policy-header", "X-Org=T_ORG"]
    args = build_parser().parse_args(argv)
    monkeypatch.setenv("T_KEY", KEY)
    monkeypatch.delenv("T_ORG", raising=False)
    with pytest.raises(GapError, match="the variable T_ORG is not set"):
        _policy_headers(args)
    monkeypatch.setenv("T_ORG", ORG)
    act, _ = policy_act(args.policy, args.protocol, _policy_headers(args))
    assert "actions" in act({"prompt": "hold"})  # the session is open, and answers
    assert gated.server.seen[-1]["authorization"] == f"Api-Key {KEY}"
    assert gated.server.seen[-1]["x-org"] == ORG
    bad = build_parser().parse_args([*argv[:7], "--policy-header", f"X-Org={ORG}"])
    with pytest.raises(GapError, match="write NAME=VARIABLE") as info:
        _policy_headers(bad)
    assert ORG not in str(info.value)  # a value given by mistake is not echoed
