// Copy buttons: <button data-copy="ELEMENT-ID">Copy</button> copies that element's text (a command
// shown on an empty page, say) and says "Copied" for a moment. No inline handlers (CSP).
(function () {
  "use strict";
  function fallback(text) {
    const area = document.createElement("textarea");
    area.value = text;
    area.setAttribute("readonly", "");
    area.style.position = "fixed";
    area.style.opacity = "0";
    document.body.appendChild(area);
    area.select();
    try { document.execCommand("copy"); } finally { area.remove(); }
  }
  document.addEventListener("click", (event) => {
    const button = event.target.closest("button[data-copy]");
    if (!button) return;
    const source = document.getElementById(button.dataset.copy);
    if (!source) return;
    const text = source.textContent.trim();
    const done = () => {
      const label = button.dataset.label || button.textContent;
      button.dataset.label = label;
      button.textContent = "Copied";
      button.dataset.copied = "1";
      setTimeout(() => { button.textContent = label; }, 1500);
    };
    if (navigator.clipboard && window.isSecureContext) navigator.clipboard.writeText(text).then(done, () => { fallback(text); done(); });
    else { fallback(text); done(); }
  });
})();
