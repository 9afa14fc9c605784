// The charts report.html and the live dashboard draw: plain browser JavaScript that builds SVG (no
// library, nothing fetched), kept as a string both pages inline. `gwCharts.line` draws one chart
// of one or more series of [x, y] points, each on its own path (class "curve", data-series and
// data-points attributes, which the browser tests count), with vertical markers for restarts and
// resizes; `gwCharts.stack` draws stacked areas (compute, communication, waiting); `gwCharts.bars`
// horizontal stacked bars per rank. Each call replaces what the holder held, so the dashboard
// redraws in place.

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
  function frame(holder, x0, x1, lo, hi, o) {
    var svg = el("svg", { viewBox: "0 0 " + W + " " + H, width: W, height: H, role: "img" }, holder);
    if (x1 === x0) x1 = x0 + 1;
    if (hi === lo) hi = lo + 1;
    var sx = function (x) { return L + (x - x0) / (x1 - x0) * (W - L - R); };
    var sy = function (y) { return H - B - (y - lo) / (hi - lo) * (H - T - B); };
    el("rect", { x: L, y: T, width: W - L - R, height: H - T - B, fill: "none", stroke: "#ccc" }, svg);
    for (var i = 0; i <= 4; i++) {
      var yv = lo + (hi - lo) * i / 4, y = sy(yv);
      el("line", { x1: L, x2: W - R, y1: y, y2: y, stroke: "#eee" }, svg);
      el("text", { x: L - 6, y: y + 4, "text-anchor": "end", "font-size": 11, fill: "#555" }, svg).textContent = fmt(yv);
    }
    var whole = o.whole, ticks = [];
    if (whole) { var every = Math.max(1, Math.ceil((x1 - x0) / 8)); for (var t = Math.ceil(x0); t <= x1; t += every) ticks.push(t); }
    else for (var k = 0; k <= 4; k++) ticks.push(x0 + (x1 - x0) * k / 4);
    ticks.forEach(function (xv) {
      el("text", { x: sx(xv), y: H - B + 16, "text-anchor": "middle", "font-size": 11, fill: "#555" }, svg).textContent = o.time ? fmtTime(xv) : fmt(whole ? xv : Math.round(xv * 100) / 100);
    });
    el("text", { x: (L + W - R) / 2, y: H - 3, "text-anchor": "middle", "font-size": 12 }, svg).textContent = o.xLabel || "";
    el("text", { x: 12, y: (T + H - B) / 2, "font-size": 12, transform: "rotate(-90 12 " + (T + H - B) / 2 + ")", "text-anchor": "middle" }, svg).textContent = o.yLabel || "";
    return { svg: svg, sx: sx, sy: sy, x0: x0, x1: x1 };
  }
  function markers(f, list, labelY) {
    (list || []).forEach(function (m) {
      if (m.x < f.x0 || m.x > f.x1) return;
      var x = f.sx(m.x), color = m.kind === "resize" ? "#9467bd" : m.kind === "restart" ? "#d62728" : "#888";
      el("line", { x1: x, x2: x, y1: T, y2: H - B, stroke: color, "stroke-dasharray": "4 3", "class": "marker", "data-kind": m.kind || "" }, f.svg);
      el("text", { x: x + 3, y: labelY || T + 11, "font-size": 10, fill: color }, f.svg).textContent = m.label || m.kind || "";
    });
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
  // o: { series: [{ name, points: [[x, y], ...], color? }], xLabel, yLabel, markers, time, zero }
  function line(holder, o) {
    clear(holder);
    var xs = [], ys = [];
    o.series.forEach(function (s) { s.points.forEach(function (p) { if (p[1] !== null && isFinite(p[1])) { xs.push(p[0]); ys.push(p[1]); } }); });
    if (!ys.length) return empty(holder, o.emptyText || "no data yet");
    var lo = Math.min.apply(null, ys), hi = Math.max.apply(null, ys), pad = (hi - lo) * 0.05 || Math.abs(hi) * 0.05;
    var low = (o.zero || lo >= 0) && lo - pad < 0 ? 0 : lo - pad;
    if (o.zero) low = Math.min(0, low);
    var x0 = Math.min.apply(null, xs), x1 = Math.max.apply(null, xs);
    var whole = !o.time && xs.every(function (x) { return x === Math.round(x); });
    var f = frame(holder, x0, x1, low, hi + pad, { xLabel: o.xLabel, yLabel: o.yLabel, time: o.time, whole: whole });
    var colors = [];
    o.series.forEach(function (s, i) {
      var c = s.color || COLORS[i % COLORS.length], d = "", n = 0, gap = true;
      colors.push(c);
      var dots = s.points.length <= 60;
      // A null value breaks the line (a restart between two attempts' points).
      s.points.forEach(function (p) {
        if (p[1] === null || !isFinite(p[1])) { gap = true; return; }
        var x = f.sx(p[0]).toFixed(1), y = f.sy(p[1]).toFixed(1);
        d += (gap ? "M" : "L") + x + "," + y;
        gap = false;
        n++;
        if (dots) el("circle", { cx: x, cy: y, r: 2.5, fill: c }, f.svg);
      });
      el("path", { d: d || "M0,0", fill: "none", stroke: c, "stroke-width": 2, "class": "curve", "data-series": s.name, "data-points": n }, f.svg);
    });
    markers(f, o.markers);
    legend(holder, o.series.map(function (s) { return s.name; }), colors);
    return 1;
  }
  // o: { xs, layers: [{ name, values }], xLabel, yLabel, markers }; a few tall steps are clipped.
  function stack(holder, o) {
    clear(holder);
    var n = o.xs.length;
    if (!n) return empty(holder, o.emptyText || "no step times were reported");
    var totals = [];
    for (var i = 0; i < n; i++) { var t = 0; o.layers.forEach(function (l) { t += l.values[i] || 0; }); totals.push(t); }
    var sorted = totals.slice().sort(function (a, b) { return a - b; });
    var max = sorted[n - 1], p95 = sorted[Math.min(n - 1, Math.floor(n * 0.95))];
    var hi = Math.min(max, 1.5 * p95) || max || 1;
    var f = frame(holder, o.xs[0], o.xs[n - 1], 0, hi * 1.05, { xLabel: o.xLabel, yLabel: o.yLabel, time: o.time, whole: !o.time });
    var lower = o.xs.map(function () { return 0; }), colors = [];
    o.layers.forEach(function (l, li) {
      var c = l.color || COLORS[[0, 3, 7, 2][li % 4]];
      colors.push(c);
      var upper = lower.map(function (v, i) { return Math.min(hi, v + (l.values[i] || 0)); });
      var d = "";
      for (var i = 0; i < n; i++) d += (i ? "L" : "M") + f.sx(o.xs[i]).toFixed(1) + "," + f.sy(upper[i]).toFixed(1);
      for (var j = n - 1; j >= 0; j--) d += "L" + f.sx(o.xs[j]).toFixed(1) + "," + f.sy(lower[j]).toFixed(1);
      el("path", { d: d + "Z", fill: c, "fill-opacity": 0.75, stroke: c, "class": "area", "data-series": l.name, "data-points": n }, f.svg);
      lower = upper;
    });
    var clipped = totals.filter(function (t) { return t > hi; }).length;
    if (clipped) el("text", { x: W - R - 4, y: T + 12, "text-anchor": "end", "font-size": 11, fill: "#555" }, f.svg).textContent = clipped + " step(s) above " + fmt(hi) + " ms clipped (max " + fmt(max) + " ms)";
    // Marker labels on a second line, under the clipping note.
    markers(f, o.markers, T + 25);
    legend(holder, o.layers.map(function (l) { return l.label || l.name; }), colors);
    return 1;
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
