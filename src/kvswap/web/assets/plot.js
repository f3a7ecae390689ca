// A small plot of the last minutes, drawn as inline SVG (no library): the tokens/s of each
// answer this page received (its final `timings`), and the server's mind switch time from
// /metrics (engine milliseconds spent seating minds, per mind seated, between two polls).

const WINDOW_MS = 5 * 60 * 1000;
const SVG = "http://www.w3.org/2000/svg";
const W = 320;
const H = 176;
// The legend sits above the plot area, the axis titles beside and below it.
const PAD = { left: 40, right: 40, top: 26, bottom: 34 };
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

// The frame: axes, their ticks and titles, and the legend of the two series.
function frame(maxTps, maxMs, metrics) {
  const bottom = H - PAD.bottom;
  const right = W - PAD.right;
  const middle = (PAD.top + bottom) / 2;
  const label = (x, y, text, anchor = "start") =>
    el("text", { class: "label", x, y, "text-anchor": anchor }, text);
  const title = (x, y, text, turn = 0) => {
    const at = { class: "axis-title", x: 0, y: 0, "text-anchor": "middle" };
    return el("text", { ...at, transform: `translate(${x} ${y}) rotate(${turn})` }, text);
  };
  const legend = el("g", { class: "legend" });
  legend.append(
    el("circle", { class: "tps", cx: PAD.left + 3, cy: 11, r: 3 }),
    label(PAD.left + 10, 14, "tokens/s of this page's answers"),
    el("rect", { class: "switch", x: PAD.left + 170, y: 8, width: 6, height: 6 }),
    label(PAD.left + 180, 14, metrics === false ? "switch ms: --metrics" : "ms per mind switch"),
  );
  return [
    el("line", { class: "axis", x1: PAD.left, y1: bottom, x2: right, y2: bottom }),
    el("line", { class: "axis", x1: PAD.left, y1: PAD.top, x2: PAD.left, y2: bottom }),
    el("line", { class: "axis", x1: right, y1: PAD.top, x2: right, y2: bottom }),
    label(PAD.left - 4, PAD.top + 8, maxTps.toFixed(0), "end"),
    label(PAD.left - 4, bottom, "0", "end"),
    label(right + 4, PAD.top + 8, metrics ? maxMs.toFixed(1) : "—"), // null: not known yet
    label(right + 4, bottom, "0"),
    label(PAD.left, bottom + 11, "-5 min"),
    label(right, bottom + 11, "now", "end"),
    title(12, middle, "tokens/s", -90),
    title(W - 10, middle, "ms per switch", 90),
    title((PAD.left + right) / 2, H - 6, "time (last 5 minutes)"),
    legend,
  ];
}

export class Plot {
  constructor(svg, caption, { metrics }) {
    this.svg = svg;
    this.caption = caption;
    this.metrics = metrics; // whether the server serves /metrics; null until /props says
    this.tps = []; // { at, value }
    this.switchMs = []; // { at, value }
    this.prev = null; // the last /metrics seen
  }

  setMetrics(metrics) {
    this.metrics = metrics;
    this.draw();
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

    const nodes = frame(maxTps, maxMs, this.metrics);
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
    this.svg.setAttribute("viewBox", `0 0 ${W} ${H}`);
    this.svg.replaceChildren(...nodes);
    this.svg.dataset.nTps = String(this.tps.length);
    this.svg.dataset.nSwitch = String(this.switchMs.length);
    this.caption.textContent =
      this.metrics === false
        ? "Each answer's speed; start kvswap with --metrics to plot switch times too"
        : "Each answer's speed (left axis) and the server's mind switch time (right axis)";
  }
}
