// The rule editor: the threshold's label names the unit of the metric chosen (%, ms, °C, …).
// The units come from the threshold input's data-units attribute (alerts.forms.METRIC_UNITS).
(function () {
  "use strict";
  var metric = document.querySelector("select[data-rule-metric]");
  var threshold = document.getElementById("id_threshold");
  var label = document.querySelector("label[for='id_threshold']");
  if (!metric || !threshold || !label || !threshold.dataset.units) return;
  var units = JSON.parse(threshold.dataset.units);

  function draw() {
    var unit = units[metric.value];
    label.textContent = unit ? "Threshold (" + unit + "):" : "Threshold:";
  }
  metric.addEventListener("change", draw);
  draw();
})();
