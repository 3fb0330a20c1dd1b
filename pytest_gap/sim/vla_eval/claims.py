"""What the vla-eval backend assumes about vla-eval's internals, each a named, checked claim.

The backend drives vla-eval below its public `evaluate()`: it builds one benchmark adapter per
(suite, task), runs single episodes through vla-eval's `SyncEpisodeRunner`, and talks to the
model server through vla-eval's `Connection`. Those are internals; a vla-eval release may move
them. Every such assumption is listed here and checked by `gap verify-harness`, against the
installed vla-eval or a source checkout, by reading the source (nothing is imported, so a
checkout of another version can be checked without installing it).

A claim's check returns where it found the thing (`file:line`) or raises `ClaimBroken` with
what it found instead. `holds_up` says what in the backend depends on it.
"""

from __future__ import annotations

import ast
import functools
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

PACKAGE = "vla_eval"
LIBERO_FILE = "benchmarks/libero/benchmark.py"


class ClaimBroken(Exception):
    """A claim does not hold; the message says what was found instead."""


class HarnessNotFound(Exception):
    """No vla-eval to check: not importable, or the path holds no vla_eval package."""


@dataclass(frozen=True)
class Claim:
    name: str
    statement: str
    file: str  # relative to the vla_eval package directory
    holds_up: str
    check: Callable[[Source], str]


# -- reading source ---------------------------------------------------------------------------
class Source:
    """The parsed modules of one vla_eval package directory."""

    def __init__(self, root: Path):
        self.root = root

    @functools.cache  # noqa: B019 - one Source per check run
    def module(self, rel: str) -> ast.Module:
        path = self.root / rel
        if not path.is_file():
            raise ClaimBroken(f"{rel} does not exist")
        return ast.parse(path.read_text(), filename=str(path))

    def cls(self, rel: str, name: str) -> ast.ClassDef:
        for node in self.module(rel).body:
            if isinstance(node, ast.ClassDef) and node.name == name:
                return node
        raise ClaimBroken(f"no class {name} in {rel}")

    def method(self, rel: str, cls: str, name: str) -> ast.FunctionDef | ast.AsyncFunctionDef:
        for node in self.cls(rel, cls).body:
            if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef) and node.name == name:
                return node
        raise ClaimBroken(f"no method {cls}.{name} in {rel}")

    def function(self, rel: str, name: str) -> ast.FunctionDef | ast.AsyncFunctionDef:
        for node in self.module(rel).body:
            if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef) and node.name == name:
                return node
        raise ClaimBroken(f"no function {name} in {rel}")


def _at(rel: str, node: ast.AST) -> str:
    return f"{rel}:{node.lineno}"


def _calls(node: ast.AST) -> set[str]:
    """`a.b(...)` and `f(...)` calls under node, as "a.b" / "f"."""
    found = set()
    for sub in ast.walk(node):
        if isinstance(sub, ast.Call):
            func = sub.func
            if isinstance(func, ast.Attribute) and isinstance(func.value, ast.Name):
                found.add(f"{func.value.id}.{func.attr}")
            elif isinstance(func, ast.Name):
                found.add(func.id)
    return found


def _dict_keys(node: ast.AST) -> set[str]:
    """The string keys of every dict literal under node."""
    keys = set()
    for sub in ast.walk(node):
        if isinstance(sub, ast.Dict):
            keys |= {k.value for k in sub.keys if isinstance(k, ast.Constant)}
    return keys


def _params(fn: ast.FunctionDef | ast.AsyncFunctionDef) -> tuple[list[str], list[str]]:
    args = fn.args
    return [a.arg for a in args.posonlyargs + args.args], [a.arg for a in args.kwonlyargs]


def max_step_mapping(source: Source) -> dict[str, int]:
    """vla-eval's LIBERO MAX_STEP_MAPPING, read from its source (importing the module would set
    EGL environment defaults as a side effect; the catalogue must stay cheap)."""
    for node in source.module(LIBERO_FILE).body:
        if (
            isinstance(node, ast.Assign)
            and any(isinstance(t, ast.Name) and t.id == "MAX_STEP_MAPPING" for t in node.targets)
            and isinstance(node.value, ast.Dict)
        ):
            try:
                value = ast.literal_eval(node.value)
            except ValueError:
                break
            if all(isinstance(k, str) and isinstance(v, int) for k, v in value.items()):
                return value
    raise ClaimBroken(f"no literal MAX_STEP_MAPPING {{suite: steps}} in {LIBERO_FILE}")


