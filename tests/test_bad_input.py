"""What a user is told when a session cannot do what was asked, and how many workers it starts.

Real sessions on the fake backend (tests/fake_backend.py): `gap benchmark` and `pytest` as a user
runs them, with real managed policy servers and real xdist workers.
"""

from __future__ import annotations

import shutil
import sys
from pathlib import Path

import pytest

from pytest_gap.run.workers import capacity_warning, fit_workers
from pytest_gap.servers.manager import PolicyUnreachable, free_port, preflight
from tests.fake_session import BACKEND, TESTS, FakeSession

GAP = str(Path(sys.executable).with_name("gap"))
pytest_plugins = ["pytester"]


@pytest.fixture
def fake(pytester) -> FakeSession:
    return FakeSession(pytester)


def _grid(fake: FakeSession, *, seeds=(1,), policies: dict | None = None) -> Path:
    """A grid of trials that succeed (fake/easy task 0, `seeds`): the policy_only mode on the
    `policies` when given, else the workflow mode on the session's `wf`."""
    block = {
        "backend": BACKEND,
        "families": ["fake"],
        "variations": ["easy"],
        "task_ids": [0],
        "seeds": list(seeds),
        "num_workers": 1,
        "output_dir": "runs",
    }
    if policies:
        block |= {
            "modes": ["policy_only"],
            "policies": list(policies),
            "mode_overrides": {"policy_only": {"template": "policy_only"}},
        }
    else:
        block |= {"modes": ["workflow"], "mode_overrides": {"workflow": {"workflow_dir": "wf"}}}
    return fake.config({"benchmark": block, **({"policies": policies} if policies else {})})


def _processes(fake: FakeSession) -> int:
    """The pytest processes the session ran (controller and workers; fake_conftest's record)."""
    return len(fake.modules.read_text().splitlines())


# -- why a session stopped ------------------------------------------------------------------------
def test_preflight_names_an_unreachable_server_and_its_cause_once():
    port = free_port()  # nothing listens there
    url = f"ws://127.0.0.1:{port}"
    with pytest.raises(PolicyUnreachable) as info:
        preflight({"ghost": (url, "openpi", {})}, timeout_s=2)
    message = str(info.value)
    assert "\n" not in message
    assert message.count(url) == 1 and message.count("start it") == 1, message
    assert "ConnectionRefusedError" in message and "policies.ghost.url" in message


def test_gap_benchmark_says_why_a_policy_server_did_not_start(fake):
    """A managed server that exits before listening errors its cells (an infrastructure
    failure, exit 1 under --gate); gap's own last lines say why, not only the gate's
    "errored cells"."""
    config = _grid(fake, policies={"a": {"command": [sys.executable, "-c", "exit(3)"]}})
    out = fake.pytester.run(GAP, "benchmark", str(config), "--gate", timeout=120)
    assert out.ret == 1
    errors = out.stderr.str().strip().splitlines()
    assert len(errors) == 1, errors
    assert errors[0].startswith("gap: errored policy_only@a fake/easy: ")
    assert "the server exited with status 3 before listening" in errors[0]


def _tsv_rows(run_dir: Path) -> dict[str, dict[str, str]]:
    """summary.tsv's cell rows by cell key (mode[@policy] family/variation)."""
    lines = (run_dir / "summary.tsv").read_text().split("\n\n")[0].splitlines()
    header = lines[0].split("\t")
    rows = [dict(zip(header, line.split("\t"), strict=True)) for line in lines[1:]]
    return {f"{r['mode']}@{r['policy_id']} {r['family']}/{r['variation']}": r for r in rows}


def test_an_unreachable_url_policy_fails_gap_benchmark_gate_or_not(fake):
    """The spec's preflight stops the run on an unreachable `url:` policy. Here its cells error
    without running and the other cells are scored, and the run still fails: `gap benchmark`
    exits 1 without --gate (one stderr line naming the url and the fix), the Python API says
    which service was down, and pytest exits 1 through the gate. The summaries carry the
    reference loops' rate, where the down server's trial counts as a failure."""
    url = f"ws://127.0.0.1:{free_port()}"  # nothing listens there
    config = fake.config(
        {
            "policies": {"ghost": {"url": url}},
            "trials": {"max_steps": 8},
            "benchmark": {
                "backend": BACKEND,
                "families": ["fake"],
                "variations": ["easy"],
                "modes": ["workflow", "policy_only"],
                "policies": ["ghost"],
                "task_ids": [0],
                "seeds": [1],  # succeeds on the fake backend
                "num_workers": 1,
                "gate_threshold": 0.0,
                "output_dir": "runs",
                "mode_overrides": {
                    "workflow": {"workflow_dir": "wf"},
                    "policy_only": {"template": "policy_only"},
                },
            },
        }
    )
    out = fake.pytester.run(GAP, "benchmark", str(config), timeout=120)
    assert out.ret == 1, out.stdout.str() + out.stderr.str()
    errors = out.stderr.str().strip().splitlines()
    assert len(errors) == 1, errors
    assert errors[0].startswith("gap: errored policy_only@ghost fake/easy: ")
    assert f"policy ghost at {url} did not answer" in errors[0]
    assert "start it first" in errors[0] and "fix policies.ghost.url" in errors[0]
    rows = _tsv_rows(fake.run_dir())
    scored, down = rows["workflow@ fake/easy"], rows["policy_only@ghost fake/easy"]
    assert (scored["n_success"], scored["n_trials"], scored["error"]) == ("1", "1", "")
    assert (down["n_trials"], down["n_infra"], down["success_rate"]) == ("0", "1", "")
    assert (down["ref_success_rate"], down["ref_n_trials"]) == ("0.000", "1")

    from pytest_gap import benchmark

    fake.pytester._monkeypatch.syspath_prepend(str(TESTS))  # the API plans here: the fake backend
    summary = benchmark.run(config, quiet=True)
    assert not summary.ok and not summary.gated and summary.exit_code == 1
    assert list(summary.services_down) == ["policies"]
    assert url in summary.services_down["policies"]
    assert summary.summary["ref_success_rate"] == 0.5 and summary.summary["ref_n_trials"] == 2

    session = fake.run(config.name)  # plain pytest: the gate (errored cells) fails it
    text = session.stdout.str()
    assert session.ret == 1, text
    assert "gate FAIL: success_rate=1.000 threshold=0.000" in text
    assert "\nref_success_rate " in text  # the reference loops' block, after today's pivot
    assert "ref_success_rate (as openpi's and vla-eval's loops count: infrastructure failures " in (
        text
    )
    assert "pooled 0.50 [" in text and "n=2; the gate reads success_rate" in text


