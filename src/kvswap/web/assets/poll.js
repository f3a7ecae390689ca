// The server's live state, polled while the page is visible (a hidden tab asks nothing):
// GET /pages (minds, page store, disk), GET /slots, and GET /metrics when /props says the
// server serves it. Each round hands every listener one snapshot:
//   { pages, slots, metrics, errors: { pages, slots, metrics }, at }
// where a source that failed is null and its ApiError is in `errors`.

import { getJson, getText } from "./api.js";

// Prometheus text as { name: value } (kvswap writes no labels).
export function parseMetrics(text) {
  const out = {};
  for (const line of text.split("\n")) {
    if (!line || line.startsWith("#")) continue;
    const cut = line.lastIndexOf(" ");
    const value = Number(line.slice(cut + 1));
    if (cut > 0 && Number.isFinite(value)) out[line.slice(0, cut)] = value;
  }
  return out;
}

async function settle(promise) {
  try {
    return [await promise, null];
  } catch (err) {
    return [null, err];
  }
}

export class Poller {
  constructor({ intervalMs, metrics }) {
    this.intervalMs = intervalMs;
    this.metrics = metrics; // /props endpoint_metrics
    this.listeners = [];
    this.timer = 0;
    this.running = false;
    this.inFlight = null;
    this.last = null;
    document.addEventListener("visibilitychange", () => {
      if (!document.hidden && this.running) this.refresh();
    });
  }

  subscribe(fn) {
    this.listeners.push(fn);
    if (this.last) fn(this.last);
  }

  start() {
    this.running = true;
    this.refresh();
  }

  stop() {
    this.running = false;
    clearTimeout(this.timer);
  }

  // One round now (a round already on its way is shared); the next one follows the interval.
  refresh() {
    if (!this.inFlight) {
      this.inFlight = this.round().finally(() => {
        this.inFlight = null;
        this.schedule();
      });
    }
    return this.inFlight;
  }

  schedule() {
    clearTimeout(this.timer);
    if (this.running && !document.hidden) {
      this.timer = setTimeout(() => this.refresh(), this.intervalMs);
    }
  }

  async round() {
    const [pages, slots, metrics] = await Promise.all([
      settle(getJson("pages")),
      settle(getJson("slots")),
      this.metrics ? settle(getText("metrics").then(parseMetrics)) : [null, null],
    ]);
    this.last = {
      pages: pages[0],
      slots: slots[0],
      metrics: metrics[0],
      errors: { pages: pages[1], slots: slots[1], metrics: metrics[1] },
      at: Date.now(),
    };
    for (const fn of this.listeners) fn(this.last);
    return this.last;
  }
}
