"""Cap how many trials of one kind run at once across worker processes (file-lock slots).

`mode_overrides.<mode>.num_workers` (and a suite's `num_workers`) bound a mode's concurrent
trials below the session's `-n`, e.g. so that one websocket VLA server is not queued by every
worker. A slot is an flock'ed file in the run dir: the kernel releases it when its holder dies,
so a crashed worker never leaks one.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import time
from collections.abc import Iterator
from pathlib import Path

POLL_S = 0.2


@contextlib.contextmanager
def slot(directory: Path, limit: int) -> Iterator[int]:
    """Hold one of `limit` slots under `directory` for the duration of the block."""
    directory.mkdir(parents=True, exist_ok=True)
    while True:
        for index in range(limit):
            fd = os.open(directory / f"slot_{index}.lock", os.O_RDWR | os.O_CREAT, 0o644)
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                os.close(fd)
                continue
            try:
                yield index
            finally:
                fcntl.flock(fd, fcntl.LOCK_UN)
                os.close(fd)
            return
        time.sleep(POLL_S)
