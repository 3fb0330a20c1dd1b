// gap viz: draws the report's data (pytest_gap/viz/model.py Report) as pages chosen by the URL
// hash: #/ overview, #/cell/<key>, #/trial/<key>, #/compare. Text goes in with textContent only
// (prompts and reasons are user text); nothing is fetched except traces from `gap viz --serve`.
"use strict";
const DATA = JSON.parse(document.getElementById("gap-data").textContent);
const TRIALS = new Map(DATA.trials.map((t) => [t.key, t]));
const CELLS = new Map(DATA.cells.map((c) => [c.key, c]));
const BY_CELL = new Map();
for (const t of DATA.trials) {
  if (!BY_CELL.has(t.cell)) BY_CELL.set(t.cell, []);
  BY_CELL.get(t.cell).push(t);
}
const OUTCOMES = ["failed", "errored", "infra", "timeout", "success"];

function h(tag, attrs, ...children) {
  const el = document.createElementNS(
    ["svg", "g", "rect", "text", "path", "defs", "marker", "title"].includes(tag)
      ? "http://www.w3.org/2000/svg"
      : "http://www.w3.org/1999/xhtml",
    tag
  );
  for (const [k, v] of Object.entries(attrs || {})) {
    if (v === null || v === undefined || v === false) continue;
    if (k.startsWith("on")) el.addEventListener(k.slice(2), v);
    else el.setAttribute(k, v === true ? "" : String(v));
  }
  for (const c of children.flat()) {
    if (c === null || c === undefined || c === false) continue;
    el.append(c instanceof Node ? c : document.createTextNode(String(c)));
  }
  return el;
}
const fmt = (v, d = 2) => (v === null || v === undefined ? "-" : Number(v).toFixed(d));
const ci = (pair) => (pair ? `[${fmt(pair[0])}, ${fmt(pair[1])}]` : "");
const link = (hash, ...children) => h("a", { href: "#" + hash }, ...children);
const cellHash = (key) => "/cell/" + encodeURIComponent(key);
const trialHash = (key) => "/trial/" + encodeURIComponent(key);
const badge = (outcome) => h("span", { class: "badge " + outcome }, outcome);

function heatColor(rate) {
  if (rate === null || rate === undefined) return "#eceff1";
  const hue = Math.round(120 * rate); // red 0 -> green 1
  return `hsl(${hue}, 60%, ${78 - 12 * Math.abs(rate - 0.5)}%)`;
}

function heatmap(metric, id) {
  const rows = DATA.overview.rows;
  const cols = DATA.overview.columns;
  const at = new Map(DATA.cells.map((c) => [c.row + "\u0000" + c.column, c]));
  const table = h("table", { class: "heat", id },
    h("tr", {}, h("th", {}, metric === "success_rate" ? "success" : "completion"),
      cols.map((c) => h("th", {}, c))));
  for (const r of rows) {
    const tr = h("tr", {}, h("th", {}, r));
    for (const col of cols) {
      const c = at.get(r + "\u0000" + col);
      if (!c) { tr.append(h("td", { class: "empty muted" }, "-")); continue; }
      const rate = c[metric];
      const interval = metric === "success_rate" ? c.success_ci : c.completion_ci;
      const td = h("td", {
        class: "cell" + (c.error ? " err" : ""),
        "data-cell": c.key,
        "data-rate": rate === null ? "" : rate,
        title: c.error || "",
        style: c.error ? null : `background:${heatColor(rate)}`,
        onclick: () => { location.hash = cellHash(c.key); },
      },
        h("div", { class: "rate" }, c.error ? "ERR" : fmt(rate)),
        h("div", { class: "ci" }, ci(interval)),
        h("div", { class: "n" }, `n=${c.n_trials}` + (c.n_errored ? `, ${c.n_errored} errored` : "")),
        metric === "success_rate" && c.control && c.control.drop !== null
          ? h("div", { class: "drop", title: `drop vs ${c.control.control}` }, `drop ${fmt(c.control.drop)}`)
          : null);
      tr.append(td);
    }
    table.append(tr);
  }
  return table;
}

