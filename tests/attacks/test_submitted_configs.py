"""A submitted config is data, never code (issue 33, section 1).

Crafted submissions against real `gap serve` processes on loopback, sent as the control frame a
client sends (and through a real `gap submit` process where its exit status matters). Each is
refused in one line per problem that names the key; nothing it names is imported or run (the
modules it names would write a marker file); nothing outside its run dir changes; and the same
server then takes an honest submission. The servers run with their address space capped, so an
expansion that got through kills that server (and fails the test) instead of the machine.

Submissions need no simulator: a refused config never reaches one, and the one attach below
runs a trial whose cell cannot run (no env is built).
"""

from __future__ import annotations

import copy
import hashlib
import itertools
import json
import os
import resource
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest
import yaml
from websockets.exceptions import ConnectionClosed
from websockets.sync.client import connect

from pytest_gap.policies.wire import packb, unpackb
from pytest_gap.producers.templates import template_dir
from tests.service_configs import remote_policy_config
from tests.test_service import GAP, _free_port

_IDS = itertools.count()
MEMORY_CAP = 2 * 2**30  # an idle `gap serve` peaks near 300 MB of address space
TIMEOUT = 60


def honest() -> dict:
    """The config a service run takes (tests/test_service.py's): one remote policy, policy_only."""
    return remote_policy_config()


def fresh(prefix: str) -> str:
    """A run id no earlier test took (a submission taken by mistake must not mask the next)."""
    return f"{prefix}-{next(_IDS)}"


def _cap_memory() -> None:
    resource.setrlimit(resource.RLIMIT_AS, (MEMORY_CAP, MEMORY_CAP))


class Serve:
    """A `gap serve` process on a free loopback port; `pythonpath` is importable from it, `env`
    is added to its environment."""

    def __init__(
        self,
        home: Path,
        *extra: str,
        pythonpath: Path | None = None,
        env: dict[str, str] | None = None,
    ):
        self.home, self.port = home, _free_port()
        self.runs = home / "runs"
        self.url = f"http://127.0.0.1:{self.port}"
        given = env or {}  # added to the server's environment (a run secret it is to use)
        env = {k: v for k, v in os.environ.items() if k.lower() not in ("http_proxy", "no_proxy")}
        env["NO_PROXY"] = "127.0.0.1,localhost"
        if pythonpath is not None:
            env["PYTHONPATH"] = str(pythonpath)
        env.update(given)
        self.log_path = home / f"serve_{self.port}.log"
        self.token_file = home / f"token_{self.port}"
        self.token_file.write_text(f"token-{self.port}\n")
        self.headers = {"Authorization": f"Bearer token-{self.port}"}
        argv = [GAP, "serve", "--port", str(self.port), "--runs-dir", str(self.runs), *extra]
        argv += ["--token-file", str(self.token_file)]
        with open(self.log_path, "a") as log:
            self.process = subprocess.Popen(
                argv, stdout=log, stderr=subprocess.STDOUT, env=env, preexec_fn=_cap_memory
            )
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                break
            try:
                urllib.request.urlopen(f"{self.url}/healthz", timeout=1)
                return
            except OSError:
                time.sleep(0.2)
        raise AssertionError(f"gap serve did not come up: {self.log_path.read_text()}")

    def submit(self, text: str, run_id: str, name: str = "attack.yaml") -> dict:
        """The control frame `gap submit` sends; the server's answer (ConnectionClosed if it
        dropped the connection without one)."""
        frame = {"op": "submit", "run_id": run_id, "config_name": name, "config_text": text}
        with connect(
            f"ws://127.0.0.1:{self.port}/control",
            max_size=None,
            open_timeout=TIMEOUT,
            additional_headers=self.headers,
        ) as ws:
            ws.send(packb(frame))
            return unpackb(ws.recv(timeout=TIMEOUT))

    def status(self, run_id: str) -> dict:
        request = urllib.request.Request(f"{self.url}/runs/{run_id}", headers=self.headers)
        with urllib.request.urlopen(request, timeout=30) as answer:
            return json.loads(answer.read())

    def rss_kb(self) -> int:
        status = Path(f"/proc/{self.process.pid}/status").read_text()
        (line,) = (line for line in status.splitlines() if line.startswith("VmRSS:"))
        return int(line.split()[1])

    def serves_an_honest_client(self) -> None:
        """Alive, and an honest submission (a fresh run id) is scheduled."""
        assert self.process.poll() is None, self.log_path.read_text()
        run_id = f"honest-{time.monotonic_ns()}"
        answer = self.submit(yaml.safe_dump(honest()), run_id)
        assert answer["ok"], answer
        assert answer["message"] == f"run {run_id}: 1 trials scheduled"

    def stop(self) -> None:
        if self.process.poll() is None:
            self.process.kill()
            self.process.wait(timeout=30)


