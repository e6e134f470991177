// The perfmodel page: settings in, the server's answers (the CLI's own numbers) drawn.
"use strict";

const $ = (sel, root) => (root || document).querySelector(sel);
const $$ = (sel, root) => Array.from((root || document).querySelectorAll(sel));
const state = {pending: 0, version: 0, error: null, estimate: null, curve: null,
               sim: null, plan: null, view: "estimate", css: ""};
window.perfmodelState = state;

// The server answers only its own page: the token (kept in an HttpOnly cookie set from the
// start-up URL's ?token=, sent with every request) on each API call, JSON as
// application/json, an upload as application/octet-stream.
async function api(path, body, signal) {
  const file = body instanceof Blob;
  const res = await fetch(path, body === undefined ? {signal, credentials: "same-origin"} :
    {method: "POST", body: typeof body === "string" || file ? body : JSON.stringify(body),
     headers: {"Content-Type": file ? "application/octet-stream" : "application/json"},
     credentials: "same-origin", signal});
  const data = await res.json();
  if (!res.ok) throw Object.assign(new Error(data.error || res.statusText), {user: res.status === 400});
  return data;
}

// --- settings ------------------------------------------------------------------------
function formValues(form) {
  const out = {};
  for (const node of $$("[name]", form)) {
    if (node.type === "checkbox") out[node.name] = node.checked;
    else if (node.value.trim() !== "") out[node.name] = node.value.trim();
  }
  return out;
}
const settings = () => formValues($("#settings"));
const pick = (obj, keys) => Object.fromEntries(keys.filter(k => k in obj).map(k => [k, obj[k]]));
const SERVED = ["model", "hardware", "engine", "weights-dtype", "act-dtype", "kv-dtype",
                "tp", "pp", "ep", "dp", "attention-dp"];

function clearErrors(scope) {
  $$(".err:not(.upload)", scope).forEach(e => { e.textContent = ""; });   // an upload's stays
}

function showError(message, fallback) {
  // the CLI's line: "error: <message>", next to the option it names when the page has it
  const text = "error: " + message;
  const flag = (message.match(/^--([a-z0-9-]+)/) || [])[1];
  const spot = flag && $(`.err[data-for="${flag}"]`);
  (spot || fallback || $("#form-error")).textContent = text;
  state.error = text;
}

// --- estimate ------------------------------------------------------------------------
let inflight = null;
async function update() {
  if (inflight) inflight.abort();
  const ctl = new AbortController();
  inflight = ctl;
  state.pending++;
  const t0 = performance.now();
  try {
    const data = await api("/api/estimate", settings(), ctl.signal);
    clearErrors($("#settings"));
    state.error = null;
    state.estimate = data;
    renderEstimate(data);
    if (state.view === "roofline") renderRoofline(data.roofline);   // others: when shown
    $("#status").textContent = `estimate in ${(performance.now() - t0).toFixed(0)} ms`;
    if (state.view === "batch") await updateCurve();
    $$(".view").forEach(v => v.classList.remove("stale"));
  } catch (err) {
    if (err.name === "AbortError") return;
    clearErrors($("#settings"));
    showError(err.message);
    $$("#view-estimate, #view-roofline, #view-batch").forEach(v => v.classList.add("stale"));
  } finally {
    state.pending--;
    state.version++;
    if (inflight === ctl) inflight = null;
  }
}

const SUMMARY = [["ttft_s", "time to first token", "s"], ["tpot_s", "time per output token", "s"],
  ["e2e_s", "end to end", "s"], ["throughput_tokens_per_s", "throughput", "tok/s"],
  ["decode_tokens_per_s", "decode throughput", "tok/s"],
  ["throughput_per_device_tokens_per_s", "throughput per device", "tok/s"],
  ["devices", "devices", ""], ["weights_bytes", "weights", "B"],
  ["kv_cache_bytes", "KV cache", "B"], ["max_batch", "largest batch that fits", ""],
  ["communication_share", "communication share", ""]];

