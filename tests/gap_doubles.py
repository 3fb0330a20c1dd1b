"""Fault doubles for harness tests, installed as the conftest of a pytester session.

Skills that stall (for the watchdog) or kill their own process (a segfault, an OOM kill, or a
whole session killed with SIGKILL). They exist only in tests: a workflow in the product can
call registered skills only.
"""

from __future__ import annotations

import os
import signal
import time
from pathlib import Path

from pydantic import BaseModel

from pytest_gap.skills.context import SkillContext
from pytest_gap.skills.registry import skill


class Done(BaseModel):
    ok: bool = True


@skill
def stall(ctx: SkillContext, seconds: float = 60.0) -> Done:
    """Hang for `seconds` (in Python, so the signal watchdog can interrupt it)."""
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        time.sleep(0.05)
    return Done()


@skill
def kill_process(ctx: SkillContext, once_marker: str = "") -> Done:
    """SIGKILL this process; with `once_marker`, only if that file does not exist yet."""
    if once_marker:
        marker = Path(once_marker)
        if marker.exists():
            return Done()
        marker.write_text("killed once\n")
    os.kill(os.getpid(), signal.SIGKILL)
    return Done()