function dropTable() {
  const rows = DATA.cells.filter((c) => c.control);
  if (!rows.length) return [];
  const head = ["cell", "control arm", "control", "perturbed", "drop [95% CI]", "McNemar p", "pairs"];
  return [
    h("h2", {}, "Drop against the control arm (paired by task and seed)"),
    h("table", { class: "trials", id: "drops" },
      h("thead", {}, h("tr", {}, head.map((x) => h("th", {}, x)))),
      h("tbody", {}, rows.map((c) => {
        const d = c.control;
        return h("tr", { "data-cell": c.key },
          h("td", {}, link(cellHash(c.key), `${c.row} ${c.column}`)), h("td", {}, d.control),
          h("td", {}, fmt(d.control_rate)), h("td", {}, fmt(d.perturbed_rate)),
          h("td", {}, d.drop === null ? "-" : `${fmt(d.drop)} ${ci(d.drop_ci_low === null ? null : [d.drop_ci_low, d.drop_ci_high])}`),
          h("td", {}, d.p_value === null ? "-" : d.p_value.toPrecision(3)), h("td", {}, d.n_pairs));
      }))),
    h("p", { class: "muted" }, "drop = the control arm's success minus the perturbed cell's, over the (task, seed) episodes both ran; interval: bootstrap over tasks"),
  ];
}

function counts(trials) {
  const n = Object.fromEntries(OUTCOMES.map((o) => [o, 0]));
  for (const t of trials) n[t.outcome] += 1;
  return n;
}

function overview() {
  const o = DATA.overview;
  const n = counts(DATA.trials);
  const notOk = DATA.trials.filter((t) => t.outcome !== "success");
  const shown = notOk.slice(0, 50);
  return [
    o.gate ? h("div", { class: "gate " + (o.verdict || ""), id: "gate" }, o.gate) : h("p", { class: "muted" }, "no gate recorded (summary.json missing: the session did not finish)"),
    o.coverage ? h("p", { class: "muted", id: "coverage" }, o.coverage) : null,
    h("p", {}, `${DATA.trials.length} trials: ` + OUTCOMES.map((k) => `${n[k]} ${k}`).join(", ")),
    h("h2", {}, "Success rate (95% Wilson interval)"),
    heatmap("success_rate", "heat-success"),
    h("h2", {}, "Completion rate (95% task-bootstrap interval)"),
    heatmap("completion_rate", "heat-completion"),
    ...dropTable(),
    h("h2", {}, `Trials that did not succeed (${notOk.length})`),
    notOk.length ? trialTable(shown, false, true) : h("p", { class: "muted" }, "none"),
    notOk.length > shown.length ? h("p", { class: "muted" }, `first ${shown.length}; open a cell for the rest`) : null,
  ];
}

function cellName(t) {
  const c = CELLS.get(t.cell);
  return c ? `${c.row} ${c.column}` : t.cell;
}

