// The live dashboard's page: one HTML document with its script inline (no build step, nothing
// fetched from elsewhere), fed by the dashboard server's /api/state and /api/events (server-sent
// events). It shows the cluster (nodes, resources used/total, backends, GPUs, liveness), the jobs
// (state, attempt, restarts, resizes, progress, strategy), and for the selected job: live per-rank
// curves (loss, samples/s, step time split into compute / communication / waiting, and one chart
// per reported metric), stragglers, the all-reduce plan with its reasons, checkpoints, incidents
// and the tail of each worker's output. The page holds no data itself: when a token is required it
// asks for it and fetches nothing before. Test hooks: <body data-ready="1"> once the first state
// arrived, data-updates counts events, each chart series' legend row (class "curve" or "area")
// carries data-series and data-points. The page keeps at most MAX_POINTS progress points per rank
// (past that it drops every other one, as the server does), so a tab left open on a run of days
// stays bounded; the charts are uPlot's (chart-script.ts): zoom by dragging, values under the cursor.
import { CHART_SCRIPT, chartHead } from "./chart-script.ts"

const escapeHtml = (s: string): string => s.replace(/[&<>"]/g, (c) => ({ "&": "&amp;", "<": "&lt;", ">": "&gt;", '"': "&quot;" })[c] as string)

const STYLE = `
body { font: 14px/1.4 system-ui, sans-serif; margin: 0; color: #222; background: #fafafa; }
header { background: #1d2633; color: #fff; padding: 10px 20px; display: flex; gap: 16px; align-items: baseline; }
header h1 { font-size: 18px; margin: 0; } header .sub { color: #b8c4d4; } #conn { margin-left: auto; font-size: 13px; }
#conn.ok { color: #7ee787; } #conn.bad { color: #ff9b8f; }
main { padding: 16px 20px; max-width: 1700px; }
h2 { font-size: 15px; margin: 0 0 8px; }
.card { background: #fff; border: 1px solid #ddd; border-radius: 6px; padding: 10px 12px; margin-bottom: 14px; }
.grid { display: flex; flex-wrap: wrap; gap: 14px; } .grid > .card { margin-bottom: 0; }
table { border-collapse: collapse; font-size: 13px; } td, th { border-bottom: 1px solid #eee; padding: 3px 8px; text-align: left; white-space: nowrap; }
th { color: #555; font-weight: 600; } tr.sel td { background: #eef4ff; } tr.job { cursor: pointer; }
.badge { display: inline-block; padding: 0 6px; border-radius: 8px; font-size: 12px; color: #fff; background: #888; }
.s-running { background: #2ca02c; } .s-finished { background: #1f77b4; } .s-failed, .s-lost { background: #d62728; }
.s-restarting, .s-resizing, .s-scheduling, .s-starting { background: #ff7f0e; } .s-interrupted { background: #8c564b; }
.s-alive { background: #2ca02c; } .s-dead { background: #d62728; } .s-left { background: #888; }
.meta { color: #555; margin: 4px 0 12px; } .warn { color: #b00; font-weight: 600; }
.legend span { margin-right: 12px; font-size: 12px; } .legend i { display: inline-block; width: 10px; height: 10px; margin-right: 4px; border-radius: 2px; }
pre { font-size: 12px; background: #f4f4f4; padding: 8px; overflow: auto; max-height: 360px; margin: 0; }
#logs { max-height: 420px; min-height: 120px; } .nodata { color: #777; }
#login { max-width: 420px; margin: 60px auto; } #login input { width: 100%; box-sizing: border-box; padding: 6px; font: inherit; margin: 8px 0; }
`

const SCRIPT = String.raw`
(function () {
  var S = { nodes: null, jobs: {}, order: [], selected: null, cluster: "", address: "" };
  var updates = 0, dirty = false, token = null;
  var $ = function (id) { return document.getElementById(id); };
  function esc(s) { return String(s).replace(/[&<>"]/g, function (c) { return { "&": "&amp;", "<": "&lt;", ">": "&gt;", '"': "&quot;" }[c]; }); }
  function num(v, d) { return typeof v === "number" && isFinite(v) ? (Number.isInteger(v) ? String(v) : v.toFixed(d === undefined ? 3 : d)) : "-"; }
  function bytes(n) { if (!n) return "0"; var u = ["B", "KiB", "MiB", "GiB", "TiB"], i = 0; while (n >= 1024 && i < u.length - 1) { n /= 1024; i++; } return n.toFixed(i ? 1 : 0) + " " + u[i]; }
  function ago(ms) { var s = Math.max(0, Math.round(ms / 1000)); return s < 2 ? "now" : s < 120 ? s + "s ago" : Math.round(s / 60) + "m ago"; }
  function dur(ms) { return gwCharts.fmtTime(Math.max(0, ms) / 1000); }
  function stateOf(s) { return s.lost ? "lost" : s.state; }
  function badge(st) { return '<span class="badge s-' + esc(st) + '">' + esc(st) + "</span>"; }

  // Token: from the URL fragment the CLI printed (then out of the address bar), or this tab's session.
  var m = /(?:^#|&)token=([^&]+)/.exec(location.hash);
  if (m) { token = decodeURIComponent(m[1]); try { sessionStorage.setItem("gw-token", token); } catch (e) {} history.replaceState(null, "", location.pathname); }
  else { try { token = sessionStorage.getItem("gw-token"); } catch (e) {} }
  function authHeaders() { return token ? { Authorization: "Bearer " + token } : {}; }

  function job(id) {
    var j = S.jobs[id];
    if (!j) { j = S.jobs[id] = { snapshot: null, points: {}, reports: [], logs: [] }; }
    return j;
  }
  var MAX_POINTS = 10000;
  function addPoints(j, pts) {
    pts.forEach(function (p) {
      var list = (j.points[p.rank] = j.points[p.rank] || []);
      list.push(p);
      if (list.length > MAX_POINTS) j.points[p.rank] = list.filter(function (_, i) { return i % 2 === 0 || i === list.length - 1; });
    });
  }
  function addReports(j, rs) {
    var seen = {}; j.reports.forEach(function (r) { seen[r.index] = 1; });
    rs.forEach(function (r) { if (!seen[r.index]) j.reports.push(r); });
    j.reports.sort(function (a, b) { return a.index - b.index; });
  }
  function addLogs(j, lines) { j.logs = j.logs.concat(lines); if (j.logs.length > 3000) j.logs = j.logs.slice(-3000); }
  function init(state) {
    S.cluster = state.cluster; S.address = state.address; S.nodes = state.nodes; S.jobs = {};
    state.jobs.forEach(function (x) { var j = job(x.snapshot.job); j.snapshot = x.snapshot; addPoints(j, x.points); addReports(j, x.reports); addLogs(j, x.logs); });
    document.body.setAttribute("data-ready", "1");
  }
  function onEvent(type, e) {
    if (type === "init") init(e);
    else if (type === "nodes") S.nodes = e.nodes;
    else if (type === "job") job(e.snapshot.job).snapshot = e.snapshot;
    else if (type === "tm") { var j = job(e.job); addPoints(j, e.points); addReports(j, e.reports); }
    else if (type === "log") addLogs(job(e.job), e.lines);
    updates++;
    document.body.setAttribute("data-updates", String(updates));
    dirty = true;
  }

  function renderNodes() {
    var r = S.nodes;
    if (!r) { $("nodes").innerHTML = '<tr><td class="nodata">asking the cluster…</td></tr>'; return; }
    var rows = ["<tr><th>node</th><th>state</th><th>host</th><th>CPU</th><th>memory</th><th>GPU</th><th>backends</th><th>actors</th><th>NATS server</th><th>seen</th></tr>"];
    r.nodes.forEach(function (n) {
      var t = n.resources.total, u = n.resources.used;
      var gpus = n.gpus && n.gpus.length ? " " + esc(Array.from(new Set(n.gpus.map(function (g) { return g.name; }))).join(",")) : "";
      rows.push("<tr><td>" + esc(n.nodeId) + (n.head ? " (head)" : "") + "</td><td>" + badge(n.state) + "</td><td>" + esc(n.hostname) + "</td><td>" + num(u.CPU || 0, 1) + "/" + num(t.CPU || 0, 1) +
        "</td><td>" + bytes(u.memory || 0) + "/" + bytes(t.memory || 0) + "</td><td>" + (u.GPU || 0) + "/" + (t.GPU || 0) + gpus + "</td><td>" + esc((n.backends || []).join(", ") || "-") +
        (n.webgpu ? " (webgpu: " + esc(n.webgpu.description || n.webgpu.vendor || "adapter") + ")" : "") + "</td><td>" + n.processes.length + "</td><td>" + esc(n.nats.serverName || "") + "</td><td>" + ago(n.lastSeenMsAgo) + "</td></tr>");
    });
    $("nodes").innerHTML = rows.join("");
    var alive = r.nodes.filter(function (n) { return n.state === "alive"; }).length;
    var tot = r.totals, keys = Object.keys(tot.total);
    $("totals").textContent = alive + " alive node(s) of " + r.nodes.length + " · " + keys.map(function (k) {
      return k + " " + (k === "memory" ? bytes(tot.used[k] || 0) + "/" + bytes(tot.total[k]) : num(tot.used[k] || 0, 1) + "/" + num(tot.total[k], 1));
    }).join(", ");
  }

  function ordered() {
    return Object.keys(S.jobs).map(function (k) { return S.jobs[k]; }).filter(function (j) { return j.snapshot; })
      .sort(function (a, b) { return b.snapshot.startedAt - a.snapshot.startedAt; });
  }
  function renderJobs(list) {
    var rows = ["<tr><th>job</th><th>state</th><th>attempt</th><th>workers</th><th>restarts</th><th>resizes</th><th>progress</th><th>samples/s</th><th>loss</th><th>reports</th><th>strategy</th><th>started</th><th>duration</th></tr>"];
    list.forEach(function (j) {
      var s = j.snapshot, r0 = s.ranks[0], rate = 0;
      s.ranks.forEach(function (r) { rate += r.samplesPerSec || 0; });
      var prog = r0 ? "epoch " + r0.epoch + " step " + (r0.step + 1) + (r0.stepsPerEpoch ? "/" + r0.stepsPerEpoch : "") : "-";
      var size = s.worldSize + (s.minWorkers !== s.maxWorkers ? " (" + s.minWorkers + ".." + s.maxWorkers + ")" : "");
      var end = s.endedAt || (s.lost ? s.updatedAt : Date.now());
      rows.push('<tr class="job' + (S.selected === s.job ? " sel" : "") + '" data-job="' + esc(s.job) + '"><td>' + esc(s.name) + '<br><small>' + esc(s.job) + "</small></td><td>" + badge(stateOf(s)) +
        "</td><td>" + s.attempt + "</td><td>" + size + "</td><td>" + s.restarts + "</td><td>" + s.resizes.length + "</td><td>" + prog + "</td><td>" + (rate ? Math.round(rate) : "-") +
        "</td><td>" + (r0 ? num(r0.loss, 4) : "-") + "</td><td>" + s.reports + "</td><td>" + esc(s.strategy.strategy + " / " + s.strategy.algorithm + (s.strategy.compression !== "none" ? " / " + s.strategy.compression : "")) +
        "</td><td>" + new Date(s.startedAt).toLocaleTimeString() + "</td><td>" + dur(end - s.startedAt) + "</td></tr>");
    });
    if (list.length === 0) rows.push('<tr><td class="nodata" colspan="13">no jobs yet: start one (new Trainer(...).fit(), or gradwire train)</td></tr>');
    $("jobs").innerHTML = rows.join("");
  }

  function markersOf(s) {
    return (s.incidents || []).filter(function (i) { return i.kind === "restart" || i.kind === "resize"; })
      .map(function (i) { return { x: (Date.parse(i.time) - s.startedAt) / 1000, kind: i.kind, label: i.kind }; });
  }
  function timeSeries(j, pick) {
    var s = j.snapshot;
    return Object.keys(j.points).map(Number).sort(function (a, b) { return a - b; }).map(function (rank) {
      var out = [], prev = null;
      j.points[rank].forEach(function (p) {
        var x = (p.t - s.startedAt) / 1000;
        if (prev !== null && p.attempt !== prev) out.push([x, null]);
        out.push([x, pick(p)]);
        prev = p.attempt;
      });
      return { name: "rank " + rank, points: out };
    });
  }
  function splitOverTime(j) {
    var s = j.snapshot, all = [];
    Object.keys(j.points).forEach(function (r) { all = all.concat(j.points[r]); });
    all.sort(function (a, b) { return a.t - b.t; });
    if (!all.length) return { xs: [], c: [], m: [], w: [] };
    var t0 = all[0].t, t1 = all[all.length - 1].t, bins = Math.min(150, all.length), width = Math.max(1, (t1 - t0) / bins);
    var acc = [];
    all.forEach(function (p) {
      var b = Math.min(bins - 1, Math.floor((p.t - t0) / width));
      var a = acc[b] || (acc[b] = { c: 0, m: 0, w: 0, n: 0, t: 0 });
      a.c += p.computeMs; a.m += p.commMs; a.w += p.waitMs; a.n++; a.t += p.t;
    });
    var out = { xs: [], c: [], m: [], w: [] };
    acc.forEach(function (a) { if (!a) return; out.xs.push((a.t / a.n - s.startedAt) / 1000); out.c.push(a.c / a.n); out.m.push(a.m / a.n); out.w.push(a.w / a.n); });
    return out;
  }
  function renderJob(j) {
    var s = j.snapshot, sec = $("job");
    sec.hidden = false;
    sec.setAttribute("data-job", s.job);
    sec.setAttribute("data-restarts", String(s.restarts));
    sec.setAttribute("data-state", stateOf(s));
    $("job-title").innerHTML = esc(s.name) + " " + badge(stateOf(s));
    var rate = 0; s.ranks.forEach(function (r) { rate += r.samplesPerSec || 0; });
    $("job-meta").innerHTML = "job " + esc(s.job) + " · attempt " + s.attempt + " · " + s.worldSize + " worker(s)" +
      " · <span id=\"restarts\">restarts " + s.restarts + "</span> (" + s.countedFailures + " counted) · resizes " + s.resizes.length + " · " + s.reports + " report round(s)" +
      (rate ? " · " + Math.round(rate) + " samples/s" : "") + " · driver " + esc(s.driver.host) + " pid " + s.driver.pid + " · run directory " + esc(s.runDir) +
      (s.lost ? ' · <span class="warn">lost: its driver stopped answering ' + ago(Date.now() - s.updatedAt) + "</span>" : "") +
      (s.error ? '<br><span class="warn">' + esc(s.error) + "</span>" : "");
    var mk = markersOf(s);
    gwCharts.line($("c-loss"), { series: timeSeries(j, function (p) { return p.loss; }), xLabel: "time since start", yLabel: "loss", time: true, markers: mk });
    gwCharts.line($("c-rate"), { series: timeSeries(j, function (p) { return p.samplesPerSec; }), xLabel: "time since start", yLabel: "samples/s", time: true, zero: true, markers: mk });
    gwCharts.line($("c-step"), { series: timeSeries(j, function (p) { return p.computeMs + p.commMs + p.waitMs; }), xLabel: "time since start", yLabel: "ms per step", time: true, zero: true, markers: mk });
    var sp = splitOverTime(j);
    gwCharts.stack($("c-split"), { xs: sp.xs, time: true, xLabel: "time since start", yLabel: "ms per step (mean over ranks)", markers: mk,
      layers: [{ name: "compute", label: "compute", values: sp.c }, { name: "communication", label: "communication", values: sp.m }, { name: "waiting", label: "waiting", values: sp.w }] });
    // Stragglers: compute + waiting against the median rank's (communication is where the others wait for it).
    var own = s.ranks.map(function (r) { return r.computeMs + r.waitMs; }), sorted = own.slice().sort(function (a, b) { return a - b; });
    var median = sorted.length ? sorted[Math.floor((sorted.length - 1) / 2)] : 0, slow = [];
    gwCharts.bars($("c-strag"), s.ranks.map(function (r, i) {
      var ratio = median > 0 ? own[i] / median : 1, flag = s.ranks.length > 1 && ratio > 1.3;
      if (flag) slow.push("rank " + r.rank + " " + ratio.toFixed(1) + "x slower");
      return { label: "rank " + r.rank, parts: [r.computeMs, r.commMs, r.waitMs], flag: flag, note: flag ? "(" + ratio.toFixed(1) + "x)" : "" };
    }), { names: ["compute", "communication", "waiting"], unit: " ms" });
    $("strag-text").textContent = slow.length ? "stragglers: " + slow.join(", ") : s.ranks.length ? "no straggler: every rank within 1.3x of the median" : "";
    renderReportCharts(j);
    renderPlan(s);
    renderCheckpoints(s);
    renderIncidents(s);
    renderLogs(j);
  }
  function renderReportCharts(j) {
    var holder = $("c-reports"), reps = j.reports;
    var metrics = {};
    reps.forEach(function (r) { (r.perRank || []).forEach(function (m) { Object.keys(m).forEach(function (k) { if (k !== "epoch" && !/\/rank\d+$/.test(k)) metrics[k] = 1; }); }); });
    var names = Object.keys(metrics).sort(function (a, b) { return (/loss/.test(b) ? 1 : 0) - (/loss/.test(a) ? 1 : 0) || (a < b ? -1 : 1); });
    var want = names.join("|");
    if (holder.getAttribute("data-metrics") !== want) {
      holder.innerHTML = "";
      names.forEach(function (k, i) {
        var card = document.createElement("div"); card.className = "card";
        var h = document.createElement("h2"); h.textContent = k + " per report (each rank)"; card.appendChild(h);
        var d = document.createElement("div"); d.id = "r-" + i; d.setAttribute("data-metric", k); card.appendChild(d);
        holder.appendChild(card);
      });
      holder.setAttribute("data-metrics", want);
    }
    var xOf = function (r) { return typeof r.metrics.epoch === "number" ? r.metrics.epoch + 1 : r.index + 1; };
    var byEpoch = reps.length && typeof reps[0].metrics.epoch === "number";
    var marks = [];
    for (var i = 1; i < reps.length; i++) if (reps[i].attempt !== reps[i - 1].attempt) marks.push({ x: xOf(reps[i]), kind: "restart", label: "attempt " + reps[i].attempt });
    names.forEach(function (k, i) {
      var ranks = 0; reps.forEach(function (r) { ranks = Math.max(ranks, (r.perRank || []).length); });
      var series = [];
      for (var rank = 0; rank < ranks; rank++) series.push({ name: "rank " + rank, points: reps.filter(function (r) { return r.perRank && r.perRank[rank] && typeof r.perRank[rank][k] === "number"; }).map(function (r) { return [xOf(r), r.perRank[rank][k]]; }) });
      gwCharts.line($("r-" + i), { series: series, xLabel: byEpoch ? "epoch" : "report", yLabel: k, markers: marks });
    });
    if (!names.length) holder.innerHTML = '<p class="nodata">no report round yet</p>';
  }
  function renderPlan(s) {
    var st = s.strategy;
    var html = "<p>strategy " + esc(st.strategy) + " · algorithm " + esc(st.algorithm) + " · compression " + esc(st.compression) + (st.zeroStage ? " · ZeRO stage " + st.zeroStage : "") + "</p>";
    if (s.plan) html += "<p>" + esc(s.plan.summary) + "</p><details><summary>the plan and why (explain.txt)</summary><pre>" + esc(s.plan.text) + "</pre></details>";
    else html += '<p class="nodata">no plan explained yet (rank 0 explains it after the start-up probe)</p>';
    if (s.plan !== undefined && $("plan").getAttribute("data-text") === (s.plan ? s.plan.text : "")) return;
    $("plan").innerHTML = html;
    $("plan").setAttribute("data-text", s.plan ? s.plan.text : "");
  }
  function renderCheckpoints(s) {
    var c = s.checkpoints, fmtm = function (m) { return Object.keys(m || {}).filter(function (k) { return typeof m[k] === "number"; }).slice(0, 6).map(function (k) { return esc(k) + "=" + num(m[k], 4); }).join(" "); };
    $("ckpt").innerHTML = c.count && c.latest ? "<p>" + c.count + " kept</p><p>latest: <code>" + esc(c.latest.path) + "</code> " + fmtm(c.latest.metrics) + "</p>" +
      (c.best ? "<p>best: <code>" + esc(c.best.path) + "</code> " + fmtm(c.best.metrics) + "</p>" : "") : '<p class="nodata">no checkpoint yet</p>';
  }
  function renderIncidents(s) {
    var rows = (s.incidents || []).slice().reverse().map(function (i) { return "<tr><td>" + esc(new Date(i.time).toLocaleTimeString()) + "</td><td>" + esc(i.kind) + '</td><td style="white-space:normal">' + esc(i.text) + "</td></tr>"; });
    $("incidents").innerHTML = rows.length ? "<tr><th>time</th><th>what</th><th>detail</th></tr>" + rows.join("") : '<tr><td class="nodata">none</td></tr>';
  }
  function renderLogs(j) {
    var sel = $("log-rank"), want = sel.value, ranks = {};
    j.logs.forEach(function (l) { if (typeof l.rank === "number") ranks[l.rank] = 1; });
    var opts = ["all"].concat(Object.keys(ranks).sort(function (a, b) { return a - b; }));
    if (sel.getAttribute("data-opts") !== opts.join(",")) {
      sel.innerHTML = opts.map(function (o) { return '<option value="' + o + '">' + (o === "all" ? "all workers" : "rank " + o) + "</option>"; }).join("");
      sel.setAttribute("data-opts", opts.join(","));
      sel.value = opts.indexOf(want) >= 0 ? want : "all";
    }
    var lines = j.logs.filter(function (l) { return sel.value === "all" || String(l.rank) === sel.value; }).slice(-400);
    var pre = $("logs"), atEnd = pre.scrollTop + pre.clientHeight >= pre.scrollHeight - 20;
    pre.textContent = lines.length ? lines.map(function (l) { return "[" + (typeof l.rank === "number" ? "rank " + l.rank : l.actor) + " " + l.node + "] " + l.line; }).join("\n") : "no output yet";
    pre.setAttribute("data-lines", String(lines.length));
    if (atEnd) pre.scrollTop = pre.scrollHeight;
  }
  function render() {
    if (!dirty) return;
    dirty = false;
    renderNodes();
    var list = ordered();
    if (!S.selected || !S.jobs[S.selected] || !S.jobs[S.selected].snapshot) {
      var running = list.filter(function (j) { return !j.snapshot.endedAt && !j.snapshot.lost; });
      S.selected = (running[0] || list[0] || { snapshot: { job: null } }).snapshot.job;
    }
    renderJobs(list);
    if (S.selected) renderJob(S.jobs[S.selected]); else $("job").hidden = true;
    $("clusterName").textContent = S.cluster;
    $("address").textContent = S.address;
  }
  $("jobs").addEventListener("click", function (e) {
    var tr = e.target.closest("tr[data-job]");
    if (tr) { S.selected = tr.getAttribute("data-job"); dirty = true; render(); }
  });
  $("log-rank").addEventListener("change", function () { if (S.selected) renderLogs(S.jobs[S.selected]); });
  setInterval(function () { dirty = dirty || document.body.getAttribute("data-ready") === "1"; render(); }, 500);

  function connected(ok, text) { var c = $("conn"); c.textContent = text; c.className = ok ? "ok" : "bad"; }
  function showLogin(message) {
    $("main").hidden = true; $("login").hidden = false;
    $("login-msg").textContent = message;
    connected(false, "token required");
  }
  $("login-form").addEventListener("submit", function (e) {
    e.preventDefault();
    token = $("token").value.trim();
    try { sessionStorage.setItem("gw-token", token); } catch (x) {}
    start();
  });
  var source = null;
  function start() {
    fetch("/api/state", { headers: authHeaders() }).then(function (r) {
      if (r.status === 401) { showLogin(token ? "That token was refused." : "This dashboard needs the token that gradwire dashboard printed."); return null; }
      if (!r.ok) throw new Error("HTTP " + r.status);
      return r.json();
    }).then(function (state) {
      if (!state) return;
      $("login").hidden = true; $("main").hidden = false;
      onEvent("init", state);
      render();
      if (source) source.close();
      source = new EventSource("/api/events" + (token ? "?token=" + encodeURIComponent(token) : ""));
      source.onopen = function () { connected(true, "live"); };
      source.onerror = function () { connected(false, "reconnecting…"); };
      ["init", "nodes", "job", "tm", "log"].forEach(function (t) {
        source.addEventListener(t, function (ev) { onEvent(t, JSON.parse(ev.data)); });
      });
    }).catch(function (e) { connected(false, "unreachable: " + e.message); setTimeout(start, 2000); });
  }
  start();
})();
`

export const renderDashboardPage = (o: { readonly cluster: string; readonly tokenRequired: boolean }): string => `<!doctype html>
<html lang="en"><head><meta charset="utf-8"><title>gradwire dashboard — ${escapeHtml(o.cluster)}</title>
<meta name="viewport" content="width=device-width, initial-scale=1">
<style>${STYLE}</style>
${chartHead()}</head>
<body data-ready="0" data-updates="0" data-token-required="${o.tokenRequired ? "1" : "0"}">
<header><h1>gradwire</h1><span class="sub">cluster <b id="clusterName">${escapeHtml(o.cluster)}</b> · <span id="address"></span></span><span id="conn">connecting…</span></header>
<div id="login" class="card" hidden><h2>Token</h2><p id="login-msg"></p>
<form id="login-form"><input id="token" type="password" autocomplete="off" placeholder="token"><button type="submit">Open</button></form></div>
<main id="main">
<div class="card"><h2>Cluster</h2><table id="nodes"></table><p id="totals" class="meta"></p></div>
<div class="card"><h2>Jobs</h2><table id="jobs"></table></div>
<section id="job" hidden>
<div class="card"><h2 id="job-title"></h2><div id="job-meta" class="meta"></div>
<div class="grid">
<div class="card"><h2>Loss per rank</h2><div id="c-loss"></div></div>
<div class="card"><h2>Samples/s per rank</h2><div id="c-rate"></div></div>
<div class="card"><h2>Step time per rank</h2><div id="c-step"></div></div>
<div class="card"><h2>Compute / communication / waiting (mean over ranks)</h2><div id="c-split"></div></div>
<div class="card"><h2>Stragglers (recent ms per step)</h2><div id="c-strag"></div><p id="strag-text" class="meta"></p></div>
</div></div>
<div class="grid" id="c-reports"></div>
<div class="grid" style="margin-top:14px">
<div class="card" style="flex:1 1 420px"><h2>All-reduce plan</h2><div id="plan"></div></div>
<div class="card" style="flex:1 1 420px"><h2>Checkpoints</h2><div id="ckpt"></div></div>
<div class="card" style="flex:1 1 420px"><h2>Restarts, resizes and outages</h2><table id="incidents"></table></div>
</div>
<div class="card" style="margin-top:14px"><h2>Worker output <select id="log-rank"><option value="all">all workers</option></select></h2><pre id="logs"></pre></div>
</section>
</main>
<script>${CHART_SCRIPT}</script>
<script>${SCRIPT}</script>
</body></html>
`
