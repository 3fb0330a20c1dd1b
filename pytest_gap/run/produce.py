"""Which workflow a trial runs, and the one call that has it produced for the trial.

`trial_workflow` names the destination of a (cell, task, instruction); `produce_for_trial`
fills the instruction's placeholders and hands the request to the producer its mode names in
the mode table (pytest_gap/modes.py), through `producers.base.produce` (once per destination,
whatever the number of workers). Above the producers and the plan: it reads both.
"""

from __future__ import annotations

import hashlib
from pathlib import Path

from pydantic import BaseModel, ConfigDict

from pytest_gap.cells import Trial
from pytest_gap.config.llm import LLMConfig
from pytest_gap.layout import PRODUCED_FILE
from pytest_gap.modes import BUILTIN, ModeTable
from pytest_gap.producers.base import ProduceRequest, produce
from pytest_gap.workflow.templates import task_placeholders


class TrialWorkflow(BaseModel):
    """Which workflow a trial runs: where it goes, and the instruction it is produced for."""

    model_config = ConfigDict(frozen=True)

    dir: Path
    name: str  # the workflow dir relative to the run dir (result.json's `workflow`)
    prompt: str  # what the workflow is given (a suite's task_prompts entry, or the env's)


def trial_workflow(
    trial: Trial, instruction: str, run_dir: Path, *, generated: bool = False
) -> TrialWorkflow:
    """The workflow of this trial's instruction: one per distinct instruction of a (cell, task).

    `task_NN/workflow/` where the instruction is fixed (LIBERO tasks, or a suite's
    `task_prompts` entry), and `task_NN/workflow_<sha256 of the instruction, 8 hex>/` for
    `generated` variations whose instruction changes with the seed (grocery_packing lists the
    seed's items), so each seed runs the workflow written for what it is asked to do.
    """
    given = trial.cell.task_prompts.get(trial.task_id)
    prompt = given or instruction
    name = "workflow"
    if given is None and generated:
        name = f"workflow_{hashlib.sha256(prompt.encode()).hexdigest()[:8]}"
    return TrialWorkflow(
        dir=run_dir / trial.task_dir / name, name=f"{trial.task_dir}/{name}", prompt=prompt
    )


def produce_for_trial(
    trial: Trial,
    workflow: TrialWorkflow,
    *,
    llm: LLMConfig | None = None,
    config_source: str = "config",
    max_validation_retries: int = 2,
    mode_table: ModeTable | None = None,
) -> float:
    """Produce `workflow` (unless it was) with the producer of the cell's mode in `mode_table`
    (default: the built-in table); return the seconds spent producing (0 when it existed).
    Placeholders: the instruction's {{target}}, {{container}}, {{items}}, the cell's object hints
    and its {{policy_id}}."""
    if (workflow.dir / PRODUCED_FILE).is_file():
        return 0.0
    cell = trial.cell
    values = {**task_placeholders(workflow.prompt), **cell.objects}
    if cell.policy_id:
        values["policy_id"] = cell.policy_id
    request = ProduceRequest(
        instruction=workflow.prompt,
        placeholders=values,
        objects=cell.objects,
        workflow_dir=cell.workflow_dir,
        llm=llm,
        config_source=config_source,
        max_validation_retries=max_validation_retries,
    )
    producer = (mode_table or BUILTIN).producer(cell.mode)
    return produce(producer, request, workflow.dir)
