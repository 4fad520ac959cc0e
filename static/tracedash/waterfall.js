/* The trace waterfall: a virtualised span tree (only the rows in view are in the DOM, recycled from
 * a small pool, so a 10,000-span trace opens and scrolls like a 10-span one), a time ruler, a
 * minimap with drag-to-zoom, find-in-trace, keyboard navigation and a span detail pane.
 *
 * Data: the JSON of GET /api/v1/traces/<id>, embedded by the page with json_script. Everything a
 * user sent (names, attributes, prompts, messages) is written with textContent, never innerHTML.
 * Plain JS, no framework, nothing loaded from outside the server.
 */
(function () {
  "use strict";
  const dataEl = document.getElementById("trace-data");
  if (!dataEl) return;
  const data = JSON.parse(dataEl.textContent);
  const COLORS = JSON.parse(document.getElementById("phase-colors").textContent);
  // The page embeds spans column-wise ({fields, rows}); rebuild one object per span.
  const spans = Array.isArray(data.spans) ? data.spans : data.spans.rows.map((row) => {
    const span = {};
    data.spans.fields.forEach((f, k) => { span[f] = row[k]; });
    return span;
  });
  const n = spans.length;
  const ROW_H = 24;
  const OVERSCAN = 10;
  const PROMPT_KEY = /^(gen_ai\.(prompt|completion)|llm\.(input|output)_messages|input\.value$|output\.value$)/;

  // --- structure -------------------------------------------------------------------------------
  const index = new Map();
  spans.forEach((s, i) => index.set(s.span_id, i));
  const parent = new Int32Array(n).fill(-1);
  const subtreeEnd = new Int32Array(n);  // spans are depth-first: a subtree is [i, subtreeEnd[i])
  {
    const open = [];
    for (let i = 0; i < n; i++) {
      const depth = spans[i].depth;
      while (open.length && spans[open[open.length - 1]].depth >= depth) subtreeEnd[open.pop()] = i;
      if (open.length && depth > 0) parent[i] = open[open.length - 1];
      open.push(i);
    }
    while (open.length) subtreeEnd[open.pop()] = n;
  }
  const critical = new Map();  // span index -> [[start, end], ...] of its critical-path segments
  for (const seg of data.critical_path) {
    const i = index.get(seg.span_id);
    if (i === undefined) continue;
    if (!critical.has(i)) critical.set(i, []);
    critical.get(i).push([seg.start_ns, seg.end_ns]);
  }
  let t0 = Infinity, t1 = -Infinity;
  for (const s of spans) { t0 = Math.min(t0, s.start_ns); t1 = Math.max(t1, s.start_ns + s.duration_ns); }
  if (!isFinite(t0)) { t0 = 0; t1 = 1; }
  if (t1 <= t0) t1 = t0 + 1;
  let viewLo = t0, viewHi = t1;

  const collapsed = new Uint8Array(n);
  let visible = new Int32Array(0);
  let selected = -1;
  let matches = [], matchPos = -1, matchSet = new Set();

  // --- elements --------------------------------------------------------------------------------
  const $ = (id) => document.getElementById(id);
  const list = $("wf-list"), canvas = $("wf-canvas"), ticks = $("wf-ruler-ticks");
  const detailBody = $("wf-detail-body"), detailEmpty = $("wf-detail-empty");
  const findInput = $("wf-find"), findCount = $("wf-find-count"), resetZoom = $("wf-reset-zoom");

  function el(tag, cls, text) {
    const e = document.createElement(tag);
    if (cls) e.className = cls;
    if (text !== undefined && text !== null) e.textContent = String(text);
    return e;
  }
  function fmtMs(ns) {
    if (ns === null || ns === undefined) return "—";
    const ms = ns / 1e6;
    return (Math.abs(ms) < 1 ? ms.toFixed(3) : ms.toFixed(1)) + " ms";
  }

  // --- visible rows ----------------------------------------------------------------------------
  function rebuild() {
    const out = new Int32Array(n);
    let k = 0;
    for (let i = 0; i < n;) {
      out[k++] = i;
      i = collapsed[i] ? subtreeEnd[i] : i + 1;
    }
    visible = out.subarray(0, k);
    canvas.style.height = (k * ROW_H) + "px";
    for (const row of pool) row.index = -1;  // force a refresh of every pooled row
    render();
  }
  function positionOf(i) {
    // Binary search: visible is increasing.
    let lo = 0, hi = visible.length - 1;
    while (lo <= hi) {
      const mid = (lo + hi) >> 1;
      if (visible[mid] === i) return mid;
      if (visible[mid] < i) lo = mid + 1; else hi = mid - 1;
    }
    return -1;
  }
  function expandTo(i) {
    let changed = false;
    for (let p = parent[i]; p >= 0; p = parent[p]) if (collapsed[p]) { collapsed[p] = 0; changed = true; }
    if (changed) rebuild();
  }

  // --- the row pool ----------------------------------------------------------------------------
  const pool = [];
  function makeRow() {
    const row = el("div", "wf-row");
    row.setAttribute("role", "treeitem");
    const label = el("div", "wf-label");
    const toggle = el("button", "wf-toggle");
    toggle.type = "button";
    toggle.tabIndex = -1;
    const name = el("span", "wf-name"), svc = el("span", "wf-svc"), badges = el("span", "wf-badges");
    label.append(toggle, name, svc, badges);
    const dur = el("div", "wf-dur");
    const track = el("div", "wf-track");
    const bar = el("div", "wf-bar");
    const ttft = el("div", "wf-ttft");
    ttft.title = "TTFT: first output token";
    bar.append(ttft);
    track.append(bar);
    row.append(label, dur, track);
    canvas.append(row);
    const r = { row, label, toggle, name, svc, badges, dur, track, bar, ttft, segs: [], index: -1 };
    row.addEventListener("click", () => { if (r.index >= 0) select(r.index, { scroll: false }); });
    toggle.addEventListener("click", (e) => { e.stopPropagation(); if (r.index >= 0) toggleCollapse(r.index); });
    track.addEventListener("dblclick", () => { if (r.index >= 0) zoomToSpan(spans[r.index]); });
    return r;
  }
  function ensurePool() {
    const want = Math.ceil((list.clientHeight || 600) / ROW_H) + 2 * OVERSCAN;
    while (pool.length < want) pool.push(makeRow());
  }
  function pct(ns) { return ((ns - viewLo) / (viewHi - viewLo)) * 100; }

  function fillRow(r, i) {
    const s = spans[i];
    r.index = i;
    r.row.dataset.spanId = s.span_id;
    r.row.setAttribute("aria-level", String(s.depth + 1));
    r.label.style.paddingLeft = (4 + Math.min(s.depth, 40) * 14) + "px";
    const hasKids = s.child_count > 0;
    r.toggle.textContent = hasKids ? (collapsed[i] ? "▸" : "▾") : "";
    r.toggle.disabled = !hasKids;
    r.toggle.setAttribute("aria-label", hasKids ? (collapsed[i] ? "Expand" : "Collapse") : "");
    if (hasKids) r.row.setAttribute("aria-expanded", collapsed[i] ? "false" : "true"); else r.row.removeAttribute("aria-expanded");
    r.name.textContent = s.name;
    r.name.title = s.name;
    r.svc.textContent = s.service;
    r.badges.textContent = "";
    if (s.status === "error") r.badges.append(badge("error", "err", s.status_message || "error"));
    if (s.orphan) r.badges.append(badge("orphan", "orphan", "Parent span " + s.parent_span_id + " is not in this trace"));
    if (s.extra_root) r.badges.append(badge("root?", "orphan", "Another span without a parent; the longest one is the trace's root"));
    if (s.skew_note) r.badges.append(badge("skew", "skew", s.skew_note));
    if (collapsed[i] && hasKids) r.badges.append(badge("+" + (subtreeEnd[i] - i - 1), "hidden-count", (subtreeEnd[i] - i - 1) + " spans hidden"));
    r.dur.textContent = fmtMs(s.duration_ns) + (s.self_ns !== s.duration_ns ? " · self " + fmtMs(s.self_ns) : "");
    r.dur.title = "total " + fmtMs(s.duration_ns) + ", self (exclusive) " + fmtMs(s.self_ns);
    const cls = ["wf-row"];
    if (s.status === "error") cls.push("is-error");
    if (s.orphan || s.extra_root) cls.push("is-orphan");
    if (s.on_critical_path) cls.push("is-critical");
    if (i === selected) cls.push("selected");
    if (matchSet.has(i)) cls.push("match");
    if (matchPos >= 0 && matches[matchPos] === i) cls.push("match-current");
    r.row.className = cls.join(" ");
    r.row.setAttribute("aria-selected", i === selected ? "true" : "false");
    // bar, critical segments and TTFT in the zoom window
    const left = pct(s.start_ns), right = pct(s.start_ns + s.duration_ns);
    r.bar.style.left = left + "%";
    r.bar.style.width = "max(2px, " + Math.max(0, right - left) + "%)";
    r.bar.style.background = COLORS[s.phase] || COLORS.other;
    r.bar.hidden = right < 0 || left > 100;
    r.bar.title = s.phase + " · " + fmtMs(s.duration_ns);
    for (const seg of r.segs) seg.remove();
    r.segs = [];
    const segs = critical.get(i);
    if (segs && s.duration_ns > 0) {
      for (const [a, b] of segs) {
        const seg = el("div", "wf-crit");
        seg.style.left = ((a - s.start_ns) / s.duration_ns) * 100 + "%";
        seg.style.width = ((b - a) / s.duration_ns) * 100 + "%";
        r.bar.append(seg);
        r.segs.push(seg);
      }
    }
    if (s.ttft_ns !== null && s.duration_ns > 0) {
      r.ttft.hidden = false;
      r.ttft.style.left = Math.min(100, (s.ttft_ns / s.duration_ns) * 100) + "%";
      r.ttft.title = "TTFT " + fmtMs(s.ttft_ns);
    } else {
      r.ttft.hidden = true;
    }
  }
  function badge(text, cls, title) {
    const b = el("span", "wf-badge " + cls, text);
    b.title = title;
    return b;
  }

  let frame = 0;
  function render() {
    frame = 0;
    ensurePool();
    const top = Math.max(0, list.scrollTop - ROW_H);
    const first = Math.max(0, Math.floor(top / ROW_H) - OVERSCAN);
    for (let k = 0; k < pool.length; k++) {
      const r = pool[k];
      const pos = first + k;
      if (pos >= visible.length) { r.row.hidden = true; r.index = -1; continue; }
      r.row.hidden = false;
      r.row.style.transform = "translateY(" + (pos * ROW_H) + "px)";
      fillRow(r, visible[pos]);
    }
  }
  function schedule() { if (!frame) frame = requestAnimationFrame(render); }
  list.addEventListener("scroll", schedule, { passive: true });
  // When a scroll ends between two rows, settle on the nearest row boundary: the sticky ruler then
  // never covers part of the top row (row k starts just under the ruler when scrollTop = k × ROW_H).
  function alignToRow() {
    const max = list.scrollHeight - list.clientHeight;
    if (list.scrollTop >= max - 1) return;  // the bottom: the last row is already whole
    const aligned = Math.round(list.scrollTop / ROW_H) * ROW_H;
    if (Math.abs(aligned - list.scrollTop) >= 0.5) list.scrollTop = Math.min(aligned, max);
  }
  if ("onscrollend" in list) list.addEventListener("scrollend", alignToRow);
  else {
    let settle = 0;
    list.addEventListener("scroll", () => { clearTimeout(settle); settle = setTimeout(alignToRow, 150); }, { passive: true });
  }
  window.addEventListener("resize", () => { drawMinimap(); drawRuler(); schedule(); });

  // --- ruler and zoom --------------------------------------------------------------------------
  function niceStep(raw) {
    const mag = Math.pow(10, Math.floor(Math.log10(raw)));
    for (const m of [1, 2, 2.5, 5, 10]) if (m * mag >= raw) return m * mag;
    return 10 * mag;
  }
  function fmtTick(ns, step) {
    if (step >= 1e9) return (ns / 1e9).toFixed(step % 1e9 ? 1 : 0) + " s";
    if (step >= 1e6) return (ns / 1e6).toFixed(step % 1e6 ? 1 : 0) + " ms";
    return (ns / 1e3).toFixed(step % 1e3 ? 1 : 0) + " µs";
  }
  function drawRuler() {
    // Round-numbered ticks (offsets from the trace's start), about one per 110 px.
    ticks.textContent = "";
    const width = ticks.clientWidth || 600;
    const step = niceStep(Math.max(1, (viewHi - viewLo) / Math.max(2, Math.floor(width / 110))));
    for (let off = Math.ceil((viewLo - t0) / step) * step; t0 + off <= viewHi; off += step) {
      const x = pct(t0 + off);
      const t = el("span", "wf-tick", fmtTick(off, step));
      t.style.left = x + "%";
      if (x > 92) t.classList.add("last");
      ticks.append(t);
    }
    const wf = $("waterfall");
    wf.dataset.viewStartMs = ((viewLo - t0) / 1e6).toFixed(3);
    wf.dataset.viewEndMs = ((viewHi - t0) / 1e6).toFixed(3);
  }
  function zoom(lo, hi) {
    viewLo = Math.max(t0, Math.min(lo, hi));
    viewHi = Math.min(t1, Math.max(lo, hi));
    if (viewHi - viewLo < 1000) viewHi = viewLo + 1000;
    resetZoom.disabled = viewLo === t0 && viewHi === t1;
    drawRuler();
    drawMinimapWindow();
    for (const row of pool) row.index = -1;
    render();
  }
  resetZoom.addEventListener("click", () => zoom(t0, t1));
  function zoomToSpan(s) {
    const pad = Math.max(s.duration_ns * 0.05, 1000);
    zoom(s.start_ns - pad, s.start_ns + s.duration_ns + pad);
  }

  // --- minimap ---------------------------------------------------------------------------------
  const mini = $("wf-minimap"), miniCanvas = $("wf-minimap-canvas"), miniWindow = $("wf-minimap-window"), miniDrag = $("wf-minimap-drag");
  function drawMinimap() {
    const w = mini.clientWidth || 800, h = mini.clientHeight || 48;
    const ratio = window.devicePixelRatio || 1;
    miniCanvas.width = w * ratio;
    miniCanvas.height = h * ratio;
    miniCanvas.style.width = w + "px";
    miniCanvas.style.height = h + "px";
    const ctx = miniCanvas.getContext("2d");
    ctx.scale(ratio, ratio);
    ctx.clearRect(0, 0, w, h);
    const rowH = Math.max(h / Math.max(n, 1), 0.5);
    for (let i = 0; i < n; i++) {
      const s = spans[i];
      ctx.fillStyle = COLORS[s.phase] || COLORS.other;
      const x = ((s.start_ns - t0) / (t1 - t0)) * w;
      ctx.fillRect(x, (i / n) * h, Math.max(1, (s.duration_ns / (t1 - t0)) * w), Math.max(1, rowH));
    }
    drawMinimapWindow();
  }
  function drawMinimapWindow() {
    const w = mini.clientWidth || 800;
    miniWindow.style.left = ((viewLo - t0) / (t1 - t0)) * w + "px";
    miniWindow.style.width = Math.max(2, ((viewHi - viewLo) / (t1 - t0)) * w) + "px";
  }
  let dragFrom = null;
  function miniX(e) {
    const rect = mini.getBoundingClientRect();
    return Math.max(0, Math.min(rect.width, e.clientX - rect.left));
  }
  mini.addEventListener("mousedown", (e) => { dragFrom = miniX(e); miniDrag.hidden = false; miniDrag.style.left = dragFrom + "px"; miniDrag.style.width = "0px"; e.preventDefault(); });
  window.addEventListener("mousemove", (e) => {
    if (dragFrom === null) return;
    const x = miniX(e);
    miniDrag.style.left = Math.min(x, dragFrom) + "px";
    miniDrag.style.width = Math.abs(x - dragFrom) + "px";
  });
  window.addEventListener("mouseup", (e) => {
    if (dragFrom === null) return;
    const x = miniX(e), w = mini.clientWidth || 1;
    miniDrag.hidden = true;
    if (Math.abs(x - dragFrom) >= 3) {
      const toNs = (px) => t0 + (px / w) * (t1 - t0);
      zoom(toNs(Math.min(x, dragFrom)), toNs(Math.max(x, dragFrom)));
    }
    dragFrom = null;
  });

  // --- collapse ---------------------------------------------------------------------------------
  function toggleCollapse(i, value) {
    if (spans[i].child_count === 0) return;
    collapsed[i] = value === undefined ? (collapsed[i] ? 0 : 1) : (value ? 1 : 0);
    rebuild();
    if (selected > i && selected < subtreeEnd[i] && collapsed[i]) select(i, { scroll: false });
  }
  $("wf-collapse-all").addEventListener("click", () => {
    // Everything below the top level folds; the top-level spans stay open so the tree's shape shows.
    for (let i = 0; i < n; i++) collapsed[i] = spans[i].child_count > 0 && spans[i].depth > 0 ? 1 : 0;
    rebuild();
    if (selected >= 0) moveSelectionOutOfFolds();
  });
  $("wf-expand-all").addEventListener("click", () => { collapsed.fill(0); rebuild(); });
  function moveSelectionOutOfFolds() {
    // A selected span inside a folded subtree hands the selection to the outermost folded ancestor.
    let best = selected;
    for (let p = parent[selected]; p >= 0; p = parent[p]) if (collapsed[p]) best = p;
    if (best !== selected) select(best, { scroll: false });
  }

  // --- selection and detail --------------------------------------------------------------------
  function spanLink(s) {
    const url = new URL(location.pathname, location.origin);
    url.searchParams.set("project", String(data.project_id));
    url.searchParams.set("span", s.span_id);
    return url.toString();
  }
  function scrollIntoView(i) {
    const pos = positionOf(i);
    if (pos < 0) return;
    const rulerH = $("wf-ruler").offsetHeight;
    const top = pos * ROW_H, view = list.clientHeight - rulerH;
    if (top < list.scrollTop) list.scrollTop = top;
    else if (top + ROW_H > list.scrollTop + view) list.scrollTop = top + ROW_H - view;
  }
  function select(i, opts) {
    if (i < 0 || i >= n) return;
    selected = i;
    expandTo(i);
    if (!opts || opts.scroll !== false) scrollIntoView(i);
    for (const row of pool) row.index = -1;
    render();
    showDetail(spans[i]);
    if (!opts || opts.history !== false) history.replaceState(null, "", spanLink(spans[i]));
  }
  function copyText(text, button) {
    const done = () => { const old = button.textContent; button.textContent = "Copied"; setTimeout(() => { button.textContent = old; }, 1200); };
    if (navigator.clipboard && navigator.clipboard.writeText) {
      navigator.clipboard.writeText(text).then(done, () => fallbackCopy(text) && done());
    } else if (fallbackCopy(text)) done();
  }
  function fallbackCopy(text) {
    const area = el("textarea");
    area.value = text;
    document.body.append(area);
    area.select();
    let ok = false;
    try { ok = document.execCommand("copy"); } catch (e) { ok = false; }
    area.remove();
    return ok;
  }
  function kvTable(map, cls, keepOrder) {
    const keys = keepOrder ? Object.keys(map) : Object.keys(map).sort();
    const table = el("table", "kv " + (cls || ""));
    for (const k of keys) {
      const tr = el("tr");
      tr.append(el("th", "", k), el("td", "", map[k]));
      table.append(tr);
    }
    return table;
  }
  function section(title, body, open) {
    const d = el("details", "wf-section");
    d.open = open !== false;
    d.append(el("summary", "", title), body);
    return d;
  }
  function showDetail(s) {
    detailEmpty.hidden = true;
    detailBody.hidden = false;
    detailBody.textContent = "";
    const head = el("div", "wf-detail-head");
    const title = el("h2", "wf-detail-name", s.name);
    const status = el("span", "status status-" + (s.status === "error" ? "error" : "ok"), s.status);
    head.append(title, status);
    detailBody.append(head);
    if (s.status === "error" || s.status_message) {
      detailBody.append(el("p", "error wf-status-message", s.status_message ? "Status message: " + s.status_message : "Error (no message)"));
    }
    const facts = {
      "span id": s.span_id, "parent": s.parent_span_id || "(none: root)", "service": s.service, "phase": s.phase,
      "model": s.model || "—", "start": "+" + fmtMs(s.start_ns - t0), "duration": fmtMs(s.duration_ns),
      "self time": fmtMs(s.self_ns),
      "critical path": s.critical_ns ? fmtMs(s.critical_ns) + " of its own time" : (s.on_critical_path ? "on it, through its children" : "no"),
    };
    if (s.reported_phase) facts["phase"] = s.phase + " (part of the model call above it; sent as " + s.reported_phase + ")";
    if (s.ttft_ns !== null) facts["TTFT"] = fmtMs(s.ttft_ns);
    else if (s.phase === "inference" && !s.reported_phase) facts["TTFT"] = "unknown (the instrumentation sent no first-token time)";
    // null: the span reported no count (unknown, not 0)
    if (s.input_tokens != null || s.output_tokens != null) facts["tokens in / out"] = (s.input_tokens ?? "—") + " / " + (s.output_tokens ?? "—");
    if (s.cost_usd !== null) facts["cost"] = window.tracedashFormat.money(s.cost_usd);  // format.js: as the server writes it
    detailBody.append(kvTable(facts, "facts", true));
    if (s.orphan) detailBody.append(el("p", "note", "Orphan: its parent span " + s.parent_span_id + " is not in this trace (not sent, or not arrived yet)."));
    if (s.skew_note) detailBody.append(el("p", "note", "Clock skew: it " + s.skew_note + "."));
    const linkRow = el("div", "wf-link");
    const link = el("input");
    link.id = "wf-span-link";
    link.readOnly = true;
    link.value = spanLink(s);
    const copyLink = el("button", "", "Copy link");
    copyLink.type = "button";
    copyLink.id = "wf-copy-link";
    copyLink.addEventListener("click", () => copyText(link.value, copyLink));
    linkRow.append(link, copyLink);
    detailBody.append(linkRow);

    const promptKeys = Object.keys(s.attributes).filter((k) => PROMPT_KEY.test(k)).sort();
    if (promptKeys.length) {
      const box = el("div", "wf-prompts");
      for (const k of promptKeys) {
        const d = el("details", "wf-prompt");
        d.open = true;
        const summary = el("summary", "", k);
        const copy = el("button", "wf-copy", "Copy");
        copy.type = "button";
        copy.addEventListener("click", (e) => { e.preventDefault(); copyText(s.attributes[k], copy); });
        summary.append(" ", copy);
        d.append(summary, el("pre", "wf-prompt-text", s.attributes[k]));
        box.append(d);
      }
      detailBody.append(section("Prompt & completion", box));
    }
    const others = {};
    for (const k of Object.keys(s.attributes)) if (!PROMPT_KEY.test(k)) others[k] = s.attributes[k];
    detailBody.append(section("Attributes (" + Object.keys(others).length + ")", kvTable(others, "attributes")));
    if (Object.keys(s.resource_attributes).length) {
      detailBody.append(section("Resource", kvTable(s.resource_attributes, "resource"), false));
    }
    const events = el("ol", "wf-events");
    for (const ev of s.events) {
      const li = el("li");
      li.append(el("strong", "", ev.name), el("span", "muted", " +" + fmtMs(ev.time_ns - s.start_ns) + " into the span"));
      if (Object.keys(ev.attributes).length) li.append(kvTable(ev.attributes));
      events.append(li);
    }
    detailBody.append(section("Events (" + s.events.length + ")", s.events.length ? events : el("p", "muted", "No events.")));
    // GenAI events sent as OTLP log records (prompts, completions, tool messages) for this span.
    const genai = s.genai_events || [];
    if (genai.length) {
      const genaiList = el("ol", "wf-events wf-genai-events");
      for (const ev of genai) {
        const li = el("li");
        li.append(el("strong", "", ev.name || "(no event name)"),
                  el("span", "muted", " +" + fmtMs(ev.time_ns - s.start_ns) + " into the span" + (ev.severity ? " · " + ev.severity : "")));
        if (ev.body !== null && ev.body !== "") {
          li.append(el("pre", "wf-prompt-text", typeof ev.body === "string" ? ev.body : JSON.stringify(ev.body, null, 2)));
        }
        if (Object.keys(ev.attributes).length) li.append(kvTable(ev.attributes));
        genaiList.append(li);
      }
      detailBody.append(section("GenAI events (" + genai.length + ")", genaiList));
    }
  }

  // --- find --------------------------------------------------------------------------------------
  function spanMatches(s, q) {
    if (s.name.toLowerCase().includes(q) || s.service.toLowerCase().includes(q) || s.span_id.includes(q)
        || s.model.toLowerCase().includes(q) || s.status_message.toLowerCase().includes(q)) return true;
    for (const k in s.attributes) {
      if (k.toLowerCase().includes(q) || String(s.attributes[k]).toLowerCase().includes(q)) return true;
    }
    return false;
  }
  function runFind() {
    const q = findInput.value.trim().toLowerCase();
    matches = [];
    if (q) for (let i = 0; i < n; i++) if (spanMatches(spans[i], q)) matches.push(i);
    matchSet = new Set(matches);
    matchPos = -1;
    findCount.textContent = q ? (matches.length ? matches.length + " matches" : "no matches") : "";
    for (const row of pool) row.index = -1;
    render();
  }
  function refreshFind() {
    clearTimeout(findTimer);
    const q = findInput.value.trim().toLowerCase();
    if (q !== lastQuery) { lastQuery = q; runFind(); }
  }
  function gotoMatch(step) {
    refreshFind();
    if (!matches.length) return;
    matchPos = matchPos < 0 ? (step > 0 ? 0 : matches.length - 1) : (matchPos + step + matches.length) % matches.length;
    findCount.textContent = (matchPos + 1) + " / " + matches.length;
    select(matches[matchPos]);
  }
  let lastQuery = "", findTimer = 0;
  findInput.addEventListener("input", () => {
    clearTimeout(findTimer);
    findTimer = setTimeout(refreshFind, 120);
  });
  findInput.addEventListener("keydown", (e) => {
    if (e.key === "Enter") { e.preventDefault(); gotoMatch(e.shiftKey ? -1 : 1); }
    else if (e.key === "Escape") { findInput.blur(); list.focus(); }
  });
  $("wf-find-next").addEventListener("click", () => gotoMatch(1));
  $("wf-find-prev").addEventListener("click", () => gotoMatch(-1));

  // --- keyboard ----------------------------------------------------------------------------------
  const NAV_KEYS = new Set(["ArrowDown", "ArrowUp", "ArrowLeft", "ArrowRight", "Enter", "Home", "End"]);
  document.addEventListener("keydown", (e) => {
    const typing = e.target instanceof HTMLInputElement || e.target instanceof HTMLTextAreaElement;
    if (e.key === "/" && !typing) { e.preventDefault(); findInput.focus(); findInput.select(); return; }
    // Nothing focused yet (the page just opened): the arrows drive the waterfall.
    if (e.target === document.body && NAV_KEYS.has(e.key) && !e.altKey && !e.ctrlKey && !e.metaKey) {
      list.focus({ preventScroll: true });
      navigate(e);
    }
  });
  list.addEventListener("keydown", (e) => {
    if (e.target instanceof HTMLInputElement) return;
    navigate(e);
  });
  function navigate(e) {
    const pos = selected >= 0 ? positionOf(selected) : -1;
    const s = selected >= 0 ? spans[selected] : null;
    let handled = true;
    switch (e.key) {
      case "ArrowDown": select(visible[Math.min(visible.length - 1, pos + 1)]); break;
      case "ArrowUp": select(visible[Math.max(0, pos - 1)]); break;
      case "ArrowRight":
        if (!s) select(visible[0]);
        else if (s.child_count && collapsed[selected]) toggleCollapse(selected, false);
        else if (s.child_count) select(selected + 1);
        break;
      case "ArrowLeft":
        if (!s) select(visible[0]);
        else if (s.child_count && !collapsed[selected]) toggleCollapse(selected, true);
        else if (parent[selected] >= 0) select(parent[selected]);
        break;
      case "Enter": if (s) toggleCollapse(selected); break;
      case "Home": select(visible[0]); break;
      case "End": select(visible[visible.length - 1]); break;
      default: handled = false;
    }
    if (handled) e.preventDefault();
  }

  // --- live: spans of this trace that arrive while the page is open --------------------------------
  function listen() {
    const proto = location.protocol === "https:" ? "wss" : "ws";
    const ws = new WebSocket(proto + "://" + location.host + "/ws/projects/" + encodeURIComponent(data.project_id) + "/traces/");
    ws.onmessage = (msg) => {
      const event = JSON.parse(msg.data);
      if (event.type !== "traces.ingested" || !(event.trace_ids || []).includes(data.trace_id)) return;
      $("trace-live-reload").href = location.href;  // keeps ?span=
      $("trace-live").hidden = false;
    };
    ws.onclose = (e) => { if (e.code !== 4403) setTimeout(listen, 3000); };
  }
  listen();

  // --- start -------------------------------------------------------------------------------------
  drawRuler();
  drawMinimap();
  rebuild();
  const wanted = new URLSearchParams(location.search).get("span");
  if (wanted && index.has(wanted)) {
    select(index.get(wanted), { history: false });
    list.focus({ preventScroll: true });
  } else if (wanted) {
    detailEmpty.textContent = "Span " + wanted + " is not in this trace.";
  }
  window.__waterfallReady = performance.now();
  $("waterfall").dataset.ready = "1";
})();
