"""The server's runs, on disk: `<runs dir>/<run id>/` holds the submitted config (config.yaml),
the run's card (service.json: the run secret's SHA-256, never the secret) and the trial records
in the harness's layout. Which trials are
saved is read from the records, so a server restarted on the same runs dir resumes every run
where it stood; which are in progress lives in memory only (a restart hands them out again).

Two doors lead in. `submit` is the public one (`/control`, any token holder): its config is
data, read as a file is (config.read_yaml_text) and held to the config's remote profile (no
imports, no paths, no commands) before anything is added to it. `register` is the operator's
(`gap serve --config`, which `gap online` uses for its benchmark sets): a config file on the
server, trusted as any config file a session runs. A run's card says which door it came by, so
a restarted server reads each config again as it was first read.
"""

from __future__ import annotations

import hashlib
import json
import logging
import threading
from pathlib import Path

from pytest_gap.cells import Cell, Trial
from pytest_gap.config.document import BenchmarkConfig, load_config
from pytest_gap.config.keys import Profile
from pytest_gap.config.messages import ConfigError
from pytest_gap.doors import new_secret, same_secret
from pytest_gap.errors import one_line
from pytest_gap.layout import RESULT_FILE, SMOKE_DIR, inside
from pytest_gap.plan import all_trials, plan
from pytest_gap.policies.endpoint import PolicyEndpoint
from pytest_gap.report import RunSummary, fold_config
from pytest_gap.results import TrialResult, now_iso, read_result, scan_results, write_json
from pytest_gap.service.limits import OPTION, ServiceLimits
from pytest_gap.service.protocol import RunRefused, Submit, Submitted
from pytest_gap.service.splits import SERVICE_MODE, Splits, apply_split
from pytest_gap.service.work import work_problems

log = logging.getLogger(__name__)
CONFIG_FILE = "config.yaml"
SERVICE_FILE = "service.json"
MAX_ATTEMPTS = 3  # runs of one trial that the harness could not score before it gives up
SECRET_DIGEST = "run_secret_sha256"  # the card's key for the run secret's digest


def secret_digest(secret: str) -> str:
    """What the card keeps of a run secret: its SHA-256 (the secret is 256 random bits, so the
    digest needs no salt and gives nothing away to a reader of the runs dir)."""
    return hashlib.sha256(secret.encode()).hexdigest()


def _config(
    text: str,
    name: str,
    base: Path,
    splits: Splits,
    limits: ServiceLimits,
    profile: Profile = "remote",
) -> tuple[BenchmarkConfig, list[Cell], str | None]:
    """The run's config and cells from its text. `remote` (a submission): the hardened reader,
    then the remote profile on the data as submitted, then the split's additions; `file` (the
    operator's config): as a session reads a config file, relative paths from `base`. Its work
    (trials x steps) is counted against `limits` before a cell is planned."""
    split: str | None = None

    def with_split(data: dict) -> dict:  # the server's split, added after the remote check
        nonlocal split
        data, split = apply_split(data, name, splits)
        return data

    try:
        config = load_config(name, text=text, profile=profile, base=base, amend=with_split)
        too_much = work_problems(config, limits, name)
        if too_much:
            raise RunRefused("\n".join(too_much))
        cells = plan(config)
    except ConfigError as exc:
        raise RunRefused(str(exc)) from None
    modes = sorted({c.mode for c in cells})
    policies = sorted({c.policy_id for c in cells if c.policy_id})
    if modes != [SERVICE_MODE] or len(policies) != 1:
        raise RunRefused(
            f"{name}: a service run evaluates one remote policy: set benchmark.modes: "
            f"[{SERVICE_MODE}] and benchmark.policies to one registry entry (got modes "
            f"{', '.join(modes)}; policies {', '.join(policies) or 'none'})"
        )
    # A cell that cannot run (no template, no policy) would be handed out, fail, and be given
    # up on: the run is refused now, with the cell's own reason.
    unrunnable = sorted({c.error for c in cells if c.error})
    if unrunnable:
        raise RunRefused("\n".join(f"{name}: {error}" for error in unrunnable))
    return config, cells, split


