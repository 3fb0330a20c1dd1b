"""How `gap viz` scales: a run dir of N trials written, its report built, and the overview drawn
in headless Chromium, for a small and a large run side by side.

    python bench/viz_scale.py [--trials 500 5000]

The run dirs are synthetic but in the harness's own formats: TrialResult records written by
`write_result`, each with a 5-node dag_trace.json and per-node I/O files like a workflow trial's
(20 cells: 4 rows x 5 columns, 10 tasks, seeds to fill). Printed per size: report size, seconds
to build it, and milliseconds from navigation start to the overview drawn (`gapRenderedMs`).
Target (issue 17): 5,000 trials draw the overview in under 2 s.
"""

from __future__ import annotations

import argparse
import itertools
import json
import shutil
import tempfile
import time
from pathlib import Path

from pytest_gap import ids
from pytest_gap.results import TrialResult, write_json, write_result
from pytest_gap.viz.html import write_report

ROWS = ("workflow", "policy_only@a", "policy_only@b", "llm_generation")
COLUMNS = ("libero/object", "libero/spatial", "libero/goal", "libero/10", "posvar/all")
NODES = ("home", "pick", "is_holding", "place", "done")


def _trace(trace_dir: Path, success: bool) -> None:
    nodes = [
        {
            "id": n,
            "type": "end" if n == "done" else "tool",
            "skill": n,
            "status": "ok",
            "executions": [{"seq": i + 1, "duration_ms": 900.0, "start_step": 30 * i}],
        }
        for i, n in enumerate(NODES)
    ]
    edges = [
        {"source": a, "target": b, "kind": "next", "taken": 1} for a, b in itertools.pairwise(NODES)
    ]
    write_json(
        trace_dir / "dag_trace.json",
        {
            "workflow": "pick_place",
            "result": {"success": success},
            "nodes": nodes,
            "edges": edges,
            "events": [{"message": "grasp closed", "step": 58, "width": 0.06}],
        },
    )
    for i, n in enumerate(NODES):
        write_json(
            trace_dir / "nodes" / f"{i + 1:03d}_{n}.json",
            {
                "seq": i + 1,
                "node": n,
                "inputs": {"name": "alphabet_soup_1"},
                "outputs": {"holding": True, "position": [0.1, 0.2, 0.9]},
            },
        )


def make_run(root: Path, n_trials: int) -> Path:
    run_dir = root / "runs" / "20261202_000000"
    per_cell = max(1, n_trials // (len(ROWS) * len(COLUMNS)))
    count = 0
    for row in ROWS:
        mode, _, policy = row.partition("@")
        for column in COLUMNS:
            family, variation = column.split("/")
            for i in range(per_cell):
                task, seed = i % 10, i // 10
                names = (mode, policy or None, family, variation, None)
                key = ids.trial_key(ids.cell_key(*names), task, seed)
                success = (task + seed) % 4 != 0
                result = TrialResult(
                    nodeid=ids.node_id(
                        "grid.yaml", ids.trial_id(ids.cell_id_parts(*names), task, seed)
                    ),
                    config="grid.yaml",
                    mode=mode,
                    policy_id=policy or None,
                    family=family,
                    variation=variation,
                    suite=f"libero_{variation}",
                    task_id=task,
                    seed=seed,
                    success=success,
                    completion=1.0 if success else 0.5,
                    steps=140,
                    wall_s=25.0,
                    reason=None if success else "step limit",
                    trace=f"{key}/trace/dag_trace.json",
                )
                write_result(run_dir / key, result)
                _trace(run_dir / key / "trace", success)
                count += 1
    return run_dir


def draw_ms(report: Path) -> float:
    from selenium import webdriver
    from selenium.webdriver.chrome.options import Options
    from selenium.webdriver.chrome.service import Service
    from selenium.webdriver.support.ui import WebDriverWait

    options = Options()
    options.binary_location = shutil.which("chromium")
    for arg in ("--headless=new", "--no-sandbox", "--disable-dev-shm-usage", "--disable-gpu"):
        options.add_argument(arg)
    driver = webdriver.Chrome(service=Service(shutil.which("chromedriver")), options=options)
    try:
        driver.get(report.as_uri())
        WebDriverWait(driver, 60).until(lambda d: d.execute_script("return window.gapRenderedMs"))
        return float(driver.execute_script("return window.gapRenderedMs"))
    finally:
        driver.quit()


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--trials", type=int, nargs="+", default=[500, 5000])
    args = parser.parse_args()
    rows = []
    for n in args.trials:
        with tempfile.TemporaryDirectory(prefix="gap-viz-bench-") as tmp:
            run_dir = make_run(Path(tmp), n)
            t0 = time.perf_counter()
            report = write_report(run_dir)
            build_s = time.perf_counter() - t0
            size_mb = report.stat().st_size / 1e6
            data = report.read_text()
            inlined = json.loads(data.split('type="application/json">')[1].split("</script>")[0])
            rows.append((n, size_mb, len(inlined["traces"]), build_s, draw_ms(report)))
    print(f"{'trials':>7} {'report MB':>10} {'traces inlined':>15} {'build s':>8} {'draw ms':>8}")
    for n, size, traces, build, draw in rows:
        print(f"{n:7d} {size:10.1f} {traces:15d} {build:8.1f} {draw:8.0f}")
    if len(rows) > 1:
        print(f"draw ratio {rows[-1][0]} / {rows[0][0]} trials: {rows[-1][4] / rows[0][4]:.2f}")
    big = rows[-1]
    verdict = "MET" if big[4] < 2000 else "MISSED"
    print(f"target: {big[0]} trials draw the overview in < 2000 ms: {big[4]:.0f} ms {verdict}")


if __name__ == "__main__":
    main()