function num(v, unit) {
  if (typeof v !== "number") return String(v);
  if (unit === "s") return v >= 1 ? v.toFixed(3) + " s" : (v * 1e3).toPrecision(4) + " ms";
  return Charts.fmt(v) + (unit ? " " + unit : "");
}

function cell(key, value, unit) {
  return `<td data-key="${key}" data-value="${value}">${num(value, unit)}</td>`;
}

function banded(key, obj, field, unit) {
  // a figure and, where the summary has its 80% band (field_low, field_high), the band below
  const lo = obj[field + "_low"], hi = obj[field + "_high"];
  const band = lo === undefined || hi === undefined ? "" :
    `<div class="band" data-band="${key}" data-low="${lo}" data-high="${hi}">${num(lo, unit)} – ${num(hi, unit)}</div>`;
  return `<td data-key="${key}" data-value="${obj[field]}">${num(obj[field], unit)}${band}</td>`;
}

function renderEstimate(data) {
  const e = data.estimate;
  $("#view-estimate .cli code").textContent = data.command;
  const rows = SUMMARY.filter(([k]) => k in e).map(([k, label, unit]) => {
    const lo = e[k + "_low"], hi = e[k + "_high"];
    const band = lo !== undefined && hi !== undefined
      ? `<td class="band" data-band="${k}" data-low="${lo}" data-high="${hi}">80%: ${num(lo, unit)} – ${num(hi, unit)}</td>` : "<td></td>";
    return `<tr><td>${label}</td>${cell(k, e[k], unit)}${band}</tr>`;
  });
  rows.push(`<tr><td>fits in memory</td><td data-key="fits" data-value="${e.fits}">${e.fits ? "yes" : "no"}</td><td></td></tr>`);
  $("#summary").innerHTML = `<tr><th>${e.model} on ${e.hardware} (${e.engine})</th><th>estimate</th><th>band</th></tr>` + rows.join("");
  const notes = [...(typeof e.band === "string" ? [`band: ${e.band}`] : []), ...(e.warnings || []), ...(data.dropped.length ? [`not an estimate option: ${data.dropped.join(" ")}`] : [])];
  $("#view-estimate .warnings").textContent = notes.join("\n");
  const ops = (e.operators || []).slice().sort((a, b) => b.time_s * b.count - a.time_s * a.count);
  const banded = ops.some(o => o.time_s_low !== undefined);
  $("#operators").innerHTML = "<tr><th>phase</th><th>operator</th><th>class</th><th>time</th>" +
    (banded ? "<th>80% band</th>" : "") + "<th>FLOPs</th><th>bytes</th><th>FLOP/B</th><th>bound</th></tr>" +
    ops.map(o => `<tr><td>${o.phase}</td><td>${o.name}</td><td>${o.op_class}</td>${cell("time_s", o.time_s, "s")}` +
      (banded ? `<td class="band">${o.time_s_low === undefined || o.time_s_low === null ? "" : num(o.time_s_low, "s") + " – " + num(o.time_s_high, "s")}</td>` : "") +
      `<td>${Charts.fmt(o.flops)}</td><td>${Charts.fmt(o.bytes)}</td><td>${o.intensity === null ? "" : Charts.fmt(o.intensity)}</td><td>${o.bound}</td></tr>`).join("");
}

function renderRoofline(r) {
  $("#view-roofline .cli code").textContent = r.command +
    (r.dropped.length ? `\n# the figure command has no ${r.dropped.join(", ")}: the page's roofline includes them` : "");
  const series = r.roofs.map(roof => ({name: `${roof.kind} ${roof.dtype}`, kind: "line",
    dash: roof.kind === "peak" ? "5,3" : "none", color: roof.kind === "peak" ? "#777" : "#333",
    width: 1.2, points: roof.x.map((x, i) => [x, roof.y[i]])}));
  for (const [phase, color] of [["prefill", "#1f77b4"], ["decode", "#d62728"]]) {
    series.push({name: `${phase} operators`, kind: "points", color,
      points: r.points.filter(p => p.phase === phase).map(p => [p.intensity, p.attained_flops_per_s, p])});
  }
  Charts.draw($("#roofline-chart"), {title: "Roofline: operators of one step", width: 760, height: 440, legendBelow: true,
    x: {label: "arithmetic intensity (FLOP/byte)", log: true, min: 0.1, max: 1e4},
    y: {label: "attained FLOP/s", log: true}, series,
    tip: p => `${p.phase} ${p.name} (${p.op_class})\nFLOPs ${Charts.fmt(p.flops)}  bytes ${Charts.fmt(p.bytes)}\n` +
      `${Charts.fmt(p.intensity)} FLOP/B, ${Charts.fmt(p.attained_flops_per_s)} FLOP/s\n${p.bound}-bound, ${(p.share * 100).toFixed(1)}% of the step`});
}

