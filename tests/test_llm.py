"""LLM workflow generation through the real `openai` client against a local
OpenAI-compatible server: settings, caching, retries, validation fixes, traces without keys."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from pytest_gap.config import LLMConfig
from pytest_gap.producers.chat import (
    ChatClient,
    LLMConfigError,
    LLMUnavailable,
    cache_key,
    resolve_settings,
)
from pytest_gap.producers.llm import extract_json, generate_workflow
from pytest_gap.workflow.templates import task_placeholders
from tests.llm_double import OPENROUTER_NO_MODEL, PICK_PLACE, ChatDouble

KEY = "sk-test-SECRET-4242"
PROMPT = "pick up the alphabet soup and place it in the basket"
GAP = shutil.which("gap", path=str(Path(sys.executable).parent)) or "gap"


def _settings(double: ChatDouble, tmp_path: Path, **llm):
    fields = {"model": "test-model", "endpoint": double.url, "api_key": KEY}
    config = LLMConfig(**(fields | {"cache_dir": tmp_path / "cache"} | llm))
    settings = resolve_settings(config, "grid.yaml")
    return settings.model_copy(update={"timeout_s": 2.0, "max_retries": 3})


def _client(double, tmp_path, **llm):
    return ChatClient(_settings(double, tmp_path, **llm), sleep=lambda s: None)


def test_settings_name_what_to_set(monkeypatch):
    monkeypatch.delenv("OPENROUTER_API_KEY", raising=False)
    with pytest.raises(LLMConfigError, match=r"llm\.model is not set"):
        resolve_settings(LLMConfig())
    with pytest.raises(LLMConfigError, match="set OPENROUTER_API_KEY"):
        resolve_settings(LLMConfig(model="openai/gpt-4.1"))
    monkeypatch.setenv("OPENROUTER_API_KEY", KEY)
    settings = resolve_settings(LLMConfig(model="openai/gpt-4.1"))
    assert settings.base_url == "https://openrouter.ai/api/v1" and settings.api_key == KEY
    assert KEY not in repr(settings) and KEY not in settings.model_dump_json()
    with pytest.raises(LLMConfigError, match=r"vertex needs llm\.project_id and llm\.region"):
        resolve_settings(LLMConfig(provider="vertex", model="gemini"))
    monkeypatch.delenv("OPENAI_API_KEY", raising=False)
    local = resolve_settings(LLMConfig(model="qwen", endpoint="http://localhost:8000/v1/"))
    assert local.base_url == "http://localhost:8000/v1" and local.api_key == "EMPTY"


def test_generation_end_to_end_with_cache_and_clean_traces(tmp_path):
    values = task_placeholders(PROMPT)
    with ChatDouble() as double:
        chat = _client(double, tmp_path)
        first = generate_workflow(PROMPT, chat=chat, values=values, trace_dir=tmp_path / "t1")
        assert first.valid and first.calls == 2 and first.cached == 0
        assert first.workflow["nodes"]["pick"]["inputs"]["name"] == "alphabet soup"
        assert len(double.requests) == 2
        sent = double.requests[1]
        assert sent["path"] == "/v1/chat/completions"
        headers = {k.lower(): v for k, v in sent["headers"].items()}
        assert headers["authorization"] == f"Bearer {KEY}"
        assert sent["body"]["model"] == "test-model" and sent["body"]["temperature"] == 0.7
        assert sent["body"]["stream"] is False
        assert double.requests[0]["body"]["response_format"] == {"type": "json_object"}
        structured = sent["body"]["response_format"]
        assert structured["type"] == "json_schema"
        assert "nodes" in structured["json_schema"]["schema"]["properties"]
        assert "run_policy" in sent["body"]["messages"][1]["content"]  # the skill catalogue
        again = generate_workflow(
            PROMPT, chat=_client(double, tmp_path), values=values, trace_dir=tmp_path / "t2"
        )
        assert again.valid and again.cached == 2
        assert len(double.requests) == 2  # cache hits make no HTTP call
    traces = sorted((tmp_path / "t1").iterdir())
    assert [p.name for p in traces] == ["01_coordinator.json", "02_writer.json"]
    for path in [*traces, *(tmp_path / "cache").rglob("*.json")]:
        assert KEY not in path.read_text()


def test_another_endpoint_misses_the_cache(tmp_path):
    """Two servers may serve different models under one name: their answers are not shared."""
    messages = [{"role": "user", "content": "same prompt"}]
    with ChatDouble() as first, ChatDouble(lambda request: "from the second server") as second:
        assert not _client(first, tmp_path).complete(messages)[1]
        assert _client(first, tmp_path).complete(messages)[1]  # same endpoint: a hit
        text, cached = _client(second, tmp_path).complete(messages)
        assert (text, cached) == ("from the second server", False)
        assert len(first.requests) == 1 and len(second.requests) == 1


def test_the_cache_key_names_the_provider_and_the_endpoint(tmp_path):
    """A proxy can route one URL and model name to several providers: each keeps its answers."""
    messages = [{"role": "user", "content": "same prompt"}]
    with ChatDouble() as double:
        settings = _settings(double, tmp_path)
    key = cache_key(settings, messages)
    assert key == cache_key(settings.model_copy(), messages)
    assert key != cache_key(settings.model_copy(update={"provider": "openrouter"}), messages)
    moved = settings.model_copy(update={"base_url": "http://127.0.0.1:1/v1"})
    assert key != cache_key(moved, messages)


def test_preflight_passes_a_good_key_and_model_with_one_uncached_token(tmp_path):
    with ChatDouble(key=KEY, models={"test-model"}) as double:
        _client(double, tmp_path).check()
        (sent,) = double.requests
        assert sent["body"]["max_tokens"] == 1 and sent["body"]["model"] == "test-model"
    assert not (tmp_path / "cache").exists() or not list((tmp_path / "cache").glob("*.json"))


def test_preflight_names_provider_model_and_the_setting_to_fix(tmp_path, monkeypatch):
    def refusal(double, **llm) -> str:
        client = ChatClient(_settings(double, tmp_path, **llm), sleep=lambda s: None)
        with pytest.raises(LLMConfigError) as caught:
            client.check()
        message = str(caught.value)
        assert "\n" not in message and "sk-wrong" not in message
        where = f"grid.yaml: llm provider openai-compatible at {client.settings.base_url}"
        assert message.startswith(where)
        return message.removeprefix(where)

    with ChatDouble(key=KEY, models={"test-model"}) as double:
        assert refusal(double, api_key="sk-wrong") == (
            " refused the API key for model 'test-model' (401: Incorrect API key provided); "
            "fix llm.api_key"
        )
        monkeypatch.setenv("OPENAI_API_KEY", "sk-wrong")
        assert refusal(double, api_key=None).endswith("; fix OPENAI_API_KEY (or llm.api_key)")
        monkeypatch.delenv("OPENAI_API_KEY")
        assert "fix OPENAI_API_KEY or llm.api_key (the endpoint wants a key)" in refusal(
            double, api_key=None
        )
        assert refusal(double, model="nope") == (
            " has no model 'nope' (404: The model `nope` does not exist.); fix llm.model"
        )
        wrong_path = refusal(double, endpoint=double.url.removesuffix("/v1"))
        assert (
            "answered 404 for chat/completions" in wrong_path and "fix llm.endpoint" in wrong_path
        )
        with pytest.raises(LLMConfigError, match="has no model 'nope'"):  # in a trial, too
            _client(double, tmp_path, model="nope").complete([{"role": "user", "content": "x"}])
    with ChatDouble(
        key=KEY, models={"openai/gpt-4.1"}, unknown_model=OPENROUTER_NO_MODEL
    ) as double:
        assert refusal(double, model="openai/gpt-4.2") == (
            " has no model 'openai/gpt-4.2' (400: openai/gpt-4.2 is not a valid model ID); "
            "fix llm.model"
        )
    with ChatDouble(refuse=(403, "This key may not use this model")) as double:
        assert refusal(double) == (
            " does not allow this key to use model 'test-model' (403: This key may not use this "
            "model); fix llm.api_key or llm.model"
        )


def test_preflight_leaves_service_trouble_to_infra_and_odd_parameters_alone(tmp_path):
    with ChatDouble(refuse=(400, "Unsupported parameter: 'max_tokens'")) as double:
        _client(double, tmp_path).check()  # the key and the model were accepted
    with ChatDouble(refuse=(503, "overloaded")) as double:
        with pytest.raises(LLMUnavailable, match="failed 4 times; last: InternalServerError"):
            _client(double, tmp_path).check()
        url = double.url
    with pytest.raises(LLMUnavailable, match="APIConnectionError"):  # nothing listens any more
        ChatClient(
            _settings(double, tmp_path).model_copy(update={"base_url": url, "max_retries": 0})
        ).check()


def test_rate_limits_and_server_errors_are_retried_then_reported(tmp_path):
    with ChatDouble() as double:
        double.script = [{"status": 429}, {"status": 503}]
        chat = _client(double, tmp_path)
        _, cached = chat.complete([{"role": "user", "content": "hello"}])
        assert not cached and chat.http_calls == 3 and len(double.requests) == 3
        double.script = [{"status": 500}] * 4
        with pytest.raises(LLMUnavailable, match="failed 4 times; last: InternalServerError"):
            chat.complete([{"role": "user", "content": "another"}])


def test_a_slow_answer_times_out_and_is_retried(tmp_path):
    with ChatDouble() as double:
        double.script = [{"delay": 3.0}]
        chat = _client(double, tmp_path)
        text, _ = chat.complete([{"role": "user", "content": "slow"}])
        assert json.loads(text) == PICK_PLACE and chat.http_calls == 2


def test_malformed_and_invalid_answers_go_back_for_fixes(tmp_path):
    bad_skill = json.loads(json.dumps(PICK_PLACE))
    bad_skill["nodes"]["pick"]["skill"] = "teleport"
    with ChatDouble() as double:
        double.script = [
            {},  # coordinator
            {"content": "Sure! Here is the workflow you asked for."},
            {"content": "```json\n" + json.dumps(bad_skill) + "\n```"},
        ]
        generation = generate_workflow(
            PROMPT,
            chat=_client(double, tmp_path),
            values=task_placeholders(PROMPT),
            trace_dir=tmp_path / "traces",
        )
        assert generation.valid and generation.calls == 4
        fixes = [r["body"]["messages"][-1]["content"] for r in double.requests[2:]]
        assert "the answer is not a JSON object" in fixes[0]
        assert "unknown skill 'teleport'" in fixes[1]
        double.script = [{}, *[{"content": "{}"}] * 3]
        failed = generate_workflow(
            "put the milk in the basket",
            chat=_client(double, tmp_path),
            max_validation_retries=2,
        )
        assert not failed.valid and failed.calls == 4 and failed.problems
    assert [p.name for p in sorted((tmp_path / "traces").iterdir())] == [
        "01_coordinator.json",
        "02_writer.json",
        "03_fix1.json",
        "04_fix2.json",
    ]


def test_endpoints_without_structured_output_get_plain_requests(tmp_path):
    with ChatDouble() as double:
        double.script = [{"status": 400, "body": "response_format is not supported"}]
        chat = _client(double, tmp_path)
        chat.complete([{"role": "user", "content": "x"}], {"type": "object"})
        assert "response_format" in double.requests[0]["body"]
        assert "response_format" not in double.requests[1]["body"]


def test_json_extraction():
    assert extract_json('text {"a": {"b": 1}} more') == {"a": {"b": 1}}
    assert extract_json('```json\n{"a": 1}\n```') == {"a": 1}
    with pytest.raises(ValueError, match="no JSON object"):
        extract_json("no json here")


def test_gap_generate_writes_a_workflow_dir(tmp_path):
    with ChatDouble() as double:
        out = subprocess.run(
            [
                GAP,
                "generate",
                PROMPT,
                "--out",
                str(tmp_path / "wf"),
                "--model",
                "m",
                "--endpoint",
                double.url,
            ],
            capture_output=True,
            text=True,
            timeout=120,
            env={**__import__("os").environ, "GAP_LLM_CACHE_DIR": str(tmp_path / "cache")},
        )
    assert out.returncode == 0, out.stderr
    assert "valid workflow:" in out.stdout and "(8 nodes)" in out.stdout
    workflow = json.loads((tmp_path / "wf/workflow.json").read_text())
    assert workflow["nodes"]["place"]["inputs"]["container"] == "basket"
    assert (tmp_path / "wf/agent_traces/02_writer.json").is_file()


pytest_plugins = ["pytester"]


def test_llm_generation_mode_generates_once_per_task_and_runs_on_libero(pytester, monkeypatch):
    import yaml

    monkeypatch.setenv("OPENAI_API_KEY", KEY)
    with ChatDouble() as double:
        config = {
            "llm": {"model": "test-model", "endpoint": double.url, "cache_dir": "cache"},
            "benchmark": {
                "families": ["libero"],
                "variations": ["object"],
                "modes": ["llm_generation"],
                "task_ids": [0],
                "n_seeds": 2,
                "gate_threshold": 1.0,
                "output_dir": "runs",
            },
        }
        (pytester.path / "grid.yaml").write_text(yaml.safe_dump(config))
        result = pytester.runpytest_subprocess("grid.yaml", "-n", "2", timeout=300)
        out = result.stdout.str()
        assert result.ret == 0, out
        probe, *calls = double.requests  # the preflight's token, then the generation
        assert probe["body"]["max_tokens"] == 1
        assert len(calls) == 2  # one coordinator + one writer call for the task
    assert "gate PASS: success_rate=1.000 threshold=1.000" in out
    (task_dir,) = (pytester.path / "runs").glob("*/llm_generation/libero/object/task_00")
    produced = json.loads((task_dir / "workflow/produced.json").read_text())
    assert produced["valid"] and produced["model"] == "test-model" and produced["calls"] == 2
    assert sorted(p.name for p in (task_dir / "workflow/agent_traces").iterdir()) == [
        "01_coordinator.json",
        "02_writer.json",
    ]
    for path in pytester.path.rglob("*"):
        if path.is_file() and path.suffix in (".json", ".tsv", ".txt", ".yaml"):
            assert KEY not in path.read_text(errors="replace"), path


def test_gap_benchmark_fails_fast_without_a_model(tmp_path, monkeypatch):
    import yaml

    config = tmp_path / "smoke.yaml"
    config.write_text(
        yaml.safe_dump(
            {
                "benchmark": {
                    "families": ["libero"],
                    "variations": ["object"],
                    "modes": ["llm_generation"],
                    "n_tasks": 1,
                    "n_seeds": 1,
                    "output_dir": "runs",
                },
            }
        )
    )
    out = subprocess.run(
        [GAP, "benchmark", str(config)], capture_output=True, text=True, timeout=60
    )
    assert out.returncode == 2
    assert "llm.model is not set" in out.stderr
    assert not (tmp_path / "runs").exists()


def _llm_grid(path: Path, llm: dict) -> None:
    import yaml

    grid = {
        "families": ["libero"],
        "variations": ["object"],
        "modes": ["llm_generation"],
        "task_ids": [0],
        "n_seeds": 1,
        "output_dir": "runs",
    }
    path.write_text(yaml.safe_dump({"llm": {"cache_dir": "cache", **llm}, "benchmark": grid}))


def test_a_refused_key_or_unknown_model_stops_the_session_before_any_trial(pytester, monkeypatch):
    """A config error: pytest exits 4 and `gap benchmark` 2, with one line saying what to fix."""
    with ChatDouble(key=KEY, models={"test-model"}) as double:
        _llm_grid(pytester.path / "grid.yaml", {"model": "test-model", "endpoint": double.url})
        monkeypatch.setenv("OPENAI_API_KEY", "sk-wrong")
        session = pytester.runpytest_subprocess("grid.yaml", "-n", "2", timeout=120)
        assert session.ret == 4
        assert (
            "refused the API key for model 'test-model' (401: Incorrect API key provided); "
            "fix OPENAI_API_KEY (or llm.api_key)" in session.stderr.str()
        )
        assert not (pytester.path / "runs").exists()

        monkeypatch.setenv("OPENAI_API_KEY", KEY)
        _llm_grid(pytester.path / "grid.yaml", {"model": "test-modle", "endpoint": double.url})
        cli = subprocess.run(
            [GAP, "benchmark", "grid.yaml", "--gate"],
            cwd=pytester.path,
            capture_output=True,
            text=True,
            timeout=120,
        )
        assert cli.returncode == 2, cli.stdout + cli.stderr
        assert cli.stderr == (
            f"gap: error: {pytester.path / 'grid.yaml'}: llm provider openai-compatible at "
            f"{double.url} has no model 'test-modle' (404: The model `test-modle` does not "
            "exist.); fix llm.model\n"
        )
        assert not (pytester.path / "runs").exists()
        assert all(r["body"]["max_tokens"] == 1 for r in double.requests)  # preflights only


def test_an_llm_that_is_down_errors_only_the_cells_that_need_it(tmp_path):
    from pytest_gap.config import load_config
    from pytest_gap.plan import plan
    from pytest_gap.servers.preflight import check_llms

    with ChatDouble(refuse=(503, "overloaded")) as double:
        _llm_grid(tmp_path / "grid.yaml", {"model": "m", "endpoint": double.url})
    config = load_config(tmp_path / "grid.yaml")
    cells = plan(config)
    down = check_llms([(tmp_path / "grid.yaml", config, cells, tmp_path)], max_retries=0)
    why = down[str(tmp_path / "grid.yaml")]["llm"]
    assert why.startswith("the LLM did not answer the preflight request: ")
    (cell,) = [c.unavailable(down[str(tmp_path / "grid.yaml")]) for c in cells]
    assert cell.error == why and cell.infra_error and not cell.needs_llm
    templated = cell.model_copy(
        # the plan reads uses_llm off the mode table: a workflow cell's producer needs no LLM
        update={"mode": "workflow", "uses_llm": False, "workflow_dir": tmp_path, "error": None}
    )
    assert templated.unavailable({"llm": why}) == templated  # templates need no LLM


def _give_up_echoing_the_task(request: dict) -> str:
    """Stages for the coordinator; for the writer a give-up graph whose description is the task
    it was asked for, so a test can tell which instruction a workflow was written for."""
    messages = request["messages"]
    if request.get("max_tokens") == 1:  # the session's preflight request
        return "OK"
    if "You plan robot" in messages[0]["content"]:
        return json.dumps({"stages": [{"name": "stop", "goal": "give up", "skills": ["home"]}]})
    task = messages[1]["content"].splitlines()[0].removeprefix("Task: ")
    return json.dumps(
        {
            "version": 1,
            "name": "give_up",
            "description": task,
            "start": "home",
            "nodes": {
                "home": {"type": "tool", "skill": "home", "next": "failed"},
                "failed": {"type": "end", "status": "failure"},
            },
        }
    )


def test_llm_generation_writes_one_workflow_per_distinct_instruction(pytester, monkeypatch):
    """grocery_packing's instruction lists the seed's items: seeds 0 and 4 of task 0 ask for the
    same items, seed 1 for others. Two generations across two workers, and every seed runs the
    one for its items."""
    import yaml

    monkeypatch.setenv("OPENAI_API_KEY", KEY)
    with ChatDouble(answer=_give_up_echoing_the_task) as double:
        config = {
            "llm": {"model": "test-model", "endpoint": double.url, "cache_dir": "cache"},
            "benchmark": {
                "families": ["grocery_packing"],
                "variations": ["object"],
                "modes": ["llm_generation"],
                "task_ids": [0],
                "seeds": [0, 1, 4],
                "gate_threshold": 0.0,
                "output_dir": "runs",
            },
        }
        (pytester.path / "grid.yaml").write_text(yaml.safe_dump(config))
        result = pytester.runpytest_subprocess("grid.yaml", "-n", "2", timeout=300)
        assert result.ret == 0, result.stdout.str()
        writer_tasks = sorted(
            r["body"]["messages"][1]["content"].splitlines()[0]
            for r in double.requests
            if r["body"].get("max_tokens") != 1
            and "You plan robot" not in r["body"]["messages"][0]["content"]
        )
    assert writer_tasks == [
        "Task: pack the cream cheese and the milk into the basket",
        "Task: pack the cream cheese and the tomato sauce into the basket",
    ]
    (task_dir,) = (pytester.path / "runs").glob("*/llm_generation/grocery_packing/object/task_00")
    run_dir = task_dir.parents[3]
    results = {
        s: json.loads((task_dir / f"seed_{s:03d}/result.json").read_text()) for s in (0, 1, 4)
    }
    assert results[0]["prompt"] == results[4]["prompt"] != results[1]["prompt"]
    assert results[0]["workflow"] == results[4]["workflow"] != results[1]["workflow"]
    for seed, res in results.items():
        assert res["prompt"] == res["env_prompt"], seed  # no task_prompts: the env's own
        workflow = json.loads((run_dir / res["workflow"] / "workflow.json").read_text())
        assert workflow["description"] == res["prompt"], seed
        assert res["exit_status"] == "end_failure" and res["error"] is None, seed
    assert len(list(task_dir.glob("workflow_*"))) == 2