function trialTable(trials, withFilter, withCell = false) {
  const columns = [
    ...(withCell ? [["cell", cellName]] : []),
    ["task", (t) => t.task_id], ["seed", (t) => t.seed], ["init state", (t) => t.init_state],
    ["outcome", (t) => t.outcome], ["exit status", (t) => t.exit_status || String(t.exit_code)],
    ["completion", (t) => t.completion], ["steps", (t) => t.steps], ["wall s", (t) => t.wall_s],
    ["reason", (t) => t.reason || ""],
  ];
  let sortBy = 0, ascending = true, filter = "all";
  const body = h("tbody", {});
  const wrap = h("div", {});
  function draw() {
    const rows = trials.filter((t) => filter === "all" || t.outcome === filter);
    const get = columns[sortBy][1];
    rows.sort((a, b) => {
      const x = get(a), y = get(b);
      const c = x === y ? 0 : x === null ? -1 : y === null ? 1 : x < y ? -1 : 1;
      return ascending ? c : -c;
    });
    body.replaceChildren(...rows.map((t) => h("tr", { class: "trial", "data-outcome": t.outcome, "data-key": t.key },
      withCell ? h("td", {}, link(cellHash(t.cell), cellName(t))) : null,
      h("td", {}, link(trialHash(t.key), `task ${t.task_id}`)),
      h("td", {}, t.seed), h("td", {}, t.init_state ?? "-"), h("td", {}, badge(t.outcome)),
      h("td", {}, t.exit_status || String(t.exit_code)), h("td", {}, fmt(t.completion)),
      h("td", {}, t.steps), h("td", {}, fmt(t.wall_s, 1)), h("td", {}, t.reason || ""))));
  }
  const head = h("tr", {}, columns.map(([name], i) => h("th", {
    class: "sortable", "data-sort": name,
    onclick: () => { ascending = sortBy === i ? !ascending : true; sortBy = i; draw(); },
  }, name)));
  if (withFilter) {
    const n = counts(trials);
    const bar = h("div", { class: "filters" });
    for (const f of ["all", ...OUTCOMES]) {
      const label = f === "all" ? `all (${trials.length})` : `${f} (${n[f]})`;
      bar.append(h("button", {
        "data-filter": f, class: f === filter ? "on" : "",
        onclick: (e) => {
          filter = f;
          for (const b of bar.children) b.classList.toggle("on", b === e.currentTarget);
          draw();
        },
      }, label));
    }
    wrap.append(bar);
  }
  draw();
  wrap.append(h("table", { class: "trials" }, h("thead", {}, head), body));
  return wrap;
}

function taskBars(cell) {
  const bars = h("div", { class: "bars", id: "task-bars" });
  for (const t of cell.tasks) {
    const track = h("div", { class: "track" },
      h("div", { class: "fill", style: `width:${100 * (t.rate || 0)}%` }));
    if (t.ci_low !== null) {
      track.append(h("div", { class: "whisker", style: `left:${100 * t.ci_low}%;width:${100 * (t.ci_high - t.ci_low)}%` }));
    }
    bars.append(h("div", { class: "bar", "data-task": t.task_id },
      h("span", { style: "width:60px" }, `task ${t.task_id}`), track,
      h("span", {}, `${t.n_success}/${t.n_trials} ${fmt(t.rate)} [${fmt(t.ci_low)}, ${fmt(t.ci_high)}]`)));
  }
  return bars;
}

function cellPage(key) {
  const cell = CELLS.get(key);
  const trials = BY_CELL.get(key) || [];
  if (!cell) return [h("p", {}, `no cell ${key} in this run`)];
  return [
    h("h2", {}, `${cell.row}  ${cell.column}`),
    h("p", {}, `success ${fmt(cell.success_rate)} ${ci(cell.success_ci)} (${cell.n_success}/${cell.n_trials}), ` +
      `completion ${fmt(cell.completion_rate)} ${ci(cell.completion_ci)}, planned ${cell.n_planned}` +
      (cell.n_errored ? `, ${cell.n_errored} errored` : "") + (cell.n_infra ? `, ${cell.n_infra} infra` : "")),
    cell.error ? h("p", { class: "note" }, cell.error) : null,
    cell.control ? h("p", { id: "cell-drop" }, `against its control arm ${cell.control.control}: ` +
      `${fmt(cell.control.control_rate)} -> ${fmt(cell.control.perturbed_rate)}, drop ${cell.control.drop === null ? "-" : fmt(cell.control.drop)} ` +
      `over ${cell.control.n_pairs} paired episodes (McNemar p ${cell.control.p_value === null ? "-" : cell.control.p_value.toPrecision(3)})`) : null,
    h("h2", {}, "Per task (95% Wilson interval)"), taskBars(cell),
    h("h2", {}, "Trials"), trialTable(trials, true),
  ];
}

const STATUS = (s) => "status-" + (["ok", "error", "skipped", "pending", "running"].includes(s) ? s : "pending");

