"""How far a session is through each benchmark config: trials done of those selected, successes,
errored trials, elapsed time and an ETA from the median trial time so far. Pure bookkeeping:
the plugin feeds it records and prints its line."""

from __future__ import annotations

import statistics

from pydantic import BaseModel

from pytest_gap.results import TrialResult


def _duration(seconds: float) -> str:
    seconds = max(0, round(seconds))
    hours, rest = divmod(seconds, 3600)
    minutes, secs = divmod(rest, 60)
    if hours:
        return f"{hours}h{minutes:02d}m"
    return f"{minutes}m{secs:02d}s" if minutes else f"{secs}s"


class Progress(BaseModel):
    """One config's progress. `parallel` is how many trials run at once (xdist workers)."""

    name: str
    total: int
    started: float  # time.monotonic() when the session's first trial of it was recorded
    parallel: int = 1
    done: int = 0
    succeeded: int = 0
    errored: int = 0
    walls: list[float] = []  # wall seconds of the trials this session ran (not replayed ones)

    def record(self, result: TrialResult, replayed: bool) -> None:
        self.done += 1
        self.succeeded += result.success
        self.errored += result.errored
        if not replayed:
            self.walls.append(result.wall_s)

    def eta(self) -> float | None:
        """Seconds left at the median trial time so far; None before any trial ran."""
        left = max(0, self.total - self.done)
        if not self.walls:
            return None if left else 0.0
        return statistics.median(self.walls) * left / max(1, self.parallel)

    def line(self, now: float) -> str:
        rate = f" ({self.succeeded / self.done:.2f})" if self.done else ""
        eta = self.eta()
        return (
            f"{self.name}: {self.done}/{self.total} trials, {self.succeeded} succeeded{rate}, "
            f"{self.errored} errored, {_duration(now - self.started)} elapsed, "
            f"ETA {'?' if eta is None else _duration(eta)}"
        )