# -- code a submission would have the server import -------------------------------------------
def _marker_module(path: Path, marker: Path, body: str = "") -> None:
    """A module whose import leaves `marker` behind (then runs `body`)."""
    path.write_text(f"from pathlib import Path\nPath({str(marker)!r}).write_text('ran')\n{body}")


@pytest.fixture(scope="module")
def evil(tmp_path_factory) -> Path:
    """Modules and skill directories that write a marker when imported; the markers live in
    `evil/markers/`, which must stay empty."""
    root = tmp_path_factory.mktemp("evil")
    markers = root / "markers"
    markers.mkdir()
    _marker_module(root / "gap_evil_backend.py", markers / "backend", "class Backend: pass\n")
    _marker_module(root / "gap_evil_skills.py", markers / "skills_module")
    (root / "skills_dir").mkdir()
    _marker_module(root / "skills_dir" / "evil.py", markers / "skills_dir")
    (root / "exit_dir").mkdir()
    _marker_module(root / "exit_dir" / "bye.py", markers / "exit_dir", "raise SystemExit(3)\n")
    return root


@pytest.fixture(scope="module")
def _servers(tmp_path_factory, evil):
    started: list[Serve] = []
    yield started
    for served in started:
        served.stop()


@pytest.fixture
def server(_servers, tmp_path_factory, evil) -> Serve:
    """The module's server (`evil` on its import path), or a new one where an earlier test's
    attack stopped it: that test has failed already; this one is judged on its own."""
    if not _servers or _servers[-1].process.poll() is not None:
        _servers.append(Serve(tmp_path_factory.mktemp("serve"), pythonpath=evil))
    return _servers[-1]


def _tree(root: Path) -> dict[str, str]:
    """Every file under `root` and a digest of its bytes."""
    return {
        p.relative_to(root).as_posix(): hashlib.sha256(p.read_bytes()).hexdigest()
        for p in sorted(root.rglob("*"))
        if p.is_file()
    }


def _refused(answer: dict, *names: str) -> list[str]:
    """The refusal's lines; each named key is in one of them; every line is one short line."""
    assert answer.get("ok") is False, answer
    lines = answer["error"].splitlines()
    assert all(len(line) < 400 for line in lines), lines
    for name in names:
        assert any(name in line for line in lines), (name, lines)
    return lines


def _set(data: dict, dotted: str, value) -> dict:
    *parents, last = dotted.split(".")
    node = data
    for key in parents:
        node = node.setdefault(key, {})
    if value is DROP:
        node.pop(last, None)
    else:
        node[last] = value
    return data


