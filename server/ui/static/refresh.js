// Reloads the pending approvals every 5 s. The page works without it.
(function () {
  "use strict";
  var box = document.getElementById("pending");
  if (!box || !window.fetch) return;
  setInterval(function () {
    var a = document.activeElement;
    if (a && box.contains(a) && a.tagName === "INPUT") return; // the operator is typing a reason
    fetch("/ui/pending", { credentials: "same-origin", cache: "no-store" })
      .then(function (r) { return r.ok ? r.text() : Promise.reject(r.status); })
      .then(function (html) { box.innerHTML = html; })
      .catch(function () {});
  }, 5000);
})();