class ServiceRun:
    """One run as the server holds it: its plan (bounded by `limits` before it is made), what
    is saved (read from its records), what is out with a client, and what was given up, why."""

    def __init__(
        self, run_dir: Path, splits: Splits | None = None, limits: ServiceLimits | None = None
    ):
        self.run_dir, self.limits = run_dir, limits or ServiceLimits()
        try:
            self.card = json.loads((run_dir / SERVICE_FILE).read_text())
            text = (run_dir / CONFIG_FILE).read_text()
            name = str(self.card["config_name"])
        except (OSError, ValueError, KeyError, TypeError) as exc:
            raise RunRefused(
                f"run {run_dir.name} on disk cannot be read ({type(exc).__name__}: "
                f"{one_line(str(exc), 120)}); move its directory out of the runs dir"
            ) from None
        # Only `register` writes a card that says trusted (with the config file's directory).
        trusted = self.card.get("trusted") is True
        base = Path(self.card["base"]) if trusted else run_dir
        profile: Profile = "file" if trusted else "remote"
        self.config, self.cells, self.split = _config(
            text, name, base, splits or {}, self.limits, profile
        )
        self.trials: dict[str, Trial] = {t.key: t for t in all_trials(self.cells)}
        self.policy_id: str = self.cells[0].policy_id
        self.entry = self.config.policies[self.policy_id]
        self.saved: set[str] = {
            key for key, r in scan_results(run_dir).items() if key in self.trials and not r.errored
        }
        self.in_progress: dict[str, int] = {}  # trial key -> worker id
        self.attempts: dict[str, int] = {}  # runs of a trial the harness could not score
        self.handouts: dict[str, int] = {}  # unscored ends of a trial not of its own making
        self.given_up: dict[str, str] = {}  # trial key -> why it is missing
        self.last_errors: dict[str, str] = {}  # trial key -> its last attempt's error
        self.infra_failures = 0
        self.failing: dict[int, int] = {}  # worker id -> trials in a row its client failed
        self.refused: dict[int, str] = {}  # worker id -> why it may not attach again
        self.smoke_episodes = len(list((run_dir / SMOKE_DIR).rglob(RESULT_FILE)))
        self.gate_line: str | None = None  # the gate's line once ended (`gate`)
        # Its outputs are written (the card completed): by this server, or before a restart.
        # Every attached client's handler gets there when the run ends; the first writes.
        self.summarized = self.ended and "finished_at" in self.card
        self.summary_lock = threading.Lock()

    @property
    def run_id(self) -> str:
        return self.run_dir.name

    def admits(self, run_secret: str) -> bool:
        """Whether `run_secret` is the one this run was created with (constant time). A run
        whose card holds no digest (made before run secrets) admits no one."""
        digest = self.card.get(SECRET_DIGEST)
        if not isinstance(digest, str) or not run_secret:
            return False
        return same_secret(secret_digest(run_secret), digest)

    def endpoint(self, url: str) -> PolicyEndpoint:
        """The run's policy as a trial reaches it: `url` (a worker's relay), the entry's
        obs_format (what the remote policy reads and answers) and its reply bounds (the relay
        waits on the client as long as the trial waits on the relay)."""
        return PolicyEndpoint(
            url=url,
            protocol="openpi",
            obs_format=self.entry.resolved_obs_format,
            timeout_s=self.entry.timeout_s,
            warmup_timeout_s=self.entry.warmup_timeout_s,
            max_reply_mb=self.entry.max_reply_mb,
        )

    def claim(self, worker_id: int) -> Trial | None:
        """The next trial no one has saved, is running or gave up on, in plan order."""
        for key, trial in self.trials.items():
            if key not in self.saved and key not in self.in_progress and key not in self.given_up:
                self.in_progress[key] = worker_id
                return trial
        return None

    def smoke_trial(self) -> Trial:
        """The first trial of the plan, for a fake-action connectivity check."""
        return next(iter(self.trials.values()))

    def finish(
        self,
        key: str,
        worker_id: int,
        *,
        harness_error: str | None = None,
        client: str | None = None,
    ) -> None:
        """A trial ended: saved if its record is scored, else handed out again, within bounds.
        `harness_error`: the server itself could not run it (no thread, no memory: its record,
        if any, is not read); `client`: why the worker's client failed it (gone, silent).
        Neither is the trial's fault: it goes out again until it has ended unscored
        `max_trial_handouts` times; a worker whose client failed `max_worker_failures` trials
        in a row is refused. A trial the harness cannot run for a reason of its own (an
        errored record that is not an infrastructure failure) is given up after MAX_ATTEMPTS."""
        self.in_progress.pop(key, None)
        result = None if harness_error else read_result(inside(self.run_dir, key))
        scored = isinstance(result, TrialResult) and not result.errored
        if scored:  # the policy answered every step it was asked (a client gone after: ok)
            self.saved.add(key)
            self.failing.pop(worker_id, None)
            return
        self.infra_failures += 1
        why = harness_error or (result.error if isinstance(result, TrialResult) else "no record")
        if client:
            self._client_failed(worker_id, client)
        infra = bool(harness_error or client) or (
            isinstance(result, TrialResult) and result.infra_failure
        )
        if infra:
            self._hand_out_again(key, str(why))
        else:
            self._attempted(key, str(why))

    def _hand_out_again(self, key: str, why: str) -> None:
        self.handouts[key] = n = self.handouts.get(key, 0) + 1
        if n >= self.limits.max_trial_handouts:
            limit = self.limits.max_trial_handouts
            self._give_up(
                key,
                f"ended unscored {n} times, never by the policy's answers (--max-trial-handouts "
                f"{limit})",
                why,
            )
        else:
            log.warning("run %s: %s is handed out again: %s", self.run_id, key, why)

    def _attempted(self, key: str, why: str) -> None:
        self.attempts[key] = n = self.attempts.get(key, 0) + 1
        if n >= MAX_ATTEMPTS:
            self._give_up(key, f"the harness could not run it {n} times", why)
        else:
            log.warning("run %s: %s is handed out again: %s", self.run_id, key, why)

    def _give_up(self, key: str, why: str, last: str) -> None:
        """Give up on `key`: `why` (names no trial: the held-out split shows it), and the last
        attempt's error (which may: the split shows it to the operator only)."""
        self.given_up[key] = why
        self.last_errors[key] = one_line(last, 200)
        log.warning("run %s: %s given up: %s (last: %s)", self.run_id, key, why, last)

    def given_up_reasons(self, held_out: bool) -> list[str]:
        """Why each trial was given up, one line each (on the held-out split, no trial named)."""
        if held_out:
            return list(self.given_up.values())
        last = self.last_errors
        return [f"{key}: {why}; last: {last[key]}" for key, why in self.given_up.items()]

    def _client_failed(self, worker_id: int, why: str) -> None:
        self.failing[worker_id] = n = self.failing.get(worker_id, 0) + 1
        if n >= self.limits.max_worker_failures:
            self.refused[worker_id] = (
                f"worker id {worker_id} of run {self.run_id} is refused: its client failed {n} "
                f"trials in a row (--max-worker-failures {self.limits.max_worker_failures}; "
                f"last: {one_line(why, 160)}); fix the client, then attach under a new worker id"
            )
            log.warning("run %s: %s", self.run_id, self.refused[worker_id])

    @property
    def complete(self) -> bool:
        return len(self.saved) == len(self.trials)

    @property
    def ended(self) -> bool:
        """Every trial saved or given up on: no episode is left to hand out."""
        return len(self.saved) + len(self.given_up.keys() - self.saved) == len(self.trials)

    def summary(self) -> RunSummary:
        return self.folded()[0]

    def gate(self) -> str:
        """The gate line of an ended run (its records read once; they change no more)."""
        if self.gate_line is None:
            self.gate_line = self.summary().gate.line()
        return self.gate_line

    def folded(self) -> tuple[RunSummary, dict[str, TrialResult]]:
        """The run's summary and the records it folds (keyed by trial dir)."""
        results = scan_results(self.run_dir)
        return fold_config(self.cells, results, self.config), results


