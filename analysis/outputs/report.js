// dsprof report: builds the swimlane and per-step charts from the JSON data block.
// Trace text is untrusted: tooltips use textContent, plotly labels go through escapeHtml.
(function () {
  "use strict";
  var data = JSON.parse(document.getElementById("dsprof-data").textContent);
  var lane = data.swimlane;
  var stepsChart = data.steps;
  var WIDTH_BY_DEPTH = [16, 10, 5];
  var SERVING_WIDTH = 12;
  var ROW_PX = 24;

  function escapeHtml(text) {
    return String(text).replace(/[&<>"']/g, function (c) {
      return {"&": "&amp;", "<": "&lt;", ">": "&gt;", '"': "&quot;", "'": "&#39;"}[c];
    });
  }

  function ms(us) { return (us / 1000).toFixed(3) + " ms"; }

  // One line-segment trace per phase: start, midpoint (for hover), end, gap.
  function segmentTrace(index, starts, durs, rows, name, color, width) {
    var n = index.length;
    var x = new Array(4 * n), y = new Array(4 * n);
    for (var k = 0; k < n; k++) {
      var i = index[k], s = starts[i], d = durs[i], yy = lane.rows.y[rows[i]];
      x[4 * k] = s; x[4 * k + 1] = s + d / 2; x[4 * k + 2] = s + d; x[4 * k + 3] = null;
      y[4 * k] = yy; y[4 * k + 1] = yy; y[4 * k + 2] = yy; y[4 * k + 3] = null;
    }
    for (var j = 0; j < x.length; j++) { if (x[j] !== null) { x[j] = x[j] / 1000; } }
    return {
      type: "scatter", mode: "lines", x: x, y: y, name: escapeHtml(name),
      line: {color: color, width: width}, hoverinfo: "none", connectgaps: false,
    };
  }

  var traceInfo = [];

  function buildSwimlane() {
    var spans = lane.spans, phases = lane.phases;
    var byPhase = phases.name.map(function () { return []; });
    for (var i = 0; i < spans.phase.length; i++) { byPhase[spans.phase[i]].push(i); }
    var traces = [];
    var agg = lane.aggregate;
    if (agg.row.length) {
      var aggIndex = agg.row.map(function (_, k) { return k; });
      traces.push(segmentTrace(aggIndex, agg.start_us, agg.dur_us, agg.row, "aggregated steps", "#c9ced6", WIDTH_BY_DEPTH[0]));
      traceInfo.push({kind: "aggregate", index: aggIndex});
    }
    for (var p = 0; p < phases.name.length; p++) {
      if (!byPhase[p].length) { continue; }
      var width = phases.kind[p] === "serving" ? SERVING_WIDTH : WIDTH_BY_DEPTH[Math.min(phases.depth[p], 2)];
      traces.push(segmentTrace(byPhase[p], spans.start_us, spans.dur_us, spans.row, phases.name[p], phases.color[p], width));
      traceInfo.push({kind: "span", index: byPhase[p]});
    }
    var ys = lane.rows.y;
    var yMin = ys.length ? Math.min.apply(null, ys) : 0;
    var yMax = ys.length ? Math.max.apply(null, ys) : 0;
    var st = lane.steps;
    if (st.step.length) {
      var bx = new Array(3 * st.step.length), by = new Array(3 * st.step.length);
      for (var s = 0; s < st.step.length; s++) {
        bx[3 * s] = st.start_ms[s]; bx[3 * s + 1] = st.start_ms[s]; bx[3 * s + 2] = null;
        by[3 * s] = yMin - 0.5; by[3 * s + 1] = yMax + 0.5; by[3 * s + 2] = null;
      }
      traces.push({type: "scatter", mode: "lines", x: bx, y: by, name: "step start", hoverinfo: "skip",
                   line: {color: "#8892a0", width: 1, dash: "dot"}});
      traceInfo.push(null);
    }
    var layout = {
      height: Math.max(260, 120 + (yMax - yMin + 1) * ROW_PX),
      margin: {l: 120, r: 20, t: 40, b: 50},
      hovermode: "closest", hoverdistance: 40, dragmode: "zoom", showlegend: true,
      legend: {orientation: "h", y: 1.02, yanchor: "bottom", x: 0},
      xaxis: {title: {text: "ms"}, zeroline: false},
      yaxis: {
        tickmode: "array",
        tickvals: lane.ticks.map(function (t) { return t.y; }),
        ticktext: lane.ticks.map(function (t) { return escapeHtml(t.text); }),
        range: [yMax + 0.7, yMin - 0.7], fixedrange: true, zeroline: false, showgrid: false,
      },
    };
    return Plotly.newPlot("swimlane", traces, layout, {displaylogo: false, responsive: true});
  }

  function hoverLines(info, k) {
    var rows = lane.rows;
    if (info.kind === "aggregate") {
      var a = lane.aggregate, i = info.index[k], r = a.row[i];
      return [
        "steps " + a.step_lo[i] + "–" + a.step_hi[i] + " (aggregated)",
        "lane: " + rows.label[r] + (rows.rank[r] === null ? "" : " (rank " + rows.rank[r] + ")"),
        a.spans[i] + " spans",
        "start: " + ms(a.start_us[i]), "covers: " + ms(a.dur_us[i]),
      ];
    }
    var sp = lane.spans, j = info.index[k], row = sp.row[j];
    var serving = rows.kind[row] === "serving";
    return [
      lane.names[sp.name[j]],
      "phase: " + lane.phases.name[sp.phase[j]],
      "step: " + (sp.step[j] < 0 ? "—" : sp.step[j]),
      serving ? "lane: " + rows.label[row] : "rank: " + (rows.rank[row] === null ? "—" : rows.rank[row]),
      serving ? "" : "device: " + rows.label[row] + (rows.sub[row] ? " (sub-lane " + rows.sub[row] + ")" : ""),
      "start: " + ms(sp.start_us[j]), "duration: " + ms(sp.dur_us[j]),
    ].filter(function (t) { return t !== ""; });
  }

  function attachHover(gd) {
    var tip = document.getElementById("tooltip");
    gd.on("plotly_hover", function (ev) {
      var pt = ev.points[0], info = traceInfo[pt.curveNumber];
      if (!info) { return; }
      tip.textContent = hoverLines(info, Math.floor(pt.pointNumber / 4)).join("\n");
      tip.hidden = false;
      var e = ev.event || {clientX: 0, clientY: 0};
      tip.style.left = (e.clientX + window.scrollX + 14) + "px";
      tip.style.top = (e.clientY + window.scrollY + 14) + "px";
    });
    gd.on("plotly_unhover", function () { tip.hidden = true; });
  }

  var stepIndex = new Map();
  lane.steps.step.forEach(function (s, i) { stepIndex.set(s, i); });

  function zoomToStep(step) {
    var i = stepIndex.get(step);
    if (i === undefined) { return false; }
    var a = lane.steps.start_ms[i], b = lane.steps.end_ms[i], pad = Math.max((b - a) * 0.25, 0.01);
    Plotly.relayout("swimlane", {"xaxis.range": [a - pad, b + pad]});
    document.getElementById("swimlane-section").scrollIntoView({block: "start"});
    return true;
  }

  function stepChart(id, values, threshold, marked, title) {
    var markedSet = new Set(marked);
    var mx = [], my = [];
    stepsChart.step.forEach(function (s, i) { if (markedSet.has(s)) { mx.push(s); my.push(values[i]); } });
    var many = stepsChart.step.length > 2000;
    var traces = [
      {type: "scatter", mode: many ? "lines" : "lines+markers", x: stepsChart.step, y: values, name: title,
       line: {color: "#4c78a8", width: 1}, marker: {size: 4}, hovertemplate: "step %{x}: %{y:.3f} ms<extra></extra>"},
      {type: "scatter", mode: "markers", x: mx, y: my, name: "over threshold",
       marker: {color: "#e45756", size: 8, symbol: "x"}, hovertemplate: "step %{x}: %{y:.3f} ms<extra></extra>"},
    ];
    var shapes = threshold === null || threshold === undefined ? [] : [
      {type: "line", xref: "paper", x0: 0, x1: 1, y0: threshold, y1: threshold, line: {color: "#e45756", dash: "dash", width: 1}},
    ];
    var layout = {
      title: {text: escapeHtml(title) + (threshold === null || threshold === undefined ? "" : " (threshold " + threshold + " ms)")},
      height: 260, margin: {l: 60, r: 20, t: 40, b: 40}, shapes: shapes, showlegend: false,
      xaxis: {title: {text: "step"}}, yaxis: {title: {text: "ms"}, rangemode: "tozero"},
    };
    return Plotly.newPlot(id, traces, layout, {displaylogo: false, responsive: true}).then(function (gd) {
      gd.on("plotly_click", function (ev) { zoomToStep(ev.points[0].x); });
      return gd;
    });
  }

  document.querySelectorAll("button.zoom").forEach(function (button) {
    button.addEventListener("click", function () { zoomToStep(Number(button.dataset.step)); });
  });

  var ready = Promise.all([
    buildSwimlane().then(function (gd) { attachHover(gd); return gd; }),
    stepChart("start-skew", stepsChart.start_skew_ms, stepsChart.late_threshold_ms, stepsChart.late_steps, "runner-start skew"),
    stepChart("end-skew", stepsChart.end_skew_ms, stepsChart.tail_threshold_ms, stepsChart.tail_steps, "runner-end skew"),
  ]).then(function () { document.body.dataset.rendered = "true"; });

  window.dsprofReport = {data: data, ready: ready, zoomToStep: zoomToStep, hoverLines: hoverLines, traceInfo: traceInfo};
})();
