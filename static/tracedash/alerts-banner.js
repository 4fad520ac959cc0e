// The live firing banner: listens on ws/projects/<id>/alerts/ and redraws the list with
// textContent only (rule names and labels are user data). Close code 4403 = not a member: stop.
(function () {
  "use strict";
  var banner = document.getElementById("alerts-banner");
  if (!banner || !window.WebSocket) return;
  var project = banner.dataset.project, url = banner.dataset.alertsUrl, delay = 1000;

  function draw(firing) {
    // Silenced alerts and informational (severity "info") rules never show in the banner.
    var shown = firing.filter(function (a) { return !a.silenced && a.severity !== "info"; });
    banner.hidden = shown.length === 0;
    banner.querySelector(".alerts-banner-count").textContent =
      shown.length + " alert" + (shown.length === 1 ? "" : "s") + " firing";
    var list = banner.querySelector(".alerts-banner-list");
    list.replaceChildren();
    shown.slice(0, 5).forEach(function (a, i) {
      if (i) list.appendChild(document.createTextNode(", "));
      var link = document.createElement("a");
      link.href = url;
      link.textContent = a.rule + (a.series ? " (" + a.series + ")" : "");
      list.appendChild(link);
    });
    banner.dispatchEvent(new CustomEvent("alerts:changed", { detail: shown }));
  }

  function connect() {
    var scheme = location.protocol === "https:" ? "wss://" : "ws://";
    var socket = new WebSocket(scheme + location.host + "/ws/projects/" + project + "/alerts/");
    socket.onopen = function () { delay = 1000; };
    socket.onmessage = function (event) {
      var message = JSON.parse(event.data);
      if (message.type === "alerts.changed") draw(message.firing || []);
    };
    socket.onclose = function (event) {
      if (event.code === 4403) return;
      setTimeout(connect, delay);
      delay = Math.min(delay * 2, 30000);
    };
  }
  connect();
})();
