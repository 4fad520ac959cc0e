// Copy buttons, on every page: <button data-copy="ELEMENT-ID" data-copy-what="the key">Copy</button>
// copies that element's text and says "Copied" for a moment; where the page has a #copy-status
// element it also says there what was copied, or that copying failed and the text must be copied
// by hand. No inline handlers (CSP).
(function () {
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
  function report(button, copied) {
    const what = button.dataset.copyWhat || "the text";
    const status = document.getElementById("copy-status");
    if (status) {
      status.textContent = copied ? `Copied ${what} to the clipboard.`
        : `Could not copy ${what}: select it and copy it by hand.`;
    }
    if (!copied) return;
    const label = button.dataset.label || button.textContent;
    button.dataset.label = label;
    button.textContent = "Copied";
    button.dataset.copied = "1";
    setTimeout(() => { button.textContent = label; }, 1500);
  }
  document.addEventListener("click", (event) => {
    const button = event.target.closest("button[data-copy]");
    if (!button) return;
    const source = document.getElementById(button.dataset.copy);
    if (!source) return;
    const text = source.textContent.trim();
    if (navigator.clipboard && window.isSecureContext) {
      navigator.clipboard.writeText(text).then(() => report(button, true), () => report(button, fallbackCopy(text)));
    } else {
      report(button, fallbackCopy(text));
    }
  });
})();
