"""The report page's static parts: its stylesheet, the error-capturing script that runs first,
and the script that draws every figure and records what rendered (read by the browser test)."""

from __future__ import annotations

STYLE = """
body { font: 14px/1.45 system-ui, -apple-system, "Segoe UI", sans-serif; margin: 0 auto;
       max-width: 1500px; padding: 0 24px 48px; color: #222; }
h1 { font-size: 24px; margin: 24px 0 4px; } h2 { font-size: 19px; margin-top: 36px;
     border-bottom: 1px solid #ddd; padding-bottom: 4px; } h3 { font-size: 15px; }
p.lead { color: #555; margin-top: 0; }
table { border-collapse: collapse; margin: 8px 0 16px; font-size: 13px; }
th, td { border: 1px solid #ddd; padding: 4px 8px; text-align: left; vertical-align: top; }
thead th { background: #f4f6f8; } td.num { text-align: right; font-variant-numeric: tabular-nums; }
.table-wrap { overflow-x: auto; }
.grid { display: grid; grid-template-columns: repeat(auto-fit, minmax(560px, 1fr)); gap: 12px; }
.figure { min-height: 260px; border: 1px solid #eee; border-radius: 4px; }
pre.definitions { white-space: pre-wrap; background: #f8f8f8; padding: 10px 12px;
                  border-radius: 4px; font-size: 13px; }
.hidden { display: none; }
"""

# Runs before anything else on the page, so that any later failure (or injected script) is
# recorded in #js-errors instead of passing silently.
ERROR_CAPTURE_JS = """
(function () {
  var errors = [];
  function record(message) {
    errors.push(String(message));
    var el = document.getElementById("js-errors");
    if (el) { el.textContent = JSON.stringify(errors); }
  }
  window.__reportRecordError = record;
  window.__reportErrors = errors;
  window.addEventListener("error", function (e) {
    record("error: " + (e.message || e.type) + (e.filename ? " at " + e.filename + ":" +
      e.lineno : ""));
  }, true);
  window.addEventListener("unhandledrejection", function (e) {
    record("unhandled rejection: " + ((e.reason && e.reason.stack) || e.reason));
  });
  var consoleError = console.error;
  console.error = function () {
    record("console.error: " + Array.prototype.join.call(arguments, " "));
    return consoleError.apply(console, arguments);
  };
  window.alert = function (message) { record("alert: " + message); };
})();
"""

# Draws each div.figure from its JSON <script>, then writes #render-status: per figure id the
# number of traces and of non-empty drawn marks (lines, fills, points, bars) in its SVG.
RENDER_JS = """
(function () {
  var record = window.__reportRecordError;
  var start = performance.now();
  var divs = Array.prototype.slice.call(document.querySelectorAll("div.figure"));
  var jobs = divs.map(function (div) {
    try {
      var spec = JSON.parse(document.getElementById(div.id + "-data").textContent);
      var config = {responsive: true, displaylogo: false};
      return Plotly.newPlot(div, spec.data, spec.layout, config).catch(function (e) {
        record("plot " + div.id + ": " + e);
      });
    } catch (e) {
      record("plot " + div.id + ": " + e);
      return Promise.resolve();
    }
  });
  Promise.all(jobs).then(function () {
    var figures = {};
    divs.forEach(function (div) {
      var marks = 0;
      div.querySelectorAll(".main-svg .trace path").forEach(function (p) {
        var d = p.getAttribute("d") || "";
        if (d.length > 4 && d !== "M0,0Z") { marks += 1; }
      });
      figures[div.id] = {
        traces: (div.data || []).length,
        marks: marks,
        svgs: div.querySelectorAll(".main-svg").length
      };
    });
    var status = {figures: figures, render_ms: performance.now() - start};
    document.getElementById("render-status").textContent = JSON.stringify(status);
    // Errors raised before #js-errors existed (early in <body>) are only in the array.
    document.getElementById("js-errors").textContent = JSON.stringify(window.__reportErrors);
    document.body.setAttribute("data-rendered", "true");
  });
})();
"""
