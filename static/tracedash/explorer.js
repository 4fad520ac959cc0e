// The trace explorer's live updates. The page listens on the project's websocket; when traces are
// announced (``traces.summarized`` once their summary is written, ``traces.ingested`` at ingest)
// it asks /traces/rows.json, with the page's own query and the announced ids, which of them match.
// Sorted by newest first on the first page, matching rows are inserted in place and the rows the
// reader is looking at stay where they are on screen; otherwise a banner counts them ("N new").
// Everything user-supplied is set with textContent, never parsed as HTML.
(function () {
  "use strict";
  const script = document.getElementById("explorer-script");
  const table = document.getElementById("explorer");
  if (!script || !table) return;
  const tbody = table.tBodies[0];
  const liveInserts = table.dataset.liveInserts === "1";
  const hasNextPage = !!document.getElementById("next-page");
  const rowsUrl = script.dataset.rowsUrl;
  const banner = document.getElementById("live-banner");
  const bannerCount = document.getElementById("live-count");
  const newIds = new Set();

  function queryWithout(names) {
    const params = new URLSearchParams(location.search);
    names.forEach((n) => params.delete(n));
    return params;
  }

  function pad(n) { return String(n).padStart(2, "0"); }
  function utc(iso) {
    const d = new Date(iso);
    return `${d.getUTCFullYear()}-${pad(d.getUTCMonth() + 1)}-${pad(d.getUTCDate())} ` +
      `${pad(d.getUTCHours())}:${pad(d.getUTCMinutes())}:${pad(d.getUTCSeconds())}`;
  }
  function el(tag, attrs, text) {
    const node = document.createElement(tag);
    Object.entries(attrs || {}).forEach(([k, v]) => node.setAttribute(k, v));
    if (text !== undefined) node.textContent = text;
    return node;
  }
  function td(text, cls) { return el("td", cls ? { class: cls } : {}, text); }
  function dash() { return el("span", { class: "muted" }, "—"); }

  // Mirrors templates/dashboard/_explorer_row.html.
  function renderRow(row) {
    const tr = el("tr", { "data-trace-id": row.trace_id, "data-start-ns": String(row.start_ns) });
    if (row.status === "error") tr.className = "is-error";
    const idCell = el("td");
    const link = el("a", { class: "trace-link", href: `/traces/${row.trace_id}/`, title: row.trace_id });
    link.appendChild(el("code", {}, `${row.trace_id.slice(0, 12)}…`));
    idCell.appendChild(link);
    tr.appendChild(idCell);
    const root = td(row.root_name);
    root.title = row.root_name;
    if (!row.has_root) {
      root.appendChild(document.createTextNode(" "));
      root.appendChild(el("span", { class: "tag", title: "The root span has not arrived; duration is the extent of the spans received." }, "no root"));
    }
    tr.appendChild(root);
    [row.service, row.model].forEach((text) => { const cell = td(text); cell.title = text; tr.appendChild(cell); });
    tr.appendChild(td(utc(row.start), "nowrap"));
    tr.appendChild(td(`${row.duration_ms.toFixed(1)} ms`, "num"));
    const ttft = td(row.ttft_ms === null ? "" : `${row.ttft_ms.toFixed(1)} ms`, "num");
    if (row.ttft_ms === null) ttft.appendChild(dash());
    tr.appendChild(ttft);
    tr.appendChild(td(`${row.input_tokens} / ${row.output_tokens}`, "num"));
    const cost = td(row.cost_usd === null ? "" : window.tracedashFormat.money(row.cost_usd), "num");  // format.js: as the server writes it
    if (row.cost_usd === null) cost.appendChild(dash());
    else if (row.cost_estimated) {
      cost.appendChild(document.createTextNode(" "));
      cost.appendChild(el("span", { class: "tag", title: "Part of the cost comes from the price table" }, "est."));
    }
    tr.appendChild(cost);
    const status = el("td");
    const badge = el("span", { class: `status status-${row.status === "error" ? "error" : "ok"}` }, row.status);
    if (row.error_message) badge.title = row.error_message;
    status.appendChild(badge);
    status.className = "status-cell";
    if (row.error_message) {
      // The error's text (escaped: textContent), cut to 80 characters; the whole of it on hover.
      const text = row.error_message.length > 80 ? row.error_message.slice(0, 79) + "…" : row.error_message;
      status.appendChild(document.createTextNode(" "));
      const message = el("span", { class: "error-message" }, text);
      message.title = row.error_message;
      status.appendChild(message);
    }
    tr.appendChild(status);
    tr.appendChild(td(String(row.span_count), "num"));
    const phases = el("td", { class: "phases-col" });
    const bar = el("div", { class: "phase-bar", role: "img" });
    bar.setAttribute("aria-label", row.phases.map((s) => `${s.phase} ${s.ms.toFixed(1)} ms`).join(", "));
    row.phases.forEach((s) => {
      const seg = el("span", { class: "seg", "data-phase": s.phase, title: `${s.phase}: ${s.ms.toFixed(1)} ms (${Math.round(s.percent)} %)` });
      seg.style.width = `${s.percent.toFixed(2)}%`;
      bar.appendChild(seg);
    });
    phases.appendChild(bar);
    tr.appendChild(phases);
    return tr;
  }

  // Newest first, ties by trace id descending (the server's order for sort=start&dir=desc).
  function before(row, tr) {
    const start = BigInt(tr.dataset.startNs);
    const mine = BigInt(row.start_ns);
    return mine > start || (mine === start && row.trace_id > tr.dataset.traceId);
  }

  // The first row at least partly on screen: the one the reader is looking at.
  function anchorRow() {
    for (const tr of tbody.rows) {
      if (tr.getBoundingClientRect().bottom > 0) return tr;
    }
    return null;
  }

  function insertRows(rows) {
    const anchor = window.scrollY > 0 ? anchorRow() : null;
    const anchorTop = anchor ? anchor.getBoundingClientRect().top : 0;
    let inserted = 0;
    rows.forEach((row) => {
      const existing = tbody.querySelector(`tr[data-trace-id="${row.trace_id}"]`);
      const fresh = renderRow(row);
      if (existing) { existing.replaceWith(fresh); return; }  // re-summarised: late spans
      const next = Array.from(tbody.rows).find((tr) => before(row, tr));
      if (next) tbody.insertBefore(fresh, next);
      else if (!hasNextPage) tbody.appendChild(fresh);
      else return;  // it belongs on a later page
      fresh.classList.add("is-new");
      inserted += 1;
    });
    if (inserted) {
      table.hidden = false;
      const empty = document.getElementById("no-traces");
      if (empty) empty.hidden = true;
    }
    if (anchor) window.scrollBy(0, anchor.getBoundingClientRect().top - anchorTop);
  }

  function announce(rows) {
    rows.forEach((row) => {
      if (!tbody.querySelector(`tr[data-trace-id="${row.trace_id}"]`)) newIds.add(row.trace_id);
    });
    if (newIds.size) {
      bannerCount.textContent = String(newIds.size);
      banner.hidden = false;
    }
  }

  async function fetchMatching(ids) {
    if (!ids.length) return;
    const params = queryWithout(["cursor", "ids"]);
    params.set("ids", ids.slice(0, 200).join(","));
    try {
      const response = await fetch(`${rowsUrl}?${params}`, { credentials: "same-origin", headers: { Accept: "application/json" } });
      if (!response.ok) return;
      const body = await response.json();
      if (!body.rows || !body.rows.length) return;
      if (liveInserts) insertRows(body.rows);
      else announce(body.rows);
    } catch (err) {
      // The server is restarting or the network dropped: the next announcement tries again.
    }
  }

  // Announcements arrive in bursts under load: ask for their ids at most once a second.
  const pending = new Set();
  let flushTimer = null;
  function want(ids, delayMs) {
    setTimeout(() => {
      ids.forEach((id) => pending.add(id));
      if (flushTimer === null) {
        flushTimer = setTimeout(() => {
          flushTimer = null;
          const batch = Array.from(pending).slice(0, 200);
          batch.forEach((id) => pending.delete(id));
          fetchMatching(batch);
          if (pending.size) want([], 0);
        }, 1000);
      }
    }, delayMs);
  }

  const proto = location.protocol === "https:" ? "wss" : "ws";
  function connect() {
    const ws = new WebSocket(`${proto}://${location.host}${script.dataset.wsPath}`);
    ws.onmessage = (msg) => {
      const event = JSON.parse(msg.data);
      if (event.type === "traces.summarized") {
        want(event.trace_ids || [], 0);
      } else if (event.type === "traces.ingested") {
        // Summaries follow ingestion by a few seconds; look then (and again on traces.summarized).
        want(event.trace_ids || [], 3000);
      }
    };
    ws.onclose = (e) => { if (e.code !== 4403) setTimeout(connect, 3000); };
  }
  connect();
})();
