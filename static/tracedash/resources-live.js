// Live resources: when samples (or spans) of this project arrive, re-read the series and redraw in
// place. Only a window that ends "now" (a preset: data-live="1") moves; an absolute window stays.
// The script tag carries data-url (the series JSON), data-project (the project id) and data-live.
(function () {
  "use strict";
  const me = document.currentScript;
  if (me.dataset.live !== "1") return;
  const proto = location.protocol === "https:" ? "wss" : "ws";
  const seriesUrl = me.dataset.url + location.search;
  const projectId = encodeURIComponent(me.dataset.project);
  let pending = null, busy = false;
  function refresh() {
    pending = null;
    if (busy) { pending = setTimeout(refresh, 1000); return; }
    busy = true;
    fetch(seriesUrl, { credentials: "same-origin", headers: { Accept: "application/json" } })
      .then((r) => (r.ok ? r.json() : null))
      .then((body) => {
        if (!body) return;
        window.tracedashCharts.drawFigures(body.figures);
        document.body.dataset.resourcesRefreshed = String(Number(document.body.dataset.resourcesRefreshed || 0) + 1);
      })
      .finally(() => { busy = false; });
  }
  function connect() {
    const ws = new WebSocket(`${proto}://${location.host}/ws/projects/${projectId}/traces/`);
    ws.onopen = () => { document.getElementById("live-status").hidden = false; };
    ws.onmessage = (msg) => {
      const event = JSON.parse(msg.data);
      if (event.type !== "resources.ingested" && event.type !== "traces.ingested") return;
      if (!pending) pending = setTimeout(refresh, 500);  // one refresh per burst of events
    };
    ws.onclose = (e) => {
      document.getElementById("live-status").hidden = true;
      if (e.code !== 4403) setTimeout(connect, 3000);
    };
  }
  connect();
})();