function graph(trace, panel) {
  const W = 150, H = 44;
  const pos = new Map(trace.nodes.map((n) => [n.id, n]));
  const svg = h("svg", { class: "graph", id: "graph", width: trace.width, height: trace.height, viewBox: `0 0 ${trace.width} ${trace.height}` },
    h("defs", {}, h("marker", { id: "arrow", viewBox: "0 0 10 10", refX: 10, refY: 5, markerWidth: 6, markerHeight: 6, orient: "auto-start-reverse" },
      h("path", { d: "M 0 0 L 10 5 L 0 10 z", fill: "#2f4858" }))));
  for (const e of trace.edges) {
    const a = pos.get(e.source), b = pos.get(e.target);
    if (!a || !b) continue;
    const x1 = a.x + W / 2, y1 = a.y + H, x2 = b.x + W / 2;
    const back = b.y <= a.y;
    const y2 = back ? b.y + H : b.y;
    const bend = back ? Math.max(W, Math.abs(x2 - x1)) : 0;
    const d = back
      ? `M ${x1} ${a.y} C ${x1 + bend} ${a.y - 30}, ${x2 + bend} ${y2 + 30}, ${x2 + 6} ${y2}`
      : `M ${x1} ${y1} C ${x1} ${(y1 + y2) / 2}, ${x2} ${(y1 + y2) / 2}, ${x2} ${y2}`;
    svg.append(h("path", { class: "edge " + (e.taken ? "taken" : "untaken"), d, "marker-end": "url(#arrow)", "data-edge": `${e.source}->${e.target}` },
      h("title", {}, `${e.source} -> ${e.target} (${e.kind}): taken ${e.taken}`)));
    if (e.taken) {
      svg.append(h("text", { x: (x1 + x2) / 2 + 4, y: back ? y2 + 14 : (y1 + y2) / 2 }, `${e.taken}x`));
    }
  }
  for (const n of trace.nodes) {
    const ms = n.runs.reduce((s, r) => s + (r.duration_ms || 0), 0);
    const g = h("g", { class: "node", "data-node": n.id, "data-status": n.status, transform: `translate(${n.x},${n.y})`,
      onclick: (ev) => {
        for (const other of svg.querySelectorAll("g.node")) other.classList.remove("selected");
        ev.currentTarget.classList.add("selected");
        panel.replaceChildren(...nodePanel(n));
      } },
      h("rect", { width: W, height: H, class: STATUS(n.status) }),
      h("text", { x: 6, y: 16 }, n.id + (n.runs.length > 1 ? `  x${n.runs.length}` : "")),
      h("text", { x: 6, y: 32, class: "muted" }, (n.skill || n.type) + (n.runs.length ? `  ${(ms / 1000).toFixed(2)} s` : "")),
      h("title", {}, `${n.id}: ${n.status}`));
    svg.append(g);
  }
  return svg;
}

function nodePanel(n) {
  const out = [h("h3", {}, `${n.id} (${n.skill || n.type}): ${n.status}`)];
  if (!n.runs.length) out.push(h("p", { class: "muted" }, "never reached"));
  for (const r of n.runs) {
    out.push(h("div", { class: "run" },
      h("b", {}, `#${r.seq} ${r.status}`),
      ` ${fmt(r.duration_ms, 1)} ms, steps ${r.start_step ?? "?"}-${r.end_step ?? "?"}`,
      r.error ? h("p", { class: "note" }, r.error) : null,
      r.decision ? h("div", {}, "decision: ", h("code", {}, JSON.stringify(r.decision))) : null,
      r.inputs !== null ? h("div", {}, "inputs", h("pre", {}, JSON.stringify(r.inputs, null, 1))) : null,
      r.outputs !== null ? h("div", {}, "outputs", h("pre", {}, JSON.stringify(r.outputs, null, 1))) : null,
      r.images.length ? h("div", { class: "perception" }, r.images.map((src) => h("img", { src, alt: src, loading: "lazy" }))) : null));
  }
  return out;
}

