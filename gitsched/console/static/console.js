// gitsched console: follow the log without a full reload.
// The server sends a `head` event (server-sent events) whenever the log's seq, the
// backend's health or the open branches' plans change; the page then fetches itself
// again and swaps in the new <main> and status line. No inline script, no CDN.
(function () {
  "use strict";
  var body = document.body;
  var base = body.getAttribute("data-base") || "";
  var version = body.getAttribute("data-version") || "";
  var live = document.getElementById("live");
  if (!live || !window.EventSource) {
    return;
  }
  var busy = false;
  var again = false;

  function setLive(ok, text) {
    live.textContent = text;
    live.className = ok ? "live" : "live off";
  }

  function swap(html) {
    var doc = new DOMParser().parseFromString(html, "text/html");
    ["main", "#status", "#problem"].forEach(function (selector) {
      var fresh = doc.querySelector(selector);
      var old = document.querySelector(selector);
      if (fresh && old) {
        old.replaceWith(fresh);
      }
    });
    live = document.getElementById("live") || live;
    var nextVersion = doc.body.getAttribute("data-version");
    if (nextVersion !== null) {
      version = nextVersion;
      body.setAttribute("data-version", nextVersion);
    }
    setLive(true, "live");
  }

  function reload() {
    if (busy) {
      again = true;
      return;
    }
    busy = true;
    fetch(window.location.href, { credentials: "same-origin", headers: { "X-Console-Refresh": "1" } })
      .then(function (response) {
        return response.ok ? response.text() : null;
      })
      .then(function (html) {
        if (html !== null) {
          swap(html);
        }
      })
      .catch(function () {
        setLive(false, "console unreachable");
      })
      .then(function () {
        busy = false;
        if (again) {
          again = false;
          reload();
        }
      });
  }

  var events = new EventSource(base + "/events");
  events.addEventListener("head", function (event) {
    var head = JSON.parse(event.data);
    setLive(true, "live");
    if (head.version !== version) {
      reload();
    }
  });
  events.onerror = function () {
    setLive(false, "reconnecting…");
  };
})();
