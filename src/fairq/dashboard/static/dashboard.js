// fairq dashboard: poll the page's JSON endpoint and update it in place; draw the
// served-share chart. No dependencies, no external assets.
(function () {
  "use strict";
  var REFRESH_MS = 1500;
  var PALETTE = ["#3b6fd8", "#e0723a", "#2f9e6e", "#c64d8c", "#8a63d2", "#c9a227", "#2aa3b8", "#d24b4b", "#8c8c8c"];
  var body = document.body;
  var page = body.dataset.page;
  var api = body.dataset.api;

  function el(tag, attrs, children) {
    var node = document.createElement(tag);
    Object.keys(attrs || {}).forEach(function (k) {
      if (k === "text") node.textContent = attrs[k];
      else if (k === "className") node.className = attrs[k];
      else node.setAttribute(k, attrs[k]);
    });
    (children || []).forEach(function (c) { node.appendChild(c); });
    return node;
  }
  function limit(v) { return v === null || v === undefined ? "\u2014" : String(v); }
  function wait(s) {
    if (s === null || s === undefined) return "\u2014";
    if (s < 60) return s.toFixed(1) + " s";
    if (s < 3600) return Math.floor(s / 60) + " m " + String(Math.floor(s % 60)).padStart(2, "0") + " s";
    return Math.floor(s / 3600) + " h " + String(Math.floor((s % 3600) / 60)).padStart(2, "0") + " m";
  }
  function td(text, cls, field) {
    var a = { text: text };
    if (cls) a.className = cls;
    if (field) a["data-field"] = field;
    return el("td", a);
  }
  function badge(paused) {
    return el("span", { className: "badge " + (paused ? "paused" : "ok"), text: paused ? "paused" : "active" });
  }
  // Every name is encoded whole: a queue called "a/../jobs" stays one path segment.
  function queuePath(env, queue) { return "/queues/" + encodeURIComponent(env) + "/" + encodeURIComponent(queue); }
  function redrivePath(env, runId) { return "/envs/" + encodeURIComponent(env) + "/dlq/" + encodeURIComponent(runId) + "/redrive"; }
  function runPath(env, runId) { return "/runs/" + encodeURIComponent(env) + "/" + encodeURIComponent(runId); }
  function actionPath(env, action) { return "/envs/" + encodeURIComponent(env) + "/actions/" + action; }
  function runApi(env, runId) { return "/api/runs/" + encodeURIComponent(env) + "/" + encodeURIComponent(runId); }
  function hidden(name, value) { return el("input", { type: "hidden", name: name, value: value }); }
  function stamp(ms) { return ms ? new Date(ms).toLocaleString() : "\u2014"; }
  function fillStamps(root) {
    root.querySelectorAll(".ts[data-ms]").forEach(function (node) {
      if (!node.dataset.ms) return;
      var d = new Date(Number(node.dataset.ms));
      node.textContent = node.tagName === "TD" ? d.toLocaleTimeString() : d.toLocaleString();
    });
  }
  function setField(root, field, text) {
    var node = root.querySelector('[data-field="' + field + '"]');
    if (node && node.textContent !== text) node.textContent = text;
  }

  // ------------------------------------------------------------------ overview
  function renderOverview(data) {
    var box = document.getElementById("envs");
    var frag = document.createDocumentFragment();
    if (!data.environments.length) {
      frag.appendChild(el("section", { className: "card" }, [el("p", { className: "empty", text: "No environment has enqueued a run yet." })]));
    }
    data.environments.forEach(function (e) {
      var rows = e.queues.map(function (q) {
        var link = el("a", { href: queuePath(e.env, q.queue), text: q.queue });
        var state = el("td", { "data-field": "state" }, [badge(q.paused)]);
        return el("tr", { "data-queue": q.queue }, [
          el("td", {}, [link]),
          td(String(q.queued), "num", "queued"),
          td(String(q.running), "num", "running"),
          td(limit(q.concurrency_limit), "num", "concurrency_limit"),
          td(limit(q.queue_size_limit), "num", "queue_size_limit"),
          td(wait(q.oldest_wait_s), "num", "oldest_wait"),
          td(q.order, "", "order"),
          state,
        ]);
      });
      if (!rows.length) rows = [el("tr", {}, [el("td", { colspan: "8", className: "empty", text: "no queues yet" })])];
      var head = el("thead", {}, [el("tr", {}, ["Queue", "Queued", "Running", "Concurrency limit", "Size limit", "Oldest wait", "Order", "State"].map(function (h, i) {
        return el("th", { className: i > 0 && i < 6 ? "num" : "", text: h });
      }))]);
      frag.appendChild(el("section", { className: "card env", "data-env": e.env }, [
        el("div", { className: "card-head" }, [
          el("h2", { text: e.env }),
          el("span", { className: "chip" }, [document.createTextNode("running "), el("b", { "data-field": "env-running", text: String(e.running) }), document.createTextNode(" / " + e.concurrency_limit)]),
          el("span", { className: "chip" + (e.dead_lettered ? " warn" : "") }, [document.createTextNode("DLQ "), el("b", { "data-field": "env-dlq", text: String(e.dead_lettered) })]),
        ]),
        el("table", { className: "grid" }, [head, el("tbody", {}, rows)]),
      ]));
    });
    box.replaceChildren(frag);
  }

  // ------------------------------------------------------------------ queue page
  function renderQueue(data) {
    var q = data.queue;
    var tiles = document.getElementById("tiles");
    setField(tiles, "queued", String(q.queued));
    setField(tiles, "running", String(q.running));
    setField(tiles, "concurrency_limit", limit(q.concurrency_limit));
    setField(tiles, "queue_size_limit", limit(q.queue_size_limit));
    setField(tiles, "oldest_wait", wait(q.oldest_wait_s));
    setField(tiles, "state", q.paused ? "paused" : "active");
    setField(tiles, "env_running", String(data.env_running));
    setField(tiles, "order", q.order);
    setField(tiles, "max_per_key", limit(q.max_per_key));
    setField(tiles, "charge", q.charge);
    setField(tiles, "delayed", String(q.delayed));
    setField(tiles, "next_due", q.next_due_ms ? "next due " + new Date(q.next_due_ms).toLocaleTimeString() : "");
    var pause = document.getElementById("pause-form");
    if (pause) {
      var verb = q.paused ? "resume" : "pause";
      pause.setAttribute("action", actionPath(data.env, verb));
      pause.dataset.confirm = (q.paused ? "Resume" : "Pause") + " queue " + q.queue + "?";
      document.getElementById("pause-button").textContent = q.paused ? "Resume" : "Pause";
    }
    document.getElementById("variant-count").textContent = String(data.variant_count);

    var vrows = data.variants.map(function (v) {
      var cells = [td(v.key, "key"), td(v.tenant || "\u2014"), td(String(v.queued), "num", "queued"), td(String(v.running), "num", "running"),
        td(limit(v.cap), "num", "cap"), td(wait(v.oldest_wait_s), "num")];
      if (data.fair_order) {
        cells.push(td(v.virtual_tag === null ? "\u2014" : v.virtual_tag.toFixed(2), "num", "tag"));
        cells.push(td(String(v.weight), "num", "weight"));
      }
      return el("tr", { "data-key": v.key }, cells);
    });
    if (!vrows.length) vrows = [el("tr", {}, [el("td", { colspan: "8", className: "empty", text: "no concurrency-key runs" })])];
    document.querySelector("#variants tbody").replaceChildren.apply(document.querySelector("#variants tbody"), vrows);

    document.getElementById("dlq-count").textContent = String(data.dead_lettered);
    var back = queuePath(data.env, q.queue);
    var drows = data.dead_letters.map(function (d) {
      var form = el("form", { method: "post", action: redrivePath(data.env, d.run_id) }, [
        hidden("next", back),
        el("button", { type: "submit", className: "redrive", text: "Redrive" }),
      ]);
      var del = el("form", { method: "post", action: actionPath(data.env, "delete"), "data-confirm": "Delete dead letter " + d.run_id + " for good?" }, [
        hidden("run", d.run_id), hidden("next", back),
        el("button", { type: "submit", className: "delete", text: "Delete" }),
      ]);
      var tb = el("details", { className: "tb", "data-run": d.run_id }, [el("summary", { text: "traceback" }), el("pre", { text: tracebacks[d.run_id] || "" })]);
      if (openTracebacks[d.run_id]) tb.open = true;
      return el("tr", { "data-run": d.run_id }, [
        el("td", { className: "key" }, [el("a", { href: runPath(data.env, d.run_id), text: d.run_id })]), td(d.queue), td(d.key || "\u2014"), td(String(d.attempt), "num"),
        td(new Date(d.dead_lettered_at_ms).toLocaleTimeString(), "ts"),
        el("td", { className: "payload error" }, [document.createTextNode(d.error || "\u2014"), tb]),
        td(d.payload, "payload"), el("td", { className: "buttons" }, [form, del]),
      ]);
    });
    if (!drows.length) drows = [el("tr", {}, [el("td", { colspan: "8", className: "empty", text: "the dead-letter queue is empty" })])];
    document.querySelector("#dlq tbody").replaceChildren.apply(document.querySelector("#dlq tbody"), drows);

    var rrows = (data.recent || []).map(function (r) {
      return el("tr", { "data-run": r.run_id }, [
        el("td", { className: "key" }, [el("a", { href: runPath(data.env, r.run_id), text: r.run_id })]),
        el("td", {}, [el("span", { className: "badge " + r.status, text: r.status })]),
        td(new Date(r.finished_at_ms).toLocaleTimeString(), "ts"), td(String(r.attempts), "num"),
        td(r.duration_ms === null ? "\u2014" : r.duration_ms + " ms", "num"), td(r.concurrency_key || "\u2014"), td(r.tenant || "\u2014"),
      ]);
    });
    if (!rrows.length) rrows = [el("tr", {}, [el("td", { colspan: "7", className: "empty", text: "no finished runs yet" })])];
    var rbody = document.querySelector("#recent tbody");
    rbody.replaceChildren.apply(rbody, rrows);

    var src = document.getElementById("served-source");
    src.dataset.source = data.served.source;
    src.textContent = "counted by every dequeue";
    document.getElementById("served-total").textContent = String(data.served.total);
    drawChart(data.served);
    renderShares(data.shares);
  }

  // ------------------------------------------------------------------ received vs entitled
  function amount(v) { return Number.isInteger(v) ? String(v) : v.toFixed(1); }
  function ratio(v) { return v === null || v === undefined ? "\u2014" : v.toFixed(2); }
  function shareRows(shares) {
    var rows = shares.rows.map(function (r) {
      return { label: r.label, received: r.received, entitled: r.entitled, ratio: r.ratio, other: false };
    });
    if (shares.other) {
      var o = shares.other;
      rows.push({ label: "other (" + o.count + " tenants)", received: o.received, entitled: o.entitled, ratio: o.ratio, other: true });
    }
    return rows;
  }
  function renderShares(shares) {
    if (!shares) return;
    document.getElementById("shares-unit").textContent = shares.unit;
    document.getElementById("shares-samples").textContent = String(shares.samples[1]);
    var rows = shareRows(shares);
    var trs = rows.map(function (r) {
      var tr = el("tr", { className: r.other ? "other" : "" }, [
        td(r.label, "key"), td(amount(r.received[1]), "num"), td(amount(r.entitled[1]), "num"),
      ].concat(r.ratio.map(function (x) { return td(ratio(x), "num"); })));
      if (!r.other) tr.dataset.tenant = r.label;
      return tr;
    });
    if (!trs.length) trs = [el("tr", {}, [el("td", { colspan: "6", className: "empty", text: "nothing received in the last 15 minutes" })])];
    var tbody = document.querySelector("#shares tbody");
    tbody.replaceChildren.apply(tbody, trs);
    drawShares(document.getElementById("chart-shares"), rows);
  }
  // Two bars per tenant over the last 5 minutes: received (key0) and entitled (key1).
  function drawShares(svg, rows) {
    var W = 600, L = 130, R = 60, T = 6, rowH = 22, bar = 8;
    var H = Math.max(40, T * 2 + rowH * rows.length);
    svg.setAttribute("viewBox", "0 0 " + W + " " + H);
    var max = 0;
    rows.forEach(function (r) { max = Math.max(max, r.received[1], r.entitled[1]); });
    var x = function (v) { return (W - L - R) * (max ? v / max : 0); };
    var nodes = [svgEl("line", { x1: L, y1: T, x2: L, y2: H - T, "class": "axis" })];
    rows.forEach(function (r, i) {
      var y = T + i * rowH + 2;
      var name = r.label.length > 18 ? r.label.slice(0, 17) + "\u2026" : r.label;
      nodes.push(svgEl("text", { x: L - 6, y: y + bar + 2, "text-anchor": "end", "class": "lbl" }, name));
      nodes.push(svgEl("rect", { x: L, y: y, width: Math.max(0.5, x(r.received[1])), height: bar, "class": "key0" }));
      nodes.push(svgEl("rect", { x: L, y: y + bar + 1, width: Math.max(0.5, x(r.entitled[1])), height: bar, "class": "key1" }));
      nodes.push(svgEl("text", { x: L + x(Math.max(r.received[1], r.entitled[1])) + 4, y: y + bar + 2, "class": "lbl" }, "\u00d7" + ratio(r.ratio[1])));
    });
    if (!rows.length) nodes.push(svgEl("text", { x: W / 2, y: H / 2, "text-anchor": "middle", "class": "lbl" }, "nothing received in the last 5 minutes"));
    svg.replaceChildren.apply(svg, nodes);
    svg.dataset.rows = String(rows.length);
  }

  function drawChart(served) {
    var canvas = document.getElementById("chart");
    var legend = document.getElementById("legend");
    var ratio = window.devicePixelRatio || 1;
    var width = canvas.clientWidth, height = canvas.clientHeight || 220;
    canvas.width = Math.round(width * ratio);
    canvas.height = Math.round(height * ratio);
    var ctx = canvas.getContext("2d");
    ctx.setTransform(ratio, 0, 0, ratio, 0, 0);
    ctx.clearRect(0, 0, width, height);
    var left = 40, right = 8, top = 8, bottom = 22;
    var plotW = width - left - right, plotH = height - top - bottom;
    var n = served.windows.length;
    ctx.font = "11px system-ui, sans-serif";
    ctx.fillStyle = "#6b7280";
    ctx.strokeStyle = "#e5e7eb";
    ctx.lineWidth = 1;
    [0, 0.25, 0.5, 0.75, 1].forEach(function (f) {
      var y = top + plotH * (1 - f);
      ctx.beginPath(); ctx.moveTo(left, Math.round(y) + 0.5); ctx.lineTo(left + plotW, Math.round(y) + 0.5); ctx.stroke();
      ctx.textAlign = "right"; ctx.textBaseline = "middle";
      ctx.fillText(Math.round(f * 100) + "%", left - 6, y);
    });
    var slot = plotW / Math.max(1, n), bar = Math.max(1, slot - 2);
    for (var i = 0; i < n; i++) {
      var total = 0;
      served.series.forEach(function (s) { total += s.counts[i]; });
      if (!total) continue;
      var y = top + plotH;
      served.series.forEach(function (s, k) {
        var h = plotH * s.counts[i] / total;
        ctx.fillStyle = PALETTE[k % PALETTE.length];
        ctx.fillRect(left + i * slot + 1, y - h, bar, h);
        y -= h;
      });
    }
    ctx.fillStyle = "#6b7280"; ctx.textBaseline = "top";
    for (var m = 5; m >= 0; m--) {
      var x = left + plotW * (1 - m / 5);
      ctx.textAlign = m === 5 ? "left" : m === 0 ? "right" : "center";
      ctx.fillText(m === 0 ? "now" : "\u2212" + m + " min", x, top + plotH + 6);
    }
    if (!served.total) {
      ctx.textAlign = "center"; ctx.textBaseline = "middle"; ctx.fillStyle = "#9ca3af";
      ctx.fillText("no runs served in the last 5 minutes", left + plotW / 2, top + plotH / 2);
    }
    legend.replaceChildren.apply(legend, served.series.map(function (s, k) {
      // Colour set through the CSSOM: the page's CSP allows no inline style attribute.
      var swatch = el("span", { className: "swatch" });
      swatch.style.backgroundColor = PALETTE[k % PALETTE.length];
      return el("li", {}, [
        swatch,
        el("span", { className: "lk", text: s.label }),
        el("span", { className: "share", text: (s.share * 100).toFixed(1) + "%" }),
      ]);
    }));
  }

  // ------------------------------------------------------------------ tracebacks
  // A dead letter's traceback is read when its row is opened (one request), then kept
  // open and cached across live refreshes.
  var tracebacks = {}, openTracebacks = {};
  document.addEventListener("toggle", function (e) {
    var node = e.target;
    if (!node.matches || !node.matches("details.tb")) return;
    var runId = node.dataset.run;
    openTracebacks[runId] = node.open;
    if (!node.open || tracebacks[runId] !== undefined) return;
    var env = JSON.parse(document.getElementById("initial-data").textContent).env;
    fetch(runApi(env, runId), { credentials: "same-origin", headers: { Accept: "application/json" } })
      .then(function (r) { return r.ok ? r.json() : { traceback: null }; })
      .then(function (info) {
        tracebacks[runId] = info.traceback || "(no traceback kept)";
        document.querySelectorAll('details.tb[data-run="' + CSS.escape(runId) + '"] pre').forEach(function (pre) { pre.textContent = tracebacks[runId]; });
      });
  }, true);

  // ------------------------------------------------------------------ confirmations
  document.addEventListener("submit", function (e) {
    var form = e.target;
    if (form.dataset && form.dataset.confirm && !window.confirm(form.dataset.confirm)) e.preventDefault();
  }, true);

  // ------------------------------------------------------------------ charts (SVG)
  var SVG = "http://www.w3.org/2000/svg";
  function svgEl(tag, attrs, text) {
    var node = document.createElementNS(SVG, tag);
    Object.keys(attrs).forEach(function (k) { node.setAttribute(k, attrs[k]); });
    if (text !== undefined) node.textContent = text;
    return node;
  }
  function lineChart(svg, points, series, opts) {
    var W = 600, H = 160, L = 40, R = 8, T = 8, B = 20;
    var n = points.length, max = 0;
    series.forEach(function (s) { points.forEach(function (p) { var v = p[s.field]; if (v !== null && v > max) max = v; }); });
    var nodes = [];
    [0, 0.5, 1].forEach(function (f) {
      var y = T + (H - T - B) * (1 - f);
      nodes.push(svgEl("line", { "class": "axis", x1: L, x2: W - R, y1: y, y2: y }));
      nodes.push(svgEl("text", { "class": "lbl", x: L - 4, y: y + 3, "text-anchor": "end" }, max ? String(Math.round(max * f)) : (f ? "" : "0")));
    });
    nodes.push(svgEl("text", { "class": "lbl", x: L, y: H - 5 }, "\u221260 min"));
    nodes.push(svgEl("text", { "class": "lbl", x: W - R, y: H - 5, "text-anchor": "end" }, "now"));
    var x = function (i) { return L + (W - L - R) * (n > 1 ? i / (n - 1) : 0); };
    var y = function (v) { return T + (H - T - B) * (1 - (max ? v / max : 0)); };
    series.forEach(function (s, k) {
      var d = "", pen = false, drawn = 0;
      points.forEach(function (p, i) {
        var v = p[s.field];
        if (v === null || v === undefined) { pen = false; return; }
        d += (pen ? "L" : "M") + x(i).toFixed(1) + " " + y(v).toFixed(1) + " "; pen = true; drawn++;
      });
      if (opts.bars) {
        points.forEach(function (p, i) {
          var v = p[s.field] || 0; if (!v) return;
          nodes.push(svgEl("rect", { "class": "bar", x: x(i) - 2, y: y(v), width: 4, height: (H - B) - y(v), "data-series": s.field }));
        });
      } else if (drawn) {
        nodes.push(svgEl("path", { "class": "s" + k, d: d.trim(), "data-series": s.field }));
      }
      nodes.push(svgEl("text", { "class": "lbl key" + k, x: L + 6 + k * 110, y: T + 10 }, s.label + (drawn || opts.bars ? "" : " (no data)")));
    });
    svg.replaceChildren.apply(svg, nodes);
    svg.dataset.points = String(n);
  }
  function drawCharts(charts) {
    var pts = charts.points;
    lineChart(document.getElementById("chart-throughput"), pts, [
      { field: "served", label: "served" }, { field: "completed", label: "completed" }, { field: "failed", label: "failed" },
    ], {});
    lineChart(document.getElementById("chart-wait"), pts, [
      { field: "mean_wait_ms", label: "wait" }, { field: "mean_run_ms", label: "run time" },
    ], {});
    lineChart(document.getElementById("chart-dead"), pts, [{ field: "dead_lettered", label: "dead-lettered" }], { bars: true });
    document.getElementById("chart-dlq").textContent = String(charts.dead_lettered);
    document.getElementById("charts").dataset.loaded = String(charts.now_ms);
  }
  function refreshCharts() {
    fetch(api + "/charts", { credentials: "same-origin", headers: { Accept: "application/json" } })
      .then(function (r) { if (!r.ok) throw new Error("HTTP " + r.status); return r.json(); })
      .then(drawCharts)
      .catch(function () {})
      .finally(function () { setTimeout(refreshCharts, 15000); });
  }

  // ------------------------------------------------------------------ polling
  var live = document.getElementById("live"), liveText = document.getElementById("live-text");
  function refresh() {
    fetch(api, { credentials: "same-origin", headers: { Accept: "application/json" } })
      .then(function (r) {
        if (r.ok) return r.json();
        // A 503 says why (the fairq server is not answering); anything else: its status.
        return r.json().catch(function () { return {}; }).then(function (b) {
          throw new Error(b.detail || "HTTP " + r.status);
        });
      })
      .then(function (data) {
        if (page === "overview") renderOverview(data); else renderQueue(data);
        live.classList.remove("stale");
        liveText.textContent = "live \u00b7 " + new Date(data.now_ms).toLocaleTimeString();
        body.dataset.refreshed = String(data.now_ms);
      })
      .catch(function (err) { live.classList.add("stale"); liveText.textContent = "offline (" + err.message + ")"; })
      .finally(function () { setTimeout(refresh, REFRESH_MS); });
  }
  fillStamps(document);
  if (page === "queue") {
    var initial = JSON.parse(document.getElementById("initial-data").textContent);
    drawChart(initial.served);
    renderShares(initial.shares);
    window.addEventListener("resize", function () { refresh(); });
    refreshCharts();
  }
  if (page === "unavailable") { live.classList.add("stale"); liveText.textContent = "offline"; }
  if (api) setTimeout(refresh, REFRESH_MS);
})();