# -- the claims -------------------------------------------------------------------------------
def _sync_episode_loop(src: Source) -> str:
    rel = "runners/sync_runner.py"
    fn = src.method(rel, "SyncEpisodeRunner", "run_episode")
    if not isinstance(fn, ast.AsyncFunctionDef):
        raise ClaimBroken("SyncEpisodeRunner.run_episode is not async")
    positional, keyword = _params(fn)
    if positional[:4] != ["self", "benchmark", "task", "conn"] or not {
        "max_steps",
        "recorder",
    } <= set(keyword):
        raise ClaimBroken(f"run_episode{tuple(positional + keyword)}")
    needed = {
        "benchmark.start_episode",
        "benchmark.get_observation",
        "conn.start_episode",
        "conn.act",
        "benchmark.apply_action",
        "benchmark.is_done",
        "benchmark.get_result",
        "conn.end_episode",
    }
    missing = needed - _calls(fn)
    if missing:
        raise ClaimBroken(f"run_episode no longer calls {', '.join(sorted(missing))}")
    if not {"metrics", "steps"} <= _dict_keys(fn):
        raise ClaimBroken("its result is no longer {'metrics': ..., 'steps': ...}")
    return _at(rel, fn)


def _episode_idx_is_init_state(src: Source) -> str:
    fn = src.method(LIBERO_FILE, "LIBEROBenchmark", "reset")
    reads = [
        n
        for n in ast.walk(fn)
        if isinstance(n, ast.Call)
        and isinstance(n.func, ast.Attribute)
        and n.func.attr == "get"
        and isinstance(n.func.value, ast.Name)
        and n.func.value.id == "task"
        and n.args
        and isinstance(n.args[0], ast.Constant)
        and n.args[0].value == "episode_idx"
    ]
    indexes = [
        n
        for n in ast.walk(fn)
        if isinstance(n, ast.Subscript)
        and isinstance(n.value, ast.Name)
        and n.value.id == "initial_states"
        and isinstance(n.slice, ast.Name)
        and n.slice.id == "episode_idx"
    ]
    if not reads or not indexes:
        raise ClaimBroken("reset no longer indexes initial_states with task['episode_idx']")
    return _at(LIBERO_FILE, indexes[0])


def _libero_setup_skippable(src: Source) -> str:
    fn = src.method(LIBERO_FILE, "LIBEROBenchmark", "_init_libero")
    body = [
        s for s in fn.body if not (isinstance(s, ast.Expr) and isinstance(s.value, ast.Constant))
    ]
    first = body[0] if body else None
    guard = (
        isinstance(first, ast.If)
        and isinstance(first.test, ast.Compare)
        and ast.unparse(first.test) == "self._task_suite is not None"
        and len(first.body) == 1
        and isinstance(first.body[0], ast.Return)
    )
    if not guard:
        raise ClaimBroken(
            "_init_libero does not start with `if self._task_suite is not None: return`"
        )
    built = [
        n
        for n in ast.walk(fn)
        if isinstance(n, ast.Assign)
        and ast.unparse(n.targets[0]) == "self._task_suite"
        and ast.unparse(n.value) == "benchmark_dict[self.suite]()"
    ]
    if not built:
        raise ClaimBroken(
            "_init_libero no longer sets self._task_suite = benchmark_dict[self.suite]()"
        )
    return _at(LIBERO_FILE, fn)


def _task_list_is_task_ids(src: Source) -> str:
    fn = src.method(LIBERO_FILE, "LIBEROBenchmark", "get_tasks")
    loops = [
        n
        for n in ast.walk(fn)
        if isinstance(n, ast.For) and ast.unparse(n.iter) == "range(self._task_suite.n_tasks)"
    ]
    if not loops or not {"name", "task_id", "task_obj"} <= _dict_keys(fn):
        raise ClaimBroken("get_tasks() is no longer one {name, task_id, task_obj} per task id")
    language = [
        n for n in ast.walk(fn) if isinstance(n, ast.Dict) and "task.language" in ast.unparse(n)
    ]
    if not language:
        raise ClaimBroken("a task's name is no longer its LIBERO language instruction")
    return _at(LIBERO_FILE, fn)


