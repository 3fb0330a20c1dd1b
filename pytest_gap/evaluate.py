"""Python API for a training loop: evaluate policies that live in this process (checkpoints,
callables) on a benchmark config, scored exactly as any session scores, and choose between two
with the sequential A/B test.

    from pytest_gap import evaluate
    summary = evaluate.run("benchmarks/checkpoints.yaml", {"late": policy})
    choice = evaluate.choose("benchmarks/checkpoints.yaml", best=old, candidate=new)
    if choice.verdict == "B better": old = new

A policy is anything with `infer(obs) -> {"actions": (H, 7)}` (and `infer_batch(list)` to be
served batched), or a plain function `obs -> actions`. It receives the native `gap` observation
(`images` {agentview, wrist} upright, `state` 8-D, `prompt`; policies/formats.py) unless the
call names another `obs_format`.

Why the trials do not run in this process: a session's trials run under pytest with its items,
records, summaries and gates, and running that session inside the caller's process
(GAP_PARALLEL_INPROC=1) shares the caller's GIL, GPU and process-global state with every trial
and lets its monkeypatches reach them, which is why such a run is marked a debug run, never
scored. Here the policy stays in the caller's process, served on loopback by the harness's own
PolicyServer (a fresh secret in its url), and the trials run in an ordinary session
(`benchmark.run`: a subprocess) that reaches it as it reaches any policy server: the same loop
code, warm-up, records, summaries and gates. Each record's `policy_digest` is the digest of the
served metadata (`{"policy": id, "served_by": "pytest_gap.evaluate", **metadata}`), so a label
passed as `metadata` (a checkpoint's step, its file digest) identifies what answered.

What `choose` decides: whether `candidate` is better than, not worse than (within `margin`), or
worse than `best` on the config's tasks and seeds, each cell at its share of `alpha`, stopping
as soon as that is decided (`compare:`, ab_gate.py); `undecided` when the trials run out first.
It covers these two policies' success rates on this split of init states, not the variance
between training runs of other seeds, which would need several runs of each.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path
from typing import Any, Literal

import numpy as np
from pydantic import BaseModel

from pytest_gap.benchmark import BenchmarkSummary
from pytest_gap.benchmark import run as run_session
from pytest_gap.compare.sequential_ab import ABState
from pytest_gap.config.document import BenchmarkConfig, load_config, parse_config
from pytest_gap.doors import new_secret
from pytest_gap.errors import GapError
from pytest_gap.policies.endpoint import ObsFormatName
from pytest_gap.policies.server import PolicyServer

SERVED_BY = "pytest_gap.evaluate"
Verdict = Literal["B better", "B not worse", "B worse", "undecided"]


class FunctionPolicy:
    """A function `obs -> actions` ((H, 7) or (7,)) as a policy."""

    def __init__(self, fn: Callable[[dict], Any]):
        self.fn = fn

    def infer(self, obs: dict) -> dict:
        reply = self.fn(obs)
        if isinstance(reply, dict):
            return reply
        return {"actions": np.asarray(reply, dtype=np.float32)}


def as_policy(policy: Any) -> Any:
    """`policy` itself when it has infer(obs); a torch module served batched (TorchPolicy); a
    plain callable wrapped; else GapError."""
    if callable(getattr(policy, "infer", None)):
        return policy
    if callable(getattr(policy, "state_dict", None)) and callable(getattr(policy, "eval", None)):
        from pytest_gap.policies.torch_policy import TorchPolicy  # a torch.nn.Module

        return TorchPolicy(policy)
    if callable(policy):
        return FunctionPolicy(policy)
    raise GapError(
        f"{type(policy).__name__} is not a policy: give an object with infer(obs) -> "
        '{"actions": (H, 7)} or a function obs -> actions'
    )


@contextlib.contextmanager
def serving(
    policies: Mapping[str, Any], metadata: Mapping[str, Any] | None = None, max_batch_size: int = 1
) -> Iterator[dict[str, str]]:
    """Each policy on a loopback PolicyServer of its own (batched where it has infer_batch and
    `max_batch_size` > 1), for the block's length; yields {policy id: its url, secret inside}."""
    with contextlib.ExitStack() as stack:
        urls = {}
        for policy_id, policy in policies.items():
            served = as_policy(policy)
            batch = max_batch_size if callable(getattr(served, "infer_batch", None)) else 1
            server = PolicyServer(
                served,
                metadata={"policy": policy_id, "served_by": SERVED_BY, **(metadata or {})},
                max_batch_size=batch,
                url_token=new_secret(),
            )
            urls[policy_id] = stack.enter_context(server.start()).url
        yield urls


