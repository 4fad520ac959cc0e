// tracedash charts: every <div class="chart" data-figure="ID"> is drawn with plotly from the
// figure JSON in <script type="application/json" id="ID"> (written by Django's json_script, so
// user strings arrive escaped). A point whose customdata is a same-site path ("/traces/?…") is a
// link: clicking it opens the traces behind that point.
(function () {
  "use strict";
  var CONFIG = { displaylogo: false, responsive: true };

  function draw(el, figure) {
    var config = Object.assign({}, CONFIG, figure.config || {});
    var drawn = window.Plotly.react(el, figure.data || [], figure.layout || {}, config);
    if (!el.dataset.linked) {
      el.dataset.linked = "1";
      el.on("plotly_click", function (event) {
        var point = event && event.points && event.points[0];
        var target = point && point.customdata;
        if (Array.isArray(target)) target = target[0];
        if (typeof target === "string" && target.charAt(0) === "/" && target.charAt(1) !== "/") {
          window.location.assign(target);
        }
      });
    }
    return drawn;
  }

  function render(el) {
    var source = document.getElementById(el.dataset.figure);
    if (!source) return null;
    return draw(el, JSON.parse(source.textContent));
  }

  function renderAll(root) {
    (root || document).querySelectorAll(".chart[data-figure]").forEach(render);
  }

  // Redraw from a JSON answer's {ID: figure} map (the live pages' refresh), each into its chart.
  function drawFigures(figures) {
    Object.keys(figures || {}).forEach(function (id) {
      var el = document.querySelector('.chart[data-figure="' + CSS.escape(id) + '"]');
      if (el) draw(el, figures[id]);
    });
  }

  window.tracedashCharts = { draw: draw, render: render, renderAll: renderAll, drawFigures: drawFigures };
  if (document.readyState === "loading") {
    document.addEventListener("DOMContentLoaded", function () { renderAll(); });
  } else {
    renderAll();
  }
})();
