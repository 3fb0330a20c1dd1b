"""The `gap` command line."""

from __future__ import annotations

import argparse
import contextlib
import sys
from typing import get_args

from pytest_gap.config import Perception
from pytest_gap.errors import GapError

MAX_MESSAGE_MB = 64.0  # server.DEFAULT_MAX_MESSAGE_MB (not imported: parsing stays light)


def _cmd_suites(args: argparse.Namespace) -> int:
    from pytest_gap.sim.backend import get_backend

    backend = get_backend(args.backend)
    if args.suite:
        name = args.suite
        n_tasks = backend.n_tasks(name)
        print(f"{name}: {n_tasks} tasks, max_steps {backend.max_steps(name)}")
        for task_id in range(n_tasks):
            n_init = backend.n_init_states(name, task_id)
            print(f"  {task_id:3d}  {n_init:3d} init states  {backend.task_prompt(name, task_id)}")
        return 0
    for name in backend.suites():
        print(f"{name:45s} {backend.n_tasks(name):3d} tasks  max_steps {backend.max_steps(name)}")
    for name, why in backend.unavailable().items():
        print(f"{name:45s} not usable: {why}")
    return 0


def _cmd_families(args: argparse.Namespace) -> int:
    from pytest_gap.sim.backend import get_backend

    for name, family in get_backend(args.backend).families().items():
        for variation in family.variations():
            print(f"{name + '/' + variation:45s} -> {family.resolve(variation).suite}")
    return 0


def _cmd_verify_harness(args: argparse.Namespace) -> int:
    """Check every claim the vla-eval backend makes about vla-eval internals (claims.py):
    0 all hold, 1 one broke, 2 no vla-eval to check."""
    from pytest_gap.sim.vla_eval.claims import HarnessNotFound, package_dir, verify, version_of

    try:
        root = package_dir(args.source)
    except HarnessNotFound as exc:
        print(f"gap verify-harness: {exc}", file=sys.stderr)
        return 2
    where = "installed" if args.source is None else "source checkout"
    print(f"Verifying harness claims against {where} vla-eval {version_of(root)} ({root})\n")
    verdicts = verify(root)
    width = max(len(v.claim.name) for v in verdicts)
    for v in verdicts:
        mark = "[ok  ]" if v.ok else "[FAIL]"
        found = f"found in {v.where}" if v.ok else f"broken in {v.claim.file}: {v.where}"
        print(f"  {mark} {v.claim.name:{width}s}  {v.claim.statement}")
        print(f"         {'':{width}s}  {found}")
        if not v.ok:
            print(f"         {'':{width}s}  holds up: {v.claim.holds_up}")
    broken = [v for v in verdicts if not v.ok]
    if broken:
        print(
            f"\n{len(broken)} of {len(verdicts)} claims broke: the vla-eval backend is not safe "
            "with this vla-eval; pin vla-eval==0.8.0 or update pytest_gap/sim/vla_eval/."
        )
        return 1
    print(f"\nAll {len(verdicts)} claims hold.")
    return 0


def _cmd_skills(args: argparse.Namespace) -> int:
    import json

    from pytest_gap.skills.catalogue import catalogue

    if args.config:  # its skills.packages join the catalogue (installed packages always do)
        from pytest_gap.config import load_config

        load_config(args.config)
    entries = catalogue()
    if args.json:
        print(json.dumps(entries, indent=1))
        return 0
    for entry in entries:
        inputs = ", ".join(entry["inputs"].get("properties", {}))
        print(f"{entry['name']}({inputs})  {entry['description']}")
    return 0


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
    """One trial through the harness's own trial code (runner.TrialRun): the env from the
    backend, the workflow from the prebuilt producer (placeholders: the instruction's, then
    --set), execution. Its run dir is temporary; the trace and video go where the flags say.
    Exit 0 on success, 1 on a failed workflow or a harness fault (traceback on stderr), 2 for
    an input to fix."""
    import tempfile
    from pathlib import Path

    from pytest_gap.plan import Cell, Trial
    from pytest_gap.run.trial import TrialRun
    from pytest_gap.sim.backend import get_backend, resolve_variation
    from pytest_gap.sim.pool import EnvPool

    source = _run_source(args)
    variation = resolve_variation(get_backend(args.backend), args.family, args.variation)
    trace_dir = Path(
        args.trace_dir
        or f"gap_runs/{source.name}_{args.family}_{args.variation}"
        f"_task{args.task:02d}_seed{args.seed:03d}/trace"
    )
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
            crash = Path(tmp) / trial.key / "error.txt"
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


def _cmd_benchmark(args: argparse.Namespace) -> int:
    """Exit 0 success (gate PASS), 1 run exception, gate FAIL or a service the preflight found
    down (gate or not: the cells that need it errored without running), 2 config problem."""
    from pytest_gap.benchmark import BenchmarkRunError, run

    if args.ray and args.n:
        raise GapError("--ray runs the trials on Ray actors, -n on xdist workers: drop one of them")
    try:
        summary = run(
            args.config,
            gate=args.gate,
            resume=args.resume,
            families=args.families,
            modes=args.modes,
            output_dir=args.output_dir,
            workers=args.n,
            ray=args.ray,
            shard=args.shard,
            verbose=args.verbose,
        )
    except BenchmarkRunError as exc:
        print(f"gap: error: {exc}", file=sys.stderr)
        return 1
    print(f"run dir: {summary.run_dir}")
    print(summary.gate_line)
    _print_errored_cells(summary.cells, summary.services_down)
    return 0 if summary.ok else 1  # ok: the gate (gated) or a finished session, no service down


