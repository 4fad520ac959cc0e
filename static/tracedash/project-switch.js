// The project picker in the top bar switches project as soon as a project is chosen.
// (A static file, not an inline onchange attribute: the Content-Security-Policy allows no inline script.)
document.addEventListener("DOMContentLoaded", () => {
  document.querySelectorAll("select[data-autosubmit]").forEach((select) => {
    select.addEventListener("change", () => select.form.submit());
  });
});
