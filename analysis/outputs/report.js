// dsprof report: the swimlane (a canvas of its own), the per-step charts (plotly) and the late lists.
// Data come from the JSON block; trace text is untrusted: the page writes it with textContent or on the
// canvas, and escapes what it hands to plotly (plotlyText).
(function () {
  "use strict";
  var data = JSON.parse(document.getElementById("dsprof-data").textContent);
  var sw = data.swimlane;

  // ---------------------------------------------------------------- text and colours
  // Plotly renders labels as pseudo-HTML and decodes &amp; &lt; &gt; and numeric entities only (not &quot;):
  // escape exactly what makes markup, so a name shows as it is and never as a tag.
  function plotlyText(text) {
    return String(text).replace(/&/g, "&amp;").replace(/</g, "&lt;").replace(/>/g, "&gt;");
  }
  var PHASE_COLORS = {
    "root": "#9aa5b1", "bind": "#4c78a8", "bind.args": "#72b7b2", "bind.prebuilt": "#54a24b", "runner_run": "#f58518",
    "native_fence_wait": "#e45756", "claim_release": "#eeca3b", "validate": "#9d755d", "device_wall": "#b279a2",
    "serving · request": "#c7d2dc", "serving · serving": "#a0b3c4", "serving · scheduler": "#2f6f9f",
    "serving · worker": "#5aa0c8", "serving · executor": "#7fb8d8", "serving · kernel": "#1b4965"
  };
  var DEVICE_PALETTE = ["#d4a6c8", "#8e6c8a", "#c994c7", "#6a51a3", "#9e9ac8", "#dd3497"];
  var OTHER_PALETTE = ["#ff9da6", "#8cd17d", "#86bcb6", "#fabfd2", "#79706e", "#d37295", "#bab0ac"];
  var phaseColor = sw.phases.map(function (name, i) {
    if (PHASE_COLORS[name]) { return PHASE_COLORS[name]; }
    if (name.indexOf("device_wall.") === 0) { return DEVICE_PALETTE[i % DEVICE_PALETTE.length]; }
    if (name.indexOf("serving · ") === 0) { return "#8da0b3"; }
    return OTHER_PALETTE[i % OTHER_PALETTE.length];
  });
  var AGGREGATE_COLOR = "#c9ced6", CULPRIT = "#d62728", VICTIM = "#ff9f1c", MATCH = "#ffd400";
  function ms(v) { return v.toFixed(3) + " ms"; }
  function shortName(name) { var cut = name.lastIndexOf("."); return cut < 0 ? name : name.slice(cut + 1); }

  // ---------------------------------------------------------------- spans as typed arrays
  var S = sw.spans, n = S.row.length;
  var start = new Float64Array(n), end = new Float64Array(n), row = new Int32Array(n), level = new Int32Array(n);
  for (var i = 0; i < n; i++) {
    start[i] = S.start_us[i] / 1000; end[i] = (S.start_us[i] + S.dur_us[i]) / 1000; row[i] = S.row[i]; level[i] = S.level[i];
  }
  var nRows = sw.rows.band.length, nBands = sw.bands.label.length;
  var rowLevels = new Int32Array(nRows).fill(1);
  // spans are ordered by (row, level, start): one contiguous range per (row, level), with its longest span
  var ranges = new Map();
  for (var s = 0; s < n; s++) {
    var key = row[s] * 64 + level[s], r = ranges.get(key);
    if (!r) { r = {lo: s, hi: s + 1, longest: 0}; ranges.set(key, r); } else { r.hi = s + 1; }
    r.longest = Math.max(r.longest, end[s] - start[s]);
    rowLevels[row[s]] = Math.max(rowLevels[row[s]], level[s] + 1);
  }
  var A = sw.aggregate || {row: [], start_us: [], dur_us: [], step_lo: [], step_hi: [], spans: []};
  var aggByRow = new Map();
  A.row.forEach(function (rw, k) { if (!aggByRow.has(rw)) { aggByRow.set(rw, []); } aggByRow.get(rw).push(k); });
  var bandOfRow = sw.rows.band, rankOfBand = sw.bands.rank;
  var stepIndex = new Map();
  sw.steps.step.forEach(function (st, k) { stepIndex.set(st, k); });
  var tMin = Infinity, tMax = -Infinity;
  for (var q = 0; q < n; q++) { tMin = Math.min(tMin, start[q]); tMax = Math.max(tMax, end[q]); }
  A.row.forEach(function (_, k) { tMin = Math.min(tMin, A.start_us[k] / 1000); tMax = Math.max(tMax, (A.start_us[k] + A.dur_us[k]) / 1000); });
  if (!isFinite(tMin)) { tMin = 0; tMax = 1; }
  var decodeWindow = sw.steps.step.length
    ? [sw.steps.start_ms[0], sw.steps.end_ms.reduce(function (m, v) { return Math.max(m, v); }, -Infinity)] : [tMin, tMax];

  // ---------------------------------------------------------------- state
  var state = {
    t0: 0, t1: 1, levelPx: 16, filter: "", search: "", searchHits: null, searchAt: -1,
    collapsed: sw.folded.slice(),
    highlight: null, lastPaint: {bars: 0, labels: []}
  };
  function setView(a, b) {
    var pad = Math.max((b - a) * 0.02, 0.001);
    state.t0 = a - pad; state.t1 = b + pad;
    paint();
  }

  // ---------------------------------------------------------------- layout of the visible lanes
  var GUTTER = 210, AXIS = 36, BAND_HEAD = 20, PAD = 3;
  var lanes = [];  // {kind: "band"|"row"|"summary", band, row, y, h}
  var totalHeight = 0;
  function matches(text, terms) {
    text = text.toLowerCase();
    return terms.some(function (t) { return text.indexOf(t) >= 0; });
  }
  function layoutLanes() {
    var terms = state.filter.toLowerCase().split(",").map(function (t) { return t.trim(); }).filter(Boolean);
    lanes = [];
    var y = AXIS;
    for (var b = 0; b < nBands; b++) {
      var first = sw.bands.first_row[b], count = sw.bands.rows[b];
      var bandHit = !terms.length || matches(sw.bands.label[b], terms);
      var rows = [];
      for (var r = first; r < first + count; r++) {
        if (bandHit || matches(sw.rows.label[r] + " " + sw.rows.track[r], terms)) { rows.push(r); }
      }
      if (!rows.length) { continue; }
      lanes.push({kind: "band", band: b, y: y, h: BAND_HEAD}); y += BAND_HEAD;
      if (state.collapsed[b]) {
        lanes.push({kind: "summary", band: b, rows: rows, y: y, h: 2 * state.levelPx + PAD}); y += 2 * state.levelPx + PAD;
      } else {
        rows.forEach(function (r) {
          var h = rowLevels[r] * state.levelPx + PAD;
          lanes.push({kind: "row", band: b, row: r, y: y, h: h}); y += h;
        });
      }
    }
    totalHeight = y + 4;
  }

  // ---------------------------------------------------------------- canvas
  var box = document.getElementById("swimlane"), canvas = document.getElementById("lanes"), tip = document.getElementById("tooltip");
  var spacer = document.createElement("div");
  spacer.className = "spacer";
  box.appendChild(spacer);
  var ctx = canvas.getContext("2d");
  var hatch = (function () {
    var c = document.createElement("canvas"); c.width = 6; c.height = 6;
    var g = c.getContext("2d"); g.strokeStyle = "rgba(255,255,255,0.55)"; g.lineWidth = 1.2;
    g.beginPath(); g.moveTo(0, 6); g.lineTo(6, 0); g.stroke();
    return ctx.createPattern(c, "repeat");
  })();
  function width() { return box.clientWidth; }
  function xOf(t) { return GUTTER + (t - state.t0) * (width() - GUTTER) / (state.t1 - state.t0); }
  function tOf(x) { return state.t0 + (x - GUTTER) * (state.t1 - state.t0) / (width() - GUTTER); }

  function isMatch(s) { return state.searchHits !== null && state.searchHits.has(s); }
  function highlightRole(s) {
    var h = state.highlight;
    if (!h || S.step[s] !== h.step) { return null; }
    var rank = rankOfBand[bandOfRow[row[s]]];
    if (rank === h.rank && h.spans.has(s)) { return "culprit"; }
    if (h.victims.indexOf(rank) >= 0 && h.victimSpans.has(s)) { return "victim"; }
    return null;
  }

  function paint() {
    layoutLanes();
    spacer.style.height = totalHeight + "px";
    var ratio = window.devicePixelRatio || 1, w = width(), h = Math.min(box.clientHeight, totalHeight);
    canvas.style.width = w + "px"; canvas.style.height = h + "px";
    canvas.width = Math.round(w * ratio); canvas.height = Math.round(h * ratio);
    ctx.setTransform(ratio, 0, 0, ratio, 0, 0);
    ctx.clearRect(0, 0, w, h);
    ctx.font = "11px system-ui, sans-serif";
    ctx.textBaseline = "middle";
    var scroll = box.scrollTop, paintInfo = {bars: 0, labels: []};
    // step window of the highlighted step, behind everything
    if (state.highlight && stepIndex.has(state.highlight.step)) {
      var k = stepIndex.get(state.highlight.step);
      ctx.fillStyle = "rgba(214,39,40,0.07)";
      ctx.fillRect(xOf(sw.steps.start_ms[k]), AXIS, xOf(sw.steps.end_ms[k]) - xOf(sw.steps.start_ms[k]), h - AXIS);
    }
    lanes.forEach(function (lane) {
      var top = lane.y - scroll;
      if (top + lane.h < AXIS || top > h) { return; }
      if (lane.kind === "band") { drawBandHead(lane, top, w); return; }
      ctx.save();
      ctx.beginPath(); ctx.rect(GUTTER, Math.max(top, AXIS), w - GUTTER, lane.h); ctx.clip();
      if (lane.kind === "summary") {
        lane.rows.forEach(function (r) { drawRow(r, top, 2, paintInfo); });
      } else {
        drawRow(lane.row, top, rowLevels[lane.row], paintInfo);
      }
      ctx.restore();
      drawRowLabel(lane, top);
    });
    drawSteps(h);
    drawAxis(w);
    state.lastPaint = paintInfo;
  }

  function drawBandHead(lane, top, w) {
    var rank = rankOfBand[lane.band], hl = state.highlight;
    ctx.fillStyle = "#eef1f5"; ctx.fillRect(0, top, w, BAND_HEAD);
    var role = hl && rank !== null ? (rank === hl.rank ? CULPRIT : (hl.victims.indexOf(rank) >= 0 ? VICTIM : null)) : null;
    if (role) { ctx.fillStyle = role; ctx.fillRect(0, top, 4, BAND_HEAD); }
    ctx.fillStyle = "#1f2933"; ctx.font = "bold 12px system-ui, sans-serif";
    ctx.fillText((state.collapsed[lane.band] ? "▸ " : "▾ ") + sw.bands.label[lane.band], 8, top + BAND_HEAD / 2);
    ctx.font = "11px system-ui, sans-serif";
  }

  function drawRowLabel(lane, top) {
    ctx.fillStyle = "#fff"; ctx.fillRect(0, Math.max(top, AXIS), GUTTER - 4, lane.h);
    ctx.fillStyle = "#52606d";
    var text = lane.kind === "summary" ? lane.rows.length + " lanes (folded)" : sw.rows.label[lane.row];
    if (top + 8 > AXIS) { ctx.fillText(text, 20, top + Math.min(lane.h, 2 * state.levelPx) / 2); }
  }

  function drawRow(r, top, levels, info) {
    var w = width(), lh = state.levelPx;
    var aggs = aggByRow.get(r) || [];
    ctx.fillStyle = AGGREGATE_COLOR;
    aggs.forEach(function (k) {
      var a = A.start_us[k] / 1000, b = a + A.dur_us[k] / 1000;
      if (b < state.t0 || a > state.t1) { return; }
      ctx.fillRect(xOf(a), top + 1, Math.max(xOf(b) - xOf(a), 1), lh - 2);
    });
    for (var lv = 0; lv < levels; lv++) {
      var rg = ranges.get(r * 64 + lv);
      if (!rg) { continue; }
      var y = top + 1 + lv * lh, lo = rg.lo, hi = rg.hi, from = state.t0 - rg.longest;
      while (lo < hi) { var mid = (lo + hi) >> 1; if (start[mid] < from) { lo = mid + 1; } else { hi = mid; } }
      var lastPx = -1;
      for (var s = lo; s < rg.hi && start[s] <= state.t1; s++) {
        if (end[s] < state.t0) { continue; }
        var x0 = Math.max(xOf(start[s]), GUTTER - 2), x1 = Math.min(xOf(end[s]), w + 2), bw = x1 - x0;
        var role = highlightRole(s), match = isMatch(s);
        if (bw < 1 && Math.floor(x0) === lastPx && !role && !match) { continue; }  // sub-pixel spans: one bar per pixel
        lastPx = Math.floor(x0);
        ctx.fillStyle = phaseColor[S.phase[s]];
        // a 1 px gap at the right end keeps neighbours (e.g. back-to-back kernel spans) apart
        var drawn = bw > 3 ? bw - 1 : Math.max(bw, 1);
        ctx.fillRect(x0, y, drawn, lh - 2);
        if (S.device[s]) { ctx.fillStyle = hatch; ctx.fillRect(x0, y, drawn, lh - 2); }
        info.bars++;
        if (role || match) {
          ctx.lineWidth = role ? 3 : 2;
          ctx.strokeStyle = role === "culprit" ? CULPRIT : role === "victim" ? VICTIM : MATCH;
          ctx.strokeRect(x0 - 1, y - 1, drawn + 2, lh);
        }
        if (bw > 28 && lh >= 10) { label(s, x0, y + (lh - 2) / 2, bw, info); }
      }
    }
  }

  function label(s, x, y, bw, info) {
    // a runtime span by its phase (the lane already says chip.run), others by name; shortened to fit
    var name = sw.rows.kind[row[s]] === "runtime" ? sw.phases[S.phase[s]] : sw.names[S.name[s]], room = bw - 6, text = name;
    if (ctx.measureText(text).width > room) { text = shortName(name); }
    if (ctx.measureText(text).width > room) {
      while (text.length > 1 && ctx.measureText(text + "…").width > room) { text = text.slice(0, -1); }
      if (text.length <= 1) { return; }
      text += "…";
    }
    var color = phaseColor[S.phase[s]];
    ctx.fillStyle = darkColor(color) ? "#fff" : "#111";
    ctx.fillText(text, Math.max(x, GUTTER) + 3, y);
    if (info.labels.length < 500) { info.labels.push(text); }
  }
  function darkColor(hex) {
    var v = parseInt(hex.slice(1), 16);
    return (0.299 * (v >> 16) + 0.587 * ((v >> 8) & 255) + 0.114 * (v & 255)) < 140;
  }

  function niceStep(span) {
    var raw = span / 8, p = Math.pow(10, Math.floor(Math.log10(raw))), m = raw / p;
    return p * (m < 1.5 ? 1 : m < 3.5 ? 2 : m < 7.5 ? 5 : 10);
  }
  function drawAxis(w) {
    ctx.fillStyle = "#fff"; ctx.fillRect(0, 0, w, AXIS);
    ctx.strokeStyle = "#9aa5b1"; ctx.beginPath(); ctx.moveTo(GUTTER, AXIS - 0.5); ctx.lineTo(w, AXIS - 0.5); ctx.stroke();
    var step = niceStep(state.t1 - state.t0), t = Math.ceil(state.t0 / step) * step;
    ctx.fillStyle = "#52606d";
    for (; t <= state.t1; t += step) {
      var x = xOf(t);
      ctx.fillRect(x, 0, 1, 6);
      ctx.fillText((Math.abs(step) < 1 ? t.toFixed(Math.ceil(-Math.log10(step))) : t.toFixed(0)) + " ms", x + 3, 9);
    }
    ctx.fillStyle = "#1f2933"; ctx.font = "bold 11px system-ui, sans-serif";
    ctx.fillText("time since t = 0", 8, 9);
    ctx.font = "11px system-ui, sans-serif"; ctx.fillStyle = "#52606d";
    ctx.fillText("decode steps", 8, 26);
    var st = sw.steps, labelEnd = -Infinity;  // a label is drawn only clear of the one before it, however many digits
    for (var k = 0; k < st.step.length; k++) {
      var xs = xOf(st.start_ms[k]), label = "s" + st.step[k];
      if (st.start_ms[k] < state.t0 || st.start_ms[k] > state.t1 || xs < labelEnd + 6) { continue; }
      ctx.fillRect(Math.round(xs), AXIS - 8, 1, 8);
      ctx.fillText(label, xs + 3, 26);
      labelEnd = xs + 3 + ctx.measureText(label).width;
    }
    ctx.font = "11px system-ui, sans-serif";
  }
  function drawSteps(h) {
    var st = sw.steps, lastLine = -Infinity;
    ctx.strokeStyle = "rgba(82,96,109,0.45)"; ctx.setLineDash([2, 3]); ctx.lineWidth = 1;
    for (var k = 0; k < st.step.length; k++) {
      var a = st.start_ms[k], x = Math.round(xOf(a)) + 0.5;
      if (a < state.t0 || a > state.t1 || x - lastLine < 4) { continue; }  // at most one marker per 4 px
      ctx.beginPath(); ctx.moveTo(x, AXIS); ctx.lineTo(x, h); ctx.stroke();
      lastLine = x;
    }
    ctx.setLineDash([]);
  }

  // ---------------------------------------------------------------- hit testing and hover
  function laneAt(y) {
    var yy = y + box.scrollTop;
    for (var k = 0; k < lanes.length; k++) { if (yy >= lanes[k].y && yy < lanes[k].y + lanes[k].h) { return lanes[k]; } }
    return null;
  }
  // The span (or aggregate bar, as -1 - index) under a point of the canvas, or null.
  function spanAt(x, y) {
    var lane = laneAt(y);
    if (!lane || lane.kind === "band" || x < GUTTER) { return null; }
    var t = tOf(x), slack = 2 * (state.t1 - state.t0) / (width() - GUTTER);
    var lv = Math.floor((y + box.scrollTop - lane.y - 1) / state.levelPx);
    var rows = lane.kind === "summary" ? lane.rows : [lane.row];
    for (var j = 0; j < rows.length; j++) {
      var rg = ranges.get(rows[j] * 64 + lv);
      if (rg) {
        var found = null;
        for (var s = rg.lo; s < rg.hi && start[s] <= t + slack; s++) {
          if (end[s] + slack >= t) { found = s; }
        }
        if (found !== null) { return found; }
      }
      var aggs = aggByRow.get(rows[j]) || [];
      for (var m = 0; m < aggs.length && lv === 0; m++) {
        var a = A.start_us[aggs[m]] / 1000;
        if (a - slack <= t && t <= a + A.dur_us[aggs[m]] / 1000 + slack) { return -1 - aggs[m]; }
      }
    }
    return null;
  }
  function hoverLines(s) {
    if (s < 0) {
      var k = -1 - s;
      return ["steps " + A.step_lo[k] + "–" + A.step_hi[k] + " (aggregated)", sw.bands.label[bandOfRow[A.row[k]]] + " · " + sw.rows.label[A.row[k]],
              A.spans[k] + " spans", "from " + ms(A.start_us[k] / 1000), "covers " + ms(A.dur_us[k] / 1000)];
    }
    var lines = [sw.names[S.name[s]], "phase: " + sw.phases[S.phase[s]], "step: " + (S.step[s] < 0 ? "—" : S.step[s]),
                 sw.bands.label[bandOfRow[row[s]]], "lane: " + sw.rows.track[row[s]], "start: " + ms(start[s]),
                 "duration: " + ms(end[s] - start[s])];
    if (S.device[s]) { lines.push("device clock: placed at runner_run start + its offset (approximate)"); }
    if (S.rq_us && S.rq_us[s] >= 0) { lines.push("run-queue wait (os.rq_ns): " + ms(S.rq_us[s] / 1000)); }
    var role = highlightRole(s);
    if (role) { lines.push(role === "culprit" ? "culprit of the selected step" : "waited (victim) in the selected step"); }
    return lines;
  }
  function spanCenter(s) {
    for (var k = 0; k < lanes.length; k++) {
      var lane = lanes[k];
      if ((lane.kind === "row" && lane.row === row[s]) || (lane.kind === "summary" && lane.rows.indexOf(row[s]) >= 0)) {
        var b = canvas.getBoundingClientRect(), x0 = Math.max(xOf(start[s]), GUTTER), x1 = Math.min(xOf(end[s]), width());
        return {x: b.left + (x0 + x1) / 2, y: b.top + lane.y - box.scrollTop + 1 + level[s] * state.levelPx + state.levelPx / 2};
      }
    }
    return null;
  }

  // ---------------------------------------------------------------- interaction
  function zoomAround(t, factor) {
    var a = t - (t - state.t0) * factor, b = t + (state.t1 - t) * factor;
    if (b - a < 0.001) { return; }
    state.t0 = a; state.t1 = b; paint();
  }
  box.addEventListener("wheel", function (ev) {
    var b = canvas.getBoundingClientRect(), x = ev.clientX - b.left, y = ev.clientY - b.top;
    if (ev.ctrlKey || ev.metaKey || y < AXIS) {
      ev.preventDefault();
      zoomAround(tOf(Math.max(x, GUTTER)), Math.exp(ev.deltaY * 0.002));
    } else if (ev.shiftKey) {
      ev.preventDefault();
      var dt = (ev.deltaY || ev.deltaX) * (state.t1 - state.t0) / (width() - GUTTER);
      state.t0 += dt; state.t1 += dt; paint();
    }
  }, {passive: false});
  var drag = null;
  box.addEventListener("mousedown", function (ev) {
    var b = canvas.getBoundingClientRect(), x = ev.clientX - b.left, y = ev.clientY - b.top;
    var lane = laneAt(y);
    if (lane && lane.kind === "band" && y >= AXIS) {
      state.collapsed[lane.band] = !state.collapsed[lane.band]; paint(); return;
    }
    drag = {x: x, t0: state.t0, t1: state.t1, brush: y < AXIS};
  });
  window.addEventListener("mousemove", function (ev) {
    var b = canvas.getBoundingClientRect(), x = ev.clientX - b.left, y = ev.clientY - b.top;
    if (drag && !drag.brush) {
      var dt = (x - drag.x) * (drag.t1 - drag.t0) / (width() - GUTTER);
      state.t0 = drag.t0 - dt; state.t1 = drag.t1 - dt; paint();
      return;
    }
    if (x < 0 || y < 0 || x > b.width || y > b.height) { tip.hidden = true; return; }
    var s = spanAt(x, y);
    if (s === null) { tip.hidden = true; return; }
    tip.textContent = hoverLines(s).join("\n");
    tip.hidden = false;
    tip.style.left = (ev.clientX + 14) + "px";
    tip.style.top = (ev.clientY + 14) + "px";
  });
  window.addEventListener("mouseup", function (ev) {
    if (drag && drag.brush) {
      var b = canvas.getBoundingClientRect(), x = ev.clientX - b.left;
      if (Math.abs(x - drag.x) > 4) { setView(tOf(Math.max(Math.min(x, drag.x), GUTTER)), tOf(Math.max(x, drag.x))); }
    }
    drag = null;
  });
  box.addEventListener("dblclick", function () { setView(decodeWindow[0], decodeWindow[1]); });
  box.addEventListener("scroll", function () { paint(); });
  box.addEventListener("keydown", function (ev) {
    var mid = (state.t0 + state.t1) / 2, span = state.t1 - state.t0;
    if (ev.key === "w") { zoomAround(mid, 0.8); } else if (ev.key === "s") { zoomAround(mid, 1.25); }
    else if (ev.key === "a") { state.t0 -= span * 0.1; state.t1 -= span * 0.1; paint(); }
    else if (ev.key === "d") { state.t0 += span * 0.1; state.t1 += span * 0.1; paint(); }
  });
  window.addEventListener("resize", function () { paint(); });

  function setFilter(text) { state.filter = text; box.scrollTop = 0; paint(); }
  function setSearch(text) {
    state.search = text.trim().toLowerCase();
    state.searchAt = -1;
    if (!state.search) { state.searchHits = null; } else {
      var names = new Set();
      sw.names.forEach(function (nm, k) { if (nm.toLowerCase().indexOf(state.search) >= 0) { names.add(k); } });
      var hits = [];
      for (var s = 0; s < n; s++) { if (names.has(S.name[s])) { hits.push(s); } }
      hits.sort(function (a, b) { return start[a] - start[b]; });
      state.searchHits = new Set(hits);
      state.searchList = hits;
    }
    document.getElementById("search-count").textContent =
      state.searchHits === null ? "" : state.searchHits.size.toLocaleString() + " matching spans";
    paint();
  }
  function nextMatch() {
    if (!state.searchList || !state.searchList.length) { return null; }
    state.searchAt = (state.searchAt + 1) % state.searchList.length;
    var s = state.searchList[state.searchAt], band = bandOfRow[row[s]];
    state.collapsed[band] = false;
    var span = Math.max((end[s] - start[s]) * 4, 0.05);
    setView(start[s] - span / 2, end[s] + span / 2);
    scrollToRow(row[s]);
    return s;
  }
  function scrollToRow(r) {
    layoutLanes();
    for (var k = 0; k < lanes.length; k++) {
      if (lanes[k].kind === "row" && lanes[k].row === r) { box.scrollTop = Math.max(0, lanes[k].y - AXIS - BAND_HEAD - 40); break; }
    }
    paint();
  }
  document.getElementById("lane-filter").addEventListener("input", function (ev) { setFilter(ev.target.value); });
  document.getElementById("span-search").addEventListener("input", function (ev) { setSearch(ev.target.value); });
  document.getElementById("search-next").addEventListener("click", nextMatch);
  document.getElementById("expand-all").addEventListener("click", function () { state.collapsed = state.collapsed.map(function () { return false; }); paint(); });
  document.getElementById("collapse-all").addEventListener("click", function () { state.collapsed = state.collapsed.map(function () { return true; }); paint(); });
  document.getElementById("row-height").addEventListener("input", function (ev) { state.levelPx = Number(ev.target.value); paint(); });
  document.getElementById("view-decode").addEventListener("click", function () { setView(decodeWindow[0], decodeWindow[1]); });
  document.getElementById("view-all").addEventListener("click", function () { setView(tMin, tMax); });

  // ---------------------------------------------------------------- zoom to a late step, highlighting who is blamed
  var spansOfStep = null;
  function stepSpans(step) {
    if (spansOfStep === null) {
      spansOfStep = new Map();
      for (var s = 0; s < n; s++) {
        if (S.step[s] >= 0 && rankOfBand[bandOfRow[row[s]]] !== null && sw.rows.kind[row[s]] === "runtime") {
          if (!spansOfStep.has(S.step[s])) { spansOfStep.set(S.step[s], []); }
          spansOfStep.get(S.step[s]).push(s);
        }
      }
    }
    return spansOfStep.get(step) || [];
  }
  // The culprit's spans of the blamed phase (else its runner_run), and each victim's runner_run.
  function blamed(step, rank, phase, victims) {
    var own = [], runner = [], waits = [];
    stepSpans(step).forEach(function (s) {
      var r = rankOfBand[bandOfRow[row[s]]], ph = sw.phases[S.phase[s]];
      if (r === rank && ph === phase) { own.push(s); }
      if (r === rank && ph === "runner_run") { runner.push(s); }
      if (victims.indexOf(r) >= 0 && ph === "runner_run") { waits.push(s); }
    });
    return {spans: new Set(own.length ? own : runner), victimSpans: new Set(waits)};
  }
  function zoomToStep(step, who) {
    var k = stepIndex.get(step);
    if (k === undefined) { return false; }
    who = who || {};
    var rank = who.rank === undefined ? null : who.rank, victims = who.victims || [];
    var found = blamed(step, rank, who.phase, victims);
    state.highlight = {step: step, rank: rank, victims: victims, phase: who.phase, spans: found.spans, victimSpans: found.victimSpans};
    for (var b = 0; b < nBands; b++) {
      if (rankOfBand[b] !== null && (rankOfBand[b] === rank || victims.indexOf(rankOfBand[b]) >= 0)) { state.collapsed[b] = false; }
    }
    var a = sw.steps.start_ms[k], e = sw.steps.end_ms[k];
    setView(a - (e - a) * 0.15, e + (e - a) * 0.15);
    var target = found.spans.size ? found.spans.values().next().value : null;
    if (target !== null) { scrollToRow(row[target]); }
    document.getElementById("swimlane-section").scrollIntoView({block: "start"});
    return true;
  }
  function whoOf(item) { return {rank: item.rank, victims: item.victims || [], phase: item.phase}; }

  // ---------------------------------------------------------------- legend
  (function legend() {
    var el = document.getElementById("legend");
    function chip(color, text, cls) {
      var span = document.createElement("span"); span.className = "chip " + (cls || "");
      var sq = document.createElement("i");
      if (cls === "outline") { sq.style.borderColor = color; } else { sq.style.background = color; }
      span.appendChild(sq);
      span.appendChild(document.createTextNode(text)); el.appendChild(span);
    }
    sw.phases.forEach(function (name, k) { chip(phaseColor[k], name, name.indexOf("device_wall") === 0 ? "device" : ""); });
    if (A.row.length) { chip(AGGREGATE_COLOR, "aggregated steps"); }
    chip(CULPRIT, "culprit (selected step)", "outline"); chip(VICTIM, "waited on it (victim)", "outline"); chip(MATCH, "search match", "outline");
  })();

  // ---------------------------------------------------------------- sortable, paged lists
  var PAGE = 100;
  var SORTS = {
    excess: function (a, b) { return b.excess_ms - a.excess_ms || a.step - b.step || a.rank - b.rank; },
    step: function (a, b) { return a.step - b.step || b.excess_ms - a.excess_ms; },
    rank: function (a, b) { return a.rank - b.rank || a.step - b.step; },
    mechanism: function (a, b) { return a.mechanism < b.mechanism ? -1 : a.mechanism > b.mechanism ? 1 : b.excess_ms - a.excess_ms; }
  };
  document.querySelectorAll("section.late-list").forEach(function (section) {
    var items = data.lists[section.dataset.list].slice(), page = 0, sortKey = "excess";
    var ol = section.querySelector("ol.items"), pageLabel = section.querySelector(".page");
    function render() {
      items.sort(SORTS[sortKey]);
      var pages = Math.max(1, Math.ceil(items.length / PAGE));
      page = Math.min(Math.max(page, 0), pages - 1);
      ol.textContent = "";
      ol.start = page * PAGE + 1;
      items.slice(page * PAGE, page * PAGE + PAGE).forEach(function (item) {
        var li = document.createElement("li"), button = document.createElement("button");
        button.type = "button"; button.className = "zoom"; button.textContent = "step " + item.step;
        button.addEventListener("click", function () { zoomToStep(item.step, whoOf(item)); });
        li.appendChild(button);
        var text = document.createElement("span"); text.className = "line"; text.textContent = " " + item.text; li.appendChild(text);
        item.also.forEach(function (line) { var sub = document.createElement("div"); sub.className = "also"; sub.textContent = line; li.appendChild(sub); });
        li.dataset.step = item.step; li.dataset.rank = item.rank; li.dataset.mechanism = item.mechanism; li.dataset.excess = item.excess_ms;
        ol.appendChild(li);
      });
      pageLabel.textContent = items.length ? "page " + (page + 1) + " of " + pages + " (" + items.length.toLocaleString() + " items)" : "none";
      section.querySelectorAll("[data-sort]").forEach(function (b) { b.classList.toggle("active", b.dataset.sort === sortKey); });
    }
    section.querySelectorAll("[data-sort]").forEach(function (b) {
      b.addEventListener("click", function () { sortKey = b.dataset.sort; page = 0; render(); });
    });
    section.querySelectorAll("[data-page]").forEach(function (b) {
      b.addEventListener("click", function () { page += Number(b.dataset.page); render(); });
    });
    render();
  });
  document.querySelectorAll("#findings button.zoom").forEach(function (button) {
    button.addEventListener("click", function () {
      var victims = button.dataset.victims ? button.dataset.victims.split(",").map(Number) : [];
      zoomToStep(Number(button.dataset.step), {rank: Number(button.dataset.rank), victims: victims, phase: button.dataset.phase});
    });
  });

  // ---------------------------------------------------------------- per-step charts (plotly)
  var chart = data.chart;
  function stepChart(id, values, threshold, lines, list, title) {
    var mx = [], my = [], mt = [];
    chart.step.forEach(function (st, k) {
      if (lines[st] !== undefined) { mx.push(st); my.push(values[k]); mt.push(plotlyText(lines[st])); }
    });
    var hasThreshold = threshold !== null && threshold !== undefined;
    var traces = [
      {type: "scatter", mode: chart.step.length > 2000 ? "lines" : "lines+markers", x: chart.step, y: values, name: title,
       line: {color: "#4c78a8", width: 1}, marker: {size: 4}, hovertemplate: "step %{x}: %{y:.3f} ms<extra></extra>"},
      {type: "scatter", mode: "markers", x: mx, y: my, text: mt, name: "over threshold",
       marker: {color: CULPRIT, size: 8, symbol: "x"}, hovertemplate: "%{text}<extra></extra>"}
    ];
    var layout = {
      title: {text: plotlyText(title) + (hasThreshold ? " (threshold " + threshold + " ms)" : "")},
      height: 240, margin: {l: 60, r: 20, t: 40, b: 40}, showlegend: false,
      shapes: hasThreshold ? [{type: "line", xref: "paper", x0: 0, x1: 1, y0: threshold, y1: threshold,
                               line: {color: CULPRIT, dash: "dash", width: 1}}] : [],
      xaxis: {title: {text: "step"}}, yaxis: {title: {text: "ms"}, rangemode: "tozero"}
    };
    return Plotly.newPlot(id, traces, layout, {displaylogo: false, responsive: true}).then(function (plot) {
      plot.on("plotly_click", function (ev) {
        var st = ev.points[0].x, item = data.lists[list].filter(function (it) { return it.step === st; }).sort(SORTS.excess)[0];
        zoomToStep(st, item ? whoOf(item) : {});
      });
      return plot;
    });
  }

  // ---------------------------------------------------------------- trends: the run in windows of consecutive steps
  function trendChart(id, t) {
    var x = t.first_step.map(function (first, k) { return first + (t.last_step[k] - first) / 2; });
    var label = t.first_step.map(function (first, k) { return "steps " + first + "-" + t.last_step[k]; });
    var traces = [
      {type: "scatter", mode: "lines+markers", x: x, y: t.interval_p50_ms, text: label, name: "step interval p50",
       line: {color: "#4c78a8", width: 1}, hovertemplate: "%{text}: interval p50 %{y:.3f} ms<extra></extra>"},
      {type: "scatter", mode: "lines+markers", x: x, y: t.interval_p99_ms, text: label, name: "step interval p99",
       line: {color: "#f58518", width: 1}, hovertemplate: "%{text}: interval p99 %{y:.3f} ms<extra></extra>"},
      {type: "scatter", mode: "lines+markers", x: x, y: t.end_skew_p99_ms, text: label, name: "runner-end skew p99",
       line: {color: "#54a24b", width: 1}, hovertemplate: "%{text}: end skew p99 %{y:.3f} ms<extra></extra>"},
      {type: "bar", x: x, y: t.what_if_saved_ms, text: label, name: "what-if saving", yaxis: "y2", opacity: 0.35,
       marker: {color: CULPRIT}, customdata: t.slow_steps,
       hovertemplate: "%{text}: %{y:.3f} ms saved without its causes, %{customdata} slow steps<extra></extra>"}
    ];
    var layout = {
      title: {text: "per window of " + (t.window_steps || "?") + " steps"}, height: 280, margin: {l: 60, r: 60, t: 40, b: 40},
      legend: {orientation: "h", y: -0.25}, xaxis: {title: {text: "step"}}, yaxis: {title: {text: "ms"}, rangemode: "tozero"},
      yaxis2: {title: {text: "saved ms"}, overlaying: "y", side: "right", rangemode: "tozero", showgrid: false}
    };
    return Plotly.newPlot(id, traces, layout, {displaylogo: false, responsive: true}).then(function (plot) {
      plot.on("plotly_click", function (ev) {
        var k = ev.points[0].pointNumber, lo = t.first_step[k], hi = t.last_step[k];
        var items = data.lists.slow_steps.concat(data.lists.tail_steps, data.lists.late_starts)
          .filter(function (it) { return it.step >= lo && it.step <= hi; }).sort(SORTS.excess);
        zoomToStep(items.length ? items[0].step : lo, items.length ? whoOf(items[0]) : {});
      });
      return plot;
    });
  }

  // ---------------------------------------------------------------- device time per step and rank (Kineto device activities)
  function deviceTimeChart(id, d) {
    if (!d || !document.getElementById(id)) { return Promise.resolve(); }
    var x = [d.step, d.rank];
    var parts = [["compute_ms", "compute", "#4c78a8"], ["non_compute_ms", "non-compute", "#f58518"], ["idle_ms", "idle", "#bab0ac"]];
    var traces = parts.map(function (p) {
      return {type: "bar", x: x, y: d[p[0]], name: p[1], marker: {color: p[2]},
              hovertemplate: "step %{x}: " + p[1] + " %{y:.3f} ms<extra></extra>"};
    });
    var layout = {title: {text: "device time per step and rank"}, barmode: "stack", height: 280,
                  margin: {l: 60, r: 20, t: 40, b: 60}, legend: {orientation: "h", y: -0.3}, yaxis: {title: {text: "ms"}}};
    return Plotly.newPlot(id, traces, layout, {displaylogo: false, responsive: true});
  }

  setView(decodeWindow[0], decodeWindow[1]);
  var ready = Promise.all([
    deviceTimeChart("device-time", chart.device_time),
    stepChart("step-interval", chart.interval_ms, chart.slow_threshold_ms, chart.slow_lines, "slow_steps", "step interval"),
    trendChart("trends", chart.trends),
    stepChart("start-skew", chart.start_skew_ms, chart.late_threshold_ms, chart.late_lines, "late_starts", "runner-start skew"),
    stepChart("end-skew", chart.end_skew_ms, chart.tail_threshold_ms, chart.tail_lines, "tail_steps", "runner-end skew")
  ]).then(function () { document.body.dataset.rendered = "true"; });

  window.dsprofReport = {
    data: data, ready: ready, state: state, zoomToStep: zoomToStep, spanAt: spanAt, spanCenter: spanCenter, hoverLines: hoverLines,
    setFilter: setFilter, setSearch: setSearch, nextMatch: nextMatch, visibleLanes: function () { return lanes; },
    plotlyText: plotlyText, decodeWindow: decodeWindow, extent: [tMin, tMax]
  };
})();
