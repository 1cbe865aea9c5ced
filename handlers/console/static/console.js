// Live refresh without reloading: poll the page's JSON endpoint and swap in the fragments the server rendered.
// The fragments are HTML escaped by the server's templates; nothing else is inserted. An answer marked `final`
// (a what-if run that has finished) is the last one: polling stops.
(function () {
  "use strict";
  var main = document.querySelector("main[data-live]");
  if (!main) { return; }
  var url = main.getAttribute("data-live");
  var every = parseInt(main.getAttribute("data-every"), 10) || 2000;
  var seen = null;

  function mark(text, failed) {
    var live = document.getElementById("live");
    if (!live) { return; }
    if (failed) { live.textContent = text; }
    live.classList.toggle("off", !!failed);
  }

  function apply(data) {
    var version = JSON.stringify(data.version);
    if (version === seen) { return; }
    seen = version;
    Object.keys(data.fragments).forEach(function (id) {
      var node = document.getElementById(id);
      if (node) { node.innerHTML = data.fragments[id]; }
    });
    main.setAttribute("data-version", String(data.version));
  }

  function poll() {
    fetch(url, { headers: { "Accept": "application/json" }, credentials: "same-origin", cache: "no-store" })
      .then(function (response) {
        if (!response.ok) { throw new Error("HTTP " + response.status); }
        return response.json();
      })
      .then(function (data) { apply(data); mark("", false); return data.final === true; })
      .catch(function (error) { mark("disconnected (" + error.message + "), retrying", true); return false; })
      .then(function (final) { if (!final) { window.setTimeout(poll, every); } });
  }

  window.setTimeout(poll, every);
}());
