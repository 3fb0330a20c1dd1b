"""A trial item's watchdog: pytest-timeout's timer, paused while the trial waits, and a backstop.

A trial waits for a slot (its cell's `num_workers`), for its mode's phase (an xdist worker's
schedule) or for a Ray actor: none of that is the trial's time. And pytest-timeout's `signal`
method cannot end a trial stuck where signals do not reach: the backstop does.
"""

from __future__ import annotations

import faulthandler
import os
import sys
import threading
import time

import pytest

# How long after the `signal` watchdog fires a trial may stay stuck before the backstop ends
# its process: long enough for any C call that does return (an env build, a render) to return
# and let the SIGALRM handler run.
BACKSTOP_GRACE_S = 10.0


class TimeoutWatchdog:
    """pytest-timeout's timer of one item, paused while its trial waits for a slot.

    Uses pytest-timeout's public hooks (`pytest_timeout_set_timer` / `_cancel_timer`): pausing
    cancels the timer, resuming sets a new one for the budget left, whatever the method
    (signal or thread). The settings come from the plugin's `pytest_timeout_set_timer`
    (pytest_gap/plugin/__init__.py).

    The `signal` method (the default) cannot end a trial stuck in C code that signals do not
    interrupt (a lock, a driver call): its SIGALRM handler only runs once the main thread is
    back in Python. So each signal timer has a thread backstop `BACKSTOP_GRACE_S` later: if the
    trial is still stuck, it records the trial as timed out (124), as the thread method would be
    judged, and ends the process (an xdist worker is replaced and the run goes on; a single
    process run is finished with --gap-resume).
    """

    def __init__(self, item: pytest.Item):
        self.item = item
        self.settings = None  # pytest-timeout's Settings of the first (full-budget) timer
        self.armed_at: float | None = None
        self.started: float | None = (
            None  # epoch seconds of the first timer (run.watchdog.Watchdog)
        )
        self.charged = 0.0
        self._backstop: threading.Timer | None = None

    def armed(self, settings) -> None:
        if self.settings is None:
            self.settings, self.started = settings, time.time()
        self.armed_at = time.monotonic()
        if settings.method == "signal":
            self.stand_down()
            self._backstop = threading.Timer(settings.timeout + BACKSTOP_GRACE_S, self._stuck)
            self._backstop.daemon = True
            self._backstop.start()

    def stand_down(self) -> None:
        """The timer was cancelled, or its signal reached Python: no backstop needed."""
        if self._backstop is not None:
            self._backstop.cancel()
            self._backstop = None

    def _stuck(self) -> None:
        """The trial outlived its signal watchdog by the grace: record it and end the process."""
        # the trial layer: imported by the one process that records a stuck trial (this
        # package is loaded by every pytest run of the environment, a test suite's too)
        from pytest_gap.run.record import record_crash

        item = self.item
        limit = item.trial.cell.timeout_s
        worker = hasattr(item.config, "workerinput")
        try:
            record_crash(
                item.trial,
                item.loaded.run_dir,
                nodeid=item.nodeid,
                config=str(item.loaded.path),
                detail="stuck where signals do not reach",
                plan_digest=item.loaded.plan_digest,
            )
        finally:
            capture = item.config.pluginmanager.getplugin("capturemanager")
            if capture is not None:  # say it on the real stderr, not into the item's capture
                capture.suspend_global_capture(item)
            then = "its worker is replaced" if worker else "finish the run with --gap-resume"
            sys.stderr.write(
                f"\npytest-gap: {item.nodeid} is still running {BACKSTOP_GRACE_S:g} s after its "
                f"{limit:g} s watchdog fired (stuck in code signals do not interrupt); recorded "
                f"as timed out (124), ending this process; {then}\n"
            )
            faulthandler.dump_traceback(file=sys.stderr, all_threads=True)
            sys.stderr.flush()
            os._exit(1)

    def pause(self) -> None:
        if self.armed_at is None:
            return
        self.charged += time.monotonic() - self.armed_at
        self.armed_at = None
        self.item.ihook.pytest_timeout_cancel_timer(item=self.item)

    def resume(self) -> None:
        if self.settings is None or self.armed_at is not None:
            return
        left = max(self.settings.timeout - self.charged, 0.001)
        self.item.ihook.pytest_timeout_set_timer(
            item=self.item, settings=self.settings._replace(timeout=left)
        )

    def restart(self) -> None:
        """The whole budget again, from now: the trial is re-run after a server restart."""
        if self.settings is None:
            return
        self.pause()
        self.charged, self.started = 0.0, time.time()
        self.resume()
