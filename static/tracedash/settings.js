// Settings page: a confirmation before a key is revoked or a member removed (the Copy buttons of the
// new key and its snippets are copy.js's, loaded on every page). (A static file: the Content-Security-Policy allows no inline script.)
(() => {
  "use strict";

  document.addEventListener("DOMContentLoaded", () => {
    document.querySelectorAll("form[data-confirm]").forEach((form) => {
      form.addEventListener("submit", (event) => {
        if (!window.confirm(form.dataset.confirm)) event.preventDefault();
      });
    });
    document.body.dataset.settingsReady = "1";
  });
})();