DROP = object()
POLICY = "policies.remote"
OVERRIDE = "benchmark.mode_overrides.policy_only"
# (case id, edits of the honest config, the key the refusal must name)
REMOTE_REFUSED = [
    ("command", {f"{POLICY}.url": DROP, f"{POLICY}.command": ["sh", "-c", "id"]}, "command"),
    ("start_cmd", {f"{POLICY}.url": DROP, f"{POLICY}.start_cmd": "sh -c id"}, "start_cmd"),
    ("preset", {f"{POLICY}.url": DROP, f"{POLICY}.preset": "pi05-libero"}, "preset"),
    ("env", {f"{POLICY}.env": {"LD_PRELOAD": "/tmp/x.so"}}, "policies.remote.env"),
    ("ground_truth", {f"{POLICY}.privileged_state": True}, "policies.remote.privileged_state"),
    ("llm_endpoint", {"llm.endpoint": "http://169.254.169.254/latest"}, "llm.endpoint"),
    ("llm_api_key", {"llm.api_key": "sk-or-v1-0123456789"}, "llm.api_key"),
    ("llm_cache_dir", {"llm.cache_dir": "/etc"}, "llm.cache_dir"),
    (
        "workflow_dir",
        # a real workflow dir on the server: the path itself is what a submission may not name
        {
            f"{OVERRIDE}.template": DROP,
            f"{OVERRIDE}.workflow_dir": str(template_dir("policy_only")),
        },
        f"{OVERRIDE}.workflow_dir",
    ),
    ("benchmark_output_dir", {"benchmark.output_dir": "/tmp/elsewhere"}, "benchmark.output_dir"),
    ("trials_output_dir", {"trials.output_dir": "../../../tmp"}, "trials.output_dir"),
    ("source", {"source": "/etc/passwd"}, "source"),
    ("template_path", {f"{OVERRIDE}.template": "../../../../etc"}, f"{OVERRIDE}.template"),
    ("template_unknown", {f"{OVERRIDE}.template": "my_template"}, f"{OVERRIDE}.template"),
    ("backend_import", {"benchmark.backend": "gap_evil_backend:Backend"}, "benchmark.backend"),
    ("backend_os", {"benchmark.backend": "os:system"}, "benchmark.backend"),
]


@pytest.mark.parametrize(
    "edits, key", [c[1:] for c in REMOTE_REFUSED], ids=[c[0] for c in REMOTE_REFUSED]
)
def test_a_key_a_submission_may_not_hold_is_refused_by_name(server, evil, edits, key):
    data = honest()
    for dotted, value in edits.items():
        _set(data, dotted, value)
    run_id = fresh("attack")
    answer = server.submit(yaml.safe_dump(data), run_id)
    (line,) = _refused(answer, key)
    assert "attack.yaml" in line  # which submission
    assert not list((evil / "markers").iterdir())
    assert not (server.runs / run_id).exists()
    server.serves_an_honest_client()


@pytest.mark.parametrize(
    "entry, marker",
    [("skills_dir", "skills_dir"), ("exit_dir", "exit_dir"), ("gap_evil_skills", None)],
    ids=["directory", "directory_raising_SystemExit", "module"],
)
def test_skill_packages_are_refused_and_never_imported(server, evil, entry, marker):
    package = str(evil / entry) if marker else entry
    data = {**honest(), "skills": {"packages": [package]}}
    answer = server.submit(yaml.safe_dump(data), fresh("skills"))
    (line,) = _refused(answer, "skills.packages")
    assert "submitted" in line
    assert not list((evil / "markers").iterdir())
    server.serves_an_honest_client()


def test_an_import_string_backend_of_a_suites_config_is_refused(server, evil):
    data = {"backend": "gap_evil_backend:Backend", "suites": [{"suite_name": "libero_object"}]}
    _refused(server.submit(yaml.safe_dump(data), fresh("suites")), "backend")
    assert not list((evil / "markers").iterdir())
    server.serves_an_honest_client()