// --- batch curves --------------------------------------------------------------------
async function updateCurve() {
  state.pending++;
  try {
    const data = await api("/api/curve", settings());
    state.curve = data;
    $("#view-batch .cli code").textContent = data.command +
      (data.dropped.length ? `\n# sweep has no ${data.dropped.join(", ")}` : "");
    const rows = data.rows, pts = key => rows.map(r => [r.batch, r[key], r]);
    const band = (key, scale) => rows[0][key + "_low"] === undefined ? [] :
      ["low", "high"].map(s => ({name: s === "low" ? "80% band" : "", hideLegend: s === "high", kind: "line", dash: "3,3",
        color: "#999", width: 1, points: rows.map(r => [r.batch, r[`${key}_${s}`] * scale])}));
    Charts.draw($("#tpot-chart"), {title: "Time per output token", width: 420, height: 300,
      x: {label: "batch", log: true, base: 2}, y: {label: "TPOT (ms)", log: false},
      series: [{name: "TPOT", marks: true, points: rows.map(r => [r.batch, r.tpot_s * 1e3])}, ...band("tpot_s", 1e3)]});
    Charts.draw($("#tput-chart"), {title: "Throughput", width: 420, height: 300,
      x: {label: "batch", log: true, base: 2}, y: {label: "output tokens/s", log: false},
      series: [{name: "throughput", marks: true, color: "#2ca02c", points: pts("throughput_tokens_per_s")},
               {name: "decode", marks: true, color: "#9467bd", points: pts("decode_tokens_per_s")},
               ...band("throughput_tokens_per_s", 1)]});
    Charts.draw($("#tradeoff-chart"), {title: "Throughput against latency (one point per batch)", width: 600, height: 320,
      x: {label: "TPOT (ms)", log: false}, y: {label: "output tokens/s", log: false},
      series: [{name: "batch 1 … " + rows[rows.length - 1].batch, kind: "line", marks: true, color: "#ff7f0e",
                points: rows.map(r => [r.tpot_s * 1e3, r.throughput_tokens_per_s])},
               {name: "", hideLegend: true, kind: "points", color: "#ff7f0e",
                points: rows.map(r => [r.tpot_s * 1e3, r.throughput_tokens_per_s, r])}],
      tip: r => `batch ${r.batch}: TPOT ${(r.tpot_s * 1e3).toFixed(2)} ms, ${r.throughput_tokens_per_s.toFixed(0)} tok/s`});
  } catch (err) {
    showError(err.message);
  } finally { state.pending--; state.version++; }
}

// --- long jobs: simulate and plan ----------------------------------------------------
function job(kind, path, body, onDone) {
  const run = $(`#${kind}-run`), cancel = $(`#${kind}-cancel`), bar = $(`#${kind}-progress`);
  const err = $(`.err[data-for="${kind}"]`);
  err.textContent = "";
  state.pending++;
  run.disabled = true;
  const finish = () => { run.disabled = false; cancel.disabled = true; state.pending--; state.version++; };
  api(`/api/${path}`, body).then(first => {
    cancel.disabled = false;
    cancel.onclick = () => api(`/api/job/${first.id}/cancel`, {});
    const poll = async () => {
      try {
        const j = await api(`/api/job/${first.id}`);
        if (j.total) { bar.max = j.total; bar.value = j.done; } else bar.removeAttribute("value");
        if (j.state === "running" || j.state === "queued") { setTimeout(poll, 150); return; }
        if (j.state === "done") { bar.max = 1; bar.value = 1; onDone(j.result); }
        else if (j.state === "cancelled") { bar.value = 0; err.textContent = "cancelled"; }
        else showError(j.error, err);
      } catch (e) { showError(e.message, err); }
      finish();
    };
    poll();
  }).catch(e => { showError(e.message, err); finish(); });
}