def _success_is_result(src: Source) -> str:
    fn = src.method(LIBERO_FILE, "LIBEROBenchmark", "get_step_result")
    if "success" not in _dict_keys(fn):
        raise ClaimBroken("get_step_result() no longer returns {'success': ...}")
    return _at(LIBERO_FILE, fn)


def _max_steps_table(src: Source) -> str:
    table = max_step_mapping(src)
    fn = src.method(LIBERO_FILE, "LIBEROBenchmark", "get_metadata")
    if "max_steps" not in _dict_keys(fn) or "MAX_STEP_MAPPING" not in ast.unparse(fn):
        raise ClaimBroken("get_metadata()['max_steps'] no longer comes from MAX_STEP_MAPPING")
    return f"{LIBERO_FILE}:{fn.lineno} ({len(table)} suites)"


def _merge_observation_params(src: Source) -> str:
    rel = "orchestrator.py"
    fn = src.function(rel, "_merge_observation_params")
    positional, _ = _params(fn)
    if positional != ["benchmark_cls", "configured_params", "observation_params"]:
        raise ClaimBroken(f"_merge_observation_params{tuple(positional)}")
    inner = src.method(rel, "Orchestrator", "_run_benchmark_inner")
    if "_merge_observation_params" not in _calls(inner):
        raise ClaimBroken("the orchestrator no longer configures benchmarks through it")
    return _at(rel, fn)


def _connection_client(src: Source) -> str:
    rel = "connection.py"
    init = src.method(rel, "Connection", "__init__")
    positional, _ = _params(init)
    if positional[:4] != ["self", "url", "timeout", "max_retries"]:
        raise ClaimBroken(f"Connection{tuple(positional)}")
    connect = src.method(rel, "Connection", "connect")
    if "benchmark" not in _params(connect)[1]:
        raise ClaimBroken("Connection.connect() takes no benchmark= keyword")
    src.method(rel, "Connection", "close")
    handshake = src.method(rel, "Connection", "_hello_handshake")
    if "self.server_info = reply.payload" not in ast.unparse(handshake):
        raise ClaimBroken("the HELLO reply is no longer kept as Connection.server_info")
    return _at(rel, src.cls(rel, "Connection"))


def _steps_reach_the_recorder(src: Source) -> str:
    fn = src.method(LIBERO_FILE, "LIBEROBenchmark", "step")
    calls = [
        node
        for node in ast.walk(fn)
        if isinstance(node, ast.Call) and ast.unparse(node.func).endswith("record_step")
    ]
    if not calls:
        raise ClaimBroken("LIBEROBenchmark.step() no longer calls its recorder's record_step")
    given = {k.arg for k in calls[0].keywords}
    missing = {"reward", "done", "action", "state"} - given
    if missing:
        raise ClaimBroken(f"record_step() no longer gets {sorted(missing)}")
    run = src.method("runners/sync_runner.py", "SyncEpisodeRunner", "run_episode")
    if "recorder.is_active" not in ast.unparse(run):
        raise ClaimBroken("the loop no longer asks recorder.is_active before adding recording")
    return _at(LIBERO_FILE, fn)


def _gl_env_setdefault(src: Source) -> str:
    module = src.module(LIBERO_FILE)
    found = []
    for node in module.body:
        text = ast.unparse(node)
        if "os.environ" not in text:
            continue
        if not text.startswith("os.environ.setdefault("):
            raise ClaimBroken(f"line {node.lineno} sets the environment: {text}")
        found.append(node)
    return _at(LIBERO_FILE, found[0]) if found else f"{LIBERO_FILE} (sets nothing)"


