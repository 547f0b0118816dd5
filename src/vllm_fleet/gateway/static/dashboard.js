// Polls /dashboard/state.json and redraws the worker table. No framework, no build step.
"use strict";

const REFRESH_MS = 2000;
let previous = null;  // last state, to turn cumulative counters into rates

function apiKey() {
  const match = /(?:^|&)key=([^&]+)/.exec(location.hash.slice(1));
  if (match) {
    sessionStorage.setItem("fleet-key", decodeURIComponent(match[1]));
    history.replaceState(null, "", location.pathname);  // keep the key out of the address bar
  }
  return sessionStorage.getItem("fleet-key");
}

function cell(row, text, cls) {
  const td = document.createElement("td");
  td.textContent = text;
  if (cls) td.className = cls;
  row.appendChild(td);
}

function render(state) {
  const body = document.getElementById("workers");
  body.replaceChildren();
  for (const w of state.workers) {
    const row = document.createElement("tr");
    row.dataset.address = w.address;
    const load = w.load || {};
    cell(row, w.address);
    cell(row, w.model || "?");
    cell(row, w.device || "");
    cell(row, w.state, w.state);
    cell(row, w.breaker, w.breaker);
    // In flight through this gateway: interactive + batch (service classes; batch fills idle capacity).
    cell(row, w.batch_in_flight ? `${w.in_flight - w.batch_in_flight} + ${w.batch_in_flight} batch` : w.in_flight);
    cell(row, load.running ?? "");
    cell(row, load.waiting ?? "");
    cell(row, load.kv_cache_usage === undefined ? "" : (100 * load.kv_cache_usage).toFixed(0) + "%");
    cell(row, load.output_tokens_per_s === undefined ? "" : load.output_tokens_per_s.toFixed(0));
    // Prefix-cache hits: what this gateway's cache index predicted for the prompts it sent there,
    // next to the engine's own count (all its traffic); "stale" while its event stream is not in step.
    const cache = w.cache || {};
    const pct = (x) => (x === null || x === undefined) ? "–" : (100 * x).toFixed(0) + "%";
    cell(row, cache.events === undefined ? "" :
      `${pct(cache.predicted_hit_rate)} / ${pct(cache.engine_hit_rate)}` + (cache.events === "in step" ? "" : ` (${cache.events})`)
      // Prompt tokens sent here while another worker held more of them: prefill spent for load.
      + (cache.copied_share ? `, ${pct(cache.copied_share)} copied` : "")
      // How full the index says its cache is: new prefixes go to the emptier caches.
      + (cache.kv_blocks ? `, cache ${pct(cache.blocks / cache.kv_blocks)} full` : ""),
      cache.events === "stale" ? "stale" : "");
    body.appendChild(row);
  }
  const serving = state.workers.filter((w) => w.state === "serving").length;
  // --processes N: how many gateway processes this view adds up (fewer while one restarts).
  const processes = state.processes ? `gateway processes ${state.processes.answered}/${state.processes.serving} · ` : "";
  document.getElementById("status").textContent =
    `${serving}/${state.workers.length} workers serving · models: ${state.models.join(", ") || "none"} · ` +
    processes + `updated ${new Date(state.time * 1000).toLocaleTimeString()}`;
  renderRates(state);
  // Batch requests waiting for a worker with slack, and why (the router's account).
  const waiting = state.batch_waiting || {};
  document.getElementById("batch-waiting").textContent = waiting.waiting ?
    `${waiting.waiting} batch request(s) waiting for batch capacity for ${waiting.waited_s.toFixed(0)} s: ${waiting.reason}` : "";
  previous = state;
}

function renderRates(state) {
  const rates = document.getElementById("rates");
  if (!previous || !state.requests) { rates.textContent = ""; return; }
  const dt = Math.max(0.001, state.time - previous.time);
  const parts = [];
  for (const [name, value] of Object.entries(state.requests)) {
    const rate = (value - (previous.requests[name] || 0)) / dt;
    parts.push(`<span>${name}: ${rate.toFixed(1)}/s</span>`);
  }
  rates.innerHTML = parts.join("");
}

async function refresh() {
  const headers = {};
  const key = apiKey();
  if (key) headers["Authorization"] = "Bearer " + key;
  try {
    const reply = await fetch("/dashboard/state.json", { headers, cache: "no-store" });
    if (reply.status === 401 || reply.status === 403) {
      document.getElementById("status").textContent =
        "this gateway needs an admin API key: open /dashboard#key=<key>";
      return;
    }
    render(await reply.json());
  } catch (err) {
    document.getElementById("status").textContent = "cannot reach the gateway: " + err;
  }
}

refresh();
setInterval(refresh, REFRESH_MS);
