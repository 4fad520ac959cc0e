// Live overview: when traces of this project are summarised, re-read the overview and redraw the
// charts and tiles in place (a window ending "now" only; the template includes this script only then).
// The script tag carries data-url (the overview JSON) and data-project (the project id).
(function () {
  "use strict";
  const me = document.currentScript;
  const proto = location.protocol === "https:" ? "wss" : "ws";
  const url = me.dataset.url + location.search;
  const projectId = encodeURIComponent(me.dataset.project);
  let pending = null;
  function text(el, value) { if (el) el.textContent = value; }
  function refresh() {
    pending = null;
    fetch(url, { credentials: "same-origin", headers: { Accept: "application/json" } })
      .then((r) => (r.ok ? r.json() : null))
      .then((body) => {
        if (!body) return;
        // The page showed "no requests" (a card, no charts): the first requests bring the charts.
        if (document.getElementById("no-requests") && body.stats && body.stats.requests > 0) { location.reload(); return; }
        // Likewise the cache section: its first requests that consulted a cache bring its tiles and chart.
        if ((document.getElementById("cache-none") || document.getElementById("cache-idle"))
            && body.cache && body.cache.stats.consulted > 0) { location.reload(); return; }
        window.tracedashCharts.drawFigures(body.figures);
        if (body.group_figures) window.tracedashCharts.drawFigures(body.group_figures);  // ?group_by=…
        body.kpis.concat((body.cache && body.cache.kpis) || []).forEach((k) => {
          const tile = document.querySelector(`[data-kpi="${CSS.escape(k.key)}"]`);
          if (!tile) return;
          // money through the one formatter the server's templates share (static/tracedash/format.js)
          text(tile.querySelector(".value .num"), k.value === null ? "–"
            : k.unit === "USD" ? window.tracedashFormat.money(k.value) : k.value.toFixed(k.digits));
          // the tile's link to its traces follows the value (P99 → min_ms just under the new P99);
          // the server builds it (explorer_tags.kpi_traces_link), as for the page
          const link = tile.querySelector("a.kpi-traces");
          if (link && typeof k.traces_url === "string" && k.traces_url.startsWith("/traces/?")) link.setAttribute("href", k.traces_url);
          const delta = tile.querySelector(".delta");
          if (delta) {
            delta.className = `delta ${k.verdict}`;
            text(delta, k.change_percent === null ? "no previous data"
              : `${k.change_percent > 0 ? "+" : ""}${k.change_percent.toFixed(1)} % vs previous`);
          }
        });
        document.body.dataset.overviewRefreshed = String(Number(document.body.dataset.overviewRefreshed || 0) + 1);
      });
  }
  function connect() {
    const ws = new WebSocket(`${proto}://${location.host}/ws/projects/${projectId}/traces/`);
    ws.onmessage = (msg) => {
      const event = JSON.parse(msg.data);
      if (event.type === "traces.summarized" && !pending) pending = setTimeout(refresh, 1000);
    };
    ws.onclose = (e) => { if (e.code !== 4403) setTimeout(connect, 3000); };
  }
  connect();
})();