function simulate() {
  const sim = formValues($("#sim-form"));
  if (state.trace) { delete sim.rate; sim.trace = state.trace; }
  job("sim", "simulate", {...pick(settings(), SERVED), ...sim}, renderSim);
}

function renderSim(r) {
  state.sim = r;
  $("#view-simulate .cli code").textContent = r.command;
  const head = "<tr><th>run</th><th>metric</th><th>mean</th><th>p50</th><th>p90</th><th>p99</th></tr>";
  const body = r.runs.flatMap(run => ["ttft_s", "tpot_s", "itl_s", "e2e_s", "queue_s"].map(k =>
    `<tr><td>${run.label}</td><td>${k}</td>` + ["mean", "p50", "p90", "p99"].map(p =>
      banded(`${k}.${p}`, run.summary[k], p, "s")).join("") + "</tr>"));
  const totals = r.runs.map(run => `<tr><td>${run.label}</td><td>throughput</td>${banded("throughput_tokens_per_s", run.summary, "throughput_tokens_per_s", "tok/s")}` +
    `<td>goodput</td>${run.summary.goodput_requests_per_s === undefined ? "<td></td>" :
      banded("goodput_requests_per_s", run.summary, "goodput_requests_per_s", "req/s")}<td>${run.summary.n_requests} requests</td></tr>`);
  const notes = r.runs.map(run => run.summary.band).filter(b => typeof b === "string");
  $("#sim-band").textContent = notes.length ? "band: " + notes[0] : "";
  $("#sim-summary").innerHTML = head + body.join("") + totals.join("");
  const cdf = (keys, scale, unit, target, title) => Charts.draw(target, {title, width: 420, height: 300,
    x: {label: unit, log: false}, y: {label: "share of requests", min: 0, max: 1},
    series: r.runs.flatMap((run, i) => keys.map((k, j) => ({name: `${k.replace("_s", "")} ${run.label}`,
      color: Charts.PALETTE[(i * keys.length + j) % 8], points: run.cdf[k].map(([v, q]) => [v * scale, q])})))});
  cdf(["ttft_s", "e2e_s"], 1, "seconds", $("#cdf-chart"), "Latency CDF: TTFT and end to end");
  cdf(["tpot_s", "itl_s"], 1e3, "milliseconds", $("#cdf2-chart"), "Latency CDF: TPOT and ITL");
  const rated = r.runs.filter(run => run.rate !== null);
  if (rated.length > 1) {
    Charts.draw($("#load-chart"), {title: "Latency against the offered rate (p90)", width: 600, height: 300,
      x: {label: "requests per second"}, y: {label: "seconds"},
      series: [{name: "TTFT p90", marks: true, points: rated.map(run => [run.rate, run.summary.ttft_s.p90])},
               {name: "TPOT p90 × 10", marks: true, points: rated.map(run => [run.rate, run.summary.tpot_s.p90 * 10])},
               {name: "E2E p90", marks: true, points: rated.map(run => [run.rate, run.summary.e2e_s.p90])}]});
  } else $("#load-chart").innerHTML = "";
  const s = r.runs[r.runs.length - 1].series;
  const last = r.runs[r.runs.length - 1].label;
  Charts.draw($("#series-chart"), {title: `Running and waiting (${last})`, width: 420, height: 280,
    x: {label: "time (s)"}, y: {label: "requests"},
    series: [{name: "running", points: s.t.map((t, i) => [t, s.running[i]])},
             {name: "waiting", points: s.t.map((t, i) => [t, s.waiting[i]])}]});
  Charts.draw($("#kv-chart"), {title: `KV-cache pool used (${last})`, width: 420, height: 280,
    x: {label: "time (s)"}, y: {label: "% of the pool", min: 0, max: 105},
    series: [{name: "KV pool", color: "#2ca02c", points: s.t.map((t, i) => [t, s.kv_use[i] * 100])}]});
}

