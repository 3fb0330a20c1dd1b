"""The trial's time limit as the trial code sees it: `Watchdog`, the protocol whoever enforces
the limit (pytest-timeout, in the plugin) implements, and `NoWatchdog` for a trial run without
one (`gap run`, the evaluation service).

TrialRun and run_supervised pause it while a trial waits for something that is not its own
work (a `num_workers` slot, a producer, a policy server's warm-up or restart), so that time is
never charged to the trial.
"""

from __future__ import annotations

from typing import Protocol


class Watchdog(Protocol):
    """The trial's time limit, as whoever enforces it (pytest-timeout, in the plugin) sees it."""

    # When (epoch seconds) the limit began counting, None if it never did: before the trial
    # executes (pytest-timeout counts the item's setup), so the controller that judges a
    # killed worker by running.json must count from here, not from `execute`.
    started: float | None

    def pause(self) -> None:
        """Stop charging time to the trial (it is about to wait for a slot)."""

    def resume(self) -> None:
        """Charge time again, with the budget that was left at `pause`."""

    def restart(self) -> None:
        """A full budget again, counted from now: the trial is re-run (run_supervised)."""


class NoWatchdog:
    """No time limit: nothing to pause, resume or restart."""

    started = None

    def pause(self) -> None:
        pass

    def resume(self) -> None:
        pass

    def restart(self) -> None:
        pass
