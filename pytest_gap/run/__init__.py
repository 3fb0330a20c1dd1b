"""The trial level: what one trial runs, produces and records, on whichever process runs it,
and where that process runs.

trial.py: `TrialRun`, one trial from a clean trial dir to its result.json.
produce.py: which workflow a trial runs and the one call that has it produced.
record.py: what a trial's record says, and the records written for it by others (a warm-up,
  a dead worker's trial).
supervised.py: a trial whose policy server the session supervises (waited for, re-run once).
watchdog.py: the trial's time limit as the trial code sees it (the `Watchdog` protocol).
devices.py: which GPUs a worker process owns, and the EGL device a cell's envs render on.
workers.py: how many trial workers a session starts, and a warning when they do not fit.

Below the session (plugin, service, scale, cli), above the benchmark model (plan, producers,
modes) and everything they use. The cross-process slots that bound a cell's concurrent trials
are `pytest_gap/throttle.py`, a utility the producers use too.
"""
