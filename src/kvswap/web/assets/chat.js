// The chat with one mind: its messages (from local storage, shown again after a reload), the
// composer, and a turn: the whole history goes to /v1/chat/completions with the mind's name
// (X-Mind-Id), streamed; the server keeps the mind, so only the new tokens are prefilled. Stop
// aborts the fetch, and the server cancels the request when its client goes away. Each answer
// shows its timings (cache_n, prompt_n, tokens/s) and the tier the mind was in before the turn.

import { ApiError, getText, streamChat } from "./api.js";
import { renderMarkdown } from "./markdown.js";
import { parseMetrics } from "./poll.js";
import { loadMessages, loadSettings, saveMessages, saveSettings, setLastMind } from "./store.js";

const SWITCH_MS = "llamacpp:mind_switch_ms_total";

function metaText(meta) {
  const parts = [`tier before: ${meta.tier_before}`];
  const t = meta.timings;
  if (t) {
    parts.push(`cache_n ${t.cache_n}`, `prompt_n ${t.prompt_n}`);
    parts.push(`${t.predicted_per_second.toFixed(1)} tokens/s`);
    parts.push(`prompt ${t.prompt_ms.toFixed(0)} ms`);
  }
  if (Number.isFinite(meta.switch_ms)) parts.push(`switch ${meta.switch_ms.toFixed(2)} ms`);
  if (meta.stopped) parts.push("stopped");
  return parts.join(" · ");
}

export class ChatView {
  constructor({ namespace, tierOf, refresh, metrics, plot }) {
    this.namespace = namespace;
    this.tierOf = tierOf; // (name) => tier from the freshest /pages
    this.refresh = refresh; // () => Promise: poll /pages now
    this.metrics = metrics; // the server serves /metrics
    this.plot = plot;
    this.mind = "";
    this.messages = [];
    this.controller = null; // the AbortController of the turn in flight
    this.list = document.getElementById("messages");
    this.prompt = document.getElementById("prompt");
    this.send = document.getElementById("send");
    this.stopButton = document.getElementById("stop");
    this.status = document.getElementById("chat-status");
    this.maxTokens = document.getElementById("max-tokens");
    this.temperature = document.getElementById("temperature");
    this.wire();
  }

  wire() {
    document.getElementById("composer").addEventListener("submit", (event) => {
      event.preventDefault();
      this.turn();
    });
    this.prompt.addEventListener("keydown", (event) => {
      if (event.key === "Enter" && !event.shiftKey && !event.isComposing) {
        event.preventDefault();
        this.turn();
      }
    });
    document.addEventListener("keydown", (event) => {
      if (event.key === "Escape" && this.controller && !document.querySelector("dialog[open]")) {
        this.stop();
      }
    });
    this.stopButton.addEventListener("click", () => this.stop());
    const settings = loadSettings();
    this.maxTokens.value = settings.max_tokens ?? "";
    this.temperature.value = settings.temperature ?? "";
    for (const input of [this.maxTokens, this.temperature]) {
      input.addEventListener("change", () =>
        saveSettings({ max_tokens: this.maxTokens.value, temperature: this.temperature.value }),
      );
    }
  }

  open(name) {
    if (this.controller) this.stop();
    this.mind = name;
    this.messages = loadMessages(this.namespace, name);
    setLastMind(this.namespace, name);
    document.getElementById("chat-heading").textContent = `Chat with ${name}`;
    this.prompt.disabled = false;
    this.send.disabled = false;
    this.say("");
    this.renderAll();
    this.prompt.focus();
  }

  say(text, isError = false) {
    this.status.textContent = text;
    this.status.classList.toggle("error", isError);
  }

  params() {
    const out = {};
    const maxTokens = Number.parseInt(this.maxTokens.value, 10);
    if (Number.isFinite(maxTokens) && maxTokens > 0) out.max_tokens = maxTokens;
    const temperature = Number.parseFloat(this.temperature.value);
    if (Number.isFinite(temperature) && temperature >= 0) out.temperature = temperature;
    return out;
  }

  renderAll() {
    this.list.replaceChildren(...this.messages.map((m) => this.renderMessage(m)));
    this.list.scrollTop = this.list.scrollHeight;
  }

