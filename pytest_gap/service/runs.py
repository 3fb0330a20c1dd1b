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

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    PositiveInt,
    TypeAdapter,
    ValidationError,
    field_validator,
)

from pytest_gap.cells import Cell, Trial
from pytest_gap.config.document import BenchmarkConfig, load_config
from pytest_gap.config.keys import Profile
from pytest_gap.config.messages import ConfigError
from pytest_gap.config.reader import read_yaml
from pytest_gap.doors import new_secret, same_secret
from pytest_gap.errors import GapError, one_line
from pytest_gap.layout import RESULT_FILE, SMOKE_DIR, inside
from pytest_gap.plan import all_trials, plan
from pytest_gap.policies.endpoint import PolicyEndpoint
from pytest_gap.producers.templates import template_names
from pytest_gap.report import RunSummary, fold_config
from pytest_gap.results import TrialResult, now_iso, read_result, scan_results, write_json
from pytest_gap.service.protocol import SplitName, Submit, Submitted

log = logging.getLogger(__name__)
CONFIG_FILE = "config.yaml"
SERVICE_FILE = "service.json"
SERVICE_MODE = "policy_only"  # a remote client's policy acts alone, from the arm's home pose
MAX_ATTEMPTS = 3  # runs of one trial that the harness could not score before it gives up
SECRET_DIGEST = "run_secret_sha256"  # the card's key for the run secret's digest


def secret_digest(secret: str) -> str:
    """What the card keeps of a run secret: its SHA-256 (the secret is 256 random bits, so the
    digest needs no salt and gives nothing away to a reader of the runs dir)."""
    return hashlib.sha256(secret.encode()).hexdigest()


class RunRefused(GapError):
    """A submission or attach the server will not take; the message says why and the fix."""


class Split(BaseModel):
    """A split the server holds: what a run of it measures is the server's alone. Its seeds
    (clients never see them), its tasks (None: the benchmark's default tasks), its step limit
    (None: each suite's protocol limit) and its template. A submission under `split:` names
    the policy and the suite; none of these."""

    model_config = ConfigDict(extra="forbid")
    seeds: list[int] = Field(min_length=1)
    task_ids: list[int] | None = Field(default=None, min_length=1)
    max_steps: PositiveInt | None = None
    template: str = "policy_only"

    @field_validator("template")
    @classmethod
    def _shipped(cls, template: str) -> str:
        if template not in template_names():
            raise ValueError(f"{template!r} is no shipped template; use one of {template_names()}")
        return template


Splits = dict[SplitName, Split]
# What a split decides; a submission under `split:` that sets one of them is refused, by name.
SPLIT_DECIDES = {
    "benchmark": ("seeds", "n_seeds", "task_ids", "n_tasks", "mode_overrides"),
    "trials": ("max_steps",),
}


def load_splits(path: Path) -> Splits:
    """`gap serve --splits FILE`: {val_train|val_unseen|test: {seeds: [...], task_ids: [...],
    max_steps: N, template: NAME}} (seeds required)."""
    try:  # the hardened reader: tags, keys given twice and alias bombs are refused here too
        data = read_yaml(path)
    except ConfigError as exc:
        raise GapError(f"--splits {exc}") from None
    try:
        return TypeAdapter(Splits).validate_python(data or {})
    except ValidationError as exc:
        first = exc.errors()[0]
        where = ".".join(str(x) for x in first["loc"])
        message = first["msg"].removeprefix("Value error, ")
        raise GapError(f"--splits {path}: {where}: {message}") from None


def _with_split(data: dict, name: str, splits: Splits) -> tuple[dict, str | None]:
    """The config data with what the server's split of its `split:` decides (seeds, tasks,
    step limit, template), and the split's name."""
    split = data.pop("split", None)
    if split is None:
        return data, None
    if not isinstance(split, str) or split not in splits:
        have = ", ".join(splits) or "none"
        raise RunRefused(
            f"{name}: split: {one_line(str(split), 60)} is not a split of this server (it has: "
            f"{have}); ask for one it has: a split is never substituted"
        )
    block = data.get("benchmark")
    if not isinstance(block, dict):
        raise RunRefused(f"{name}: split: {split} runs a benchmark: grid; write one")
    chosen = [
        f"{name}: {section}.{key}: split: {split} decides it on this server; remove it"
        for section, keys in SPLIT_DECIDES.items()
        if isinstance(data.get(section), dict)
        for key in keys
        if key in data[section]
    ]
    if chosen:
        raise RunRefused("\n".join(chosen))
    chosen_split = splits[split]
    block = {
        **block,
        "seeds": list(chosen_split.seeds),
        "mode_overrides": {SERVICE_MODE: {"template": chosen_split.template}},
    }
    if chosen_split.task_ids is not None:
        block["task_ids"] = list(chosen_split.task_ids)
    data["benchmark"] = block
    trials = data.get("trials", {})
    if chosen_split.max_steps is not None and isinstance(trials, dict):  # else the model says
        data["trials"] = {**trials, "max_steps": chosen_split.max_steps}
    return data, split


