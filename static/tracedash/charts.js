// tracedash charts: every <div class="chart" data-figure="ID"> is drawn with plotly from the
// figure JSON in <script type="application/json" id="ID"> (written by Django's json_script, so
// user strings arrive escaped). A point whose customdata is a same-site path ("/traces/?…") is a
// link: clicking it opens the traces behind that point. With the unified hover ("x unified") a
// click reports every series at that x; the link followed is that of the series under the
// pointer (the bar that holds it, else the nearest line point), never merely the first series.
(function () {
  "use strict";
  var CONFIG = { displaylogo: false, responsive: true };

  function linkOf(point) {
    var target = point && point.customdata;
    if (Array.isArray(target)) target = target[0];
    return typeof target === "string" && target.charAt(0) === "/" && target.charAt(1) !== "/" ? target : null;
  }

  // The point's vertical extent in pixels from the top of the chart element: a bar from its base
  // to its top (stacked bars on the same axis pile up in trace order), a marker its own height.
  function extent(el, point, stacks) {
    var axis = point.yaxis;
    var value = Number(point.y);
    if (!axis || typeof axis.l2p !== "function" || point.y === null || point.y === undefined || isNaN(value)) return null;
    var base = 0;
    var bar = point.data && point.data.type === "bar";
    if (bar && el._fullLayout && el._fullLayout.barmode === "stack") {
      var key = (axis._id || "y") + "|" + (value < 0 ? "-" : "+");
      base = stacks[key] || 0;
      stacks[key] = base + value;
    }
    var a = axis._offset + axis.l2p(base + value);
    if (!bar) return { top: a - 4, bottom: a + 4, bar: false }; // a marker and a little slack
    var b = axis._offset + axis.l2p(base);
    return { top: Math.min(a, b), bottom: Math.max(a, b), bar: true };
  }

  // The point of the click whose series is under the pointer; the first linked one when the
  // click carries no position (a keyboard or synthetic click).
  function clickedPoint(el, event) {
    var points = ((event && event.points) || []).filter(function (p) { return linkOf(p); });
    if (points.length < 2) return points[0] || null;
    var mouse = event.event;
    if (!mouse || typeof mouse.clientY !== "number") return points[0];
    var y = mouse.clientY - el.getBoundingClientRect().top;
    var stacks = {};
    var ordered = ((event && event.points) || []).slice().sort(function (a, b) { return a.curveNumber - b.curveNumber; });
    var best = null;
    var bestDistance = Infinity;
    ordered.forEach(function (point) {
      var span = extent(el, point, stacks);
      if (!span || !linkOf(point)) return;
      var distance = y < span.top ? span.top - y : y > span.bottom ? y - span.bottom : 0;
      if (span.bar) distance += 0.5; // a line's marker drawn over a bar wins at the same spot
      if (distance < bestDistance) { best = point; bestDistance = distance; }
    });
    return best || points[0];
  }

  function draw(el, figure) {
    var config = Object.assign({}, CONFIG, figure.config || {});
    var drawn = window.Plotly.react(el, figure.data || [], figure.layout || {}, config);
    if (!el.dataset.linked) {
      el.dataset.linked = "1";
      el.on("plotly_click", function (event) {
        var target = linkOf(clickedPoint(el, event));
        if (target) window.location.assign(target);
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

  window.tracedashCharts = { draw: draw, render: render, renderAll: renderAll, drawFigures: drawFigures,
                             clickedPoint: clickedPoint };
  if (document.readyState === "loading") {
    document.addEventListener("DOMContentLoaded", function () { renderAll(); });
  } else {
    renderAll();
  }
})();