def test_a_policy_id_that_is_a_path_touches_no_other_run(server):
    """A registry key becomes a directory of every trial's key: `../../victim/...` would have
    the runner rmtree another run's records and write its own there."""
    victim = "victim"
    assert server.submit(yaml.safe_dump(honest()), victim)["ok"]
    record = server.runs / victim / "policy_only/remote/libero/object/task_00/seed_000"
    record.mkdir(parents=True)
    (record / "result.json").write_text('{"a": "record of another run"}\n')
    before = _tree(server.runs / victim)
    home_before = {k: v for k, v in _tree(server.home).items() if not k.startswith("runs/")}

    escape = f"../../{victim}/policy_only/remote"
    data = honest()
    data["policies"] = {escape: data["policies"]["remote"]}
    data["benchmark"]["policies"] = [escape]
    del data["benchmark"]["mode_overrides"]  # a trial that cannot run needs no simulator
    answer = server.submit(yaml.safe_dump(data), "escape")
    _refused(answer, "policies", "policy id")
    # Had it been taken, a client's attach runs its trials (twice: the first creates the
    # parent that `..` climbs out of); refused, there is no run to attach to.
    for _ in range(2):
        with connect(
            f"ws://127.0.0.1:{server.port}/episodes",
            open_timeout=TIMEOUT,
            additional_headers=server.headers,
        ) as ws:
            ws.send(packb({"run_id": "escape", "worker_id": 0}))
            try:
                while (frame := unpackb(ws.recv(timeout=TIMEOUT)))["type"] not in (
                    "error",
                    "finished",
                ):
                    pass
            except ConnectionClosed:
                frame = {"type": "closed"}
        assert frame["type"] == "error" and "no run escape" in frame["error"], frame
    assert _tree(server.runs / victim) == before
    assert {k: v for k, v in _tree(server.home).items() if not k.startswith("runs/")} == (
        home_before
    )
    server.serves_an_honest_client()


@pytest.mark.parametrize(
    "policy_id", ["a/b", "..", ".hidden", "x y", "a\nb", "", "é", "a" * 101, "semi;colon"]
)
def test_registry_keys_match_the_name_pattern(server, policy_id):
    data = honest()
    data["policies"] = {policy_id: data["policies"]["remote"]}
    data["benchmark"]["policies"] = [policy_id]
    _refused(server.submit(yaml.safe_dump(data), fresh("names")), "policy id")
    server.serves_an_honest_client()


def _bomb(levels: int = 9, width: int = 10) -> str:
    """A "billion laughs": `levels` lists of `width` aliases each, under a key that wants an
    int (an error about its type would show, or walk, the value)."""
    names = "abcdefghijklmnopqrstuvwxyz"
    lines = ["x:", f"- &a [{','.join(['lol'] * width)}]"]
    for level in range(1, levels):
        inner = ",".join([f"*{names[level - 1]}"] * width)
        lines.append(f"- &{names[level]} [{inner}]")
    lines.append(f"benchmark: {{n_seeds: *{names[levels - 1]}}}")
    return "\n".join(lines) + "\n"


def test_an_alias_bomb_under_a_wrong_typed_key_is_refused_short(server):
    text = _bomb()
    assert len(text.encode()) <= 450  # 10**9 strings once expanded
    rss = server.rss_kb()
    answer = server.submit(text, fresh("bomb"))
    assert len(answer.get("error") or "") < 500, answer
    _refused(answer, "alias")
    assert server.rss_kb() - rss < 100_000  # kB: nothing was expanded
    server.serves_an_honest_client()


@pytest.mark.parametrize(
    "text, names",
    [
        (yaml.safe_dump(honest()) + "# " + "x" * (2 * 2**20) + "\n", ["1 MiB"]),
        (yaml.safe_dump(honest()) + "trials: {max_steps: 5}\n", ["trials", "given twice"]),
        ("benchmark: {families: " + "[" * 5000 + "]" * 5000 + "}\n", ["nested too deeply"]),
        ("benchmark: !!python/object/apply:os.system ['id']\n", ["benchmark", "tag"]),
        ("benchmark: {n_seeds: 1}\n\0", ["line 2"]),
        ("- just\n- a list\n", ["mapping"]),
    ],
    ids=["oversized", "duplicate_key", "deep", "python_tag", "nul", "not_a_mapping"],
)
def test_a_submission_goes_through_the_hardened_reader(server, text, names):
    run_id = fresh("reader")
    _refused(server.submit(text, run_id), *names)
    assert not (server.runs / run_id).exists()
    server.serves_an_honest_client()


