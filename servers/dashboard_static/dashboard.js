// harnesslab dashboard: the page is rendered on the server; this script only keeps it live.
// Every 2 s it asks /dashboard/live whether anything changed (204: no) and swaps in the
// sections the server rendered; it ticks the running iterations' elapsed time and loads a
// candidate's diff when a ledger row is clicked. No framework, no build step, no CDN.
(function () {
  "use strict";
  const body = document.body;
  const base = body.dataset.base || "/dashboard";
  const everyMs = 2000;
  let version = body.dataset.version || "";
  // The server's clock minus ours: elapsed times are the server's.
  let skew = parseFloat(body.dataset.now || "0") - Date.now() / 1000;

  function say(text) {
    const el = document.getElementById("live-state");
    if (el) el.textContent = text;
  }

  function duration(s) {
    s = Math.max(0, s);
    if (s < 60) return Math.round(s) + "s";
    if (s < 3600) return Math.floor(s / 60) + "m" + String(Math.floor(s % 60)).padStart(2, "0") + "s";
    return Math.floor(s / 3600) + "h" + String(Math.floor((s % 3600) / 60)).padStart(2, "0") + "m";
  }

  function tick() {
    const now = Date.now() / 1000 + skew;
    document.querySelectorAll("[data-since]").forEach(function (el) {
      el.textContent = duration(now - parseFloat(el.dataset.since));
    });
  }

  async function poll() {
    try {
      const r = await fetch(base + "/live?v=" + encodeURIComponent(version), {
        cache: "no-store",
        credentials: "same-origin",
      });
      if (r.status === 200) {
        const data = await r.json();
        if (data.error) {
          say(data.error);
        } else {
          version = data.v;
          body.dataset.version = version;
          skew = data.now - Date.now() / 1000;
          Object.keys(data.sections).forEach(function (id) {
            const el = document.getElementById(id);
            if (el) el.innerHTML = data.sections[id];
          });
          say("live, updated " + new Date().toLocaleTimeString());
        }
      } else if (r.status !== 204) {
        say("the server answered " + r.status);
      }
    } catch (err) {
      say("server unreachable: retrying");
    }
    tick();
    setTimeout(poll, everyMs);
  }

  async function showDiff(candidate) {
    const panel = document.getElementById("diff");
    panel.textContent = "loading " + candidate + " …";
    try {
      const r = await fetch(base + "/diff?candidate=" + encodeURIComponent(candidate), {
        cache: "no-store",
        credentials: "same-origin",
      });
      panel.innerHTML = await r.text();
    } catch (err) {
      panel.textContent = "could not load the diff: " + err;
    }
    panel.scrollIntoView({ block: "start" });
  }

  function onPick(ev) {
    if (ev.type === "keydown" && ev.key !== "Enter") return;
    const row = ev.target.closest("[data-candidate]");
    if (row && row.dataset.candidate) showDiff(row.dataset.candidate);
  }

  document.addEventListener("click", onPick);
  document.addEventListener("keydown", onPick);
  setInterval(tick, 1000);
  setTimeout(poll, everyMs);
})();
