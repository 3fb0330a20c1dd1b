"""The server's runs, on disk: `<runs dir>/<run id>/` holds the submitted config (config.yaml),
the run's card (service.json) and the trial records in the harness's layout. Which trials are
saved is read from the records, so a server restarted on the same runs dir resumes every run
where it stood; which are in progress lives in memory only (a restart hands them out again)."""

from __future__ import annotations

import json
from pathlib import Path

import yaml

from pytest_gap.config import BenchmarkConfig, ConfigError, parse_config
from pytest_gap.errors import GapError
from pytest_gap.plan import Cell, Trial, all_trials, plan
from pytest_gap.policies.endpoint import PolicyEndpoint
from pytest_gap.report import RunSummary, fold_run
from pytest_gap.results import TrialResult, now_iso, read_result, scan_results, write_json
from pytest_gap.service.protocol import SMOKE_DIR, Submit, Submitted

CONFIG_FILE = "config.yaml"
SERVICE_FILE = "service.json"
SERVICE_MODE = "policy_only"  # a remote client's policy acts alone, from the arm's home pose


class RunRefused(GapError):
    """A submission or attach the server will not take; the message says why and the fix."""


def _config(text: str, name: str, run_dir: Path) -> tuple[BenchmarkConfig, list[Cell]]:
    try:
        config = parse_config(yaml.safe_load(text), name, base=run_dir)
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
    return config, cells


class ServiceRun:
    def __init__(self, run_dir: Path):
        self.run_dir = run_dir
        self.card = json.loads((run_dir / SERVICE_FILE).read_text())
        text = (run_dir / CONFIG_FILE).read_text()
        self.config, self.cells = _config(text, self.card["config_name"], run_dir)
        self.trials: dict[str, Trial] = {t.key: t for t in all_trials(self.cells)}
        self.policy_id: str = self.cells[0].policy_id
        entry = self.config.policies[self.policy_id]
        self.obs_format = entry.resolved_obs_format
        self.saved: set[str] = {
            key for key, r in scan_results(run_dir).items() if key in self.trials and not r.errored
        }
        self.in_progress: dict[str, int] = {}  # trial key -> worker id
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
        """The next trial no one has saved or is running, in plan order; None when none is."""
        for key, trial in self.trials.items():
            if key not in self.saved and key not in self.in_progress:
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
        else:
            self.infra_failures += 1

    @property
    def complete(self) -> bool:
        return len(self.saved) == len(self.trials)

    def summary(self) -> RunSummary:
        return fold_run(
            self.cells, scan_results(self.run_dir), self.config.threshold, self.config.rule
        )


def submit(runs_dir: Path, request: Submit) -> Submitted:
    """Schedule a config's trials under a run id; the same submission again adds nothing."""
    run_dir = runs_dir / request.run_id
    if (run_dir / SERVICE_FILE).is_file():
        if (run_dir / CONFIG_FILE).read_text() != request.config_text:
            raise RunRefused(
                f"run id {request.run_id} is taken by another config on this server; pick a "
                "new run id (or resubmit the same config to reuse it)"
            )
        run = ServiceRun(run_dir)
        return Submitted(
            run_id=request.run_id,
            created=False,
            trials=len(run.trials),
            message=f"run {request.run_id} was already submitted ({len(run.trials)} trials, "
            f"{len(run.saved)} saved); nothing added",
        )
    _, cells = _config(request.config_text, request.config_name, run_dir)
    run_dir.mkdir(parents=True, exist_ok=True)
    (run_dir / CONFIG_FILE).write_text(request.config_text)
    write_json(
        run_dir / SERVICE_FILE,
        {"run_id": request.run_id, "config_name": request.config_name, "submitted_at": now_iso()},
    )
    n = len(all_trials(cells))
    return Submitted(
        run_id=request.run_id,
        created=True,
        trials=n,
        message=f"run {request.run_id}: {n} trials scheduled",
    )