def test_a_config_that_cannot_run_is_refused_at_submit(server):
    data = honest()
    del data["benchmark"]["mode_overrides"]  # policy_only runs a template: none is named
    run_id = fresh("untemplated")
    (line,) = _refused(server.submit(yaml.safe_dump(data), run_id), "template")
    assert "benchmark.mode_overrides.policy_only.template" in line
    assert not (server.runs / run_id).exists()
    server.serves_an_honest_client()


def test_gap_submit_exits_2_with_the_refusal_in_one_line(server, tmp_path):
    data = {**honest(), "skills": {"packages": ["gap_evil_skills"]}}
    (tmp_path / "bad.yaml").write_text(yaml.safe_dump(data))
    out = subprocess.run(
        [
            *(GAP, "submit", str(tmp_path / "bad.yaml"), "--run-id", "cli"),
            *("--port", str(server.port), "--token-file", str(server.token_file)),
        ],
        capture_output=True,
        text=True,
        timeout=TIMEOUT,
    )
    assert out.returncode == 2, out.stdout + out.stderr
    assert len(out.stderr.strip().splitlines()) == 1 and "skills.packages" in out.stderr
    assert "Traceback" not in out.stderr


# -- splits: the server's set decides what is measured -----------------------------------------
@pytest.fixture(scope="module")
def split_server(tmp_path_factory):
    home = tmp_path_factory.mktemp("splits")
    (home / "splits.yaml").write_text(
        yaml.safe_dump({"test": {"seeds": [7, 8], "task_ids": [1], "max_steps": 30}})
    )
    served = Serve(home, "--splits", str(home / "splits.yaml"))
    yield served
    served.stop()


def _split_config(**benchmark) -> dict:
    data = honest()
    for key in ("task_ids", "n_seeds", "mode_overrides"):
        del data["benchmark"][key]
    del data["trials"]
    data["benchmark"].update(benchmark)
    return {**data, "split": "test"}


@pytest.mark.parametrize(
    "edit, key",
    [
        ({"benchmark.task_ids": [0]}, "benchmark.task_ids"),
        ({"benchmark.n_tasks": 1}, "benchmark.n_tasks"),
        ({"benchmark.seeds": [0]}, "benchmark.seeds"),
        ({"benchmark.n_seeds": 1}, "benchmark.n_seeds"),
        ({"trials.max_steps": 1}, "trials.max_steps"),
        ({f"{OVERRIDE}.template": "policy_only_bare"}, "benchmark.mode_overrides"),
    ],
    ids=["task_ids", "n_tasks", "seeds", "n_seeds", "max_steps", "template"],
)
def test_a_split_run_takes_what_it_measures_from_the_server(split_server, edit, key):
    data = _split_config()
    for dotted, value in edit.items():
        _set(data, dotted, value)
    (line,) = _refused(split_server.submit(yaml.safe_dump(data), fresh("chosen")), key)
    assert "split" in line


@pytest.mark.parametrize(
    "edit, words",
    [
        ({"split": ["test"]}, ["is not a split of this server"]),
        ({"split": {"a": 1}}, ["is not a split of this server"]),
        ({"trials": "x"}, ["trials"]),
    ],
    ids=["split_list", "split_mapping", "trials_not_a_mapping"],
)
def test_a_wrong_typed_split_submission_is_refused_and_the_server_serves_on(
    split_server, edit, words
):
    data = {**_split_config(), **edit}
    assert len(_refused(split_server.submit(yaml.safe_dump(data), fresh("typed")), *words)) == 1
    split_server.serves_an_honest_client()


def test_a_split_run_is_planned_from_the_servers_set(split_server):
    from pytest_gap.service.runs import ServiceRun
    from pytest_gap.service.splits import load_splits

    answer = split_server.submit(yaml.safe_dump(_split_config()), "held")
    assert answer["ok"] and answer["trials"] == 2, answer
    run = ServiceRun(split_server.runs / "held", load_splits(split_server.home / "splits.yaml"))
    (cell,) = run.cells
    assert cell.task_ids == (1,) and cell.seeds == (7, 8) and cell.max_steps == 30
    assert cell.workflow_dir == template_dir("policy_only")


