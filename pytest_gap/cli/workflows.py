"""`gap run` and `gap generate`: one workflow by hand, run once through the harness's own trial
code, or written by the LLM for a prompt.

Each command imports what it runs when it runs (see the package's docstring: the parser stays
light).
"""

from __future__ import annotations

import argparse
import sys
from typing import get_args

from pytest_gap.errors import GapError
from pytest_gap.skills.perception_setting import Perception


def _parse_sets(pairs: list[str]) -> dict[str, str]:
    values = {}
    for pair in pairs:
        key, sep, value = pair.partition("=")
        if not sep or not key:
            raise GapError(f"--set {pair!r}: expected KEY=VALUE, e.g. --set target=milk")
        values[key] = value
    return values


def _run_source(args: argparse.Namespace):
    """The workflow `gap run` starts from: a directory, or a shipped template (--template)."""
    from pathlib import Path

    from pytest_gap.producers.templates import template_dir

    if (args.workflow is None) == (args.template is None):
        raise GapError("gap run: give a workflow directory or --template NAME (one of them)")
    return template_dir(args.template) if args.template else Path(args.workflow)


def _cmd_run(args: argparse.Namespace) -> int:
    """One trial through the harness's own trial code (run.trial.TrialRun): the env from the
    backend, the workflow from the prebuilt producer (placeholders: the instruction's, then
    --set), execution. Its run dir is temporary; the trace and video go where the flags say.
    Exit 0 on success, 1 on a failed workflow or a harness fault (traceback on stderr), 2 for
    an input to fix."""
    import tempfile
    from pathlib import Path

    from pytest_gap import ids
    from pytest_gap.cells import Cell, Trial
    from pytest_gap.layout import ERROR_FILE
    from pytest_gap.run.trial import TrialRun
    from pytest_gap.sim.backend import get_backend, resolve_variation
    from pytest_gap.sim.pool import EnvPool

    source = _run_source(args)
    variation = resolve_variation(get_backend(args.backend), args.family, args.variation)
    label = ids.run_label(source.name, args.family, args.variation, args.task, args.seed)
    trace_dir = Path(args.trace_dir or f"gap_runs/{label}/trace")
    cell = Cell(
        mode="workflow",
        backend=args.backend,
        family=args.family,
        variation=args.variation,
        suite=variation.suite,
        task_ids=(args.task,),
        seeds=(args.seed,),
        workflow_dir=source,
        record_video=bool(args.video),
        objects=_parse_sets(args.set),  # filled over the instruction's placeholders
        perception=args.perception,
    )
    trial = Trial(cell=cell, task_id=args.task, seed=args.seed)
    pool = EnvPool(max_envs=1)
    with tempfile.TemporaryDirectory(prefix="gap-run-") as tmp:
        run = TrialRun(
            trial,
            Path(tmp),
            nodeid=f"gap run {trial.id}",
            config="gap run",
            pool=pool,
            trace_dir=trace_dir,
            video=Path(args.video) if args.video else None,
            keep_images=args.images,
            reset_options={"video_wrist": True} if args.wrist else None,
        )
        try:
            result = run.execute()
        finally:
            pool.close()
        workflow_run = run.workflow_run
        if result.errored and workflow_run is None:  # it never got to run the workflow
            crash = Path(tmp) / trial.key / ERROR_FILE
            if crash.is_file():  # a harness fault: its traceback, as an uncaught one would be
                print(crash.read_text(), file=sys.stderr, end="")
            if crash.is_file() or result.infra_failure:
                print(f"gap: error: {result.error}", file=sys.stderr)
                return 1
            raise GapError(result.error)  # an input to fix: one line, exit 2
    verdict = "SUCCESS" if result.success else "FAILURE"
    print(f"{verdict}  {args.family}/{args.variation} task {args.task} seed {args.seed}")
    print(f"  prompt      {result.env_prompt}")
    print(
        f"  completion  {workflow_run.completion:.2f}   steps {workflow_run.steps}   "
        f"nodes {workflow_run.node_executions}   wall {workflow_run.duration_s:.1f} s"
    )
    print(
        f"  exit        {workflow_run.exit_status}"
        + (f" at {workflow_run.end_node}" if workflow_run.end_node else "")
    )
    if workflow_run.error:
        print(f"  error       {workflow_run.error}")
    print(f"  trace       {workflow_run.trace_path}")
    if args.video:
        print(f"  video       {args.video} ({run.video_frames} frames)")
    return 0 if result.success else 1


