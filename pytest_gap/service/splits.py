"""The splits a server holds (`gap serve --splits FILE`): what a run of one measures (its seeds,
tasks, step limit and template) is the server's alone. A submission under `split:` names the
policy and the suite and nothing a split decides; the split's choices are added to the
submitted data after its remote check (`apply_split`).
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    PositiveInt,
    TypeAdapter,
    ValidationError,
    field_validator,
)

from pytest_gap.config.messages import ConfigError
from pytest_gap.config.model import MAX_EPISODE_STEPS, MAX_SEED_VALUE, TaskIdFrom0
from pytest_gap.config.reader import read_yaml
from pytest_gap.errors import GapError, one_line
from pytest_gap.producers.templates import template_names
from pytest_gap.service.protocol import RunRefused, SplitName

SERVICE_MODE = "policy_only"  # a remote client's policy acts alone, from the arm's home pose


class Split(BaseModel):
    """A split the server holds: what a run of it measures is the server's alone. Its seeds
    (clients never see them), its tasks (None: the benchmark's default tasks), its step limit
    (None: each suite's protocol limit) and its template. A submission under `split:` names
    the policy and the suite; none of these."""

    model_config = ConfigDict(extra="forbid")
    seeds: list[Annotated[int, Field(ge=0, le=MAX_SEED_VALUE)]] = Field(min_length=1)
    task_ids: list[TaskIdFrom0] | None = Field(default=None, min_length=1)
    max_steps: PositiveInt | None = Field(default=None, le=MAX_EPISODE_STEPS)
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


def apply_split(data: dict, name: str, splits: Splits) -> tuple[dict, str | None]:
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
