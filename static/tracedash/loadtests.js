// A running load test's page: polls its progress (loadtests:progress) every 2 s, shows the
// counters, and reloads the page (which then shows the report or the error) once the run ends.
(function () {
  "use strict";
  var box = document.getElementById("loadtest-progress");
  if (!box || box.dataset.status !== "running") return;
  var url = box.dataset.progressUrl;
  var counters = box.querySelector(".loadtest-counters");
  var status = box.querySelector(".loadtest-status");

  function show(data) {
    var p = data.progress || {};
    if (counters && p.sent !== undefined) {
      counters.textContent = p.elapsed_s + " s of " + p.planned_s + " s · sent " + p.sent + " · done " + p.done +
        " · errors " + p.errors + " · in flight " + p.in_flight;
    }
    box.dataset.polled = String(Number(box.dataset.polled || "0") + 1);
    if (data.finished) {
      if (status) status.textContent = data.status;
      location.reload();
      return false;
    }
    return true;
  }

  function poll() {
    fetch(url, { credentials: "same-origin", headers: { Accept: "application/json" } })
      .then(function (r) { return r.ok ? r.json() : null; })
      .then(function (data) { if (!data || show(data)) setTimeout(poll, 2000); })
      .catch(function () { setTimeout(poll, 5000); });
  }

  setTimeout(poll, 1000);
})();
