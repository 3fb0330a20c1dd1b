"""The lead's decisions (pytest_gap/plugin/decisions.py) on fake reports and gates, no session:
what a report means, why a session stopped, what it tells `gap benchmark` and what it exits
with; and the reporter's summary block on a fake terminal (as xdist tests its schedulers with a
MockNode). The real sessions that lead to them are tests/test_plugin.py's."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace

import pytest

from pytest_gap.plugin.decisions import (
    Outcome,
    Stop,
    collect_stop,
    crash_line,
    exit_status,
    first_stop,
    intake,
    internal_error_stop,
    interrupt_stop,
    passed,
    report_document,
    selected_trials,
    stopped_report,
)
from pytest_gap.plugin.reporter import GapReporter
from pytest_gap.report import Gate
from pytest_gap.results import TrialResult

OK, FAILED = pytest.ExitCode.OK, pytest.ExitCode.TESTS_FAILED
TRIAL = "grid.yaml::policy_only::posvar/baseline::task00::seed000"


def _result(**fields) -> TrialResult:
    identity = dict(nodeid=TRIAL, config="/abs/grid.yaml", mode="policy_only", family="posvar")
    identity.update(variation="baseline", suite="libero_spatial", task_id=0, seed=0)
    return TrialResult(**{**identity, **fields})


def _report(nodeid: str = TRIAL, outcome: str = "passed", when: str = "call", **extras):
    """A test report as the lead gets it (pytest's, or its copy from an xdist worker)."""
    report = SimpleNamespace(nodeid=nodeid, when=when, failed=outcome == "failed")
    report.longrepr = extras.pop("longrepr", None)
    for name, value in extras.items():
        setattr(report, name, value)
    return report


def _crash(message: str):
    return SimpleNamespace(reprcrash=SimpleNamespace(message=message))


def _gate(verdict: str = "PASS", **fields) -> Gate:
    values = dict(success_rate=0.9, completion_rate=0.9, threshold=0.8, n_trials=10)
    values.update(n_success=9, reasons=[], **fields)
    return Gate(passed=verdict == "PASS", verdict=verdict, **values)


def _outcome(gate: Gate, **fields) -> Outcome:
    values = dict(config="grid.yaml", run_dir="/runs/20250101_000000", cells=[], progress=None)
    return Outcome(gate=gate, **{**values, "services_down": {}, **fields})


# -- record intake ---------------------------------------------------------------------------------
def test_a_trials_call_report_brings_its_record_and_notes():
    result = _result(success=True)
    report = _report(
        gap_result=result.model_dump(mode="json"),
        gap_run_dir="/runs/20250101_000000",
        gap_replayed=True,
        gap_notes=["a note"],
    )
    taken = intake(report)
    assert taken.record is not None
    assert taken.record.config == Path("/abs/grid.yaml")
    assert taken.record.result == result
    assert taken.record.run_dir == Path("/runs/20250101_000000")
    assert taken.record.replayed is True
    assert taken.notes == ("a note",)
    assert not taken.other_failure and taken.stop is None


def test_a_trial_that_could_not_be_recorded_brings_its_notes_and_no_record():
    """NotRecorded, a GapError: the item failed with a run dir and no result."""
    report = _report(outcome="failed", gap_run_dir="/runs/x", gap_notes=["corrupt ..."])
    taken = intake(report)
    assert taken.record is None and taken.notes == ("corrupt ...",)
    assert not taken.other_failure and taken.stop is None  # a trial's failure, recorded or not


def test_a_failed_test_that_is_no_trial_is_counted_and_is_a_reason_to_stop():
    report = _report("tests/test_x.py::test_y", "failed", longrepr=_crash("AssertionError: 1"))
    taken = intake(report)
    assert taken.other_failure
    assert taken.stop == "tests/test_x.py::test_y failed in call: AssertionError: 1"


def test_a_trial_that_never_ran_is_a_reason_to_stop_not_another_failure():
    """A broken fixture: the trial's setup failed, so its report has no record."""
    report = _report(outcome="failed", when="setup", longrepr="E   RuntimeError: no display\n")
    taken = intake(report)
    assert not taken.other_failure and taken.record is None
    assert taken.stop == f"{TRIAL} failed in setup: RuntimeError: no display"


def test_a_passed_test_that_is_no_trial_means_nothing():
    assert intake(_report("tests/test_x.py::test_y")) == type(intake(_report()))()


def test_a_crash_line_is_one_line_of_the_failure_not_its_traceback():
    assert crash_line(_report(longrepr=_crash("ValueError: bad\nsecond line"))) == (
        "ValueError: bad second line"
    )
    text = "def f():\n>   raise KeyError(1)\nE   KeyError: 1\n\nx.py:3: KeyError\n"
    assert crash_line(_report(longrepr=text)) == "KeyError: 1"
    assert crash_line(_report(longrepr="only a line\n")) == "only a line"
    assert crash_line(_report(longrepr="")) == "no detail"


def test_the_selected_trials_of_a_config_are_its_node_ids_trial_ids(tmp_path):
    (tmp_path / "a.yaml").touch()
    (tmp_path / "b.yaml").touch()
    selected = ["a.yaml::m::f/v::task00::seed000", "b.yaml::m::f/v::task00::seed001"]
    selected.append("a.yaml::m::f/v::task01::seed000")
    assert selected_trials(selected, tmp_path, (tmp_path / "a.yaml").resolve()) == {
        "m::f/v::task00::seed000",
        "m::f/v::task01::seed000",
    }


# -- stop reasons ----------------------------------------------------------------------------------
def test_the_first_reason_to_stop_wins():
    first = first_stop(None, "  interrupted: KeyboardInterrupt \n")
    assert first == Stop("interrupted: KeyboardInterrupt")
    assert first_stop(first, "internal error: later", on_config=True) is first


def test_a_config_that_does_not_collect_stops_on_its_whole_message():
    message = "grid.yaml: 2 problems\n  benchmark.families: ...\n  trials.seeds: ..."
    stop = collect_stop(_report("benchmarks/grid.yaml", "failed", longrepr=message))
    assert stop == Stop(message, on_config=True)
    other = collect_stop(_report("tests/test_x.py", "failed", longrepr=_crash("ImportError: y")))
    assert other == Stop("ImportError: y", on_config=False)
    assert collect_stop(_report("benchmarks/grid.yaml")) is None


def test_internal_errors_and_interrupts_are_one_line():
    assert internal_error_stop(_crash("boom\nmore")) == "internal error: boom more"
    assert internal_error_stop("plain text") == "internal error: plain text"
    excinfo = SimpleNamespace(exconly=lambda: "KeyboardInterrupt")
    assert interrupt_stop(excinfo) == "interrupted: KeyboardInterrupt"


def test_a_session_that_recorded_nothing_tells_why():
    assert stopped_report(Stop("grid.yaml: bad", on_config=True), FAILED) == {
        "passed": False,
        "configs": [],
        "stopped": "grid.yaml: bad",
        "error": "grid.yaml: bad",
    }
    assert stopped_report(Stop("interrupted: x"), FAILED) == {
        "passed": False,
        "configs": [],
        "stopped": "interrupted: x",
    }
    nothing = stopped_report(None, pytest.ExitCode.NO_TESTS_COLLECTED)
    assert nothing["stopped"] == "no trial was selected (check -k, -m, --gap-families, --gap-modes)"
    assert stopped_report(None, OK)["stopped"] is None


# -- the end ---------------------------------------------------------------------------------------
def test_the_report_document_lists_each_configs_gate_and_services_down():
    down = {"llm": "no key"}
    outcomes = [_outcome(_gate()), _outcome(_gate("FAIL"), config="b.yaml", services_down=down)]
    document = report_document(outcomes)
    assert document["passed"] is False and not passed(outcomes)
    assert [c["config"] for c in document["configs"]] == ["grid.yaml", "b.yaml"]
    assert document["configs"][1]["services_down"] == down
    assert document["configs"][0]["gate"] == _gate().model_dump()
    assert set(document["configs"][0]) == {"config", "run_dir", "gate", "services_down"}


@pytest.mark.parametrize(
    "exitstatus, verdict, other_failures, errors, gate_on, expected",
    [
        (FAILED, "PASS", 0, [], True, OK),  # the gate decides: failed trials, a passing gate
        (OK, "FAIL", 0, [], True, FAILED),
        (OK, "INCONCLUSIVE", 0, [], True, FAILED),
        (OK, "PASS", 1, [], True, FAILED),  # a failed test that is no trial
        (OK, "PASS", 0, ["disk full"], True, FAILED),  # no summaries: never OK
        (FAILED, "PASS", 0, [], False, FAILED),  # --gap-no-gate: pytest's status
        (OK, "FAIL", 0, [], False, OK),
        (OK, "PASS", 0, ["disk full"], False, FAILED),
        (pytest.ExitCode.INTERRUPTED, "PASS", 0, [], True, pytest.ExitCode.INTERRUPTED),
    ],
)
def test_the_exit_status(exitstatus, verdict, other_failures, errors, gate_on, expected):
    status = exit_status(
        exitstatus,
        exitstatus,
        gate_on=gate_on,
        outcomes=[_outcome(_gate()), _outcome(_gate(verdict))],
        other_failures=other_failures,
        output_errors=errors,
    )
    assert status == expected


def test_the_exit_status_keeps_what_another_plugin_set_unless_the_gate_decides():
    kept = dict(outcomes=[_outcome(_gate())], other_failures=0, output_errors=[])
    assert exit_status(OK, pytest.ExitCode.USAGE_ERROR, gate_on=False, **kept) == 4
    assert exit_status(OK, pytest.ExitCode.USAGE_ERROR, gate_on=True, **kept) == OK


# -- the reporter ----------------------------------------------------------------------------------
class FakeTerminal:
    """What the reporter uses of pytest's TerminalReporter: the lines and their markup."""

    def __init__(self):
        self.lines: list[tuple[str, dict]] = []

    def write_sep(self, sep: str, title: str) -> None:
        self.lines.append((f"{sep * 3} {title} {sep * 3}", {}))

    def write_line(self, line: str, **markup) -> None:
        self.lines.append((line, markup))


def _reporter(gate_on: bool = True, verbosity: int = 0) -> GapReporter:
    config = SimpleNamespace(get_verbosity=lambda: verbosity)
    return GapReporter(config, SimpleNamespace(gate_on=gate_on, live_progress=False))


def test_the_summary_block_says_each_configs_run_dir_and_gate_then_notes_and_errors():
    terminal = FakeTerminal()
    outcome = _outcome(_gate("FAIL"))
    _reporter().summary(terminal, [outcome], ["a note"], ["could not write"])
    assert [line for line, _ in terminal.lines] == [
        "=== pytest-gap ===",
        "grid.yaml",
        "run dir: /runs/20250101_000000",
        "report:  gap viz /runs/20250101_000000",
        outcome.gate.line(),
        "gap: a note",
        "gap: error: could not write",
    ]
    assert terminal.lines[4][1] == dict(bold=True, green=False, red=True, yellow=False)
    assert terminal.lines[5][1] == dict(yellow=True)
    assert terminal.lines[6][1] == dict(red=True, bold=True)


def test_the_gate_line_says_when_it_does_not_decide_and_nothing_is_said_with_no_outcome():
    terminal = FakeTerminal()
    _reporter(gate_on=False).summary(terminal, [_outcome(_gate())], [], [])
    assert terminal.lines[-1][0].endswith("  [--gap-no-gate: not deciding the exit status]")
    assert terminal.lines[-1][1]["green"] is True
    quiet = FakeTerminal()
    _reporter().summary(quiet, [], ["a note"], ["an error"])
    assert quiet.lines == []
