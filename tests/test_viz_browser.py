"""The `gap viz` report in a real headless Chromium (Debian's chromium + chromium-driver, driven by
selenium), over the report of a real LIBERO session: a trial that succeeds (pick_place on
libero_object) and one that fails (homes the arm and gives up, on libero_spatial), both with
video. What a person does: read the heatmap, open the failed trial, play its video, look at its
graph, click a node; filter a cell's trials. Screenshots of the overview and the failed trial go
to test-artifacts/viz/ (look at them). Without Chromium (or selenium) these tests skip, saying
why; under CI they fail instead (tests/needs.py)."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import threading
from pathlib import Path
from urllib.parse import quote

import pytest
import yaml

from pytest_gap.viz.html import write_report
from pytest_gap.viz.serve import make_server
from tests.fake_session import BACKEND, FakeSession
from tests.needs import missing
from tests.service_configs import served_hold_config

pytest_plugins = ["pytester"]

ROOT = Path(__file__).resolve().parent.parent
ARTIFACTS = ROOT / "test-artifacts" / "viz"
CHROMIUM, CHROMEDRIVER = shutil.which("chromium"), shutil.which("chromedriver")
SESSION_TIMEOUT = 600
WAIT_S = 20

try:
    from selenium import webdriver
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support.ui import WebDriverWait
except ImportError:
    webdriver = By = WebDriverWait = None
MISSING = (
    "selenium is not installed (pip install -e '.[dev]')"
    if webdriver is None
    else "no chromium/chromedriver on PATH (bash scripts/setup.sh installs Debian's chromium "
    "and chromium-driver): the browser tests of gap viz did not run"
    if CHROMIUM is None or CHROMEDRIVER is None
    else None
)

GIVE_UP = {
    "version": 1,
    "name": "give_up",
    "start": "home",
    "nodes": {
        "home": {"type": "tool", "skill": "home", "next": "check", "on_error": "check"},
        "check": {"type": "tool", "skill": "check_success", "next": "failed"},
        "failed": {"type": "end", "status": "failure"},
    },
}
FAILED = "suites/libero_spatial/task_00/seed_000"
PASSED = "suites/libero_object/task_00/seed_000"


@pytest.fixture(scope="module", autouse=True)
def _browser_at_hand():
    """Before any fixture of the module (a real session takes a minute): skip, or under CI
    fail, every test when there is no browser to drive."""
    if MISSING:
        missing(MISSING)


@pytest.fixture(scope="module")
def real_run(tmp_path_factory) -> Path:
    """The run dir of one real session: two trials with videos and traces, one of each end."""
    home = tmp_path_factory.mktemp("viz_real")
    (home / "give_up").mkdir()
    (home / "give_up" / "workflow.json").write_text(json.dumps(GIVE_UP))
    config = {
        "trials": {"output_dir": "runs", "record_video": True, "max_steps": 200},
        "suites": [
            {
                "suite_name": "libero_object",
                "task_ids": [0],
                "seeds": [0],
                "workflow_dir": str(ROOT / "examples/workflows/pick_place"),
            },
            {
                "suite_name": "libero_spatial",
                "task_ids": [0],
                "seeds": [0],
                "workflow_dir": "give_up",
            },
        ],
        "gate_threshold": 0.0,
    }
    return _session(home, config)


def _session(home: Path, config: dict) -> Path:
    """A real pytest session over `config` in `home`; its run dir."""
    (home / "bench.yaml").write_text(yaml.safe_dump(config))
    done = subprocess.run(
        [sys.executable, "-m", "pytest", "bench.yaml", "-p", "no:cacheprovider", "-q"],
        cwd=home,
        capture_output=True,
        text=True,
        timeout=SESSION_TIMEOUT,
    )
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    (run_dir,) = (home / "runs").iterdir()
    return run_dir


@pytest.fixture(scope="module")
def browser():
    from selenium.webdriver.chrome.options import Options
    from selenium.webdriver.chrome.service import Service

    options = Options()
    options.binary_location = CHROMIUM
    for arg in ("--headless=new", "--no-sandbox", "--disable-dev-shm-usage", "--disable-gpu"):
        options.add_argument(arg)
    options.add_argument("--window-size=1400,1600")
    options.add_argument("--autoplay-policy=no-user-gesture-required")
    options.set_capability("goog:loggingPrefs", {"browser": "ALL"})
    # The driver named, so selenium's manager never goes to the network for one.
    driver = webdriver.Chrome(service=Service(CHROMEDRIVER), options=options)
    yield driver
    driver.quit()


def _open(browser, url: str):
    browser.get("about:blank")
    browser.get_log("browser")  # drop what earlier pages logged
    browser.get(url)
    WebDriverWait(browser, WAIT_S).until(lambda d: d.find_elements(By.CSS_SELECTOR, "#main *"))


def _errors(browser) -> list[dict]:
    return [e for e in browser.get_log("browser") if e["level"] == "SEVERE"]


def _requests(browser) -> list[str]:
    return browser.execute_script(
        "return performance.getEntriesByType('resource').map(e => e.name).concat([location.href]);"
    )


def _playable(browser) -> bool:
    return browser.execute_script(
        "const v = document.getElementById('video');"
        "return !!v && !v.error && v.readyState >= 1 && v.duration > 0;"
    )


def _shot(browser, name: str) -> Path:
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    path = ARTIFACTS / name
    browser.save_screenshot(str(path))
    return path


def test_the_overview_has_one_heatmap_cell_per_summary_cell(real_run, browser):
    report = write_report(real_run)
    _open(browser, report.as_uri())
    summary = json.loads((real_run / "summary.json").read_text())
    cells = browser.find_elements(By.CSS_SELECTOR, "#heat-success td[data-cell]")
    assert sorted(c.get_attribute("data-cell") for c in cells) == sorted(
        c["key"] for c in summary["cells"]
    )
    rates = {c.get_attribute("data-cell"): c.text.split("\n")[0] for c in cells}
    assert rates == {"suites/libero_object": "1.00", "suites/libero_spatial": "0.00"}
    assert "gate PASS" in browser.find_element(By.ID, "gate").text
    assert _shot(browser, "overview.png").stat().st_size > 10_000
    assert _errors(browser) == []
    assert all(u.startswith("file://") for u in _requests(browser))  # nothing left the machine


def test_a_failed_trial_shows_its_video_and_its_graph(real_run, browser):
    report = write_report(real_run)
    _open(browser, report.as_uri())
    (row,) = browser.find_elements(By.CSS_SELECTOR, "tr.trial[data-outcome=failed]")
    assert row.get_attribute("data-key") == FAILED
    row.find_element(By.CSS_SELECTOR, 'a[href^="#/trial/"]').click()
    WebDriverWait(browser, WAIT_S).until(_playable)
    source = browser.find_element(By.CSS_SELECTOR, "#video source").get_attribute("src")
    assert source.startswith("file://") and source.endswith(f"{FAILED}/video.mp4")
    record = json.loads((real_run / FAILED / "result.json").read_text())
    assert browser.find_element(By.ID, "reason").text == record["reason"]
    dag = json.loads((real_run / FAILED / "trace" / "dag_trace.json").read_text())
    nodes = browser.find_elements(By.CSS_SELECTOR, "#graph g.node")
    assert len(nodes) == len(dag["nodes"]) == len(GIVE_UP["nodes"])
    status = {n.get_attribute("data-node"): n.get_attribute("data-status") for n in nodes}
    assert status == {n["id"]: n["status"] for n in dag["nodes"]}
    home = browser.find_element(By.CSS_SELECTOR, '#graph g.node[data-node="home"]')
    browser.execute_script(
        "arguments[0].dispatchEvent(new MouseEvent('click', {bubbles: true}))", home
    )
    panel = browser.find_element(By.ID, "node-panel").text
    assert panel.startswith("home (home): ok") and "outputs" in panel
    _shot(browser, "failed_trial.png")
    assert _errors(browser) == []
    assert all(u.startswith("file://") for u in _requests(browser))


def test_the_served_report_loads_traces_and_videos_from_loopback(real_run, browser):
    server = make_server(real_run)
    host, port = server.server_address[:2]
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        _open(browser, f"http://{host}:{port}/#/trial/{quote(PASSED, safe='')}")
        WebDriverWait(browser, WAIT_S).until(
            lambda d: d.find_elements(By.CSS_SELECTOR, "#graph g.node")
        )
        WebDriverWait(browser, WAIT_S).until(_playable)
        dag = json.loads((real_run / PASSED / "trace" / "dag_trace.json").read_text())
        assert len(browser.find_elements(By.CSS_SELECTOR, "#graph g.node")) == len(dag["nodes"])
        assert _errors(browser) == []
        assert all(u.startswith(f"http://{host}:{port}/") for u in _requests(browser))
    finally:
        server.shutdown()
        server.server_close()


def test_a_cells_filter_shows_only_the_trials_asked_for(pytester, browser):
    fake = FakeSession(pytester)
    fake.config(
        {
            "backend": BACKEND,
            "trials": {"output_dir": "runs"},
            "suites": [
                {
                    "suite_name": "fake_easy",
                    "task_ids": [0, 1],
                    "seeds": [0, 1, 2, 3],
                    "workflow_dir": "wf",
                }
            ],
            "gate_threshold": 0.0,
        }
    )
    assert fake.run_inprocess("bench.yaml").ret == 0
    run_dir = fake.run_dir()
    _open(browser, write_report(run_dir).as_uri() + "#/cell/" + quote("suites/fake_easy", safe=""))

    def shown() -> list[tuple[str, str]]:
        rows = browser.find_elements(By.CSS_SELECTOR, "table.trials tbody tr.trial")
        return [(r.get_attribute("data-outcome"), r.get_attribute("data-key")) for r in rows]

    assert len(shown()) == 8
    browser.find_element(By.CSS_SELECTOR, 'button[data-filter="failed"]').click()
    failed = shown()  # the fake fails seeds divisible by 3: 0 and 3, on both tasks
    assert [o for o, _ in failed] == ["failed"] * 4
    assert sorted(k.rsplit("/", 1)[1] for _, k in failed) == ["seed_000"] * 2 + ["seed_003"] * 2
    browser.find_element(By.CSS_SELECTOR, 'button[data-filter="success"]').click()
    assert [o for o, _ in shown()] == ["success"] * 4
    browser.find_element(By.CSS_SELECTOR, 'button[data-filter="all"]').click()
    browser.find_element(By.CSS_SELECTOR, 'th[data-sort="seed"]').click()
    browser.find_element(By.CSS_SELECTOR, 'th[data-sort="seed"]').click()  # descending
    seeds = [k.rsplit("_", 1)[1] for _, k in shown()]
    assert seeds == sorted(seeds, reverse=True)
    bars = browser.find_elements(By.CSS_SELECTOR, "#task-bars .bar")
    assert [b.get_attribute("data-task") for b in bars] == ["0", "1"]
    assert _errors(browser) == []


def _chart(browser) -> dict:
    return browser.execute_script(
        "const c = document.getElementById('steps-chart');"
        "if (!c) return null;"
        "const all = (q) => [...c.querySelectorAll(q)];"
        "return {steps: +c.dataset.steps,"
        " holds: all('rect.hold').map(r => [r.dataset.object, r.dataset.ended]),"
        " releases: all('path.mark.release').map(p => +p.dataset.step),"
        " chunks: all('path.chunk').map(p => +p.dataset.step),"
        " series: all('path.series').map(p => p.getAttribute('class').split(' ')[1]),"
        " dist: !!document.querySelector('#steps-dist path.series.dist')};"
    )


def test_a_trials_steps_show_what_the_hand_held_and_where_it_let_go(real_run, browser):
    """The pick_place trial grasps the can and carries it to the basket: a hold band named
    after it, ending as the record's last steps say (the episode succeeds with the can still in
    the fingers, or after a release mark); a click on the chart seeks the video there."""
    from pytest_gap.sim.step_log import read_steps

    report = write_report(real_run)
    _open(browser, report.as_uri() + "#/trial/" + quote(PASSED, safe=""))
    WebDriverWait(browser, WAIT_S).until(_playable)
    record = json.loads((real_run / PASSED / "result.json").read_text())
    steps = read_steps(real_run / record["steps_file"])
    chart = _chart(browser)
    assert chart["steps"] == record["steps"] == len(steps["step"])
    held = [g for g in steps["grasped"] if g is not None]
    ended = "end" if steps["grasped"][-1] is not None else "release"
    assert held and chart["holds"] == [[held[0], ended]]
    assert len(chart["releases"]) == (ended == "release")
    assert chart["chunks"] == []  # scripted skills: no policy reply
    assert set(chart["series"]) == {"x", "y", "z", "command", "gripper"} and chart["dist"]
    assert browser.find_elements(By.ID, "failure-label") == []  # it succeeded
    chart_el = browser.find_element(By.ID, "steps-chart")
    browser.execute_script(
        "const r = arguments[0].getBoundingClientRect();"
        "arguments[0].dispatchEvent(new MouseEvent('click', {bubbles: true,"
        " clientX: r.left + r.width * 0.75, clientY: r.top + r.height / 2}));",
        chart_el,
    )
    WebDriverWait(browser, WAIT_S).until(
        lambda d: d.execute_script("return document.getElementById('video').currentTime") > 1.0
    )
    _shot(browser, "trial_steps.png")
    assert _errors(browser) == []


def test_a_failed_trial_says_how_it_failed(real_run, browser):
    report = write_report(real_run)
    _open(browser, report.as_uri() + "#/trial/" + quote(FAILED, safe=""))
    record = json.loads((real_run / FAILED / "result.json").read_text())
    assert record["failure_label"] == "never_reached_target"
    assert browser.find_element(By.ID, "failure-label").text == record["failure_label"]
    assert _chart(browser)["holds"] == []
    assert _errors(browser) == []


def test_a_policy_trials_chunks_are_marked_and_load_from_the_server(tmp_path, browser):
    """`gap policy serve hold` answers chunks of 10, run_policy applies 5 of each: a tick every
    5 steps after the bring-up, on the served report too (api/steps)."""
    gap = shutil.which("gap", path=str(Path(sys.executable).parent)) or "gap"
    config = served_hold_config(gap, 20, seeds=[0], n_seeds=None)
    run_dir = _session(tmp_path, config)
    (result,) = run_dir.rglob("result.json")
    record = json.loads(result.read_text())
    key = str(result.parent.relative_to(run_dir))
    server = make_server(run_dir)
    host, port = server.server_address[:2]
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        _open(browser, f"http://{host}:{port}/#/trial/{quote(key, safe='')}")
        WebDriverWait(browser, WAIT_S).until(lambda d: _chart(d) is not None)
        chart = _chart(browser)
        first, total = record["bringup_steps"] + 1, record["bringup_steps"] + record["steps"]
        assert chart["chunks"] == list(range(first, total + 1, 5))
        assert chart["steps"] == total and chart["holds"] == []
        assert _errors(browser) == []
        assert all(u.startswith(f"http://{host}:{port}/") for u in _requests(browser))
    finally:
        server.shutdown()
        server.server_close()
