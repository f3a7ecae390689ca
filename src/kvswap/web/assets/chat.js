// The chat with one mind. Opening a mind shows the messages this browser kept, then asks the
// server for the mind's history (GET /minds/{name}): the messages that render its tokens
// again replace a copy that differs (a mind made or moved on through the API), so the next
// turn sends what the mind holds and prefills only the new tokens. A history the server cannot
// split into messages (a raw /completion prompt) is shown as text, with a warning that the next
// message starts over. A turn sends the whole history to /v1/chat/completions with the mind's
// name (X-Mind-Id), streamed; Stop aborts the fetch, and the server cancels the request when
// its client goes away. Each answer shows its timings and how its mind was served, from the
// answer's headers: the tier it came from, the switch's time, and a divergence from its
// history (where, and how many tokens were dropped).

import { ApiError, getJson, streamChat } from "./api.js";
import { renderMarkdown } from "./markdown.js";
import { loadMessages, loadSettings, saveMessages, saveSettings, setLastMind } from "./store.js";

const HISTORY = "history"; // the role of a mind's text shown as it is (not a chat)

function metaText(meta) {
  const served = meta.served || {};
  const tier = served.tier_before ?? meta.tier_before; // (messages kept by an older page)
  const parts = tier ? [`tier before: ${tier}`] : [];
  const t = meta.timings;
  if (t) {
    parts.push(`cache_n ${t.cache_n}`, `prompt_n ${t.prompt_n}`);
    parts.push(`${t.predicted_per_second.toFixed(1)} tokens/s`);
    parts.push(`prompt ${t.prompt_ms.toFixed(0)} ms`);
  }
  const switchMs = served.switch_ms ?? meta.switch_ms;
  if (Number.isFinite(switchMs)) parts.push(`switch ${switchMs.toFixed(2)} ms`);
  if (served.diverged_at != null) {
    parts.push(`diverged from its history at token ${served.diverged_at}: ${served.n_dropped} tokens dropped`);
  }
  if (meta.stopped) parts.push("stopped");
  return parts.join(" · ");
}

// The server's history, with what this browser kept of the same messages (their timings); the
// last answer of a mind cut by max_tokens lacks its last token there, as the mind does.
function merged(local, server) {
  return server.map((m, i) => {
    const mine = local[i];
    const last = i === server.length - 1 && m.role === "assistant";
    const same =
      mine &&
      mine.role === m.role &&
      (mine.content === m.content || (last && mine.content.startsWith(m.content)));
    return same ? mine : { role: m.role, content: m.content };
  });
}

export class ChatView {
  constructor({ namespace, refresh, plot }) {
    this.namespace = namespace;
    this.refresh = refresh; // () => Promise: poll /pages now
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
    this.prompt.disabled = true; // until the server's history is here
    this.send.disabled = true;
    this.say(`reading ${name}'s history from the server…`);
    this.renderAll();
    this.readHistory(name);
  }

  async readHistory(name) {
    let found = null;
    let why = "";
    try {
      found = await getJson(`minds/${encodeURIComponent(name)}`);
    } catch (err) {
      if (!(err instanceof ApiError && err.status === 404)) {
        why = `could not read ${name}'s history: ${err instanceof ApiError ? err.describe() : err}`;
      }
    }
    if (this.mind !== name || this.controller) return; // another mind, or a turn, since
    if (why) this.say(why, true);
    else this.adopt(name, found);
    this.prompt.disabled = false;
    this.send.disabled = false;
    this.prompt.focus();
  }

  // What the chat shows of the server's copy of the mind (null: the server holds none).
  adopt(name, found) {
    const kept = this.messages.filter((m) => m.role !== HISTORY);
    if (!found) {
      this.messages = kept;
      this.say(kept.length ? `the server holds no mind ${name}: a message starts it anew` : "");
    } else if (found.messages) {
      this.messages = merged(kept, found.messages);
      const n = found.n_tokens;
      this.say(`${name}: ${found.messages.length} messages, ${n} tokens, as the server holds them`);
    } else {
      this.messages = [{ role: HISTORY, content: found.text }];
      this.say(
        `${name} holds ${found.n_tokens} tokens that are not a chat: a message from here starts ` +
          "a new conversation and replaces them",
        true,
      );
    }
    this.save();
    this.renderAll();
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
    const names = { user: "you", system: "system", [HISTORY]: `${this.mind}'s history (text)` };
    who.textContent = names[message.role] || this.mind;
    const body = document.createElement("div");
    body.className = "body";
    if (message.role !== "assistant") body.textContent = message.content;
    else body.innerHTML = renderMarkdown(message.content); // escaped first: see markdown.js
    li.replaceChildren(who, body);
    if (message.meta) {
      const meta = document.createElement("div");
      meta.className = "meta";
      meta.classList.toggle("diverged", message.meta.served?.diverged_at != null);
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

  async turn() {
    const text = this.prompt.value;
    if (!this.mind || this.controller || !text.trim()) return;
    const mind = this.mind;
    // A history that is not a chat is replaced by this conversation (the server says so).
    if (this.messages.some((m) => m.role === HISTORY)) {
      this.messages = this.messages.filter((m) => m.role !== HISTORY);
    }
    const messages = this.messages; // this mind's, even if another one is opened meanwhile
    this.controller = new AbortController();
    this.setStreaming(true);
    const history = messages
      .filter((m) => m.content || m.role === "assistant")
      .map((m) => ({ role: m.role, content: m.content }));
    const user = { role: "user", content: text };
    const answer = { role: "assistant", content: "", meta: {} };
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
        onServed: (served) => {
          answer.meta.served = served;
        },
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
    this.controller = null;
    if (!saveMessages(this.namespace, mind, messages)) {
      this.say("this browser refused to store the messages (storage full or off)", true);
    }
    if (this.mind === mind) this.renderAll();
    this.setStreaming(false);
    this.refresh().catch(() => null);
  }
}
