// Compare page: choosing a mode reloads the page in that mode.
document.getElementById("mode-select").addEventListener("change", (e) => {
  const mode = e.target.value;
  location.assign(`?mode=${encodeURIComponent(mode)}`);
});