# -- the operator's own configs: trusted, by a door no tenant has -------------------------------
def test_a_config_given_at_start_is_trusted_and_the_public_door_stays_strict(tmp_path):
    operator = copy.deepcopy(honest())
    # a workflow directory on the server's disk: the operator's to name, never a tenant's
    operator["benchmark"]["mode_overrides"]["policy_only"] = {
        "workflow_dir": str(template_dir("policy_only"))
    }
    (tmp_path / "operator.yaml").write_text(yaml.safe_dump(operator))
    served = Serve(tmp_path, "--config", str(tmp_path / "operator.yaml"), "--run-id", "op")
    try:
        status = served.status("op")
        assert status["expected"] == 1 and status["state"] == "waiting for clients"
        again = served.submit(yaml.safe_dump(operator), "tenant", name="operator.yaml")
        _refused(again, "workflow_dir")
        served.serves_an_honest_client()
    finally:
        served.stop()


def test_bad_names_in_a_file_config_are_one_line_config_errors(tmp_path):
    from pytest_gap.config import ConfigError, load_config

    data = honest()
    data["policies"]["../../x"] = data["policies"]["remote"]
    (tmp_path / "bad.yaml").write_text(yaml.safe_dump(data))
    with pytest.raises(ConfigError) as info:
        load_config(tmp_path / "bad.yaml")
    (line,) = info.value.problems
    assert "policies" in line and "'../../x'" in line and "policy id" in line
    out = subprocess.run(
        [sys.executable, "-m", "pytest_gap.cli", "benchmark", str(tmp_path / "bad.yaml")],
        capture_output=True,
        text=True,
        timeout=TIMEOUT,
        cwd=tmp_path,
    )
    assert out.returncode == 2 and len(out.stderr.strip().splitlines()) == 1, out.stderr
    assert sorted(p.name for p in tmp_path.iterdir()) == ["bad.yaml"]  # no run dir


def test_an_operator_config_that_cannot_run_stops_gap_serve_in_one_line(tmp_path):
    data = honest()
    del data["benchmark"]["mode_overrides"]
    (tmp_path / "op.yaml").write_text(yaml.safe_dump(data))
    out = subprocess.run(
        [
            GAP,
            "serve",
            "--port",
            str(_free_port()),
            "--runs-dir",
            str(tmp_path / "runs"),
            "--config",
            str(tmp_path / "op.yaml"),
            "--run-id",
            "op",
        ],
        capture_output=True,
        text=True,
        timeout=TIMEOUT,
    )
    assert out.returncode == 2, out.stdout + out.stderr
    (line,) = out.stderr.strip().splitlines()
    assert "op.yaml: benchmark.mode_overrides.policy_only.template is not set" in line


# -- the classes behind the examples ------------------------------------------------------------
def _models(model, seen=None) -> dict[type, str]:
    """Every model of the config, and its name."""
    from pydantic import BaseModel

    seen = {} if seen is None else seen
    seen[model] = model.__name__
    for field in model.model_fields.values():
        stack = [field.annotation]
        while stack:
            kind = stack.pop()
            new = isinstance(kind, type) and issubclass(kind, BaseModel) and kind not in seen
            if new:
                _models(kind, seen)
            stack.extend(getattr(kind, "__args__", ()))
    return seen


def _mentions(annotation, kind) -> bool:
    inner = getattr(annotation, "__args__", ())
    return annotation is kind or any(_mentions(a, kind) for a in inner)


