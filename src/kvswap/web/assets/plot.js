// A small plot of the last minutes, drawn as inline SVG (no library): the tokens/s of each
// answer this page received (its final `timings`), and the server's mind switch time from
// /metrics (engine milliseconds spent seating minds, per mind seated, between two polls).

const WINDOW_MS = 5 * 60 * 1000;
const SVG = "http://www.w3.org/2000/svg";
const W = 320;
const H = 140;
const PAD = { left: 30, right: 30, top: 10, bottom: 18 };
const SWITCH_MS = "llamacpp:mind_switch_ms_total";
const SEATED = [
  "llamacpp:mind_hits_ram_total",
  "llamacpp:mind_hits_disk_total",
  "llamacpp:mind_new_total",
];

function el(name, attrs, text) {
  const node = document.createElementNS(SVG, name);
  for (const [k, v] of Object.entries(attrs)) node.setAttribute(k, String(v));
  if (text !== undefined) node.textContent = text;
  return node;
}

function clock(at) {
  return new Date(at).toLocaleTimeString();
}

export class Plot {
  constructor(svg, caption, { metrics }) {
    this.svg = svg;
    this.caption = caption;
    this.metrics = metrics;
    this.tps = []; // { at, value }
    this.switchMs = []; // { at, value }
    this.prev = null; // the last /metrics seen
  }

  addAnswer(tokensPerSecond, at = Date.now()) {
    if (Number.isFinite(tokensPerSecond) && tokensPerSecond > 0) {
      this.tps.push({ at, value: tokensPerSecond });
      this.draw();
    }
  }

  // Successive /metrics: a point for each poll interval in which minds were seated.
  addMetrics(metrics, at) {
    if (!metrics || !(SWITCH_MS in metrics)) return;
    const prev = this.prev;
    this.prev = metrics;
    if (!prev) return;
    const seated = SEATED.reduce((n, name) => n + (metrics[name] || 0) - (prev[name] || 0), 0);
    const ms = metrics[SWITCH_MS] - prev[SWITCH_MS];
    if (seated > 0 && ms >= 0) {
      this.switchMs.push({ at, value: ms / seated });
      this.draw();
    }
  }

  draw(now = Date.now()) {
    const keep = (points) => points.filter((p) => now - p.at <= WINDOW_MS);
    this.tps = keep(this.tps);
    this.switchMs = keep(this.switchMs);
    const maxTps = Math.max(1, ...this.tps.map((p) => p.value));
    const maxMs = Math.max(1, ...this.switchMs.map((p) => p.value));
    const x = (at) =>
      PAD.left + ((at - (now - WINDOW_MS)) / WINDOW_MS) * (W - PAD.left - PAD.right);
    const y = (v, max) => H - PAD.bottom - (v / max) * (H - PAD.top - PAD.bottom);

    const nodes = [
      el("line", {
        class: "axis",
        x1: PAD.left,
        y1: H - PAD.bottom,
        x2: W - PAD.right,
        y2: H - PAD.bottom,
      }),
      el("line", { class: "axis", x1: PAD.left, y1: PAD.top, x2: PAD.left, y2: H - PAD.bottom }),
      el("line", {
        class: "axis",
        x1: W - PAD.right,
        y1: PAD.top,
        x2: W - PAD.right,
        y2: H - PAD.bottom,
      }),
      el("text", { class: "label", x: 2, y: PAD.top + 8 }, maxTps.toFixed(0)),
      el("text", { class: "label", x: 2, y: H - PAD.bottom }, "0"),
      el("text", { class: "label", x: W - PAD.right + 3, y: PAD.top + 8 }, `${maxMs.toFixed(1)}`),
      el("text", { class: "label", x: W - PAD.right + 3, y: H - PAD.bottom }, "0"),
      el("text", { class: "label", x: PAD.left, y: H - 4 }, "-5 min"),
      el("text", { class: "label", x: W - PAD.right - 18, y: H - 4 }, "now"),
    ];
    for (const p of this.tps) {
      const dot = el("circle", { class: "tps", cx: x(p.at), cy: y(p.value, maxTps), r: 3 });
      dot.append(el("title", {}, `${clock(p.at)}: ${p.value.toFixed(1)} tokens/s`));
      nodes.push(dot);
    }
    for (const p of this.switchMs) {
      const cx = x(p.at);
      const cy = y(p.value, maxMs);
      const mark = el("rect", { class: "switch", x: cx - 3, y: cy - 3, width: 6, height: 6 });
      mark.append(el("title", {}, `${clock(p.at)}: ${p.value.toFixed(2)} ms per mind switch`));
      nodes.push(mark);
    }
    this.svg.replaceChildren(...nodes);
    this.svg.dataset.nTps = String(this.tps.length);
    this.svg.dataset.nSwitch = String(this.switchMs.length);
    this.caption.textContent = this.metrics
      ? `● tokens/s of this page's answers (left axis) · ■ ms per mind switch on the server (right axis, from /metrics), last 5 minutes`
      : `● tokens/s of this page's answers, last 5 minutes (start kvswap with --metrics to plot switch times too)`;
  }
}