def submit(
    runs_dir: Path,
    request: Submit,
    splits: Splits | None = None,
    limits: ServiceLimits | None = None,
) -> Submitted:
    """Schedule a submitted config's trials under a run id (the public door: the config is
    untrusted data, see the module's docstring); the same submission again adds nothing. A
    refused one (its work over `limits` among the reasons) leaves nothing on disk."""
    limits = limits or ServiceLimits()
    run_dir = inside(runs_dir, request.run_id)
    if (run_dir / SERVICE_FILE).is_file():
        if (run_dir / CONFIG_FILE).read_text() != request.config_text:
            raise RunRefused(
                f"run id {request.run_id} is taken by another config on this server; pick a "
                "new run id (or resubmit the same config to reuse it)"
            )
        run = ServiceRun(run_dir, splits, limits)
        return Submitted(
            run_id=request.run_id,
            created=False,
            trials=len(run.trials),
            message=f"run {request.run_id} was already submitted ({len(run.trials)} trials, "
            f"{len(run.saved)} saved); nothing added; its run secret went to the first submit "
            "(lost? submit under a new run id)",
        )
    _room_for_a_run(runs_dir, limits)
    text, name = request.config_text, request.config_name
    _, cells, split = _config(text, name, run_dir, splits or {}, limits)
    return _create(run_dir, text, name, split, cells, {})