function plan() {
  const p = formValues($("#plan-form"));
  if (!p.hardware) p.hardware = settings().hardware;
  job("plan", "plan", {...pick(settings(), ["model", "engine"]), ...p}, renderPlan);
}

function esc(s) { return String(s).replace(/[&<>]/g, c => ({"&": "&amp;", "<": "&lt;", ">": "&gt;"})[c]); }

function renderPlan(r) {
  state.plan = r;
  const p = r.plan;
  $("#view-plan .cli code").textContent = r.command;
  const w = p.winner || {};
  const list = (title, items) => items && items.length
    ? `<h4>${title}</h4><ul>` + items.map(x => typeof x === "string" ? `<li>${esc(x)}</li>` :
      `<li>${esc(x.label)}${x.gpus ? ` (${x.gpus} GPUs)` : ""}${x.command ? `<pre>${esc(x.command)}</pre>` : ""}</li>`).join("") + "</ul>" : "";
  $("#plan-head").innerHTML = `<h3 data-key="winner">chosen: ${esc(w.label)}</h3>` +
    `<p>${p.candidates} candidates estimated, ${p.feasible} meet both SLOs by the estimate, ${p.pareto.length} on the Pareto front` +
    (p.objective ? `; objective: ${esc(p.objective)}` : "") + "</p>";
  $("#plan-out").innerHTML = list("why", p.reasons) +
    (p.simulate_command ? `<h4>the simulation that checks it</h4><pre>${esc(p.simulate_command)}</pre>` : "") +
    "<h4>launch command lines</h4>" + Object.entries(p.commands || {}).map(([k, v]) => `<p>${esc(k)}</p><pre>${esc(v)}</pre>`).join("") +
    list("the best on each other device", p.alternatives) + list("notes", p.notes) +
    (r.warnings.length ? `<p class="warnings">${esc(r.warnings.join("\n"))}</p>` : "");
  const front = p.pareto.filter(c => c.tokens_per_s_per_user !== undefined);
  Charts.draw($("#pareto-chart"), {title: "Pareto front: throughput per GPU against speed per user", width: 700, height: 360,
    x: {label: "tokens/s per user (1 / TPOT)"}, y: {label: "output tokens/s per GPU"},
    series: [{name: "Pareto front", kind: "line", marks: true, points: front.map(c => [c.tokens_per_s_per_user, c.throughput_per_gpu]).sort((a, b) => a[0] - b[0])},
             {name: "", hideLegend: true, kind: "points", points: front.map(c => [c.tokens_per_s_per_user, c.throughput_per_gpu, c])},
             {name: "chosen", kind: "points", color: "#d62728", r: 7,
              points: front.filter(c => c.label === w.label).map(c => [c.tokens_per_s_per_user, c.throughput_per_gpu, c])}],
    tip: c => `${c.label}\n${c.throughput_per_gpu.toFixed(0)} tok/s/GPU, ${c.tokens_per_s_per_user.toFixed(1)} tok/s/user`});
}

// --- uploads -------------------------------------------------------------------------
async function upload(kind, input, onRef) {
  const file = input.files[0];
  if (!file) return;
  const spot = $(`.err[data-for="${kind === "trace" ? "sim" : kind + "-file"}"]`);
  spot.textContent = "";
  state.pending++;
  try {
    const r = await api(`/api/upload?kind=${kind}&name=${encodeURIComponent(file.name)}`, file);
    onRef(r);
  } catch (err) {
    showError(err.message, spot);
  } finally { state.pending--; state.version++; input.value = ""; }
}

function addUploaded(select, r) {
  const opt = document.createElement("option");
  opt.value = r.ref;
  opt.textContent = `${r.name} (uploaded)`;
  select.appendChild(opt);
  select.value = r.ref;
  update();
}

