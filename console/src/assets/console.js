// Edgeloop console: the one script, ours. A part of a page marked
// data-live="<url>" reloads itself from that URL every two seconds until
// the part it gets back says data-final (a rollout that has ended).
// Pages work without it; it only saves pressing reload.
"use strict";
(function () {
  const EVERY_MS = 2000;
  function follow(el) {
    const url = el.getAttribute("data-live");
    let timer = null;
    async function tick() {
      try {
        const res = await fetch(url, { credentials: "same-origin", cache: "no-store" });
        if (res.redirected || !res.ok) {
          // Logged out or gone: stop; the next navigation says why.
          return;
        }
        const html = await res.text();
        const focused = document.activeElement && el.contains(document.activeElement);
        el.innerHTML = html;
        if (focused) {
          const first = el.querySelector("button, a, summary");
          if (first) first.focus();
        }
        if (el.querySelector("[data-final]")) return;
      } catch (e) {
        // A network blip: try again on the next tick.
      }
      timer = setTimeout(tick, EVERY_MS);
    }
    if (!el.querySelector("[data-final]")) timer = setTimeout(tick, EVERY_MS);
    return () => clearTimeout(timer);
  }
  document.querySelectorAll("[data-live]").forEach(follow);
})();
