// The charts both pages draw (chart-script.ts): uPlot is inlined in the dashboard's page and in
// report.html (nothing fetched), and a long run's curves draw in headless Chromium: 4 ranks of
// 50,000 points each (the hand-written SVG script this replaced threw "Maximum call stack size
// exceeded" past about 125,000 values in one chart, and built a megabyte of path text per series),
// in a chart of a few dozen DOM nodes, with restart markers, a zoom that survives the next live
// update, and the value of every rank under the cursor.
import * as fs from "node:fs"
import * as os from "node:os"
import * as path from "node:path"
import { afterAll, describe, expect, it } from "vitest"
import { CHART_SCRIPT, chartAssets, chartHead } from "../actors/train/common/observe/chart-script.ts"
import { renderDashboardPage } from "../actors/train/common/observe/dashboard-page.ts"
import { renderReport } from "../actors/train/common/observe/report-html.ts"
import { dumpDom } from "./support/chromium.ts"

const dir = fs.mkdtempSync(path.join(os.tmpdir(), "gw-charts-"))
afterAll(() => fs.rmSync(dir, { recursive: true, force: true }))

const UPLOT_BANNER = /\/\*! https:\/\/github\.com\/leeoniya\/uPlot \(v1\.6\.\d+\) \*\//

describe("charts", () => {
  it("inlines uPlot's script and CSS in the dashboard's page and in report.html, with the series' data; nothing is fetched", () => {
    const { js, css } = chartAssets()
    expect(js).toMatch(UPLOT_BANNER)
    expect(js).not.toMatch(/<\/script/i)
    expect(css).toContain(".uplot")
    const dashboard = renderDashboardPage({ cluster: "c1", tokenRequired: false })
    const report = renderReport({
      title: "t",
      finishedAt: "now",
      restarts: 0,
      history: [{ epoch: 0, loss: 0.9, val_loss: 1.1 }, { epoch: 1, loss: 0.4, val_loss: 0.6 }],
      steps: [{ attempt: 0, rank: 0, step: 0, computeMs: 4, commMs: 2, waitMs: 1 }]
    })
    for (const page of [dashboard, report]) {
      expect(page).toMatch(UPLOT_BANNER)
      expect(page).toContain(".uplot")
      expect(page).toContain("var gwCharts")
      expect(page).not.toMatch(/\b(src|href)=["']?https?:/)
      expect(page).not.toMatch(/<script[^>]+src=/)
    }
    // The report carries its series' data for uPlot to draw.
    const data = JSON.parse(/<script type="application\/json" id="gw-data">(.*?)<\/script>/s.exec(report)![1])
    expect(data.metrics.charts).toEqual([
      { title: "loss", series: [{ name: "loss", points: [[1, 0.9], [2, 0.4]] }, { name: "val_loss", points: [[1, 1.1], [2, 0.6]] }] }
    ])
  })

  it("draws 4 ranks x 50,000 points in a few dozen nodes, keeps a zoom through an update, and reads every rank under the cursor", async () => {
    const file = path.join(dir, "long.html")
    const script = String.raw`
      var out = {};
      try {
        var N = 50000, RANKS = 4, holder = document.getElementById("c");
        function series(n) {
          var s = [];
          for (var r = 0; r < RANKS; r++) {
            var p = [];
            for (var i = 0; i < n; i++) {
              // A restart of rank 0 halfway: a null breaks its line.
              if (r === 0 && i === n / 2) p.push([i * 0.25 + r * 0.01, null]);
              p.push([i * 0.25 + r * 0.01, 2 * Math.exp(-i / n * 3) + 0.1 * Math.sin(i / 7 + r)]);
            }
            s.push({ name: "rank " + r, points: p });
          }
          return s;
        }
        var t0 = performance.now();
        out.drawn = gwCharts.line(holder, { series: series(N), xLabel: "time since start", yLabel: "loss", time: true, markers: [{ x: 6250, kind: "restart", label: "restart" }] });
        out.firstMs = performance.now() - t0;
        out.nodes = holder.getElementsByTagName("*").length;
        var u = holder.gwChart.u;
        // The user zooms (what a drag does), then the next live update arrives with more points.
        u.batch(function () { u.setScale("x", { min: 1000, max: 2000 }); });
        t0 = performance.now();
        gwCharts.line(holder, { series: series(N + 4), xLabel: "time since start", yLabel: "loss", time: true, markers: [{ x: 6250, kind: "restart", label: "restart" }] });
        out.updateMs = performance.now() - t0;
        out.sameChart = holder.gwChart.u === u;
        out.zoom = [u.scales.x.min, u.scales.x.max];
        out.points = Array.prototype.map.call(holder.querySelectorAll(".curve"), function (e) { return e.getAttribute("data-series") + "=" + e.getAttribute("data-points"); });
        out.markers = holder.querySelectorAll(".marker[data-kind=restart]").length;
        out.markerShown = holder.querySelector(".marker").style.display;
        // The cursor at x = 1500 s: each rank's value there, not only the rank whose point is nearest.
        u.setCursor({ left: u.valToPos(1500, "x"), top: 20 });
        out.values = Array.prototype.map.call(holder.querySelectorAll(".curve .u-value"), function (e) { return e.textContent; });
        // Double-click's reset (the whole range) then an update: the chart follows the data again.
        u.batch(function () { u.setScale("x", { min: u.data[0][0], max: u.data[0][u.data[0].length - 1] }); });
        gwCharts.line(holder, { series: series(N + 8), xLabel: "time since start", yLabel: "loss", time: true });
        out.followed = u.scales.x.max;
        out.markersAfter = holder.querySelectorAll(".marker").length;
      } catch (e) { out.error = String(e); }
      document.getElementById("out").textContent = JSON.stringify(out);`
    fs.writeFileSync(
      file,
      `<!doctype html><html><head><meta charset="utf-8">${chartHead()}</head><body><div id="c"></div><pre id="out"></pre>` +
        `<script>${CHART_SCRIPT}</script><script>${script}</script></body></html>`
    )
    const dom = await dumpDom(file)
    const out = JSON.parse(/<pre id="out">(.*?)<\/pre>/s.exec(dom)![1].replace(/&quot;/g, '"').replace(/&amp;/g, "&"))
    expect(out.error).toBeUndefined()
    expect(out.drawn).toBe(1)
    // A canvas chart: its size does not grow with the run.
    expect(out.nodes).toBeLessThan(120)
    expect(out.sameChart).toBe(true)
    expect(out.zoom).toEqual([1000, 2000])
    expect(out.points).toEqual(["rank 0=50004", "rank 1=50004", "rank 2=50004", "rank 3=50004"])
    expect(out.markers).toBe(1)
    // x = 6250 s is outside the zoom: its marker is hidden, not drawn outside the plot.
    expect(out.markerShown).toBe("none")
    expect(out.values).toHaveLength(4)
    for (const v of out.values) expect(Number(v)).toBeGreaterThan(0.5)
    expect(out.followed).toBeCloseTo((50008 - 1) * 0.25 + 0.03, 5)
    expect(out.markersAfter).toBe(0)
    console.log(`4 x 50,000 points: first draw ${out.firstMs.toFixed(0)} ms, update ${out.updateMs.toFixed(0)} ms, ${out.nodes} nodes`)
  }, 120_000)
})