def _print_errored_cells(cells, services_down: dict[str, str]) -> None:
    """Why cells errored (a policy server that did not start, an LLM that did not answer): one
    line per reason, naming its cells, so the gate's "errored cells" is never the last word.
    A service found down is said once: in its cells' line (the reason names the url and the
    fix), or on a line of its own when no cell recorded here carries it."""
    reasons: dict[str, list[str]] = {}
    for cell in cells:
        if cell.error:
            reasons.setdefault(" ".join(cell.error.split()), []).append(f"{cell.row} {cell.column}")
    for why, names in reasons.items():
        print(f"gap: errored {', '.join(names)}: {why}", file=sys.stderr)
    for why in (" ".join(w.split()) for w in services_down.values()):
        if not any(why in reason for reason in reasons):
            print(f"gap: error: {why}", file=sys.stderr)


def _cmd_generate(args: argparse.Namespace) -> int:
    """Exit 0 with a valid workflow, 1 when the model wrote none, 2 for a config problem."""
    import json
    import shutil
    from pathlib import Path

    from pytest_gap.config import LLMConfig, load_config
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


def _cmd_schema(args: argparse.Namespace) -> int:
    import json

    from pytest_gap.config import json_schema

    print(json.dumps(json_schema(), indent=1))
    return 0


def _cmd_compare(args: argparse.Namespace) -> int:
    """Exit 0 B not significantly worse than A, 1 it is (after Holm), 2 the comparison cannot be
    made (each reason one line) or an input to fix."""
    import json
    from pathlib import Path

    from pytest_gap.compare import CompareRefused, compare, load_run, render

    if len(args.runs) > 2:
        raise GapError(
            f"gap compare: give one run dir (with --a and --b) or two, not {len(args.runs)}"
        )
    paths = list(dict.fromkeys(Path(r).resolve() for r in args.runs))  # RUN RUN: one run
    run_a = load_run(args.runs[0])
    run_b = load_run(args.runs[1]) if len(paths) == 2 else None
    try:
        result = compare(
            run_a,
            run_b,
            args.a,
            args.b,
            allow_harness_mismatch=args.allow_harness_mismatch,
            alpha=args.alpha,
        )
    except CompareRefused as exc:
        if args.json:
            print(json.dumps({"refused": exc.reasons, "exit_code": 2}, indent=1))
        for reason in exc.reasons:
            print(f"gap compare: refused: {reason}", file=sys.stderr)
        return 2
    if args.json:
        print(json.dumps(result.to_json(), indent=1))
    else:
        print(render(result, markdown=args.markdown))
    return result.exit_code


def _cmd_merge(args: argparse.Namespace) -> int:
    """Exit 0 the merged run's gate passes, 1 it does not, 2 the merge was refused (one line:
    different plans, missing trials without --allow-partial, an --out that is not new)."""
    from pathlib import Path

    from pytest_gap.scale.merge import SHOWN
    from pytest_gap.scale.merge_session import merge

    outcome = merge(
        [Path(r) for r in args.runs],
        Path(args.out),
        config=Path(args.config) if args.config else None,
        allow_partial=args.allow_partial,
    )
    shards = f" (shards {', '.join(outcome.shards)})" if outcome.shards else ""
    print(f"merged {len(outcome.inputs)} run dirs{shards} into {outcome.out}")
    print(f"trials: {outcome.merged} of {outcome.planned} planned have a record")
    if outcome.duplicates:
        print(f"duplicates: {len(outcome.duplicates)} trials recorded in more than one input")
        for dup in outcome.duplicates[:SHOWN]:
            print(f"  {dup.trial}: kept {dup.kept} ({dup.rule})")
        if len(outcome.duplicates) > SHOWN:
            print(f"  ... (+{len(outcome.duplicates) - SHOWN} more: run_manifest.json merged_from)")
    if outcome.not_planned:
        print(f"left out: {outcome.not_planned} records of trials this plan does not have")
    for note in outcome.notes:
        print(f"gap: {note}", file=sys.stderr)
    print(outcome.gate_line)
    return 0 if outcome.passed else 1


def _cmd_viz(args: argparse.Namespace) -> int:
    """Write the HTML report (exit 0, its path printed) or serve it until interrupted."""
    from pathlib import Path

    from pytest_gap.viz.model import check_run_dir

    if len(args.runs) > 2:
        raise GapError(f"gap viz: give one run dir, or two to compare, not {len(args.runs)}")
    runs = [Path(r) for r in args.runs]
    for run in runs:
        check_run_dir(run)
    run, against = runs[-1], (runs[0] if len(runs) == 2 else None)
    if args.serve:
        from pytest_gap.viz.serve import make_server

        server = make_server(run, args.port, against=against)
        host, port = server.server_address[:2]
        print(f"gap viz: serving {run} at http://{host}:{port}/ (Ctrl-C stops)", flush=True)
        with contextlib.suppress(KeyboardInterrupt):
            server.serve_forever()
        server.server_close()
        return 0
    from pytest_gap.viz.html import write_report

    print(write_report(run, Path(args.out) if args.out else None, against=against))
    return 0


