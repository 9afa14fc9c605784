// The charts report.html and the live dashboard draw. Lines and stacked areas are drawn by uPlot
// (https://github.com/leeoniya/uPlot, MIT, a dependency): canvas, so a chart is a few dozen DOM
// nodes however long the run, its paths decimated to the pixel width, drag to zoom (double-click
// resets), and a legend that reads each series' value under the cursor. Its minified script and CSS
// are read from node_modules when a page is built and inlined (`chartAssets()`), so report.html
// stays one file that opens offline and the dashboard fetches nothing from elsewhere.
// `gwCharts.line` draws one chart of one or more series of [x, y] points (a null y breaks the
// line: a restart), with vertical markers for restarts and resizes; `gwCharts.stack` stacked areas
// (compute, communication, waiting); `gwCharts.bars` horizontal stacked bars per rank (a few
// rows: plain SVG). A line or stack drawn again into the same holder with the same series updates
// in place and keeps the user's zoom. Test hooks: each series' legend row carries class "curve"
// (lines) or "area" (stacks) with data-series and data-points (its finite points); markers are
// elements with class "marker" and data-kind.
import * as fs from "node:fs"
import { createRequire } from "node:module"

let assets: { readonly js: string; readonly css: string } | undefined

/** uPlot's minified script and stylesheet, read once from node_modules, to inline in a page. */
export const chartAssets = (): { readonly js: string; readonly css: string } => {
  if (!assets) {
    const require = createRequire(import.meta.url)
    const read = (file: string): string => fs.readFileSync(require.resolve(`uplot/dist/${file}`), "utf8").replace(/<\/(script|style)/gi, "<\\/$1")
    assets = { js: read("uPlot.iife.min.js"), css: read("uPlot.min.css") }
  }
  return assets
}

/** What a page's <head> or body needs before CHART_SCRIPT: uPlot's CSS and script, and the charts' own CSS. */
export const chartHead = (): string => {
  const a = chartAssets()
  return `<style>${a.css}
.gw-chart .u-legend { font-size: 12px; } .gw-chart .u-legend th { font-weight: normal; }
.gw-chart .u-legend th, .gw-chart .u-legend td { border: 0; padding: 1px 2px; text-align: left; background: none; }
.gw-chart .marker { position: absolute; top: 0; bottom: 0; width: 0; border-left: 1px dashed; pointer-events: none; font-size: 10px; white-space: nowrap; }
.gw-chart .marker span { position: absolute; left: 3px; }
.gw-chart .note { font-size: 11px; color: #555; margin: 2px 0 0; }
</style>
<script>${a.js}</script>`
}

