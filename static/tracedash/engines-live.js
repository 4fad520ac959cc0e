// Live engines: when engine (or resource) samples of this project arrive — the ingest announces
// both as "resources.ingested" — or traces are summarised (the app-side lines), re-read the series
// and redraw in place: the charts and the latest-figures table together, from one JSON answer.
// Only a window that ends "now" (a preset: data-live="1") moves; an absolute window stays. When the
// page's set of charts changes — the first sample ever (the page showed how to get them), the first
// instance in the window, or another engine to choose — the page reloads instead.
// The script tag carries data-url (the series JSON), data-project, data-live, data-had-samples,
// data-had-instances and data-engines (comma-separated). Each redraw counts up
// document.body.dataset.enginesRefreshed.
(function () {
  "use strict";
  const me = document.currentScript;
  if (me.dataset.live !== "1") return;
  const proto = location.protocol === "https:" ? "wss" : "ws";
  const seriesUrl = me.dataset.url + location.search;
  const projectId = encodeURIComponent(me.dataset.project);
  const hadSamples = me.dataset.hadSamples === "1", hadInstances = me.dataset.hadInstances === "1";
  const engines = me.dataset.engines || "";
  let pending = null, busy = false;

  function figure(value, digits) { return value === null || value === undefined ? "–" : Number(value).toFixed(digits); }
  function cell(text, cls) {
    const td = document.createElement("td");
    if (cls) td.className = cls;
    td.textContent = text;  // user-sent labels (URLs, model names) as text, never HTML
    return td;
  }
  function drawLatest(rows) {
    const table = document.getElementById("engines-table");
    if (!table || !Array.isArray(rows)) return;
    const kvLimit = Number(table.dataset.kvThreshold);
    const body = document.createElement("tbody");
    rows.forEach((r) => {
      const tr = document.createElement("tr");
      tr.dataset.instance = `engine=${r.engine},target=${r.target}` + (r.model ? `,model=${r.model}` : "");
      tr.appendChild(cell(r.label));
      tr.appendChild(cell(r.host || "–"));
      tr.appendChild(cell(r.last_seen || "–"));
      tr.appendChild(cell(figure(r.requests_running, 0), "num"));
      tr.appendChild(cell(figure(r.requests_waiting, 0), "num"));
      const kv = r.kv_cache_usage;
      tr.appendChild(cell(figure(kv, 1), kv !== null && kv !== undefined && kv >= kvLimit ? "num over" : "num"));
      body.appendChild(tr);
    });
    table.replaceChild(body, table.tBodies[0]);
    table.hidden = rows.length === 0;
  }
  function refresh() {
    pending = null;
    if (busy) { pending = setTimeout(refresh, 1000); return; }
    busy = true;
    fetch(seriesUrl, { credentials: "same-origin", headers: { Accept: "application/json" } })
      .then((r) => (r.ok ? r.json() : null))
      .then((body) => {
        if (!body) return;
        const hasSamples = body.newest_sample !== null, hasInstances = (body.instances || []).length > 0;
        if (hasSamples !== hadSamples || hasInstances !== hadInstances || (body.engines || []).join(",") !== engines) {
          location.reload();
          return;
        }
        window.tracedashCharts.drawFigures(body.figures);
        drawLatest(body.latest);
        document.body.dataset.enginesRefreshed = String(Number(document.body.dataset.enginesRefreshed || 0) + 1);
      })
      .finally(() => { busy = false; });
  }
  function connect() {
    const ws = new WebSocket(`${proto}://${location.host}/ws/projects/${projectId}/traces/`);
    ws.onopen = () => { document.getElementById("live-status").hidden = false; };
    ws.onmessage = (msg) => {
      const event = JSON.parse(msg.data);
      if (event.type !== "resources.ingested" && event.type !== "traces.summarized") return;
      if (!pending) pending = setTimeout(refresh, 500);  // one refresh per burst of events
    };
    ws.onclose = (e) => {
      document.getElementById("live-status").hidden = true;
      if (e.code !== 4403) setTimeout(connect, 3000);
    };
  }
  connect();
})();