def test_every_path_command_and_import_of_the_config_model_is_server_only():
    """A key added to the model later is held to the profile where it is added: every Path is
    server-only, and so are the keys that run or import something."""
    from pytest_gap.config import BenchmarkConfig, RemoteValue, ServerOnly

    models = {name: model for model, name in _models(BenchmarkConfig).items()}
    marked = {
        f"{name}.{key}"
        for name, model in models.items()
        for key, field in model.model_fields.items()
        if any(isinstance(m, ServerOnly) for m in field.metadata)
    }
    paths = {
        f"{name}.{key}"
        for name, model in models.items()
        for key, field in model.model_fields.items()
        if _mentions(field.annotation, Path)
    }
    assert paths and paths <= marked, paths - marked
    runs_or_imports = {
        "SkillsConfig.packages",
        "PolicyEntry.command",
        "PolicyEntry.preset",
        "PolicyEntry.env",
        "LLMConfig.endpoint",
        "LLMConfig.api_key",
    }
    assert runs_or_imports <= marked
    for name in ("BenchmarkConfig", "BenchmarkBlock"):  # an import string is code to import
        backend = models[name].model_fields["backend"]
        assert any(isinstance(m, RemoteValue) for m in backend.metadata)


def test_a_wrong_typed_expansion_within_the_limit_is_a_short_message(tmp_path):
    """Under the reader's limit, an alias may still fill a list with 40,000 wrong values: the
    refusal lists the first few and counts the rest."""
    from pytest_gap.config import ConfigError, load_config

    text = "x: &a [" + ",".join(["q"] * 200) + "]\n"
    text += "y: &b [" + ",".join(["*a"] * 200) + "]\nbenchmark: {task_ids: *b}\n"
    (tmp_path / "wide.yaml").write_text(text)
    with pytest.raises(ConfigError) as info:
        load_config(tmp_path / "wide.yaml")
    assert len(info.value.problems) <= 21 and len(str(info.value)) < 3000
    assert "more like these" in info.value.problems[-1]


def test_inside_refuses_every_way_out_of_a_run_dir(tmp_path):
    from pytest_gap.layout import OutsideRunDir, inside

    run = tmp_path / "run"
    (run / "mode").mkdir(parents=True)
    (tmp_path / "other").mkdir()
    (run / "mode" / "link").symlink_to(tmp_path / "other")  # planted in the run dir
    assert inside(run, "mode/p/libero/object/task_00/seed_000") == (
        run / "mode/p/libero/object/task_00/seed_000"
    )
    for escape in ("mode/../../other", "/etc", "mode/link/x", ".", "mode/.."):
        with pytest.raises(OutsideRunDir):
            inside(run, escape)


def test_a_cell_with_a_name_that_is_no_path_part_cannot_be_planned():
    """The last check before a name becomes a trial key, whatever made the name."""
    from pydantic import ValidationError

    from pytest_gap.cells import Cell

    fields = dict(mode="policy_only", family="libero", variation="object", suite="s")
    Cell(**fields, task_ids=(0,), seeds=(0,), policy_id="remote")
    for bad in ({"policy_id": "../x"}, {"variation": "a/b"}, {"mode": ".."}):
        with pytest.raises(ValidationError, match="it names a directory of the run"):
            Cell(**{**fields, **bad}, task_ids=(0,), seeds=(0,))


@pytest.mark.parametrize(
    "hello, field",
    [
        ({"run_id": "../runs", "worker_id": 0}, "run_id"),
        ({"run_id": "ok\n", "worker_id": 0}, "run_id"),
        ({"run_id": "ok", "worker_id": 10**12}, "worker_id"),
        ({"run_id": "ok", "worker_id": -1}, "worker_id"),
    ],
    ids=["run_id_path", "run_id_newline", "worker_id_huge", "worker_id_negative"],
)
def test_names_in_a_hello_are_refused_in_one_line(server, hello, field):
    with connect(
        f"ws://127.0.0.1:{server.port}/episodes",
        open_timeout=TIMEOUT,
        additional_headers=server.headers,
    ) as ws:
        ws.send(packb(hello))
        answer = unpackb(ws.recv(timeout=TIMEOUT))
    assert answer["type"] == "error", answer
    (line,) = answer["error"].splitlines()
    assert line.startswith(f"the first frame must be a hello: {field}:") and len(line) < 300
    server.serves_an_honest_client()