def with_served(
    config: BenchmarkConfig,
    urls: Mapping[str, str],
    obs_format: ObsFormatName,
    privileged: Mapping[str, bool] | None = None,
) -> BenchmarkConfig:
    """`config` with each served id a registry entry at its url (`privileged_state: true` for
    those `privileged` names), and the policy axis exactly the served ids (in the order
    given)."""
    privileged = privileged or {}
    data = config.model_dump(mode="json", exclude_unset=True, exclude={"source"})
    registry = dict(data.get("policies") or {})
    for policy_id, url in urls.items():
        registry[policy_id] = {"url": url, "obs_format": obs_format}
        if privileged.get(policy_id):  # an oracle baseline: the policy says it reads that
            registry[policy_id]["privileged_state"] = True
    data["policies"] = registry
    data.setdefault("benchmark", {})["policies"] = list(urls)
    return parse_config(data, source=config.source or "<evaluate>")


def _loaded(config: BenchmarkConfig | str | Path) -> BenchmarkConfig:
    return config if isinstance(config, BenchmarkConfig) else load_config(config)


def run(
    config: BenchmarkConfig | str | Path,
    policies: Mapping[str, Any],
    *,
    obs_format: ObsFormatName = "gap",
    metadata: Mapping[str, Any] | None = None,
    max_batch_size: int = 1,
    **session: Any,
) -> BenchmarkSummary:
    """Evaluate `policies` ({policy id: policy}) on `config` as a session would (the module
    doc); `session` takes `benchmark.run`'s options (gate, workers, output_dir, quiet, ...)."""
    if not policies:
        raise GapError("evaluate.run: give at least one policy, {policy id: policy}")
    loaded = _loaded(config)
    # An oracle baseline (policies/builtin.py ScriptedPolicy) says it reads ground truth.
    privileged = {i: bool(getattr(p, "needs_privileged_state", False)) for i, p in policies.items()}
    with serving(policies, metadata, max_batch_size) as urls:
        return run_session(with_served(loaded, urls, obs_format, privileged), **session)


class Choice(BaseModel):
    """What `choose` found: the verdict over every A/B pair of cells (the worst one decides:
    B worse anywhere, else undecided anywhere, else not worse anywhere, else better), each
    pair's line, the trials it took against those the plan held, and the session's summary."""

    verdict: Verdict
    pairs: dict[str, str]  # pair label -> its state's line
    trials_run: int  # scored trials of both arms
    trials_planned: int  # the trials a fixed-n design on the same plan runs
    run_dir: Path


ORDER: tuple[Verdict, ...] = ("B worse", "undecided", "B not worse", "B better")


def overall_verdict(verdicts) -> Verdict:
    """The verdict over several pairs of cells: the first of ORDER any pair has (B worse
    anywhere decides; B better only where every pair says so)."""
    found = set(verdicts)
    unknown = found - set(ORDER)
    if unknown or not found:
        raise GapError(f"A/B verdicts {sorted(found)}: expected some of {list(ORDER)}")
    return next(v for v in ORDER if v in found)


def choose(
    config: BenchmarkConfig | str | Path,
    best: Any,
    candidate: Any,
    *,
    margin: float = 0.05,
    alpha: float = 0.05,
    block_seeds: int = 5,
    obs_format: ObsFormatName = "gap",
    metadata: Mapping[str, Any] | None = None,
    **session: Any,
) -> Choice:
    """The sequential A/B test of `candidate` (B) against `best` (A) on `config`'s tasks and
    seeds (the module doc), stopping once it is decided."""
    loaded = _loaded(config)
    data = loaded.model_dump(mode="json", exclude_unset=True, exclude={"source"})
    data["compare"] = {
        "a": "best",
        "b": "candidate",
        "rule": "sequential",
        "margin": margin,
        "alpha": alpha,
        "block_seeds": block_seeds,
    }
    data.setdefault("benchmark", {}).pop("gate_rule", None)
    # (the arms' registry entries are added by `run`, once they are served)
    data["benchmark"]["policies"] = ["best", "candidate"]
    data["policies"] = {
        **(data.get("policies") or {}),
        "best": {"url": "ws://127.0.0.1:1/best"},
        "candidate": {"url": "ws://127.0.0.1:1/candidate"},
    }
    with_ab = parse_config(data, source=loaded.source or "<evaluate>")
    policies = {"best": best, "candidate": candidate}
    summary = run(with_ab, policies, obs_format=obs_format, metadata=metadata, **session)
    states = (summary.summary.get("gate") or {}).get("ab", {}).get("states") or {}
    if not states:
        raise GapError(
            f"{summary.run_dir}: the session recorded no A/B pair (are both arms in one "
            "policy-taking mode of the config?)"
        )
    cells = summary.cells
    return Choice(
        verdict=overall_verdict(s["verdict"] for s in states.values()),
        pairs={label: ABState.model_validate(s).line() for label, s in states.items()},
        trials_run=sum(c.n_trials for c in cells),
        trials_planned=sum(c.n_planned for c in cells),
        run_dir=summary.run_dir,
    )
