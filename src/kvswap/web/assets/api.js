// The server's HTTP API as the page uses it: where it is, the API key (kept in this tab's
// session storage only), typed errors, and the chat stream (server-sent events read from
// fetch, cancelled through an AbortSignal: the server cancels a stream whose client is gone).

import { sha256Hex } from "./sha256.js";

const KEY_ITEM = "kvswap.apiKey";

// The page's root: this module lives at ROOT/web/api.js, under any --api-prefix.
export const ROOT = new URL("../", import.meta.url);

export class ApiError extends Error {
  constructor(status, type, message) {
    super(message);
    this.status = status; // the HTTP status; 0 when the server could not be reached
    this.type = type; // the typed error's `type`, e.g. "authentication_error"
  }

  describe() {
    return this.status ? `${this.message} (${this.status} ${this.type})` : this.message;
  }
}

export function apiKey() {
  return sessionStorage.getItem(KEY_ITEM) || "";
}

export function setApiKey(key) {
  if (key) sessionStorage.setItem(KEY_ITEM, key);
  else sessionStorage.removeItem(KEY_ITEM);
}

// The namespace the server files this key's minds under (`namespace_of`).
export function namespace() {
  const key = apiKey();
  return key ? sha256Hex(key).slice(0, 16) : "public";
}

function headers(extra = {}) {
  const out = { ...extra };
  const key = apiKey();
  if (key) out.Authorization = `Bearer ${key}`;
  return out;
}

async function errorOf(resp) {
  let body = null;
  try {
    body = await resp.json();
  } catch {
    body = null; // not JSON: described by the status alone
  }
  const err = body && body.error;
  if (err && typeof err.message === "string") {
    return new ApiError(resp.status, String(err.type || "error"), err.message);
  }
  return new ApiError(resp.status, "http_error", resp.statusText || "request failed");
}

async function call(path, init) {
  let resp;
  try {
    resp = await fetch(new URL(path, ROOT), { cache: "no-store", ...init });
  } catch (err) {
    if (err.name === "AbortError") throw err;
    throw new ApiError(0, "network_error", "cannot reach the server");
  }
  if (!resp.ok) throw await errorOf(resp);
  return resp;
}

export async function getJson(path) {
  return (await call(path, { headers: headers() })).json();
}

export async function getText(path) {
  return (await call(path, { headers: headers() })).text();
}

// A mind verb (contract: POST /minds/{name}?action=page_out|page_in|spill|drop, answering
// {"mind", "action", "tier"} or a typed error).
// In a cluster the mind's name routes the action to its replica (HAProxy hashes X-Mind-Id,
// or the path's name), and that replica sends it on to the mind's owner if it is another.
export async function mindAction(name, action) {
  const path = `minds/${encodeURIComponent(name)}?action=${encodeURIComponent(action)}`;
  const extra = ASCII_NAME.test(name) ? { "X-Mind-Id": name } : {};
  return (await call(path, { method: "POST", headers: headers(extra) })).json();
}

// Header values must be ASCII; the body's "mind" field names any mind (and wins, server side).
const ASCII_NAME = /^[\x20-\x7e]+$/;

// How the answer's mind was served, from its headers (X-Kvswap-*): the tier its state came
// from, the switch's time, and where the request diverged from its history (null: it did not).
function servedOf(resp) {
  const h = (name) => resp.headers.get(`X-Kvswap-${name}`);
  if (h("Tier-Before") === null) return null;
  const diverged = h("Diverged-At");
  return {
    tier_before: h("Tier-Before"),
    switch_ms: Number(h("Switch-Ms")),
    diverged_at: diverged === null ? null : Number(diverged),
    n_dropped: Number(h("Dropped-Tokens") || 0),
  };
}

// One streamed chat turn. `onServed(served)` gets how its mind was served before any text,
// `onDelta(text)` each piece of the answer as it comes; resolves to { timings, finishReason };
// rejects with ApiError (also for an error sent mid-stream) or an AbortError when `signal`
// aborts.
export async function streamChat({ mind, messages, params, signal, onServed, onDelta }) {
  const extra = { "Content-Type": "application/json" };
  if (ASCII_NAME.test(mind)) extra["X-Mind-Id"] = mind;
  const body = JSON.stringify({ ...params, messages, mind, stream: true });
  const resp = await call("v1/chat/completions", {
    method: "POST",
    headers: headers(extra),
    body,
    signal,
  });
  const served = servedOf(resp);
  if (served && onServed) onServed(served);
  const reader = resp.body.getReader();
  const decoder = new TextDecoder();
  const result = { timings: null, finishReason: null };
  let buffer = "";
  for (;;) {
    const { value, done } = await reader.read();
    buffer += decoder.decode(value || new Uint8Array(), { stream: !done });
    const events = buffer.split(/\r?\n\r?\n/);
    buffer = done ? "" : events.pop();
    for (const event of events) {
      if (readEvent(event, result, onDelta)) return result;
    }
    if (done) return result;
  }
}

// One SSE event; true at [DONE].
function readEvent(event, result, onDelta) {
  for (const line of event.split(/\r?\n/)) {
    if (!line.startsWith("data:")) continue;
    const data = line.slice(5).trim();
    if (data === "[DONE]") return true;
    const chunk = JSON.parse(data);
    if (chunk.error) {
      const e = chunk.error;
      throw new ApiError(Number(e.code) || 500, String(e.type || "error"), String(e.message));
    }
    for (const choice of chunk.choices || []) {
      const text = choice.delta && choice.delta.content;
      if (text) onDelta(text);
      if (choice.finish_reason) result.finishReason = choice.finish_reason;
    }
    if (chunk.timings) result.timings = chunk.timings;
  }
  return false;
}