def _token(args: argparse.Namespace) -> str | None:
    """The bearer token from --token-file, else the GAP_TOKEN environment variable (never a
    command-line value: it would show in `ps`). GAP_TOKEN leaves the environment as it is read,
    whichever is used: no process started from here inherits it."""
    from pathlib import Path

    from pytest_gap.doors import read_secret, take_env
    from pytest_gap.service.protocol import TOKEN_ENV

    from_env = take_env(TOKEN_ENV)
    if not getattr(args, "token_file", None):
        return from_env
    return read_secret(Path(args.token_file), f"--token-file {args.token_file}")


def _client_token(args: argparse.Namespace, url: str) -> str | None:
    """_token, else the token `gap serve` on this machine wrote for the url's port."""
    from pytest_gap.service.client import local_token

    return _token(args) or local_token(url)


def _run_secret(args: argparse.Namespace) -> str | None:
    """--run-secret-file, else GAP_RUN_SECRET (taken out of the environment), else the secret
    `gap submit` kept on this machine for the server and run id."""
    from pathlib import Path

    from pytest_gap.doors import read_secret, take_env
    from pytest_gap.service.client import stored_run_secret
    from pytest_gap.service.protocol import RUN_SECRET_ENV

    from_env = take_env(RUN_SECRET_ENV)
    if args.run_secret_file:
        return read_secret(Path(args.run_secret_file), f"--run-secret-file {args.run_secret_file}")
    return from_env or stored_run_secret(args.url, args.run_id)


def _serve_token(args: argparse.Namespace) -> tuple[str | None, bool]:
    """(the server's token, whether it was made here): --token-file or GAP_TOKEN as given,
    none with --no-token, else a new one."""
    from pytest_gap.doors import new_secret

    given = _token(args)
    if args.no_token:
        if given:
            raise GapError("--no-token: drop --token-file and GAP_TOKEN, or drop --no-token")
        return None, False
    return (given, False) if given else (new_secret(), True)


def _cmd_serve(args: argparse.Namespace) -> int:
    import asyncio
    import logging
    import signal
    from pathlib import Path

    from pytest_gap.doors import (
        remove_secret,
        run_secret_path,
        server_token_path,
        take_env,
        write_secret,
    )
    from pytest_gap.service.protocol import RUN_SECRET_ENV
    from pytest_gap.service.runs import load_splits, register
    from pytest_gap.service.server import EvalServer

    logging.basicConfig(level=logging.INFO, format="gap serve: %(message)s")
    logging.getLogger("websockets").setLevel(logging.WARNING)  # not a line per connection
    splits = load_splits(Path(args.splits)) if args.splits else None
    if bool(args.config) != bool(args.run_id):
        raise GapError("gap serve: give --config and --run-id together (the operator's run)")
    token, made = _serve_token(args)
    # The operator's run's secret: chosen by whoever started this server (gap online hands it
    # to the task's owner), else made here and written where `gap eval` looks for it.
    chosen = take_env(RUN_SECRET_ENV) if args.config else None
    registered = None
    if args.config:  # the operator's config: trusted, and by a door no client has
        registered = register(
            Path(args.runs_dir).resolve(), args.run_id, Path(args.config), splits, chosen
        )
        print(f"gap serve: {registered.message}", flush=True)
    server = EvalServer(
        Path(args.runs_dir), host=args.host, port=args.port, token=token, splits=splits
    )
    written: list[Path] = []

    async def main() -> None:
        started = asyncio.get_running_loop().create_future()
        task = asyncio.create_task(server.serve(started))
        asyncio.get_running_loop().add_signal_handler(signal.SIGTERM, task.cancel)
        await asyncio.wait({started, task}, return_when=asyncio.FIRST_COMPLETED)
        if not started.done():  # it never listened (the port is taken)
            try:
                task.result()
            except OSError as exc:
                raise GapError(f"--port {args.port}: cannot listen: {exc.strerror}") from None
        port = started.result()
        if token is None:
            logging.warning(
                "--no-token: anyone who can reach port %d can submit runs and attach to them; "
                "drop --no-token to have a token made",
                port,
            )
        elif made:  # written once the port is known: a port already taken overwrites nothing
            written.append(write_secret(server_token_path(port), token))
            print(f"gap serve: token in {written[-1]} (local gap submit/eval/status read it)")
        if registered is not None and registered.run_secret and not chosen:
            where = run_secret_path(args.host, port, args.run_id)
            write_secret(where, registered.run_secret)
            print(f"gap serve: run {args.run_id}'s secret in {where}", flush=True)
        print(f"gap serve: http://{args.host}:{port}/ runs in {server.runs_dir}", flush=True)
        with contextlib.suppress(asyncio.CancelledError):
            await task

    try:
        with contextlib.suppress(KeyboardInterrupt):
            asyncio.run(main())
    finally:
        for path in written:  # a stopped server's token opens nothing
            remove_secret(path, token)
    return 0