def _room_for_a_run(runs_dir: Path, limits: ServiceLimits) -> None:
    """RunRefused, naming the option, when the runs dir holds `max_runs` submitted runs: each
    keeps its records on this server's disk, so a token holder cannot add runs without end.
    Counted from the cards on disk (a restart forgets nothing), the operator's own not among
    them; at most `max_runs` cards are read."""
    held = 0
    for card in runs_dir.glob(f"*/{SERVICE_FILE}"):
        try:
            trusted = json.loads(card.read_text()).get("trusted") is True
        except (OSError, ValueError, AttributeError):
            trusted = False  # an unreadable card still holds its run's place
        held += not trusted
        if held >= limits.max_runs:
            raise RunRefused(
                f"this server holds {held} submitted runs, the most {OPTION['max_runs']} "
                f"({limits.max_runs}) allows; resubmit an existing run id, or ask the "
                "operator to remove finished runs (or raise the option)"
            )


def register(
    runs_dir: Path,
    run_id: str,
    path: Path,
    splits: Splits | None = None,
    secret: str | None = None,
    limits: ServiceLimits | None = None,
) -> Submitted:
    """Schedule the operator's own config file under `run_id` (`gap serve --config`): read as
    a session reads a config file (skill packages, workflow dirs and the rest allowed),
    relative paths from its directory, and held to the same `limits` as a submission. Never
    reached from the network. Registering the same file again adds nothing; another config
    under a taken run id is refused. `secret` is the run's secret when the operator chose it
    (gap online hands it to the task's owner), else a new one, in the answer."""
    limits = limits or ServiceLimits()
    run_dir = inside(runs_dir, run_id)
    name = path.name
    try:
        text = path.read_text()
    except (OSError, UnicodeDecodeError) as exc:
        raise RunRefused(f"--config {path}: cannot read it: {exc}") from None
    if (run_dir / SERVICE_FILE).is_file():
        card = json.loads((run_dir / SERVICE_FILE).read_text())
        if (run_dir / CONFIG_FILE).read_text() != text or card.get("trusted") is not True:
            raise RunRefused(
                f"--run-id {run_id} is taken by another config on this server; pick a new one"
            )
        run = ServiceRun(run_dir, splits, limits)
        return Submitted(
            run_id=run_id,
            created=False,
            trials=len(run.trials),
            message=f"run {run_id} was already registered ({len(run.saved)} of "
            f"{len(run.trials)} trials saved); nothing added",
        )
    base = path.parent.resolve()
    _, cells, split = _config(text, name, base, splits or {}, limits, "file")
    trusted = {"trusted": True, "base": str(base)}
    return _create(run_dir, text, name, split, cells, trusted, secret)


def _create(
    run_dir: Path,
    text: str,
    name: str,
    split: str | None,
    cells: list[Cell],
    extra: dict,
    secret: str | None = None,
) -> Submitted:
    """Write a run that was checked and planned: its config, then its card (the card is what
    makes it a run: a directory without one is no run, and the next submit writes over it)."""
    n = sum(len(c.task_ids) * len(c.seeds) for c in cells)  # what all_trials gives, uncounted
    run_dir.mkdir(parents=True, exist_ok=True)
    (run_dir / CONFIG_FILE).write_text(text)
    secret = secret or new_secret()  # the submitter's alone: attaching to the run needs it
    write_json(
        run_dir / SERVICE_FILE,
        {
            "run_id": run_dir.name,
            "config_name": name,
            "split": split,
            "submitted_at": now_iso(),
            SECRET_DIGEST: secret_digest(secret),
            **extra,
        },
    )
    return Submitted(
        run_id=run_dir.name,
        created=True,
        trials=n,
        message=f"run {run_dir.name}: {n} trials scheduled",
        run_secret=secret,
    )