function eventsTable(events) {
  if (!events.length) return h("p", { class: "muted" }, "no events");
  return h("table", { id: "events" }, h("tr", {}, h("th", {}, "step"), h("th", {}, "event"), h("th", {}, "details")),
    events.map((e) => {
      const rest = Object.fromEntries(Object.entries(e).filter(([k]) => !["t_ms", "kind", "message", "step"].includes(k)));
      return h("tr", {}, h("td", {}, e.step ?? ""), h("td", {}, e.message || e.kind || ""), h("td", {}, h("code", {}, JSON.stringify(rest))));
    }));
}

function traceSection(trial, trace) {
  const panel = h("div", { class: "panel", id: "node-panel" }, h("p", { class: "muted" }, "click a node to see its inputs, outputs and images"));
  const res = trace.result || {};
  const out = [
    h("h2", {}, `Workflow ${trace.workflow || ""}: ${trace.nodes.length} nodes`),
    h("p", { class: "muted" }, `ended ${res.exit_status || "?"}` + (res.end_node ? ` at ${res.end_node}` : "") +
      (res.error ? `: ${res.error}` : "") + `, ${res.node_executions ?? "?"} node executions`),
    h("div", { class: "graph-row" }, graph(trace, panel), panel),
  ];
  if (trace.windows.length) {
    out.push(h("h2", {}, "Policy windows"), h("table", { id: "windows" },
      h("tr", {}, h("th", {}, "window"), h("th", {}, "step"), h("th", {}, "inference ms"), h("th", {}, "actions")),
      trace.windows.map((w) => h("tr", {}, h("td", {}, w.window), h("td", {}, w.step ?? ""), h("td", {}, fmt(w.infer_ms, 1)), h("td", {}, w.actions ?? "")))));
  }
  const events = [...trace.events].sort((a, b) => (a.step ?? 0) - (b.step ?? 0) || (a.t_ms ?? 0) - (b.t_ms ?? 0));
  out.push(h("h2", {}, "Skill events"), eventsTable(events));
  return out;
}

