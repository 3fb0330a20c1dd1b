"""What one run, and one evaluation server, may take: the `gap serve` options (light: the
command line's parser reads the defaults from here).

Each axis of a config is bounded (config/model.py), their product never is: a few hundred bytes
of `n_tasks`, `n_seeds` and every variation plan millions of trials. So a run's trials, and the
steps they may take in all, are bounded here and counted from the config alone before anything
is planned or written (work.py), at every door: a submission, the operator's `--config` and a
run found on disk at a restart.

`max_runs` bounds how many submitted runs the server keeps (each one's records are on its disk).
The other limits bound what attached clients hold (server.py): attachments per run (worker ids
run from 0 to one less) and per server, how often one trial is handed out before it is given
up, and how many trials in a row a worker's client may leave unanswered before that worker id
is refused.
"""

from __future__ import annotations

from dataclasses import dataclass, fields

# Far above a full LIBERO evaluation (four suites x 10 tasks x 50 seeds = 2,000 trials of at
# most 520 steps): a run of the defaults keeps one slot busy for days, not for ever.
DEFAULT_MAX_TRIALS = 20_000
DEFAULT_MAX_STEPS = 10_000_000
# The ceilings an operator may raise them to: the plan of a run is held in memory.
CEILING_TRIALS = 200_000
CEILING_STEPS = 10**9
# Each attachment may hold a simulator slot (a thread, an env, a GL context: hundreds of MB).
DEFAULT_MAX_ATTACHMENTS_PER_RUN = 16
DEFAULT_MAX_ATTACHMENTS = 32
CEILING_ATTACHMENTS = 4096
CEILING_ATTACHMENTS_PER_RUN = 1024  # worker ids are 0 to 1023 at most (protocol.MAX_WORKER_ID)
# Submitted runs one server keeps in its runs dir (each holds its records on disk): finished
# ones count until the operator removes them.
DEFAULT_MAX_RUNS = 100
CEILING_RUNS = 100_000
DEFAULT_MAX_HANDOUTS = 5
DEFAULT_MAX_WORKER_FAILURES = 3
CEILING_RETRIES = 100

# The option that sets each limit, as a refusal names it.
OPTION = {
    "max_trials_per_run": "--max-trials-per-run",
    "max_steps_per_run": "--max-steps-per-run",
    "max_runs": "--max-runs",
    "max_attachments_per_run": "--max-attachments-per-run",
    "max_attachments": "--max-attachments",
    "max_trial_handouts": "--max-trial-handouts",
    "max_worker_failures": "--max-worker-failures",
}


# (lowest, highest) of each option.
BOUNDS = {
    "max_trials_per_run": (1, CEILING_TRIALS),
    "max_steps_per_run": (1, CEILING_STEPS),
    "max_runs": (1, CEILING_RUNS),
    "max_attachments_per_run": (1, CEILING_ATTACHMENTS_PER_RUN),
    "max_attachments": (1, CEILING_ATTACHMENTS),
    "max_trial_handouts": (1, CEILING_RETRIES),
    "max_worker_failures": (1, CEILING_RETRIES),
}


@dataclass(frozen=True)
class ServiceLimits:
    """The limits of one `gap serve` (each a `--max-...` option, OPTION; BOUNDS its range). A
    plain dataclass: the command line's parser reads this module, and stays light."""

    # Trials one run may plan, and the steps they may take in all (trials x step limit).
    max_trials_per_run: int = DEFAULT_MAX_TRIALS
    max_steps_per_run: int = DEFAULT_MAX_STEPS
    # Submitted runs the runs dir holds (the operator's `--config` run is not counted).
    max_runs: int = DEFAULT_MAX_RUNS
    # Clients attached to one run at once (worker ids 0 .. this - 1), and to the server.
    max_attachments_per_run: int = DEFAULT_MAX_ATTACHMENTS_PER_RUN
    max_attachments: int = DEFAULT_MAX_ATTACHMENTS
    # Unscored ends of one trial (clients gone, harness faults) before it is given up.
    max_trial_handouts: int = DEFAULT_MAX_HANDOUTS
    # Trials in a row a worker's client failed to answer before its worker id is refused.
    max_worker_failures: int = DEFAULT_MAX_WORKER_FAILURES

    def __post_init__(self) -> None:
        for field in fields(self):
            value, (low, high) = getattr(self, field.name), BOUNDS[field.name]
            whole = isinstance(value, int) and not isinstance(value, bool)
            if not (whole and low <= value <= high):
                raise ValueError(
                    f"{OPTION[field.name]} {value!r}: give a whole number from {low} to {high}"
                )