def _cmd_submit(args: argparse.Namespace) -> int:
    """Prints the outcome; the run secret goes to a 0600 file of this user's (its path printed)
    or, with --json, to stdout alone."""
    import json
    from pathlib import Path

    from pytest_gap.service.client import run_secret_file, store_run_secret, submit

    url = f"{args.host}:{args.port}"
    done = submit(url, Path(args.config), args.run_id, _client_token(args, url))
    if args.json:
        print(json.dumps(done.model_dump(mode="json")))
        return 0
    if done.run_secret:
        path = store_run_secret(url, args.run_id, done.run_secret)
        print(f"{done.message}; run secret in {path} (gap eval on this machine reads it)")
    else:
        kept = run_secret_file(url, args.run_id)
        print(done.message + (f"; run secret in {kept}" if kept.is_file() else ""))
    return 0


def _cmd_status(args: argparse.Namespace) -> int:
    import json

    from pytest_gap.service.client import run_status

    status = run_status(args.url, args.run_id, _client_token(args, args.url))
    if args.json:
        print(json.dumps(status.model_dump(mode="json"), indent=1))
        return 0
    print(
        f"run {status.run_id}: {status.state}; {status.saved}/{status.expected} episodes saved, "
        f"{status.in_progress} in progress, {status.remaining} remaining"
        + (f", {status.infra_failures} handed out again" if status.infra_failures else "")
        + (f", {status.given_up} given up (missing)" if status.given_up else "")
        + (f", {status.smoke_episodes} smoke (not scored)" if status.smoke_episodes else "")
    )
    for w in status.workers:
        doing = f", running {w.current}" if w.current else ""
        smoke = " [smoke]" if w.smoke else ""
        print(f"  worker {w.worker_id}{smoke}: {w.state} ({w.host}), {w.episodes_done} done{doing}")
    if status.gate:
        print(status.gate)
    return 0


