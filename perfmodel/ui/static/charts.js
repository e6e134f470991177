// Small SVG charts for the perfmodel page: lines and points on linear or log axes, a legend,
// and a hover box. No library: every chart is plain SVG, so a static export keeps it.
"use strict";

const Charts = (() => {
  const NS = "http://www.w3.org/2000/svg";
  const PALETTE = ["#1f77b4", "#d62728", "#2ca02c", "#9467bd", "#ff7f0e", "#17becf",
                   "#8c564b", "#e377c2"];

  function el(name, attrs, parent) {
    const node = document.createElementNS(NS, name);
    for (const [k, v] of Object.entries(attrs || {})) node.setAttribute(k, v);
    if (parent) parent.appendChild(node);
    return node;
  }

  function fmt(v) {
    if (v === 0) return "0";
    const a = Math.abs(v), short = x => String(+x.toPrecision(3));
    for (const [from, size, unit] of [[1e15, 1e15, "P"], [1e12, 1e12, "T"], [1e9, 1e9, "G"],
                                      [1e6, 1e6, "M"], [1e4, 1e3, "k"]]) {
      if (a >= from) return short(v / size) + unit;
    }
    if (a >= 0.01) return short(v);
    return v.toExponential(0);
  }

  function scale(lo, hi, a, b, log) {
    if (log) {
      const l0 = Math.log10(lo), l1 = Math.log10(hi);
      return v => a + (Math.log10(Math.max(v, lo * 1e-3)) - l0) / (l1 - l0 || 1) * (b - a);
    }
    return v => a + (v - lo) / (hi - lo || 1) * (b - a);
  }

  function ticks(lo, hi, log, base) {
    if (log) {
      const out = [], b = base || 10;
      const k0 = Math.floor(Math.log(lo) / Math.log(b) + 1e-9);
      const k1 = Math.ceil(Math.log(hi) / Math.log(b) - 1e-9);
      const step = Math.max(1, Math.ceil((k1 - k0) / 8));
      for (let k = k0; k <= k1; k += step) {
        const v = Math.pow(b, k);
        if (v >= lo * 0.999 && v <= hi * 1.001) out.push(v);
      }
      return out;
    }
    const span = hi - lo || 1, raw = span / 5;
    const mag = Math.pow(10, Math.floor(Math.log10(raw)));
    const step = [1, 2, 5, 10].map(m => m * mag).find(s => span / s <= 6);
    const out = [];
    for (let v = Math.ceil(lo / step) * step; v <= hi + step * 1e-9; v += step) out.push(+v.toPrecision(12));
    return out;
  }

  function domain(values, log, pad) {
    let vs = values.filter(v => Number.isFinite(v) && (!log || v > 0));
    if (!vs.length) vs = log ? [1, 10] : [0, 1];
    let lo = Math.min(...vs), hi = Math.max(...vs);
    if (log) { lo /= pad ? 1.5 : 1; hi *= pad ? 1.5 : 1; if (lo === hi) { lo /= 2; hi *= 2; } }
    else { if (lo > 0 && !pad) lo = 0; if (lo === hi) hi = lo + 1; hi += (hi - lo) * 0.06; }
    return [lo, hi];
  }

  // opts: {title, width, height, x: {label, log, base, min, max}, y: {...},
  //        series: [{name, color, kind: "line"|"points", points: [[x, y, meta], ...]}],
  //        tip: meta -> text}
  function hideTip() {
    const box = document.getElementById("tipbox");
    if (box) box.style.display = "none";
  }

  function draw(target, opts) {
    hideTip();
    const W = opts.width || 640, H = opts.height || 360;
    const m = {l: 64, r: 16, t: opts.title ? 28 : 12, b: 46};
    target.innerHTML = "";
    const svg = el("svg", {viewBox: `0 0 ${W} ${H}`, width: W, height: H, class: "chart",
                           role: "img", "font-family": "sans-serif", "font-size": "11"}, target);
    if (opts.title) el("text", {x: W / 2, y: 16, "text-anchor": "middle", "font-size": "13",
                                "font-weight": "600"}, svg).textContent = opts.title;
    const all = opts.series.flatMap(s => s.points);
    const [x0, x1] = [opts.x.min, opts.x.max].every(v => v !== undefined)
      ? [opts.x.min, opts.x.max] : domain(all.map(p => p[0]), opts.x.log, opts.x.log);
    const [y0, y1] = [opts.y.min, opts.y.max].every(v => v !== undefined)
      ? [opts.y.min, opts.y.max] : domain(all.map(p => p[1]), opts.y.log, opts.y.log);
    const sx = scale(x0, x1, m.l, W - m.r, opts.x.log);
    const sy = scale(y0, y1, H - m.b, m.t, opts.y.log);
    const grid = el("g", {stroke: "#e4e4e4"}, svg);
    for (const t of ticks(x0, x1, opts.x.log, opts.x.base)) {
      el("line", {x1: sx(t), x2: sx(t), y1: m.t, y2: H - m.b}, grid);
      el("text", {x: sx(t), y: H - m.b + 14, "text-anchor": "middle", fill: "#333",
                  stroke: "none"}, svg).textContent = fmt(t);
    }
    for (const t of ticks(y0, y1, opts.y.log, opts.y.base)) {
      el("line", {x1: m.l, x2: W - m.r, y1: sy(t), y2: sy(t)}, grid);
      el("text", {x: m.l - 5, y: sy(t) + 4, "text-anchor": "end", fill: "#333"}, svg)
        .textContent = fmt(t);
    }
    el("rect", {x: m.l, y: m.t, width: W - m.l - m.r, height: H - m.t - m.b, fill: "none",
                stroke: "#999"}, svg);
    el("text", {x: (m.l + W - m.r) / 2, y: H - 8, "text-anchor": "middle"}, svg)
      .textContent = opts.x.label;
    el("text", {x: 14, y: (m.t + H - m.b) / 2, "text-anchor": "middle",
                transform: `rotate(-90 14 ${(m.t + H - m.b) / 2})`}, svg).textContent = opts.y.label;
    const clip = "c" + Math.random().toString(36).slice(2);
    el("rect", {x: m.l, y: m.t, width: W - m.l - m.r, height: H - m.t - m.b},
       el("clipPath", {id: clip}, el("defs", {}, svg)));
    const body = el("g", {"clip-path": `url(#${clip})`}, svg);
    opts.series.forEach((s, i) => {
      const color = s.color || PALETTE[i % PALETTE.length];
      const pts = s.points.filter(p => Number.isFinite(p[0]) && Number.isFinite(p[1]));
      if (s.kind === "points") {
        const g = el("g", {class: "points", "data-series": s.name}, body);
        pts.forEach(p => {
          const c = el("circle", {cx: sx(p[0]).toFixed(1), cy: sy(p[1]).toFixed(1),
                                  r: s.r || 4.5, fill: color, "fill-opacity": 0.75,
                                  stroke: "#fff", "stroke-width": 0.8}, g);
          if (p[2] !== undefined && opts.tip) {
            const text = opts.tip(p[2]);
            c.setAttribute("data-tip", text);
            el("title", {}, c).textContent = text;
          }
        });
      } else {
        const d = pts.map((p, j) => `${j ? "L" : "M"}${sx(p[0]).toFixed(1)},${sy(p[1]).toFixed(1)}`)
          .join("");
        el("path", {d, fill: "none", stroke: color, "stroke-width": s.width || 1.8,
                    "stroke-dasharray": s.dash || "none", "data-series": s.name}, body);
        if (s.marks) pts.forEach(p => el("circle", {cx: sx(p[0]), cy: sy(p[1]), r: 2.5,
                                                    fill: color}, body));
      }
    });
    const named = opts.series.filter(s => s.name && !s.hideLegend);
    named.forEach((s, i) => {
      const y = (opts.legendBelow ? H - m.b - 8 - (named.length - 1 - i) * 14 : m.t + 10 + i * 14), color = s.color || PALETTE[opts.series.indexOf(s) % PALETTE.length];
      el("rect", {x: W - m.r - 150, y: y - 8, width: 10, height: 10, fill: color}, svg);
      el("text", {x: W - m.r - 136, y: y + 1}, svg).textContent = s.name;
    });
    hover(target, svg);
    return svg;
  }

  function hover(target, svg) {
    let box = document.getElementById("tipbox");
    if (!box) {
      box = document.createElement("div");
      box.id = "tipbox";
      document.body.appendChild(box);
    }
    svg.addEventListener("mousemove", ev => {
      const tip = ev.target.getAttribute && ev.target.getAttribute("data-tip");
      if (!tip) { box.style.display = "none"; return; }
      box.textContent = tip;
      box.style.display = "block";
      box.style.left = (ev.pageX + 12) + "px";
      box.style.top = (ev.pageY + 12) + "px";
    });
    svg.addEventListener("mouseleave", () => { box.style.display = "none"; });
  }

  return {draw, fmt, hideTip, PALETTE};
})();