// A trial's per-step evidence (viz/steps.py StepsView): the action's xyz and gripper entry and
// the gripper as executed, over the steps; green bands where the hand held an object, red marks
// where it let go (orange: lost while closed), ticks where a policy reply began; below, the
// hand's distance to the goal's objects. The video (20 frames a second, frame k after step k)
// and the chart follow each other: a click seeks the video, playing moves the cursor.
const FPS = 20;
function stepsSection(t, s) {
  const W = 720, H = 200, D = 70, L = 34, R = 8;
  const n = s.steps.length, first = s.steps[0], last = s.steps[n - 1];
  const x = (step) => L + ((step - first) / Math.max(1, last - first)) * (W - L - R);
  const y = (v) => 10 + (1 - (Math.max(-1, Math.min(1, v)) + 1) / 2) * (H - 30);
  const line = (values, yOf) => values.map((v, i) => (v === null ? null : [x(s.steps[i]), yOf(v)]))
    .reduce((d, p, i, all) => (p === null ? d : d + (i && all[i - 1] ? " L" : " M") + p[0].toFixed(1) + " " + p[1].toFixed(1)), "").trim();
  const chart = h("svg", { id: "steps-chart", width: W, height: H, "data-steps": n, viewBox: `0 0 ${W} ${H}` },
    h("path", { class: "axis", d: `M ${L} ${y(0)} H ${W - R}` }),
    h("text", { x: 2, y: y(1) + 4 }, "+1"), h("text", { x: 2, y: y(-1) + 4 }, "-1"),
    s.holds.map((hold) => h("rect", { class: "hold", "data-object": hold.object, "data-ended": hold.ended,
      x: x(hold.first), y: 10, width: Math.max(1, x(hold.last) - x(hold.first)), height: H - 30 },
      h("title", {}, `held ${hold.object}, steps ${hold.first}-${hold.last} (${hold.ended})`))),
    s.holds.map((hold) => h("text", { class: "hold-label", x: x(hold.first) + 2, y: 22 }, hold.object)),
    s.chunks.map((step) => h("path", { class: "chunk", "data-step": step, d: `M ${x(step).toFixed(1)} ${H - 20} v 6` })),
    ["x", "y", "z"].map((axis, k) => h("path", { class: "series " + axis, d: line(s.xyz[k], y) })),
    h("path", { class: "series command", d: line(s.command, y) }),
    h("path", { class: "series gripper", d: line(s.gripper, y) }),
    s.holds.filter((hold) => hold.ended !== "end").map((hold) => h("path", {
      class: "mark " + hold.ended, "data-step": hold.last + 1, d: `M ${x(hold.last + 1).toFixed(1)} 10 V ${H - 20}` },
      h("title", {}, `${hold.ended} of ${hold.object} at step ${hold.last + 1}`))),
    h("text", { x: L, y: H - 2 }, `step ${first}`), h("text", { x: W - R - 60, y: H - 2 }, `step ${last}`),
    h("path", { id: "steps-cursor", d: `M ${x(first)} 10 V ${H - 20}` }));
  const dists = s.target_dist.filter((d) => d !== null);
  const top = Math.max(0.05, ...dists);
  const dist = dists.length ? h("svg", { id: "steps-dist", width: W, height: D, viewBox: `0 0 ${W} ${D}` },
    h("path", { class: "series dist", d: line(s.target_dist, (d) => 6 + (1 - d / top) * (D - 16)) }),
    h("path", { class: "axis", d: `M ${L} ${6 + (1 - 0.05 / top) * (D - 16)} H ${W - R}` }, h("title", {}, "5 cm: reached")),
    h("text", { x: 2, y: 12 }, `${top.toFixed(2)} m`), h("text", { x: 2, y: D - 8 }, "0")) : null;
  const cursor = chart.querySelector("#steps-cursor");
  const moveTo = (step) => cursor.setAttribute("d", `M ${x(Math.max(first, Math.min(last, step))).toFixed(1)} 10 V ${H - 20}`);
  chart.addEventListener("click", (ev) => {
    const box = chart.getBoundingClientRect();
    const step = Math.round(first + ((ev.clientX - box.left - L) / (W - L - R)) * (last - first));
    moveTo(step);
    const video = document.getElementById("video");
    if (video) video.currentTime = Math.max(0, step) / FPS;
  });
  setTimeout(() => {
    const video = document.getElementById("video");
    if (video) video.addEventListener("timeupdate", () => moveTo(Math.round(video.currentTime * FPS)));
  });
  return [
    h("h2", {}, `Steps: ${n}`),
    h("p", { class: "muted" }, "action x y z, gripper command (dashed) and as executed (thick); green: held, red: released, orange: dropped; ticks: a policy reply began"),
    chart, dist,
  ];
}