def _cmd_generate(args: argparse.Namespace) -> int:
    """Exit 0 with a valid workflow, 1 when the model wrote none, 2 for a config problem."""
    import json
    import shutil
    from pathlib import Path

    from pytest_gap.config.document import load_config
    from pytest_gap.config.llm import LLMConfig
    from pytest_gap.modes import BUILTIN
    from pytest_gap.producers.base import ProduceRequest
    from pytest_gap.producers.chat import resolve_settings
    from pytest_gap.workflow.templates import task_placeholders

    config = load_config(args.config) if args.config else None
    llm = config.llm if config else LLMConfig()
    overrides = {k: v for k, v in (("model", args.model), ("endpoint", args.endpoint)) if v}
    llm = llm.model_copy(update=overrides)
    source = args.config or "gap generate"
    settings = resolve_settings(llm, source)  # a config problem exits 2 before any file changes
    out = Path(args.out)
    shutil.rmtree(out / "agent_traces", ignore_errors=True)
    (out / "workflow.json").unlink(missing_ok=True)
    out.mkdir(parents=True, exist_ok=True)
    objects = _parse_sets(args.set)
    retries = config.composition.max_validation_retries if config else 2
    request = ProduceRequest(
        instruction=args.prompt,
        placeholders={**task_placeholders(args.prompt), **objects},
        objects=objects,
        llm=llm,
        config_source=source,
        max_validation_retries=retries,
    )
    # The llm_generation mode's producer, as a benchmark trial uses it.
    produced = BUILTIN.producer("llm_generation").write(request, out)
    print(
        f"model {settings.model} at {settings.base_url}: {produced['calls']} responses "
        f"({produced['cached']} from the cache)"
    )
    if not produced["valid"]:
        print(f"no valid workflow after {retries} fixes:")
        for problem in produced["problems"]:
            print(f"  {problem}")
        print(f"agent traces: {out / 'agent_traces'}")
        return 1
    nodes = json.loads((out / "workflow.json").read_text())["nodes"]
    print(f"valid workflow: {out / 'workflow.json'} ({len(nodes)} nodes)")
    print(f"run it: gap run {out} --family libero --variation object --task 0 --seed 0")
    return 0


def add(subparsers: argparse._SubParsersAction) -> None:
    """`gap run` and `gap generate`."""
    run = subparsers.add_parser("run", help="run one trial of a workflow and print the outcome")
    run.add_argument(
        "workflow", nargs="?", help="workflow directory (holding workflow.json); or --template"
    )
    run.add_argument(
        "--template", help="run a template shipped with pytest-gap (policy_only, llm_plus_policy)"
    )
    run.add_argument(
        "--backend", default="libero", help="simulator backend: a name or module:Class"
    )
    run.add_argument("--family", required=True, help="the benchmark family (gap families)")
    run.add_argument("--variation", required=True, help="the family's variation (gap families)")
    run.add_argument("--task", type=int, required=True, help="the task's index in its suite")
    run.add_argument(
        "--seed", type=int, required=True, help="the init state (seed mod its count) and jitter"
    )
    run.add_argument("--video", help="write an mp4 of the episode here")
    run.add_argument("--wrist", action="store_true", help="add the wrist camera to the video")
    run.add_argument("--trace-dir", help="where trace/dag_trace.json goes")
    run.add_argument("--images", action="store_true", help="keep perception images in the trace")
    run.add_argument(
        "--perception",
        choices=get_args(Perception),
        default="privileged",
        help="what the skills see with (skills.perception): policy_cameras is front + wrist "
        "camera only, no goal check",
    )
    run.add_argument(
        "--set",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="fill a {{placeholder}} (target and container come from the instruction)",
    )
    run.set_defaults(func=_cmd_run)
    generate = subparsers.add_parser("generate", help="have the LLM write a workflow for a prompt")
    generate.add_argument(
        "prompt", help='the task, e.g. "pick up the milk and place it in the basket"'
    )
    generate.add_argument("--out", required=True, help="workflow directory to write")
    generate.add_argument("--config", help="benchmark YAML whose llm: block to use")
    generate.add_argument("--model", help="override llm.model")
    generate.add_argument("--endpoint", help="an OpenAI-compatible base url (vLLM, ollama)")
    generate.add_argument(
        "--set", action="append", default=[], metavar="KEY=VALUE", help="an objects: hint"
    )
    generate.set_defaults(func=_cmd_generate)