// --- export --------------------------------------------------------------------------
function exportHtml() {
  const view = $(`#view-${state.view}`).cloneNode(true);
  view.querySelectorAll("form, button, progress").forEach(n => n.remove());
  const s = settings();
  const when = new Date().toISOString().replace("T", " ").slice(0, 16) + " UTC";
  return `<!doctype html><html lang="en"><head><meta charset="utf-8"><title>perfmodel: ${state.view}</title>` +
    `<style>${state.css}\n.view{display:block}</style></head><body><header><h1>perfmodel: ${esc(state.view)}</h1>` +
    `<span class="muted">${esc(s.model)} on ${esc(s.hardware)}, exported ${when}</span></header>` +
    `<section id="views">${view.outerHTML}</section></body></html>`;
}
window.perfmodelExport = exportHtml;

// --- wiring --------------------------------------------------------------------------
async function init() {
  const c = await api("/api/choices");
  const fill = (select, items, blank) => {
    select.innerHTML = (blank ? `<option value="">${blank}</option>` : "") +
      items.map(i => typeof i === "string" ? `<option value="${i}">${i}</option>` : `<option value="${i.name}" title="${esc(i.description)}">${i.name}</option>`).join("");
  };
  fill($("#model"), c.models); $("#model").value = c.models.includes("llama-3-8b") ? "llama-3-8b" : c.models[0];
  fill($("#hardware"), c.hardware); $("#hardware").value = "h100-sxm";
  fill($("#engine"), c.engines);
  $$("select.dtype").forEach(s => { fill(s, c.dtypes, s.dataset.blank); if (s.dataset.default) s.value = s.dataset.default; });
  $$("select.wformat").forEach(s => fill(s, c.weights_formats, s.dataset.blank));
  state.css = await (await fetch("/static/style.css")).text();
  const batch = $("#batch"), range = $("#batch-range");
  range.addEventListener("input", () => { batch.value = 2 ** range.value; update(); });
  batch.addEventListener("input", () => { range.value = Math.round(Math.log2(Math.max(1, +batch.value || 1))); });
  $("#settings").addEventListener("input", ev => { if (ev.target !== range && ev.target.type !== "file") update(); });
  $("#settings").addEventListener("change", ev => {
    if (ev.target.tagName === "SELECT" || ev.target.type === "checkbox") update();
    if (ev.target.id === "model" || ev.target.id === "hardware") $(`.err[data-for="${ev.target.id}-file"]`).textContent = "";
  });
  $("#model-file").addEventListener("change", ev => upload("model", ev.target, r => addUploaded($("#model"), r)));
  $("#hardware-file").addEventListener("change", ev => upload("hardware", ev.target, r => addUploaded($("#hardware"), r)));
  $("#trace-file").addEventListener("change", ev => upload("trace", ev.target, r => {
    state.trace = r.ref; $('#sim-form [name="rate"]').value = ""; $('#sim-form [name="rate"]').placeholder = r.name; }));
  $$("#tabs button").forEach(b => b.addEventListener("click", () => {
    state.view = b.dataset.view;
    Charts.hideTip();
    $$("#tabs button").forEach(x => x.classList.toggle("on", x === b));
    $$(".view").forEach(v => v.classList.toggle("on", v.id === "view-" + state.view));
    if (state.view === "batch") updateCurve();
    if (state.view === "roofline" && state.estimate) renderRoofline(state.estimate.roofline);
  }));
  $$(".copy").forEach(b => b.addEventListener("click", () => {
    const text = b.parentElement.querySelector("code").textContent;
    if (navigator.clipboard) navigator.clipboard.writeText(text).catch(() => {});
    b.textContent = "copied"; setTimeout(() => { b.textContent = "copy as CLI command"; }, 1200);
  }));
  $("#sim-run").addEventListener("click", simulate);
  $("#plan-run").addEventListener("click", plan);
  $("#export").addEventListener("click", () => {
    const a = document.createElement("a");
    a.href = URL.createObjectURL(new Blob([exportHtml()], {type: "text/html"}));
    a.download = `perfmodel-${state.view}.html`;
    a.click();
  });
  await update();
  $("#status").textContent += " · ready";
  state.ready = true;
}

init().catch(err => { $("#status").textContent = "error: " + err.message; });