def _run_id(text: str) -> str:
    from pytest_gap.service.protocol import check_run_id

    try:
        return check_run_id(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def _worker_ids(text: str) -> list[int]:
    try:
        ids = [int(x) for x in text.split(",") if x.strip()]
    except ValueError:
        ids = []
    if not ids or any(i < 0 for i in ids) or len(set(ids)) != len(ids):
        raise argparse.ArgumentTypeError(
            f"{text!r}: give distinct worker ids >= 0, comma-separated (e.g. 0,1)"
        )
    return ids


def _cmd_eval(args: argparse.Namespace) -> int:
    """One process per worker id (as EBench's clients): several ids start one `gap eval` each.
    Exit 0 when the run finished with every episode saved, 1 when episodes are missing."""
    import subprocess

    from pytest_gap.service.client import FAKE_REPLY, EvalClient, policy_act, run_status

    if args.policy is None and not args.fake_actions:
        raise GapError(
            "gap eval: give --policy ws://HOST:PORT (the model server), or --fake-actions"
        )
    token, run_secret = _client_token(args, args.url), _run_secret(args)
    if len(args.worker_ids) > 1:
        import os

        from pytest_gap.service.protocol import RUN_SECRET_ENV, TOKEN_ENV

        base = [sys.executable, "-m", "pytest_gap.cli", "eval", "--url", args.url]
        base += ["--run-id", args.run_id, "--protocol", args.protocol]
        base += ["--policy", args.policy] if args.policy else ["--fake-actions"]
        # The secrets this process holds go to its workers the way it took them: not argv.
        secrets_env = {TOKEN_ENV: token or "", RUN_SECRET_ENV: run_secret or ""}
        env = {**os.environ, **{k: v for k, v in secrets_env.items() if v}}
        children = [
            subprocess.Popen([*base, "--worker-ids", str(worker)], env=env)
            for worker in args.worker_ids
        ]
        return max(child.wait() for child in children)
    (worker,) = args.worker_ids
    if args.fake_actions:
        act, metadata = (lambda obs: FAKE_REPLY), {}
    else:
        act, metadata = policy_act(args.policy, args.protocol)
    client = EvalClient(
        args.url,
        args.run_id,
        worker,
        token=token,
        smoke=args.fake_actions,
        metadata=metadata,
        run_secret=run_secret,
    )
    finished = client.run(act)
    if args.fake_actions:
        print(
            f"worker {worker}: smoke episode answered ({client.answered} observations); not scored"
        )
        return 0
    status = run_status(args.url, args.run_id, token)
    print(
        f"worker {worker}: answered {client.answered} observations; run {args.run_id} "
        f"{status.state}, {status.saved}/{status.expected} episodes saved"
    )
    if finished.get("saved", 0) < finished.get("expected", 0) and status.saved < status.expected:
        print(
            f"gap eval: run {args.run_id} ended with {status.expected - status.saved} episodes "
            "missing",
            file=sys.stderr,
        )
        return 1
    return 0


def _cmd_online_serve(args: argparse.Namespace) -> int:
    import logging
    import signal
    import threading
    from pathlib import Path

    from pytest_gap.service.online import make_platform_server
    from pytest_gap.service.platform import Limits, Platform, load_sets, load_tokens

    logging.basicConfig(level=logging.INFO, format="gap online: %(message)s")
    given = {name: getattr(args, name, None) for name in Limits.model_fields}
    limits = Limits(**{name: value for name, value in given.items() if value is not None})
    platform = Platform(
        Path(args.runs_dir),
        load_sets(Path(args.sets)),
        load_tokens(Path(args.tokens)),
        args.capacity,
        limits,
    )
    server = make_platform_server(platform, args.host, args.port)
    watcher = threading.Thread(target=platform.watch, daemon=True)
    watcher.start()
    host, port = server.server_address[:2]
    print(f"gap online: http://{host}:{port}/ capacity {args.capacity}", flush=True)
    # SIGTERM (a supervisor, `kill`) stops it as Ctrl-C does: its task servers go with it
    signal.signal(signal.SIGTERM, lambda *_: threading.Thread(target=server.shutdown).start())
    try:
        with contextlib.suppress(KeyboardInterrupt):
            server.serve_forever()
    finally:
        platform.stop()
        server.server_close()
    return 0


def _online_token(args: argparse.Namespace) -> str:
    token = args.token or _token(args)
    if not token:
        raise GapError("give the platform token: --token T or --token-file F")
    return token


def _ready_json(task: dict) -> dict:
    """What a ready task's client needs: where to attach, as which run, with which secret."""
    keys = ("task_id", "endpoint", "run_secret")
    return {k: task.get(k) for k in keys}


def _cmd_online_submit(args: argparse.Namespace) -> int:
    """Exit 0 ready (its endpoint printed), 1 still queued when --timeout ran out, 2 refused."""
    import json
    import time

    from pytest_gap.service.client import online_submit, online_task

    token = _online_token(args)
    task = online_submit(
        args.base_url, token, args.model_name, args.benchmark_set, args.idempotency_key
    )
    deadline = time.monotonic() + args.timeout
    while task["state"] == "queued" and time.monotonic() < deadline:
        time.sleep(1.0)
        task = online_task(args.base_url, token, task["task_id"])
    if task["state"] == "ready":
        if args.print_endpoint:
            print(json.dumps(_ready_json(task)))
        else:
            print(f"task {task['task_id']} ready: {task['endpoint']}")
        return 0
    if task["state"] == "queued":
        print(
            f"task {task['task_id']} is still queued after {args.timeout:g} s; it may still "
            f"run: check with `gap online ready --task-id {task['task_id']}` (do not submit "
            "again)",
            file=sys.stderr,
        )
        return 1
    raise GapError(f"task {task['task_id']} is {task['state']}: {task.get('error')}")


def _cmd_online_ready(args: argparse.Namespace) -> int:
    """Exit 0 ready (endpoint JSON printed), 1 not (its state printed)."""
    import json

    from pytest_gap.service.client import online_task

    task = online_task(args.base_url, _online_token(args), args.task_id)
    if task["state"] == "ready":
        print(json.dumps(_ready_json(task)))
        return 0
    print(
        f"task {task['task_id']}: {task['state']}"
        + (f": {task['error']}" if task.get("error") else "")
    )
    return 1


def _cmd_online_status(args: argparse.Namespace) -> int:
    from pytest_gap.service.client import online_tasks

    for task in online_tasks(args.base_url, _online_token(args)):
        where = f" at {task['endpoint']}" if task.get("endpoint") else ""
        what = f"{task['model_name']} on {task['benchmark_set']}"
        print(f"{task['task_id']}  {task['state']:8s} {what}{where}")
    return 0


def _probability(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        value = -1.0
    if not 0 < value < 1:
        raise argparse.ArgumentTypeError(f"{text!r} is not a probability between 0 and 1")
    return value


def _positive_float(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        value = -1.0
    if not 0 < value < float("inf"):
        raise argparse.ArgumentTypeError(f"{text!r} is not a positive number")
    return value


def _positive_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        value = 0
    if value < 1:
        raise argparse.ArgumentTypeError(f"{text!r} is not a whole number of 1 or more")
    return value


def _cmd_policy_serve(args: argparse.Namespace) -> int:
    from pytest_gap.policies.builtin import load_policy

    if args.config:
        return _exec_policy_entry(args)
    policy = load_policy(args.name, actions=args.actions, chunk=args.chunk)
    if (args.protocol or "openpi") == "vla-eval":
        return _serve_vla_eval(policy, args)
    from pytest_gap.policies.server import PolicyServer

    server = PolicyServer(
        policy,
        host=args.host,
        port=args.port,
        metadata={"policy": args.name},
        max_batch_size=args.max_batch_size,
        max_wait_ms=args.max_wait_ms,
        max_message_bytes=round(args.max_message_mb * 2**20),
        debug=args.debug,
    )
    print(f"serving {args.name} on ws://{args.host}:{args.port}", flush=True)
    with contextlib.suppress(KeyboardInterrupt):
        server.run()
    return 0


def _exec_policy_entry(args: argparse.Namespace) -> int:
    """Replace this process with the command of the --config entry NAME."""
    import os

    from pytest_gap.config import load_config
    from pytest_gap.doors import child_env
    from pytest_gap.policies.manager import command_for

    own = {"--protocol": args.protocol, "--actions": args.actions, "--chunk": args.chunk}
    given = [flag for flag, value in own.items() if value is not None]
    if given:
        raise GapError(
            f"{', '.join(given)}: a --config entry is served by its own command; give such "
            "options in that command"
        )
    entries = load_config(args.config).policies
    if args.name not in entries:
        known = ", ".join(entries) or "none"
        raise GapError(f"{args.config}: policies has no entry {args.name!r} (it has {known})")
    entry = entries[args.name]
    if entry.url is not None:
        raise GapError(
            f"{args.config}: policies.{args.name} is external (url: {entry.url}); start "
            "that server where it lives"
        )
    argv, cwd = command_for(args.name, entry, args.port)
    print(f"serving {args.name}: {' '.join(argv)}", flush=True)
    if cwd is not None:
        os.chdir(cwd)
    # The environment a session gives this entry's server (doors.child_env): by hand or
    # managed, the server sees the same variables.
    os.execvpe(argv[0], argv, child_env(entry.env))


def _serve_vla_eval(policy, args: argparse.Namespace) -> int:
    """Serve over vla-eval's protocol with vla-eval's own server; the openpi server's options
    it has no counterpart for are refused rather than ignored."""
    from pytest_gap.policies.vla_eval_server import model_server, serve

    unsupported = [
        flag
        for flag, given in (
            ("--max-batch-size", args.max_batch_size != 1),
            ("--max-message-mb", args.max_message_mb != MAX_MESSAGE_MB),
            ("--debug", args.debug),
        )
        if given
    ]
    if unsupported:
        raise GapError(
            f"{', '.join(unsupported)}: for --protocol openpi only; vla-eval's own server has "
            "no such option (drop it, or serve with --protocol openpi)"
        )
    server = model_server(policy, args.name)  # refuses a policy vla-eval cannot serve
    print(f"serving {args.name} on ws://{args.host}:{args.port} (vla-eval protocol)", flush=True)
    with contextlib.suppress(KeyboardInterrupt):
        serve(server, args.host, args.port)
    return 0


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="gap", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)
    suites = sub.add_parser("suites", help="list LIBERO / LIBERO-PRO suites, or one suite's tasks")
    suites.add_argument("suite", nargs="?")
    families = sub.add_parser("families", help="list benchmark families and their variations")
    for listing, func in ((suites, _cmd_suites), (families, _cmd_families)):
        listing.add_argument(
            "--backend", default="libero", help="simulator backend: a name or module:Class"
        )
        listing.set_defaults(func=func)
    skills = sub.add_parser("skills", help="list the skills a workflow can call")
    skills.add_argument("--json", action="store_true", help="the machine-readable catalogue")
    skills.add_argument(
        "config", nargs="?", help="a benchmark YAML: list its skills.packages' skills too"
    )
    skills.set_defaults(func=_cmd_skills)
    run = sub.add_parser("run", help="run one trial of a workflow and print the outcome")
    run.add_argument(
        "workflow", nargs="?", help="workflow directory (holding workflow.json); or --template"
    )
    run.add_argument(
        "--template", help="run a template shipped with pytest-gap (policy_only, llm_plus_policy)"
    )
    run.add_argument(
        "--backend", default="libero", help="simulator backend: a name or module:Class"
    )
    run.add_argument("--family", required=True)
    run.add_argument("--variation", required=True)
    run.add_argument("--task", type=int, required=True)
    run.add_argument("--seed", type=int, required=True)
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
    bench = sub.add_parser("benchmark", help="run a benchmark config (pytest on it) and gate it")
    bench.add_argument("config", help="benchmark YAML (grid or suites shape)")
    bench.add_argument("--gate", action="store_true", help="exit 1 unless the gate passes")
    bench.add_argument("--resume", action="store_true", help="reuse the latest run dir")
    bench.add_argument("--families", nargs="+", help="only these families (grid configs)")
    bench.add_argument("--modes", nargs="+", help="only these modes (grid configs)")
    bench.add_argument("--output-dir", help="write the run dir here instead of the config's")
    bench.add_argument(
        "-n", type=int, help="parallel trial workers (default: the config's num_workers)"
    )
    bench.add_argument(
        "--ray",
        metavar="auto|ADDRESS",
        help="run the trials on a Ray cluster (pytest --gap-ray; not with -n)",
    )
    bench.add_argument(
        "--shard",
        metavar="K/N",
        help="run shard K of N of the plan (pytest --gap-shard); put the N run dirs together "
        "with gap merge",
    )
    bench.add_argument("-v", "--verbose", action="store_true", help="verbose pytest output")
    bench.set_defaults(func=_cmd_benchmark)
    policy = sub.add_parser("policy", help="learned policies")
    policy_sub = policy.add_subparsers(dest="policy_command", required=True)
    serve = policy_sub.add_parser(
        "serve",
        help="serve a policy over openpi's websocket protocol (GET /healthz: 200) or "
        "vla-eval's (GET /health: 200)",
    )
    serve.add_argument(
        "name",
        help="built-in (hold, random, scripted, replay), module:Class with infer(obs), or a "
        "--config entry",
    )
    serve.add_argument("--config", help="benchmark YAML whose policies: entry NAME to serve")
    serve.add_argument("--port", type=int, required=True)
    serve.add_argument("--host", default="127.0.0.1")
    serve.add_argument(
        "--protocol",
        choices=("openpi", "vla-eval"),
        help="openpi (default): each connection is one episode; vla-eval: vla-eval's own server, "
        "one action per observation, EPISODE_START starts afresh (scripted is refused: no "
        "vla-eval benchmark sends its privileged state)",
    )
    serve.add_argument(
        "--actions",
        metavar="FILE",
        help="replay: the actions to replay, a .npy float array (N, 7) or a .json "
        '{"actions": [[7 numbers], ...]}; every episode starts at the first, and after the last '
        "the arm holds still (zero motion, the last action's gripper command)",
    )
    serve.add_argument(
        "--chunk",
        type=_positive_int,
        metavar="N",
        help="replay: actions per reply over openpi (default 5); an exact replay needs N equal "
        "to the client's replan_every (run_policy's and openpi's LIBERO client's default: 5)",
    )
    serve.add_argument(
        "--max-batch-size",
        type=int,
        default=1,
        help="batch observations across connections (needs the policy's infer_batch)",
    )
    serve.add_argument("--max-wait-ms", type=float, default=5.0, help="batch collection window")
    serve.add_argument(
        "--max-message-mb",
        type=_positive_float,
        default=MAX_MESSAGE_MB,
        help="refuse incoming messages over this size (MiB; default 64), with close code 1009",
    )
    serve.add_argument(
        "--debug",
        action="store_true",
        help="send the traceback on a failure (default: one line, the exception and message)",
    )
    serve.set_defaults(func=_cmd_policy_serve)
    generate = sub.add_parser("generate", help="have the LLM write a workflow for a prompt")
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
    verify = sub.add_parser(
        "verify-harness",
        help="check the vla-eval backend's assumptions about vla-eval (exit 0 ok, 1 broke, "
        "2 vla-eval not importable)",
    )
    verify.add_argument(
        "source", nargs="?", help="a vla-eval source checkout (default: the installed vla-eval)"
    )
    verify.set_defaults(func=_cmd_verify_harness)
    comp = sub.add_parser(
        "compare",
        help="paired comparison of two rows (B against A): exit 0 B not worse, 1 B significantly "
        "worse, 2 cannot compare",
    )
    comp.add_argument(
        "runs", nargs="+", metavar="RUN", help="a run dir (two rows: --a, --b) or two run dirs"
    )
    comp.add_argument(
        "--a", metavar="ROW", help="row A as the pivot labels it, e.g. policy_only@base"
    )
    comp.add_argument("--b", metavar="ROW", help="row B, e.g. policy_only@candidate")
    comp.add_argument(
        "--allow-harness-mismatch",
        action="store_true",
        help="compare even when the harness_surface differs (the changed files are listed)",
    )
    comp.add_argument(
        "--alpha", type=_probability, default=0.05, help="significance level (default 0.05)"
    )
    output = comp.add_mutually_exclusive_group()
    output.add_argument("--json", action="store_true", help="machine-readable output")
    output.add_argument("--markdown", action="store_true", help="a Markdown table (PR comment)")
    comp.set_defaults(func=_cmd_compare)
    serve = sub.add_parser("serve", help="the evaluation server: remote policy clients attach")
    serve.add_argument("--host", default="127.0.0.1", help="default 127.0.0.1 (loopback only)")
    serve.add_argument("--port", type=int, default=8765)
    serve.add_argument("--runs-dir", default="service_runs", help="where runs are kept")
    serve.add_argument(
        "--token-file",
        help="a file holding the bearer token clients must send (default: GAP_TOKEN, else a "
        "new token written to a 0600 file whose path is printed)",
    )
    serve.add_argument(
        "--no-token", action="store_true", help="no token at all: anyone who reaches the port"
    )
    serve.add_argument(
        "--splits",
        help="YAML {val_train|val_unseen|test: {seeds: [...], task_ids, max_steps, template}}: "
        "the server's splits (what a run of one measures)",
    )
    serve.add_argument(
        "--config",
        help="the operator's own benchmark YAML, scheduled under --run-id before serving "
        "(trusted as a config file is; submissions are held to the remote profile)",
    )
    serve.add_argument("--run-id", type=_run_id, help="the run id of --config")
    serve.set_defaults(func=_cmd_serve)
    submit = sub.add_parser("submit", help="schedule a config's trials on an evaluation server")
    submit.add_argument("config", help="a benchmark YAML (modes: [policy_only], one policy)")
    submit.add_argument("--run-id", required=True, type=_run_id)
    submit.add_argument("--host", default="127.0.0.1")
    submit.add_argument("--port", type=int, default=8765)
    submit.add_argument("--token-file")
    submit.add_argument(
        "--json", action="store_true", help="print the answer, run secret included, as JSON"
    )
    submit.set_defaults(func=_cmd_submit)
    evaluate = sub.add_parser("eval", help="attach a policy to a run on an evaluation server")
    evaluate.add_argument("--url", required=True, help="the evaluation server, http://HOST:PORT")
    evaluate.add_argument("--run-id", required=True, type=_run_id)
    evaluate.add_argument(
        "--worker-ids", type=_worker_ids, default=[0], help="e.g. 0,1: one process each"
    )
    evaluate.add_argument("--policy", help="the model server the client asks, ws://HOST:PORT")
    evaluate.add_argument("--protocol", choices=["openpi", "vla-eval"], default="openpi")
    evaluate.add_argument(
        "--fake-actions",
        action="store_true",
        help="a connectivity smoke with a fixed action: one episode, never scored",
    )
    evaluate.add_argument("--token-file")
    evaluate.add_argument(
        "--run-secret-file",
        help="a file holding the run's secret (default: GAP_RUN_SECRET, else where gap submit "
        "wrote it on this machine)",
    )
    evaluate.set_defaults(func=_cmd_eval)
    status = sub.add_parser("status", help="where a run on an evaluation server stands")
    status.add_argument("--url", required=True)
    status.add_argument("--run-id", required=True, type=_run_id)
    status.add_argument("--token-file")
    status.add_argument("--json", action="store_true")
    status.set_defaults(func=_cmd_status)
    online = sub.add_parser("online", help="the online platform: queued evaluation tasks")
    online_sub = online.add_subparsers(dest="online_command", required=True)
    oserve = online_sub.add_parser("serve", help="take tasks; start evaluation servers for them")
    oserve.add_argument("--host", default="127.0.0.1")
    oserve.add_argument("--port", type=int, default=8780)
    oserve.add_argument("--runs-dir", default="online_runs")
    oserve.add_argument("--sets", required=True, help="YAML {benchmark set: config path}")
    oserve.add_argument("--tokens", required=True, help="a file of `TOKEN OWNER` lines")
    oserve.add_argument("--capacity", type=int, default=1, help="evaluation servers at once")
    for name, kind, text in (  # unset: service.online.Limits' defaults
        ("max_tasks_per_owner", _positive_int, "tasks queued or ready per token (default 4)"),
        ("max_queued", _positive_int, "tasks queued, all owners (default 32)"),
        ("attach_timeout_s", _positive_float, "a ready task nobody attaches to ends (300)"),
        ("request_timeout_s", _positive_float, "a connection idle this long is closed (10)"),
    ):
        oserve.add_argument("--" + name.replace("_", "-"), type=kind, help=text)
    oserve.set_defaults(func=_cmd_online_serve)
    for name, func, text in (
        ("submit", _cmd_online_submit, "create a task and wait until it is ready"),
        ("ready", _cmd_online_ready, "is a task ready? its endpoint if so"),
        ("status", _cmd_online_status, "your tasks and their states"),
    ):
        cmd = online_sub.add_parser(name, help=text)
        cmd.add_argument("--base-url", required=True, help="the platform, http://HOST:PORT")
        cmd.add_argument("--token", help="your platform token (or --token-file)")
        cmd.add_argument("--token-file")
        if name == "submit":
            cmd.add_argument("--model-name", required=True)
            cmd.add_argument("--benchmark-set", required=True)
            cmd.add_argument("--timeout", type=_positive_float, default=600.0)
            cmd.add_argument("--print-endpoint", action="store_true")
            cmd.add_argument("--idempotency-key", help="a retried submit with it never duplicates")
        if name == "ready":
            cmd.add_argument("--task-id", required=True)
        cmd.set_defaults(func=func)
    viz = sub.add_parser(
        "viz",
        help="an HTML report of a run dir (RUN_A RUN_B: of RUN_B, compared with RUN_A)",
    )
    viz.add_argument("runs", nargs="+", metavar="RUN", help="a run dir, or two to compare")
    viz.add_argument("--out", help="where to write the report (default: RUN/report.html)")
    viz.add_argument("--serve", action="store_true", help="serve it on loopback instead")
    viz.add_argument("--port", type=int, default=0, help="--serve's port (default: any free)")
    viz.set_defaults(func=_cmd_viz)
    merge = sub.add_parser(
        "merge",
        help="merge shards' run dirs (one config, one plan) into one run dir: de-duplicated, "
        "coverage checked, summaries, parquet and gate rebuilt (exit 0 gate passes, 1 fails, "
        "2 refused)",
    )
    merge.add_argument(
        "runs", nargs="+", metavar="RUN_DIR", help="run dirs, or output dirs holding them"
    )
    merge.add_argument("--out", required=True, help="the merged run dir to create (new or empty)")
    merge.add_argument(
        "--config", help="the benchmark YAML the inputs ran (default: the path they recorded)"
    )
    merge.add_argument(
        "--allow-partial",
        action="store_true",
        help="write the merge even when planned trials have no record (its gate fails on them)",
    )
    merge.set_defaults(func=_cmd_merge)
    schema = sub.add_parser("schema", help="print the benchmark YAML's JSON Schema")
    schema.set_defaults(func=_cmd_schema)
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        return args.func(args)
    except GapError as exc:
        print(f"gap: error: {exc}", file=sys.stderr)
        return 2
    except BrokenPipeError:  # `gap suites | head`: the reader left, nothing is wrong
        sys.stderr.close()
        return 0


if __name__ == "__main__":
    sys.exit(main())
