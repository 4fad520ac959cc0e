// The trace page's review form: Good / Bad and a 1-5 rating sent without leaving the page
// (POST /traces/<id>/scores/, the session's CSRF token from the form), then the trace's scores
// listed again from the answer. Every value is set as text (textContent), never as HTML.
(function () {
  "use strict";
  var form = document.getElementById("trace-review");
  if (!form) return;
  var status = document.getElementById("review-status");
  var body = document.getElementById("trace-scores-body");
  var table = document.getElementById("trace-scores-table");
  var empty = document.getElementById("trace-scores-empty");

  function cell(row, text, code) {
    var td = document.createElement("td");
    if (code) {
      var c = document.createElement("code");
      c.textContent = text;
      td.appendChild(c);
    } else {
      td.textContent = text;
    }
    row.appendChild(td);
  }

  function render(scores) {
    while (body.firstChild) body.removeChild(body.firstChild);
    scores.forEach(function (s) {
      var tr = document.createElement("tr");
      cell(tr, s.name);
      cell(tr, s.value);
      cell(tr, s.source);
      cell(tr, s.author || "—");
      cell(tr, s.comment);
      if (s.span_id) cell(tr, s.span_id, true); else cell(tr, "trace");
      cell(tr, s.time);
      body.appendChild(tr);
    });
    table.hidden = scores.length === 0;
    empty.hidden = scores.length !== 0;
  }

  form.addEventListener("submit", function (event) {
    event.preventDefault();
    var data = new FormData(form, event.submitter || undefined);
    var buttons = form.querySelectorAll("button");
    buttons.forEach(function (b) { b.disabled = true; });
    status.textContent = "Saving…";
    form.dataset.state = "saving";
    fetch(form.action, {
      method: "POST", body: data, credentials: "same-origin",
      headers: {"Accept": "application/json", "X-CSRFToken": data.get("csrfmiddlewaretoken") || ""}
    }).then(function (response) {
      return response.json().then(function (answer) {
        if (!response.ok) {
          var message = answer && answer.error ? answer.error.message : "HTTP " + response.status;
          throw new Error(message);
        }
        render(answer.scores);
        status.textContent = "Saved.";
        form.elements.comment.value = "";
        form.dataset.state = "saved";
      });
    }).catch(function (error) {
      status.textContent = "Not saved: " + error.message;
      form.dataset.state = "failed";
    }).finally(function () {
      buttons.forEach(function (b) { b.disabled = false; });
    });
  });
  form.dataset.state = "ready";
}());
