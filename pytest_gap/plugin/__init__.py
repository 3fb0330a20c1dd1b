"""pytest hooks: benchmark YAMLs become one item per trial; the session ends with the gate.

The entry module (the `pytest11` entry point `gap`, or `-p pytest_gap.plugin`): module-level
hooks of a few lines, as pytest's cacheprovider and junitxml have, over the package's modules:

- options.py: the `--gap-*` options, read once into a frozen `GapOptions`;
- files.py: which YAMLs are benchmark configs, which node ids are trials;
- session.py: what every role shares (`GapSession`: options, stamp, loaded configs), in the
  stash;
- collect.py, item.py, watchdog.py, execution.py: collection, the trial item, its watchdog, and
  how an item gets its result in this process;
- one plugin object per role, built in `pytest_configure`, registered and kept in the stash:
  `Worker` (worker.py, an xdist worker: collects and runs trials; the controller's stamp, the
  services its preflight found down and the policy servers it started come in xdist's
  `workerinput`), `Controller` (controller.py, the xdist controller: runs the preflight, hands
  workers what they need, receives each trial's record with its report, records crashed
  workers' trials, writes every config's outputs at the end) and `SingleProcess` (single.py, no
  xdist: both; with `--gap-ray` its trials run on a Ray cluster instead,
  pytest_gap/scale/ray_executor.py, and each item waits for its own trial's record). The two
  leads share lead.py, whose decisions are decisions.py's pure functions and whose lines are
  reporter.py's;
- scheduling.py: the xdist schedule (modes one after another, a task's seeds on one worker).

Thin glue over plan (what to run), run/ (run one trial), report (fold the run dir) and the
output writers (pytest_gap/outputs/, through the hooks of pytest_gap/hookspecs.py). What only a
benchmark session needs is imported where it is used: this package is loaded by every pytest
run of the environment, a test suite's too.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from pytest_gap import hookspecs
from pytest_gap.modes import BUILTIN_MODES, BUILTIN_PRODUCERS
from pytest_gap.plugin.collect import collect_file, deselect_other_shards, order_in_blocks
from pytest_gap.plugin.controller import Controller
from pytest_gap.plugin.item import TrialItem, carry_record
from pytest_gap.plugin.options import add_options, check_command_line
from pytest_gap.plugin.session import SESSION
from pytest_gap.plugin.single import SingleProcess
from pytest_gap.plugin.worker import Worker


def pytest_addhooks(pluginmanager: pytest.PytestPluginManager) -> None:
    pluginmanager.add_hookspecs(hookspecs)


@pytest.hookimpl(tryfirst=True)
def pytest_gap_modes(config: pytest.Config):
    """The harness's own rows, first in the session's table."""
    return BUILTIN_MODES


@pytest.hookimpl(tryfirst=True)
def pytest_gap_producers(config: pytest.Config):
    return BUILTIN_PRODUCERS


def pytest_addoption(parser: pytest.Parser) -> None:
    add_options(parser)


@pytest.hookimpl(tryfirst=True)
def pytest_cmdline_main(config: pytest.Config) -> int | None:
    """A bad --gap-shard, or --gap-ray with -n, is one line and exit 2, before anything
    starts."""
    return check_command_line(config)


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line("markers", "gap_mode(name): the benchmark mode of a trial")
    config.addinivalue_line("markers", "gap_family(name): the benchmark family of a trial")
    role = _role(config)
    config.stash[SESSION] = role.session
    config.pluginmanager.register(role, f"gap-{type(role).__name__.lower()}")


def _role(config: pytest.Config) -> Worker | Controller | SingleProcess:
    """This process's role: xdist says which (its `workerinput`, its `-n`)."""
    if hasattr(config, "workerinput"):
        return Worker(config)
    if config.getoption("numprocesses", None):
        return Controller(config)
    return SingleProcess(config)


def pytest_collect_file(file_path: Path, parent: pytest.Collector):
    return collect_file(file_path, parent)


@pytest.hookimpl(tryfirst=True)
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """--gap-shard K/N (collect.deselect_other_shards). First (tryfirst), so -k, -m and --lf
    select within the shard and never change which shard a trial is in. Then the trials of a
    sequentially gated cell are put in block order (collect.order_in_blocks)."""
    deselect_other_shards(config, items)
    order_in_blocks(items)


@pytest.hookimpl(optionalhook=True, tryfirst=True)
def pytest_timeout_set_timer(item: pytest.Item, settings) -> None:
    """Note when a trial's watchdog starts; pytest-timeout's own implementation sets it."""
    if isinstance(item, TrialItem):
        item.watchdog.armed(settings)


@pytest.hookimpl(optionalhook=True, tryfirst=True)
def pytest_timeout_cancel_timer(item: pytest.Item) -> None:
    """A trial's watchdog is cancelled (paused, or the item ended): so is its backstop."""
    if isinstance(item, TrialItem):
        item.watchdog.stand_down()


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call):
    report = yield
    carry_record(item, report)
    return report