export const CHART_SCRIPT = String.raw`
var gwCharts = (function () {
  var NS = "http://www.w3.org/2000/svg";
  var COLORS = ["#1f77b4", "#d62728", "#2ca02c", "#ff7f0e", "#9467bd", "#8c564b", "#e377c2", "#17becf", "#7f7f7f", "#bcbd22"];
  var W = 520, H = 240, L = 56, R = 14, T = 14, B = 34;
  function el(name, attrs, parent) {
    var e = document.createElementNS(NS, name);
    for (var k in attrs) e.setAttribute(k, attrs[k]);
    if (parent) parent.appendChild(e);
    return e;
  }
  function fmt(v) {
    var a = Math.abs(v);
    if (a >= 1e6) return (v / 1e6).toPrecision(3) + "M";
    if (a >= 1e4) return (v / 1e3).toPrecision(3) + "k";
    return a > 0 && a < 0.01 ? v.toExponential(1) : +v.toPrecision(3) + "";
  }
  function fmtTime(s) {
    if (s >= 3600) return Math.floor(s / 3600) + "h" + String(Math.floor(s % 3600 / 60)).padStart(2, "0");
    if (s >= 60) return Math.floor(s / 60) + "m" + String(Math.floor(s % 60)).padStart(2, "0");
    return (Math.round(s * 10) / 10) + "s";
  }
  function clear(holder) { while (holder.firstChild) holder.removeChild(holder.firstChild); }
  function empty(holder, text) { clear(holder); var p = document.createElement("p"); p.className = "nodata"; p.textContent = text; holder.appendChild(p); return 0; }
  // Puts series of [x, y] points on one sorted x column, as uPlot wants: a null y stays null (a gap
  // in the line: a restart), an x where a series has no point is undefined (the line spans it).
  // Each series' points are sorted by x first (stably: a retried epoch's later value comes second).
  function align(series) {
    var k = series.length, lists = [], total = 0;
    for (var s = 0; s < k; s++) {
      var p = series[s].points, sorted = true;
      for (var i = 1; i < p.length; i++) if (!(p[i][0] >= p[i - 1][0])) { sorted = false; break; }
      if (!sorted) p = p.filter(function (q) { return isFinite(q[0]); }).map(function (q, i) { return [q[0], q[1], i]; }).sort(function (a, b) { return a[0] - b[0] || a[2] - b[2]; });
      lists.push(p);
      total += p.length;
    }
    // Columns as long as every point on its own row, cut to the rows used; rows a series has no
    // point at stay holes (undefined).
    var xs = new Array(total), cols = [], counts = [], heads = [], row = 0;
    for (s = 0; s < k; s++) { cols.push(new Array(total)); counts.push(0); heads.push(0); }
    for (;;) {
      var bx = Infinity;
      for (s = 0; s < k; s++) if (heads[s] < lists[s].length && lists[s][heads[s]][0] < bx) bx = lists[s][heads[s]][0];
      if (bx === Infinity) break;
      xs[row] = bx;
      for (s = 0; s < k; s++) {
        var l = lists[s], h = heads[s];
        if (h < l.length && l[h][0] === bx) {
          var y = l[h][1];
          heads[s] = h + 1;
          if (y !== null && isFinite(y)) { cols[s][row] = y; counts[s]++; } else cols[s][row] = null;
        }
      }
      row++;
    }
    xs.length = row;
    for (s = 0; s < k; s++) cols[s].length = row;
    return { data: [xs].concat(cols), counts: counts };
  }
  // The nearest value of series si around row idx (rows of other ranks' points sit between a rank's).
  // With the cursor off the chart (idx null), the latest value: the legend then reads the run's now.
  function near(u, si, idx) {
    var d = u.data[si];
    if (idx === null || idx === undefined) idx = d.length - 1;
    for (var j = 0; j < 512; j++) { if (d[idx - j] != null) return d[idx - j]; if (d[idx + j] != null) return d[idx + j]; }
    return null;
  }
  function axes(o) {
    var xv = function (u, splits) { return splits.map(function (v) { return o.time ? fmtTime(v) : fmt(v); }); };
    var yv = function (u, splits) { return splits.map(fmt); };
    var x = { label: o.xLabel || "", values: xv, size: 36, labelSize: 18, font: "11px system-ui, sans-serif", labelFont: "12px system-ui, sans-serif" };
    if (o.whole) x.incrs = [1, 2, 5, 10, 20, 50, 100, 200, 500, 1000, 2000, 5000, 10000, 20000, 50000, 1e5, 2e5, 5e5, 1e6];
    return [x, { label: o.yLabel || "", values: yv, size: 50, labelSize: 18, font: "11px system-ui, sans-serif", labelFont: "12px system-ui, sans-serif" }];
  }
  // Restart / resize markers: elements over the plot, moved to their x at every draw (and zoom).
  function setMarkers(st, list, data, row) {
    st.markerEls.forEach(function (m) { m.el.remove(); });
    var xs = data[0], x0 = xs[0], x1 = xs[xs.length - 1];
    st.markerEls = (list || []).filter(function (m) { return m.x >= x0 && m.x <= x1; }).map(function (m) {
      var color = m.kind === "resize" ? "#9467bd" : m.kind === "restart" ? "#d62728" : "#888";
      var e = document.createElement("div");
      e.className = "marker";
      e.setAttribute("data-kind", m.kind || "");
      e.style.borderColor = color;
      e.style.color = color;
      var s = document.createElement("span");
      s.style.top = (row || 0) * 12 + "px";
      s.textContent = m.label || m.kind || "";
      e.appendChild(s);
      st.u.over.appendChild(e);
      return { x: m.x, el: e };
    });
    placeMarkers(st);
  }
  function placeMarkers(st) {
    var w = st.u.over.clientWidth || st.u.bbox.width;
    st.markerEls.forEach(function (m) {
      var p = st.u.valToPos(m.x, "x");
      m.el.style.display = p >= 0 && p <= w ? "" : "none";
      m.el.style.left = p + "px";
    });
  }
  // Draws (or, with the same kind and series, updates in place, keeping a zoom) one uPlot chart.
  function plot(holder, key, opts, data, cls, names, counts) {
    var st = holder.gwChart;
    if (st && st.key === key && holder.contains(st.u.root)) {
      var xs = st.u.data[0], sc = st.u.scales.x, span = xs.length ? xs[xs.length - 1] - xs[0] : 0;
      var zoomed = xs.length > 1 && sc.min != null && (sc.min > xs[0] + span * 1e-9 || sc.max < xs[xs.length - 1] - span * 1e-9);
      // Synchronously (not at uPlot's next microtask), so the markers and test hooks below see it.
      st.u.batch(function () { st.u.setData(data, !zoomed); });
    } else {
      if (st) st.u.destroy();
      clear(holder);
      holder.classList.add("gw-chart");
      st = holder.gwChart = { key: key, markerEls: [], u: null };
      opts.hooks = { draw: [function () { placeMarkers(st); }] };
      st.u = new uPlot(opts, data, holder);
      st.note = document.createElement("p");
      st.note.className = "note";
      holder.appendChild(st.note);
    }
    var rows = st.u.root.querySelectorAll(".u-legend .u-series");
    names.forEach(function (n, i) {
      var r = rows[i + 1];
      if (!r) return;
      r.classList.add(cls);
      r.setAttribute("data-series", n);
      r.setAttribute("data-points", String(counts[i]));
    });
    return st;
  }
  function drop(holder) { if (holder.gwChart) { holder.gwChart.u.destroy(); holder.gwChart = null; } }
  // o: { series: [{ name, points: [[x, y], ...], color? }], xLabel, yLabel, markers, time, zero }
  function line(holder, o) {
    var al = align(o.series), total = al.counts.reduce(function (a, b) { return a + b; }, 0);
    if (!total) { drop(holder); return empty(holder, o.emptyText || "no data yet"); }
    var whole = !o.time && al.data[0].every(function (x) { return x === Math.round(x); });
    var zero = o.zero;
    var opts = {
      width: W, height: H,
      scales: { x: { time: false }, y: { range: function (u, lo, hi) {
        if (lo === null || hi === null) return [0, 1];
        var pad = (hi - lo) * 0.05 || Math.abs(hi) * 0.05 || 1;
        var low = (zero || lo >= 0) && lo - pad < 0 ? 0 : lo - pad;
        if (zero) low = Math.min(0, low);
        return [low, hi + pad];
      } } },
      axes: axes({ xLabel: o.xLabel, yLabel: o.yLabel, time: o.time, whole: whole }),
      series: [{ label: o.xLabel || "x", value: function (u, v) { if (v === null || v === undefined) v = u.data[0][u.data[0].length - 1]; return v === undefined ? "–" : o.time ? fmtTime(v) : fmt(v); } }].concat(o.series.map(function (s, i) {
        return { label: s.name, stroke: s.color || COLORS[i % COLORS.length], width: 2, value: function (u, v, si, idx) { var y = v != null ? v : near(u, si, idx); return y === null ? "–" : fmt(y); } };
      }))
    };
    var key = "line|" + o.series.map(function (s) { return s.name; }).join("|") + "|" + o.xLabel + "|" + o.yLabel;
    var st = plot(holder, key, opts, al.data, "curve", o.series.map(function (s) { return s.name; }), al.counts);
    setMarkers(st, o.markers, al.data, 0);
    st.note.textContent = "";
    return 1;
  }
  // o: { xs, layers: [{ name, values }], xLabel, yLabel, markers }; a few tall steps are clipped.
  function stack(holder, o) {
    var n = o.xs.length;
    if (!n) { drop(holder); return empty(holder, o.emptyText || "no step times were reported"); }
    var totals = [];
    for (var i = 0; i < n; i++) { var t = 0; o.layers.forEach(function (l) { t += l.values[i] || 0; }); totals.push(t); }
    var sorted = totals.slice().sort(function (a, b) { return a - b; });
    var max = sorted[n - 1], p95 = sorted[Math.min(n - 1, Math.floor(n * 0.95))];
    var hi = Math.min(max, 1.5 * p95) || max || 1;
    var data = [o.xs.slice()], below = o.xs.map(function () { return 0; }), colors = [];
    o.layers.forEach(function (l, li) {
      colors.push(l.color || COLORS[[0, 3, 7, 2][li % 4]]);
      below = below.map(function (v, i) { return v + (l.values[i] || 0); });
      data.push(below);
    });
    var opts = {
      width: W, height: H,
      scales: { x: { time: false }, y: { range: function () { return [0, holder.gwHi * 1.05]; } } },
      axes: axes({ xLabel: o.xLabel, yLabel: o.yLabel, time: o.time, whole: !o.time }),
      // Each layer is drawn at its running total, filled down to the layer under it (a band).
      bands: o.layers.slice(1).map(function (l, li) { return { series: [li + 2, li + 1], fill: colors[li + 1] + "c0" }; }),
      series: [{ label: o.xLabel || "x", value: function (u, v) { if (v === null || v === undefined) v = u.data[0][u.data[0].length - 1]; return v === undefined ? "–" : o.time ? fmtTime(v) : fmt(v); } }].concat(o.layers.map(function (l, li) {
        return { label: l.label || l.name, stroke: colors[li], width: 1, fill: li === 0 ? colors[0] + "c0" : undefined,
          value: function (u, v, si, idx) { if (idx === null || idx === undefined) idx = u.data[0].length - 1; return fmt(u.data[si][idx] - (si > 1 ? u.data[si - 1][idx] : 0)); } };
      }))
    };
    var key = "stack|" + o.layers.map(function (l) { return l.name; }).join("|") + "|" + o.xLabel + "|" + o.yLabel;
    holder.gwHi = hi;
    var st = plot(holder, key, opts, data, "area", o.layers.map(function (l) { return l.name; }), o.layers.map(function () { return n; }));
    setMarkers(st, o.markers, data, 1);
    var clipped = totals.filter(function (t) { return t > hi; }).length;
    st.note.textContent = clipped ? clipped + " step(s) above " + fmt(hi) + " ms clipped (max " + fmt(max) + " ms)" : "";
    return 1;
  }
  function legend(holder, names, colors) {
    var div = document.createElement("div");
    div.className = "legend";
    names.forEach(function (n, i) {
      var s = document.createElement("span");
      var sw = document.createElement("i");
      sw.style.background = colors[i];
      s.appendChild(sw);
      s.appendChild(document.createTextNode(n));
      div.appendChild(s);
    });
    holder.appendChild(div);
  }
  // rows: [{ label, parts: [v, ...], flag }], parts named by o.names; one stacked bar per row.
  function bars(holder, rows, o) {
    clear(holder);
    if (!rows.length) return empty(holder, o.emptyText || "no data yet");
    var rowH = 22, h = T + rows.length * rowH + 22, w = W;
    var svg = el("svg", { viewBox: "0 0 " + w + " " + h, width: w, height: h, role: "img" }, holder);
    var max = 0;
    rows.forEach(function (r) { var s = 0; r.parts.forEach(function (v) { s += v; }); max = Math.max(max, s); });
    max = max || 1;
    var colors = o.names.map(function (_, i) { return COLORS[[0, 3, 7, 2][i % 4]]; });
    rows.forEach(function (r, ri) {
      var y = T + ri * rowH, x = L;
      el("text", { x: L - 6, y: y + 14, "text-anchor": "end", "font-size": 11, fill: r.flag ? "#d62728" : "#333", "font-weight": r.flag ? "bold" : "normal" }, svg).textContent = r.label;
      var total = 0;
      r.parts.forEach(function (v, i) {
        var bw = v / max * (w - L - R - 70);
        el("rect", { x: x, y: y + 3, width: Math.max(0, bw), height: rowH - 6, fill: colors[i], "class": "bar", "data-series": o.names[i] }, svg);
        x += bw; total += v;
      });
      el("text", { x: x + 4, y: y + 14, "font-size": 11, fill: "#333" }, svg).textContent = fmt(total) + (o.unit || "") + (r.note ? " " + r.note : "");
    });
    legend(holder, o.names, colors);
    return 1;
  }
  return { line: line, stack: stack, bars: bars, fmt: fmt, fmtTime: fmtTime, colors: COLORS };
})();
`