def test_a_service_down_is_said_once_where_no_cell_recorded_here_carries_it(capsys):
    """A shard whose trials did not need the down server still exits 1 for it: its own line
    then says why, and a reason some cell's line already gives is not repeated."""
    from types import SimpleNamespace

    from pytest_gap.cli.benchmark import print_errored_cells

    why = "the policy servers were not started: preflight: policy ghost at ws://h:1 ..."
    errored = SimpleNamespace(
        error=f"1 of 1 trials errored: {why}", row="policy_only@ghost", column="fake/easy"
    )
    print_errored_cells([errored], {"policies": why})
    assert capsys.readouterr().err == f"gap: errored policy_only@ghost fake/easy: {errored.error}\n"
    print_errored_cells([], {"policies": why})
    assert capsys.readouterr().err == f"gap: error: {why}\n"


def test_gap_benchmark_says_why_a_session_scored_nothing(fake):
    """Every trial's setup failed (a broken fixture): the session recorded nothing. gap says
    what broke in one line instead of "run it with -v to see why"."""
    config = _grid(fake)
    out = fake.pytester.run(GAP, "benchmark", str(config), timeout=120)
    assert out.ret == 0, out.stdout.str() + out.stderr.str()
    fake.setenv(GAP_TEST_FAKE_SETUP_ERROR="0:1")
    out = fake.pytester.run(GAP, "benchmark", str(config), timeout=120)
    errors = out.stderr.str().strip().splitlines()
    assert out.ret == 1 and len(errors) == 1, errors
    assert "scored nothing: " in errors[0] and "-v to see why" not in errors[0]
    assert "RuntimeError: broken fixture for task 0 seed 1" in errors[0]


# -- how many workers ------------------------------------------------------------------------------
def test_workers_never_outnumber_trials_and_warn_beyond_the_machine():
    assert fit_workers(8, 1) == 1 and fit_workers(8, 0) == 1 and fit_workers(2, 5) == 2
    assert capacity_warning(2, cores=4, memory_gb=64) is None
    assert capacity_warning(8, cores=2, memory_gb=64) == (
        "8 trial workers exceed this machine's 2 CPU cores: trials will run slower or be killed "
        "for memory; -n 2 fits"
    )
    warning = capacity_warning(8, cores=16, memory_gb=6.0)
    assert "6.0 GB of available memory (about 2 GB per env)" in warning and "-n 3 fits" in warning


def test_gap_benchmark_starts_one_process_for_one_trial(fake):
    config = _grid(fake)
    out = fake.pytester.run(GAP, "benchmark", str(config), "-n", "8", timeout=120)
    assert out.ret == 0, out.stdout.str() + out.stderr.str()
    assert _processes(fake) == 1  # no xdist: the one trial runs in the session's process


@pytest.mark.skipif(not shutil.which("taskset"), reason="needs taskset (util-linux)")
def test_pytest_n_starts_no_more_workers_than_planned_trials(fake):
    """Plain `pytest CONFIG -n 3` on two trials, on one core (taskset): the controller fits
    xdist to two workers before it starts any, says so, and warns that two outnumber the core."""
    config = _grid(fake, seeds=(1, 2))
    pytest_cmd = [sys.executable, "-m", "pytest", config.name, "-n", "3", "-p", "no:cacheprovider"]
    result = fake.pytester.run("taskset", "-c", "0", *pytest_cmd, timeout=120)
    out = result.stdout.str()
    assert result.ret == 0, out
    assert "gap: 3 workers asked for 2 planned trials: starting 2" in out
    assert "gap: 2 trial workers exceed this machine's 1 CPU cores" in out
    assert _processes(fake) == 3  # the controller and two workers
