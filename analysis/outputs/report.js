// dsprof report: builds the swimlane and per-step charts from the JSON data block.
// Plotly draws the swimlane's axes, legend and step lines; the spans themselves are
// painted on a canvas over the plot area (one fillRect each), which stays fast at
// hundreds of thousands of spans where an SVG path per trace would not.
// Trace text is untrusted: the tooltip uses textContent, plotly labels go through escapeHtml.
(function () {
  "use strict";
  var data = JSON.parse(document.getElementById("dsprof-data").textContent);
  var lane = data.swimlane;
  var stepsChart = data.steps;
  var THICKNESS_BY_DEPTH = [16, 10, 5];
  var SERVING_THICKNESS = 12;
  var AGGREGATE_COLOR = "#c9ced6";
  var ROW_PX = 24;
  var HOVER_SLACK_PX = 3;

  function escapeHtml(text) {
    return String(text).replace(/[&<>"']/g, function (c) {
      return {"&": "&amp;", "<": "&lt;", ">": "&gt;", '"': "&quot;", "'": "&#39;"}[c];
    });
  }

  function ms(value) { return value.toFixed(3) + " ms"; }

  // ---------------------------------------------------------------- items to paint
  // Items 0..nSpans-1 are spans, the rest aggregate bars; each belongs to one draw group.
  var spans = lane.spans, agg = lane.aggregate, phases = lane.phases;
  var nSpans = spans.row.length, nItems = nSpans + agg.row.length;
  var itemRow = new Int32Array(nItems), itemStart = new Float64Array(nItems), itemEnd = new Float64Array(nItems);
  var itemThickness = new Float32Array(nItems), itemGroup = new Array(nItems);
  var groups = [];  // {name, color, thickness, items: [], trace: legend trace index}
  if (agg.row.length) { groups.push({name: "aggregated steps", color: AGGREGATE_COLOR, thickness: THICKNESS_BY_DEPTH[0], items: []}); }
  var groupOfPhase = phases.name.map(function (name, p) {
    var thickness = phases.kind[p] === "serving" ? SERVING_THICKNESS : THICKNESS_BY_DEPTH[Math.min(phases.depth[p], 2)];
    groups.push({name: name, color: phases.color[p], thickness: thickness, items: []});
    return groups.length - 1;
  });
  for (var i = 0; i < nSpans; i++) {
    var g = groups[groupOfPhase[spans.phase[i]]];
    itemRow[i] = spans.row[i];
    itemStart[i] = spans.start_us[i] / 1000;
    itemEnd[i] = (spans.start_us[i] + spans.dur_us[i]) / 1000;
    itemThickness[i] = g.thickness;
    itemGroup[i] = g;
    g.items.push(i);
  }
  for (var k = 0; k < agg.row.length; k++) {
    var j = nSpans + k;
    itemRow[j] = agg.row[k];
    itemStart[j] = agg.start_us[k] / 1000;
    itemEnd[j] = (agg.start_us[k] + agg.dur_us[k]) / 1000;
    itemThickness[j] = THICKNESS_BY_DEPTH[0];
    itemGroup[j] = groups[0];
    groups[0].items.push(j);
  }
  groups = groups.filter(function (grp) { return grp.items.length > 0; });

  // Per lane row: items sorted by start, and the longest item, for hover look-ups.
  var nRows = lane.rows.y.length;
  var rowItems = [], rowLongest = new Float64Array(nRows);
  for (var r = 0; r < nRows; r++) { rowItems.push([]); }
  for (var it = 0; it < nItems; it++) {
    rowItems[itemRow[it]].push(it);
    rowLongest[itemRow[it]] = Math.max(rowLongest[itemRow[it]], itemEnd[it] - itemStart[it]);
  }
  rowItems = rowItems.map(function (list) {
    list.sort(function (a, b) { return itemStart[a] - itemStart[b]; });
    return Int32Array.from(list);
  });

  var xMin = Infinity, xMax = -Infinity;
  for (var q = 0; q < nItems; q++) { xMin = Math.min(xMin, itemStart[q]); xMax = Math.max(xMax, itemEnd[q]); }
  if (!isFinite(xMin)) { xMin = 0; xMax = 1; }
  var xPad = Math.max((xMax - xMin) * 0.01, 0.001);

  // ---------------------------------------------------------------- swimlane
  var gd = document.getElementById("swimlane");
  var canvas = document.createElement("canvas");
  canvas.className = "spans";

  function buildSwimlane() {
    var traces = groups.map(function (grp, index) {
      grp.trace = index;
      return {type: "scatter", mode: "lines", x: [null], y: [null], name: escapeHtml(grp.name), hoverinfo: "skip",
              line: {color: grp.color, width: Math.min(grp.thickness, 8)}};
    });
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
    }
    var layout = {
      height: Math.max(260, 120 + (yMax - yMin + 1) * ROW_PX),
      margin: {l: 120, r: 20, t: 40, b: 50},
      hovermode: false, dragmode: "zoom", showlegend: true,
      legend: {orientation: "h", y: 1.02, yanchor: "bottom", x: 0},
      xaxis: {title: {text: "ms"}, zeroline: false, range: [xMin - xPad, xMax + xPad], autorange: false},
      yaxis: {
        tickmode: "array",
        tickvals: lane.ticks.map(function (t) { return t.y; }),
        ticktext: lane.ticks.map(function (t) { return escapeHtml(t.text); }),
        range: [yMax + 0.7, yMin - 0.7], fixedrange: true, zeroline: false, showgrid: false,
      },
    };
    return Plotly.newPlot(gd, traces, layout, {displaylogo: false, responsive: true, doubleClick: "reset"}).then(function () {
      gd.appendChild(canvas);
      gd.on("plotly_afterplot", paint);
      paint();
      attachHover();
      return gd;
    });
  }

  function geometry() {
    var full = gd._fullLayout;
    return {size: full._size, xa: full.xaxis, ya: full.yaxis};
  }

  function paint() {
    var geo = geometry(), size = geo.size, ratio = window.devicePixelRatio || 1;
    canvas.style.left = size.l + "px";
    canvas.style.top = size.t + "px";
    canvas.style.width = size.w + "px";
    canvas.style.height = size.h + "px";
    canvas.width = Math.round(size.w * ratio);
    canvas.height = Math.round(size.h * ratio);
    var ctx = canvas.getContext("2d");
    ctx.setTransform(ratio, 0, 0, ratio, 0, 0);
    ctx.clearRect(0, 0, size.w, size.h);
    var x0 = geo.xa.range[0], scale = size.w / (geo.xa.range[1] - geo.xa.range[0]);
    var rowPx = lane.rows.y.map(function (y) { return geo.ya.l2p(y); });
    groups.forEach(function (grp) {
      if (gd.data[grp.trace].visible === "legendonly") { return; }
      ctx.fillStyle = grp.color;
      var half = grp.thickness / 2, items = grp.items;
      for (var n = 0; n < items.length; n++) {
        var m = items[n];
        var left = (itemStart[m] - x0) * scale, right = (itemEnd[m] - x0) * scale;
        if (right < 0 || left > size.w) { continue; }
        ctx.fillRect(left, rowPx[itemRow[m]] - half, Math.max(right - left, 1), grp.thickness);
      }
    });
  }

  // The item under a point of the plot area: in the nearest lane row, the thinnest item
  // (drawn on top) whose bar covers the point.
  function itemAt(px, py) {
    var geo = geometry(), x0 = geo.xa.range[0], scale = geo.size.w / (geo.xa.range[1] - geo.xa.range[0]);
    var best = -1, bestDist = Infinity;
    for (var row = 0; row < nRows; row++) {
      var d = Math.abs(geo.ya.l2p(lane.rows.y[row]) - py);
      if (d < bestDist) { bestDist = d; best = row; }
    }
    if (best < 0 || bestDist > ROW_PX / 2) { return -1; }
    var x = x0 + px / scale, slack = HOVER_SLACK_PX / scale, list = rowItems[best];
    var lo = 0, hi = list.length;
    while (lo < hi) { var mid = (lo + hi) >> 1; if (itemStart[list[mid]] <= x + slack) { lo = mid + 1; } else { hi = mid; } }
    var found = -1;
    for (var n = lo - 1; n >= 0 && itemStart[list[n]] >= x - slack - rowLongest[best]; n--) {
      var m = list[n];
      if (itemEnd[m] + slack >= x && itemThickness[m] / 2 + 1 >= bestDist && (found < 0 || itemThickness[m] < itemThickness[found])) {
        if (isShown(m)) { found = m; }
      }
    }
    return found;
  }

  function isShown(item) { return gd.data[itemGroup[item].trace].visible !== "legendonly"; }

  function hoverLines(item) {
    var rows = lane.rows;
    if (item >= nSpans) {
      var a = item - nSpans, r = agg.row[a];
      return [
        "steps " + agg.step_lo[a] + "–" + agg.step_hi[a] + " (aggregated)",
        "lane: " + rows.label[r] + (rows.rank[r] === null ? "" : " (rank " + rows.rank[r] + ")"),
        agg.spans[a] + " spans",
        "start: " + ms(itemStart[item]), "covers: " + ms(itemEnd[item] - itemStart[item]),
      ];
    }
    var row = spans.row[item], serving = rows.kind[row] === "serving";
    return [
      lane.names[spans.name[item]],
      "phase: " + phases.name[spans.phase[item]],
      "step: " + (spans.step[item] < 0 ? "—" : spans.step[item]),
      serving ? "lane: " + rows.label[row] : "rank: " + (rows.rank[row] === null ? "—" : rows.rank[row]),
      serving ? "" : "device: " + rows.label[row] + (rows.sub[row] ? " (sub-lane " + rows.sub[row] + ")" : ""),
      "start: " + ms(itemStart[item]), "duration: " + ms(spans.dur_us[item] / 1000),
    ].filter(function (t) { return t !== ""; });
  }

  function attachHover() {
    var tip = document.getElementById("tooltip");
    gd.addEventListener("mousemove", function (ev) {
      var box = canvas.getBoundingClientRect();
      var item = itemAt(ev.clientX - box.left, ev.clientY - box.top);
      if (item < 0) { tip.hidden = true; return; }
      tip.textContent = hoverLines(item).join("\n");
      tip.hidden = false;
      tip.style.left = (ev.clientX + window.scrollX + 14) + "px";
      tip.style.top = (ev.clientY + window.scrollY + 14) + "px";
    });
    gd.addEventListener("mouseleave", function () { tip.hidden = true; });
  }

  // Client coordinates of an item's middle (for tests and links).
  function itemCenter(item) {
    var geo = geometry(), box = canvas.getBoundingClientRect();
    var x0 = geo.xa.range[0], scale = geo.size.w / (geo.xa.range[1] - geo.xa.range[0]);
    var left = (itemStart[item] - x0) * scale, right = (itemEnd[item] - x0) * scale;
    return {x: box.left + (left + Math.max(right, left + 1)) / 2, y: box.top + geo.ya.l2p(lane.rows.y[itemRow[item]])};
  }

  var stepIndex = new Map();
  lane.steps.step.forEach(function (s, n) { stepIndex.set(s, n); });

  function zoomToStep(step) {
    var n = stepIndex.get(step);
    if (n === undefined) { return false; }
    var a = lane.steps.start_ms[n], b = lane.steps.end_ms[n], pad = Math.max((b - a) * 0.25, 0.01);
    Plotly.relayout(gd, {"xaxis.range": [a - pad, b + pad]});
    document.getElementById("swimlane-section").scrollIntoView({block: "start"});
    return true;
  }

  // ---------------------------------------------------------------- per-step charts
  function stepChart(id, values, threshold, marked, title) {
    var markedSet = new Set(marked);
    var mx = [], my = [];
    stepsChart.step.forEach(function (s, n) { if (markedSet.has(s)) { mx.push(s); my.push(values[n]); } });
    var many = stepsChart.step.length > 2000;
    var hasThreshold = threshold !== null && threshold !== undefined;
    var traces = [
      {type: "scatter", mode: many ? "lines" : "lines+markers", x: stepsChart.step, y: values, name: title,
       line: {color: "#4c78a8", width: 1}, marker: {size: 4}, hovertemplate: "step %{x}: %{y:.3f} ms<extra></extra>"},
      {type: "scatter", mode: "markers", x: mx, y: my, name: "over threshold",
       marker: {color: "#e45756", size: 8, symbol: "x"}, hovertemplate: "step %{x}: %{y:.3f} ms<extra></extra>"},
    ];
    var layout = {
      title: {text: escapeHtml(title) + (hasThreshold ? " (threshold " + threshold + " ms)" : "")},
      height: 260, margin: {l: 60, r: 20, t: 40, b: 40}, showlegend: false,
      shapes: hasThreshold ? [{type: "line", xref: "paper", x0: 0, x1: 1, y0: threshold, y1: threshold,
                               line: {color: "#e45756", dash: "dash", width: 1}}] : [],
      xaxis: {title: {text: "step"}}, yaxis: {title: {text: "ms"}, rangemode: "tozero"},
    };
    return Plotly.newPlot(id, traces, layout, {displaylogo: false, responsive: true}).then(function (plot) {
      plot.on("plotly_click", function (ev) { zoomToStep(ev.points[0].x); });
      return plot;
    });
  }

  document.querySelectorAll("button.zoom").forEach(function (button) {
    button.addEventListener("click", function () { zoomToStep(Number(button.dataset.step)); });
  });

  var ready = Promise.all([
    buildSwimlane(),
    stepChart("start-skew", stepsChart.start_skew_ms, stepsChart.late_threshold_ms, stepsChart.late_steps, "runner-start skew"),
    stepChart("end-skew", stepsChart.end_skew_ms, stepsChart.tail_threshold_ms, stepsChart.tail_steps, "runner-end skew"),
  ]).then(function () { document.body.dataset.rendered = "true"; });

  window.dsprofReport = {data: data, ready: ready, zoomToStep: zoomToStep, hoverLines: hoverLines, itemAt: itemAt, itemCenter: itemCenter};
})();