CLAIMS: tuple[Claim, ...] = (
    Claim(
        "sync-episode-loop",
        "SyncEpisodeRunner.run_episode(benchmark, task, conn, *, max_steps, recorder) is the "
        "episode loop: start_episode, observe, act, apply_action until is_done; "
        "returns {metrics, steps}",
        "runners/sync_runner.py",
        "a trial is one call of vla-eval's own loop; success and steps come from its result",
        _sync_episode_loop,
    ),
    Claim(
        "episode-idx-is-init-state",
        "LIBEROBenchmark.reset starts from initial_states[task['episode_idx']]",
        LIBERO_FILE,
        "seed s starts from init state s mod n, the same scene as the libero backend",
        _episode_idx_is_init_state,
    ),
    Claim(
        "libero-setup-without-torch",
        "LIBEROBenchmark._init_libero returns at once when _task_suite is set; otherwise it "
        "only patches torch.load and builds benchmark_dict[suite]()",
        LIBERO_FILE,
        "the backend sets _task_suite itself, so the adapter never imports torch",
        _libero_setup_skippable,
    ),
    Claim(
        "task-list-is-task-ids",
        "LIBEROBenchmark.get_tasks()[i] is LIBERO task i, named by its language instruction",
        LIBERO_FILE,
        "task ids and prompts are the same in both backends",
        _task_list_is_task_ids,
    ),
    Claim(
        "success-is-step-result",
        "LIBEROBenchmark.get_step_result() returns {'success': env done}",
        LIBERO_FILE,
        "a trial's success is vla-eval's metrics['success']",
        _success_is_result,
    ),
    Claim(
        "max-steps-table",
        "LIBERO's step limits are the literal MAX_STEP_MAPPING, served as "
        "get_metadata()['max_steps']",
        LIBERO_FILE,
        "the catalogue's max_steps, read without importing the adapter",
        _max_steps_table,
    ),
    Claim(
        "merge-observation-params",
        "orchestrator._merge_observation_params(benchmark_cls, configured_params, "
        "observation_params) is how the orchestrator applies a server's HELLO",
        "orchestrator.py",
        "the benchmark sends what the server asked for, as vla-eval's orchestrator does",
        _merge_observation_params,
    ),
    Claim(
        "connection-client",
        "Connection(url, timeout, max_retries).connect(benchmark=...) keeps the HELLO reply "
        "in server_info",
        "connection.py",
        "trials talk to model servers through vla-eval's own client",
        _connection_client,
    ),
    Claim(
        "steps-reach-the-recorder",
        "LIBEROBenchmark.step() hands each step's reward, done, executed action and state to "
        "the episode's recorder (record_step); the loop adds recording to EPISODE_START only "
        "for a recorder that is_active",
        LIBERO_FILE,
        "a trial's per-step evidence comes from vla-eval's own adapter, its messages unchanged",
        _steps_reach_the_recorder,
    ),
    Claim(
        "gl-env-setdefault",
        "the LIBERO adapter only setdefault()s GL variables at import",
        LIBERO_FILE,
        "rendering follows pytest-gap's GL choice (sim/gl.py), made before the import",
        _gl_env_setdefault,
    ),
)


# -- running them -----------------------------------------------------------------------------
@dataclass
class Verdict:
    claim: Claim
    ok: bool
    where: str  # where it was found, or why it broke


def package_dir(path: str | Path | None = None) -> Path:
    """The vla_eval package directory: the installed one (None), or the one in `path` (the
    package itself, a checkout root holding vla_eval/ or src/vla_eval/)."""
    if path is None:
        try:
            import vla_eval
        except ImportError as exc:
            raise HarnessNotFound(
                f"vla-eval is not importable ({exc}); pip install vla-eval"
            ) from None
        return Path(vla_eval.__file__).resolve().parent
    root = Path(path).expanduser().resolve()
    for candidate in (root, root / PACKAGE, root / "src" / PACKAGE):
        if (candidate / "__init__.py").is_file() and (candidate / "runners").is_dir():
            return candidate
    raise HarnessNotFound(
        f"{root} holds no vla_eval package (looked in ., vla_eval/, src/vla_eval/)"
    )


def version_of(root: Path) -> str:
    """The version a vla_eval package directory declares (its _version.py), else 'unknown'."""
    path = root / "_version.py"
    if path.is_file():
        for node in ast.parse(path.read_text()).body:
            if isinstance(node, ast.Assign) and isinstance(node.value, ast.Constant):
                names = {ast.unparse(t) for t in node.targets}
                if "__version__" in " ".join(names):
                    return str(node.value.value)
    return "unknown"


def verify(root: Path) -> list[Verdict]:
    source = Source(root)
    verdicts = []
    for claim in CLAIMS:
        try:
            verdicts.append(Verdict(claim, True, claim.check(source)))
        except ClaimBroken as exc:
            verdicts.append(Verdict(claim, False, str(exc)))
        except SyntaxError as exc:
            verdicts.append(Verdict(claim, False, f"cannot parse {exc.filename}: {exc.msg}"))
    return verdicts