  renderMessage(message, li = document.createElement("li")) {
    li.className = `msg ${message.role}`;
    const who = document.createElement("div");
    who.className = "who";
    who.textContent = message.role === "user" ? "you" : this.mind;
    const body = document.createElement("div");
    body.className = "body";
    if (message.role === "user") body.textContent = message.content;
    else body.innerHTML = renderMarkdown(message.content); // escaped first: see markdown.js
    li.replaceChildren(who, body);
    if (message.meta) {
      const meta = document.createElement("div");
      meta.className = "meta";
      meta.textContent = metaText(message.meta);
      if (message.meta.error) {
        const error = document.createElement("span");
        error.className = "error";
        error.textContent = ` · ${message.meta.error}`;
        meta.append(error);
      }
      li.append(meta);
    }
    return li;
  }

  // Redraw the answer being streamed, following it down if the reader was at the bottom.
  renderLast() {
    const atBottom = this.list.scrollHeight - this.list.scrollTop - this.list.clientHeight < 40;
    const last = this.list.lastElementChild;
    if (last) this.renderMessage(this.messages[this.messages.length - 1], last);
    if (atBottom) this.list.scrollTop = this.list.scrollHeight;
  }

  save() {
    if (!saveMessages(this.namespace, this.mind, this.messages)) {
      this.say("this browser refused to store the messages (storage full or off)", true);
    }
  }

  setStreaming(on) {
    this.send.disabled = on;
    this.stopButton.hidden = !on;
    if (on) this.stopButton.focus();
    else this.prompt.focus();
  }

  stop() {
    if (this.controller) this.controller.abort();
  }

  async switchMsTotal() {
    if (!this.metrics) return Number.NaN;
    try {
      return parseMetrics(await getText("metrics"))[SWITCH_MS] ?? Number.NaN;
    } catch {
      return Number.NaN; // the per-answer switch time is left out, the turn goes on
    }
  }

  async turn() {
    const text = this.prompt.value;
    if (!this.mind || this.controller || !text.trim()) return;
    const mind = this.mind;
    const messages = this.messages; // this mind's, even if another one is opened meanwhile
    this.controller = new AbortController();
    this.setStreaming(true);
    this.say("…");
    await this.refresh().catch(() => null); // the tier before the turn, as fresh as can be
    const switchBefore = await this.switchMsTotal();
    const history = messages
      .filter((m) => m.content)
      .map((m) => ({ role: m.role, content: m.content }));
    const user = { role: "user", content: text };
    const answer = { role: "assistant", content: "", meta: { tier_before: this.tierOf(mind) } };
    messages.push(user, answer);
    this.prompt.value = "";
    this.save();
    this.renderAll();
    this.say(`${mind} is answering…`);
    try {
      const result = await streamChat({
        mind,
        messages: [...history, { role: "user", content: text }],
        params: this.params(),
        signal: this.controller.signal,
        onDelta: (piece) => {
          answer.content += piece;
          if (this.mind === mind) this.renderLast();
        },
      });
      answer.meta.timings = result.timings;
      if (result.timings) this.plot.addAnswer(result.timings.predicted_per_second);
      this.say(`${mind} answered.`);
    } catch (err) {
      if (err.name === "AbortError") {
        answer.meta.stopped = true;
        this.say(`stopped ${mind}'s answer.`);
      } else {
        const why = err instanceof ApiError ? err.describe() : String(err);
        if (answer.content) {
          answer.meta.error = why;
        } else {
          messages.splice(messages.length - 2, 2); // nothing came: the text goes back to the composer
          if (this.mind === mind && !this.prompt.value) this.prompt.value = text;
        }
        this.say(`${mind} could not answer: ${why}`, true);
      }
    }
    answer.meta.switch_ms = (await this.switchMsTotal()) - switchBefore;
    this.controller = null;
    if (!saveMessages(this.namespace, mind, messages)) {
      this.say("this browser refused to store the messages (storage full or off)", true);
    }
    if (this.mind === mind) this.renderAll();
    this.setStreaming(false);
    this.refresh().catch(() => null);
  }
}