function trialPage(key) {
  const t = TRIALS.get(key);
  if (!t) return [h("p", {}, `no trial ${key} in this run`)];
  const cell = CELLS.get(t.cell);
  const media = t.video
    ? h("video", { controls: true, preload: "metadata", id: "video", width: 512 }, h("source", { src: t.video, type: "video/mp4" }))
    : t.frames ? h("img", { class: "frames", src: t.frames, alt: "frame strip", id: "frames" })
    : h("p", { class: "muted" }, "no video or frames recorded (record_video / frames_every)");
  const traceBox = h("div", { id: "trace" });
  const stepsBox = h("div", { id: "steps" });
  const page = [
    h("p", {}, link(cellHash(t.cell), cell ? `${cell.row}  ${cell.column}` : t.cell), `  /  task ${t.task_id}, seed ${t.seed}`),
    h("div", { class: "trial-top" }, media, h("div", {},
      h("p", {}, badge(t.outcome), ` exit ${t.exit_status || t.exit_code}, completion ${fmt(t.completion)}, ${t.steps} steps, ${fmt(t.wall_s, 1)} s`),
      t.reason ? h("p", { class: "note", id: "reason" }, t.reason) : null,
      t.failure_label ? h("p", {}, "how it failed: ", h("b", { id: "failure-label" }, t.failure_label)) : null,
      t.prompt ? h("p", {}, "instruction: ", h("i", {}, t.prompt)) : null,
      h("p", { class: "muted" }, t.nodeid))),
    stepsBox,
    traceBox,
  ];
  if (DATA.steps[key]) stepsBox.append(...stepsSection(t, DATA.steps[key]).filter(Boolean));
  else if (t.steps_file && DATA.serve) {
    fetch("api/steps?key=" + encodeURIComponent(key)).then((r) => r.json())
      .then((steps) => stepsBox.replaceChildren(...stepsSection(t, steps).filter(Boolean)))
      .catch((err) => stepsBox.replaceChildren(h("p", { class: "note" }, `steps did not load: ${err}`)));
  } else if (t.steps_file) {
    stepsBox.append(h("p", { class: "note" }, "this trial's steps are not inlined (the report's size budget); open the run with `gap viz RUN_DIR --serve` to see them"));
  }
  const inline = DATA.traces[key];
  if (inline) traceBox.append(...traceSection(t, inline));
  else if (!t.trace) traceBox.append(h("p", { class: "muted" }, "no workflow trace recorded for this trial"));
  else if (DATA.serve) {
    traceBox.append(h("p", { class: "muted" }, "loading trace..."));
    fetch("api/trace?key=" + encodeURIComponent(key)).then((r) => r.json()).then((trace) => {
      traceBox.replaceChildren(...traceSection(t, trace));
    }).catch((err) => traceBox.replaceChildren(h("p", { class: "note" }, `trace did not load: ${err}`)));
  } else {
    traceBox.append(h("p", { class: "note" }, "this trace is not inlined (the report's size budget); open the run with `gap viz RUN_DIR --serve` to load it"));
  }
  const turns = t.agent_traces ? DATA.agents[t.agent_traces] : null;
  if (turns && turns.length) {
    page.push(h("h2", {}, "LLM agents (prompts and answers, redacted)"),
      h("div", { id: "agents" }, turns.map((a) => h("details", {}, h("summary", {}, a.name), h("pre", {}, a.text)))));
  }
  return page;
}

function comparePage() {
  const c = DATA.compare;
  if (!c) return [h("p", { class: "muted" }, "no comparison: run `gap viz RUN_A RUN_B`")];
  if (c.refused) return [h("h2", {}, "Comparison refused"), h("ul", { id: "refused" }, c.refused.map((r) => h("li", {}, r)))];
  const rows = [...c.cells, c.pooled];
  const cols = ["cell", "n_pairs", "a_success", "b_success", "diff", "ci_low", "ci_high", "a_only", "b_only", "p_value", "p_holm", "n_excluded", "verdict"];
  return [
    h("h2", {}, `B (${c.b.row}, ${c.b.run}) against A (${c.a.row}, ${c.a.run})`),
    h("p", { class: "gate " + (c.exit_code ? "FAIL" : "PASS") }, c.verdict),
    h("table", { id: "compare" }, h("tr", {}, cols.map((k) => h("th", {}, k))),
      rows.map((r) => h("tr", { "data-cell": r.cell }, cols.map((k) => h("td", {}, typeof r[k] === "number" && !Number.isInteger(r[k]) ? fmt(r[k], 3) : (r[k] ?? "")))))),
    c.notes.length ? h("ul", {}, c.notes.map((n) => h("li", {}, n))) : null,
  ];
}

function render() {
  const hash = decodeURIComponent(location.hash.slice(1)) || "/";
  const main = document.getElementById("main");
  let page;
  if (hash.startsWith("/cell/")) page = cellPage(hash.slice(6));
  else if (hash.startsWith("/trial/")) page = trialPage(hash.slice(7));
  else if (hash === "/compare") page = comparePage();
  else page = overview();
  main.replaceChildren(...page.filter(Boolean));
  window.scrollTo(0, 0);
}

document.getElementById("title").textContent = DATA.title;
if (DATA.compare) document.getElementById("nav-compare").hidden = false;
window.addEventListener("hashchange", render);
render();
window.gapRenderedMs = performance.now(); // the first page drawn: bench/viz_scale.py reads it
