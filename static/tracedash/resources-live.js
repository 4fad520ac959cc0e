// Live resources: when samples (or spans) of this project arrive, re-read the series and redraw in
// place: the charts and the latest-figures table together, from one JSON answer, so the table never
// says 40 % while the chart beside it says 91 %. Only a window that ends "now" (a preset:
// data-live="1") moves; an absolute window stays. When the first GPU reports to a page that showed
// "no GPU has reported" (or the last one leaves), or the first host, the page reloads: its set of charts changes.
// The script tag carries data-url (the series JSON), data-project (the project id), data-live and
// data-has-gpu.
(function () {
  "use strict";
  const me = document.currentScript;
  if (me.dataset.live !== "1") return;
  const proto = location.protocol === "https:" ? "wss" : "ws";
  const seriesUrl = me.dataset.url + location.search;
  const projectId = encodeURIComponent(me.dataset.project);
  const hadGpu = me.dataset.hasGpu === "1", hadHosts = me.dataset.hasHosts === "1";
  let pending = null, busy = false;

  function figure(value, digits) { return value === null || value === undefined ? "–" : Number(value).toFixed(digits); }
  function cell(text, cls) {
    const td = document.createElement("td");
    if (cls) td.className = cls;
    td.textContent = text;
    return td;
  }
  function drawLatest(rows) {
    const table = document.getElementById("latest-table");
    if (!table || !Array.isArray(rows)) return;
    const cpuLimit = Number(table.dataset.cpuThreshold), memLimit = Number(table.dataset.gpuMemoryThreshold);
    const body = document.createElement("tbody");
    rows.forEach((r) => {
      const tr = document.createElement("tr");
      tr.dataset.host = r.host;
      tr.dataset.gpu = String(r.gpu_index);
      tr.appendChild(cell(r.host));
      tr.appendChild(cell(r.gpu_index < 0 ? "host" : `GPU ${r.gpu_index}${r.gpu_name ? " · " + r.gpu_name : ""}`));
      tr.appendChild(cell(r.last_seen));
      const over = (v, limit, strict) => v !== null && (strict ? v > limit : v >= limit);
      tr.appendChild(cell(figure(r.cpu_percent, 1), over(r.cpu_percent, cpuLimit, true) ? "num over" : "num"));
      tr.appendChild(cell(figure(r.memory_percent, 1), "num"));
      tr.appendChild(cell(figure(r.gpu_utilization, 1), "num"));
      tr.appendChild(cell(figure(r.gpu_memory_percent, 1), over(r.gpu_memory_percent, memLimit, false) ? "num over" : "num"));
      tr.appendChild(cell(figure(r.gpu_temperature, 0), "num"));
      tr.appendChild(cell(figure(r.gpu_power_watts, 0), "num"));
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
        const hasHosts = Array.isArray(body.devices) && body.devices.some((d) => d.gpu_index < 0);
        if ((typeof body.has_gpu === "boolean" && body.has_gpu !== hadGpu) || hasHosts !== hadHosts) { location.reload(); return; }
        window.tracedashCharts.drawFigures(body.figures);
        drawLatest(body.latest);
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
