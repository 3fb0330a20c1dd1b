"""How many trial workers a session starts: never more than it has trials, and a one-line warning
when they outnumber the machine's cores or its memory (about GB_PER_ENV per simulator env).

`gap benchmark` fits its -n before it starts pytest; the plugin's xdist controller fits a plain
`pytest CONFIG -n N` (or `-n auto`) before xdist starts its workers
(pytest_gap/plugin/controller.py).
Pure functions over what the machine reports; nothing here imports pytest or a simulator.
"""

from __future__ import annotations

import os
from pathlib import Path

# What one worker holds with a LIBERO env open (MuJoCo, robosuite, renderer, policy client),
# measured in the low GBs; a worker over that on a full machine is swapped or OOM-killed.
GB_PER_ENV = 2.0


def fit_workers(requested: int, n_trials: int) -> int:
    """Workers to start for `requested` and `n_trials` selected trials: at least 1, and no
    more than the trials (an idle worker still imports the simulator and holds memory)."""
    return max(1, min(requested, n_trials))


def usable_cores() -> int:
    try:
        return len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        return os.cpu_count() or 1


def available_memory_gb(meminfo: Path = Path("/proc/meminfo")) -> float | None:
    """MemAvailable in GB, or None where the system does not say (not Linux)."""
    try:
        for line in meminfo.read_text().splitlines():
            if line.startswith("MemAvailable:"):
                return int(line.split()[1]) / 2**20  # kB -> GB
    except (OSError, ValueError, IndexError):
        return None
    return None


def capacity_warning(
    workers: int, cores: int | None = None, memory_gb: float | None = None
) -> str | None:
    """One line when `workers` exceed the cores or the memory at GB_PER_ENV each, else None.
    `cores` and `memory_gb` default to this machine's."""
    cores = cores if cores is not None else usable_cores()
    memory_gb = memory_gb if memory_gb is not None else available_memory_gb()
    over = []
    if workers > cores:
        over.append(f"{cores} CPU cores")
    if memory_gb is not None and workers * GB_PER_ENV > memory_gb:
        over.append(f"{memory_gb:.1f} GB of available memory (about {GB_PER_ENV:g} GB per env)")
    if not over:
        return None
    fits = cores if memory_gb is None else min(cores, int(memory_gb // GB_PER_ENV))
    return (
        f"{workers} trial workers exceed this machine's {' and '.join(over)}: trials will run "
        f"slower or be killed for memory; -n {max(1, fits)} fits"
    )
