// Settings page: "Copy" buttons for the new key and its snippets, and a confirmation before a key is
// revoked or a member removed. (A static file: the Content-Security-Policy allows no inline script.)
(() => {
  "use strict";

  function fallbackCopy(text) {
    // navigator.clipboard needs a secure context (https or localhost); elsewhere, copy a selection.
    const area = document.createElement("textarea");
    area.value = text;
    area.setAttribute("readonly", "");
    area.style.position = "fixed";
    area.style.opacity = "0";
    document.body.appendChild(area);
    area.select();
    let ok = false;
    try { ok = document.execCommand("copy"); } catch (e) { ok = false; }
    area.remove();
    return ok;
  }

  function report(button, message) {
    const status = document.getElementById("copy-status");
    if (status) status.textContent = message;
    const label = button.dataset.label || button.textContent;
    button.dataset.label = label;
    button.textContent = message.startsWith("Copied") ? "Copied" : label;
    window.setTimeout(() => { button.textContent = label; }, 2000);
  }

  function copy(button) {
    const target = document.getElementById(button.dataset.copy);
    if (!target) return;
    const text = target.textContent.trim();
    const what = button.dataset.copy === "new-key-secret" ? "the key" : "the snippet";
    const done = () => report(button, `Copied ${what} to the clipboard.`);
    const failed = () => report(button, `Could not copy ${what}: select it and copy it by hand.`);
    if (navigator.clipboard && navigator.clipboard.writeText) {
      navigator.clipboard.writeText(text).then(done, () => (fallbackCopy(text) ? done() : failed()));
    } else if (fallbackCopy(text)) {
      done();
    } else {
      failed();
    }
  }

  document.addEventListener("DOMContentLoaded", () => {
    document.querySelectorAll("button[data-copy]").forEach((button) => {
      button.addEventListener("click", () => copy(button));
    });
    document.querySelectorAll("form[data-confirm]").forEach((form) => {
      form.addEventListener("submit", (event) => {
        if (!window.confirm(form.dataset.confirm)) event.preventDefault();
      });
    });
    document.body.dataset.settingsReady = "1";
  });
})();