def _config(
    text: str, name: str, base: Path, splits: Splits, profile: Profile = "remote"
) -> tuple[BenchmarkConfig, list[Cell], str | None]:
    """The run's config and cells from its text. `remote` (a submission): the hardened reader,
    then the remote profile on the data as submitted, then the split's additions; `file` (the
    operator's config): as a session reads a config file, relative paths from `base`."""
    split: str | None = None

    def with_split(data: dict) -> dict:  # the server's split, added after the remote check
        nonlocal split
        data, split = _with_split(data, name, splits)
        return data

    try:
        config = load_config(name, text=text, profile=profile, base=base, amend=with_split)
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
    def __init__(self, run_dir: Path, splits: Splits | None = None):
        self.run_dir = run_dir
        self.card = json.loads((run_dir / SERVICE_FILE).read_text())
        text = (run_dir / CONFIG_FILE).read_text()
        # Only `register` writes a card that says trusted (with the config file's directory).
        trusted = self.card.get("trusted") is True
        base = Path(self.card["base"]) if trusted else run_dir
        self.config, self.cells, self.split = _config(
            text, self.card["config_name"], base, splits or {}, "file" if trusted else "remote"
        )
        self.trials: dict[str, Trial] = {t.key: t for t in all_trials(self.cells)}
        self.policy_id: str = self.cells[0].policy_id
        entry = self.config.policies[self.policy_id]
        self.obs_format = entry.resolved_obs_format
        self.saved: set[str] = {
            key for key, r in scan_results(run_dir).items() if key in self.trials and not r.errored
        }
        self.in_progress: dict[str, int] = {}  # trial key -> worker id
        self.attempts: dict[str, int] = {}  # runs of a trial the harness could not score
        self.given_up: set[str] = set()
        self.infra_failures = 0
        self.smoke_episodes = len(list((run_dir / SMOKE_DIR).rglob(RESULT_FILE)))
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
        obs_format (what the remote policy reads and answers)."""
        return PolicyEndpoint(url=url, protocol="openpi", obs_format=self.obs_format)

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

    def finish(self, key: str) -> None:
        """A trial ended: saved if its record is scored, handed out again if not."""
        self.in_progress.pop(key, None)
        result = read_result(inside(self.run_dir, key))
        if isinstance(result, TrialResult) and not result.errored:
            self.saved.add(key)
            return
        self.infra_failures += 1
        why = result.error if isinstance(result, TrialResult) else "no record"
        # A client gone mid-episode is not the trial's fault: its episode goes out again as
        # often as that happens. A trial the harness itself cannot run would go round forever.
        if not (isinstance(result, TrialResult) and result.infra_failure):
            self.attempts[key] = self.attempts.get(key, 0) + 1
            if self.attempts[key] >= MAX_ATTEMPTS:
                self.given_up.add(key)
                log.warning(
                    "run %s: %s given up after %d attempts: %s", self.run_id, key, MAX_ATTEMPTS, why
                )
                return
        log.warning("run %s: %s is handed out again: %s", self.run_id, key, why)

    @property
    def complete(self) -> bool:
        return len(self.saved) == len(self.trials)

    @property
    def ended(self) -> bool:
        """Every trial saved or given up on: no episode is left to hand out."""
        return len(self.saved) + len(self.given_up - self.saved) == len(self.trials)

    def summary(self) -> RunSummary:
        return self.folded()[0]

    def folded(self) -> tuple[RunSummary, dict[str, TrialResult]]:
        """The run's summary and the records it folds (keyed by trial dir)."""
        results = scan_results(self.run_dir)
        return fold_config(self.cells, results, self.config), results


def submit(runs_dir: Path, request: Submit, splits: Splits | None = None) -> Submitted:
    """Schedule a submitted config's trials under a run id (the public door: the config is
    untrusted data, see the module's docstring); the same submission again adds nothing."""
    run_dir = inside(runs_dir, request.run_id)
    if (run_dir / SERVICE_FILE).is_file():
        if (run_dir / CONFIG_FILE).read_text() != request.config_text:
            raise RunRefused(
                f"run id {request.run_id} is taken by another config on this server; pick a "
                "new run id (or resubmit the same config to reuse it)"
            )
        run = ServiceRun(run_dir, splits)
        return Submitted(
            run_id=request.run_id,
            created=False,
            trials=len(run.trials),
            message=f"run {request.run_id} was already submitted ({len(run.trials)} trials, "
            f"{len(run.saved)} saved); nothing added; its run secret went to the first submit "
            "(lost? submit under a new run id)",
        )
    _, cells, split = _config(request.config_text, request.config_name, run_dir, splits or {})
    return _create(run_dir, request.config_text, request.config_name, split, cells, {})


def register(
    runs_dir: Path,
    run_id: str,
    path: Path,
    splits: Splits | None = None,
    secret: str | None = None,
) -> Submitted:
    """Schedule the operator's own config file under `run_id` (`gap serve --config`): read as
    a session reads a config file (skill packages, workflow dirs and the rest allowed),
    relative paths from its directory. Never reached from the network. Registering the same
    file again adds nothing; another config under a taken run id is refused. `secret` is the
    run's secret when the operator chose it (gap online hands it to the task's owner), else a
    new one, in the answer."""
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
        run = ServiceRun(run_dir, splits)
        return Submitted(
            run_id=run_id,
            created=False,
            trials=len(run.trials),
            message=f"run {run_id} was already registered ({len(run.saved)} of "
            f"{len(run.trials)} trials saved); nothing added",
        )
    base = path.parent.resolve()
    _, cells, split = _config(text, name, base, splits or {}, "file")
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
    n = len(all_trials(cells))
    return Submitted(
        run_id=run_dir.name,
        created=True,
        trials=n,
        message=f"run {run_dir.name}: {n} trials scheduled",
        run_secret=secret,
    )
