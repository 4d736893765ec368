// The PVM console's only script (served by PVM itself; the pages work without it).
// "/" focuses the page's search or filter box; elements with data-refresh="<seconds>" reload their own
// content from the same URL in place (the pools page), so a live view needs no page reload.
(function () {
  "use strict";
  document.addEventListener("keydown", function (event) {
    if (event.key !== "/" || event.ctrlKey || event.metaKey || event.altKey) return;
    var target = event.target;
    if (target && (target.tagName === "INPUT" || target.tagName === "TEXTAREA" || target.tagName === "SELECT")) return;
    var box = document.querySelector("[data-focus-key]");
    if (box) { event.preventDefault(); box.focus(); }
  });
  function refresh(element) {
    var seconds = Number(element.getAttribute("data-refresh")) || 5;
    window.setTimeout(function () {
      fetch(window.location.href, { credentials: "same-origin", headers: { "Accept": "text/html" } })
        .then(function (answer) { return answer.ok ? answer.text() : Promise.reject(answer.status); })
        .then(function (html) {
          var page = new DOMParser().parseFromString(html, "text/html");
          var fresh = page.getElementById(element.id);
          if (fresh) { element.innerHTML = fresh.innerHTML; }
          var stamp = document.querySelector("[data-refreshed]");
          if (stamp) { stamp.textContent = new Date().toLocaleTimeString(); }
        })
        .catch(function (why) {
          var stamp = document.querySelector("[data-refreshed]");
          if (stamp) { stamp.textContent = "refresh failed (" + why + "); retrying"; }
        })
        .then(function () { refresh(element); });
    }, seconds * 1000);
  }
  document.addEventListener("DOMContentLoaded", function () {
    document.querySelectorAll("[data-refresh][id]").forEach(refresh);
  });
})();
