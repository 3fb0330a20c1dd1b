"""The server's runs, on disk: `<runs dir>/<run id>/` holds the submitted config (config.yaml),
the run's card (service.json) and the trial records in the harness's layout. Which trials are
saved is read from the records, so a server restarted on the same runs dir resumes every run
where it stood; which are in progress lives in memory only (a restart hands them out again)."""

from __future__ import annotations

import json
import logging
from pathlib import Path

import yaml
from pydantic import BaseModel, ConfigDict, Field, TypeAdapter, ValidationError

from pytest_gap.config import BenchmarkConfig, ConfigError, parse_config
from pytest_gap.errors import GapError
from pytest_gap.plan import Cell, Trial, all_trials, plan
from pytest_gap.policies.endpoint import PolicyEndpoint
from pytest_gap.report import RunSummary, fold_run
from pytest_gap.results import TrialResult, now_iso, read_result, scan_results, write_json
from pytest_gap.service.protocol import SMOKE_DIR, SplitName, Submit, Submitted

log = logging.getLogger(__name__)
CONFIG_FILE = "config.yaml"
SERVICE_FILE = "service.json"
SERVICE_MODE = "policy_only"  # a remote client's policy acts alone, from the arm's home pose
MAX_ATTEMPTS = 3  # runs of one trial that the harness could not score before it gives up


class RunRefused(GapError):
    """A submission or attach the server will not take; the message says why and the fix."""


class Split(BaseModel):
    """A split the server holds: its seeds are the server's alone (clients never see them)."""

    model_config = ConfigDict(extra="forbid")
    seeds: list[int] = Field(min_length=1)


Splits = dict[SplitName, Split]


def load_splits(path: Path) -> Splits:
    """`gap serve --splits FILE`: {val_train|val_unseen|test: {seeds: [...]}}."""
    try:
        data = yaml.safe_load(path.read_text())
        return TypeAdapter(Splits).validate_python(data or {})
    except (OSError, UnicodeDecodeError, yaml.YAMLError) as exc:
        raise GapError(f"--splits {path}: cannot read it: {exc}") from None
    except ValidationError as exc:
        first = exc.errors()[0]
        where = ".".join(str(x) for x in first["loc"])
        raise GapError(f"--splits {path}: {where}: {first['msg']}") from None


def _with_split(data: dict, name: str, splits: Splits) -> tuple[dict, str | None]:
    """The config data with the server's seeds of its `split:`, and the split's name."""
    split = data.pop("split", None)
    if split is None:
        return data, None
    if split not in splits:
        have = ", ".join(splits) or "none"
        raise RunRefused(
            f"{name}: split: {split} is not a split of this server (it has: {have}); ask for "
            "one it has: a split is never substituted"
        )
    block = data.get("benchmark")
    if not isinstance(block, dict) or block.get("seeds") is not None or "n_seeds" in block:
        raise RunRefused(
            f"{name}: split: {split} takes its seeds from the server; remove benchmark.seeds "
            "and benchmark.n_seeds (and use a benchmark: grid)"
        )
    data["benchmark"] = {**block, "seeds": list(splits[split].seeds)}
    return data, split


def _config(
    text: str, name: str, run_dir: Path, splits: Splits
) -> tuple[BenchmarkConfig, list[Cell], str | None]:
    try:
        data = yaml.safe_load(text)
        split = None
        if isinstance(data, dict):
            data, split = _with_split(dict(data), name, splits)
        config = parse_config(data, name, base=run_dir)
        cells = plan(config)
    except yaml.YAMLError as exc:
        raise RunRefused(f"{name}: not valid YAML: {str(exc).splitlines()[0]}") from None
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
    return config, cells, split


class ServiceRun:
    def __init__(self, run_dir: Path, splits: Splits | None = None):
        self.run_dir = run_dir
        self.card = json.loads((run_dir / SERVICE_FILE).read_text())
        text = (run_dir / CONFIG_FILE).read_text()
        self.config, self.cells, self.split = _config(
            text, self.card["config_name"], run_dir, splits or {}
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
        self.smoke_episodes = len(list((run_dir / SMOKE_DIR).rglob("result.json")))

    @property
    def run_id(self) -> str:
        return self.run_dir.name

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
        result = read_result(self.run_dir / key)
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
        return fold_run(
            self.cells, scan_results(self.run_dir), self.config.threshold, self.config.rule
        )


def submit(runs_dir: Path, request: Submit, splits: Splits | None = None) -> Submitted:
    """Schedule a config's trials under a run id; the same submission again adds nothing."""
    run_dir = runs_dir / request.run_id
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
            f"{len(run.saved)} saved); nothing added",
        )
    _, cells, split = _config(request.config_text, request.config_name, run_dir, splits or {})
    run_dir.mkdir(parents=True, exist_ok=True)
    (run_dir / CONFIG_FILE).write_text(request.config_text)
    write_json(
        run_dir / SERVICE_FILE,
        {
            "run_id": request.run_id,
            "config_name": request.config_name,
            "split": split,
            "submitted_at": now_iso(),
        },
    )
    n = len(all_trials(cells))
    return Submitted(
        run_id=request.run_id,
        created=True,
        trials=n,
        message=f"run {request.run_id}: {n} trials scheduled",
    )
