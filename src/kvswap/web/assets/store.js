// What the page keeps in this browser's local storage: each mind's messages (per namespace,
// so two API keys never mix), the mind last open, and the chat settings. The server keeps the
// mind itself; these copies are what the page shows again after a reload. The API key is never
// written here (api.js keeps it in session storage).

const PREFIX = "kvswap.v1.";

function chatKey(ns, mind) {
  return `${PREFIX}chat.${ns}.${encodeURIComponent(mind)}`;
}

function read(key, fallback) {
  try {
    const raw = localStorage.getItem(key);
    return raw === null ? fallback : JSON.parse(raw);
  } catch {
    return fallback; // unreadable (edited by hand, or storage off): start empty
  }
}

// false when the browser refused (storage full or disabled); the caller says so.
function write(key, value) {
  try {
    localStorage.setItem(key, JSON.stringify(value));
    return true;
  } catch {
    return false;
  }
}

export function loadMessages(ns, mind) {
  const messages = read(chatKey(ns, mind), []);
  return Array.isArray(messages) ? messages : [];
}

export function saveMessages(ns, mind, messages) {
  return write(chatKey(ns, mind), messages);
}

// Minds this browser has talked to in namespace `ns`.
export function knownMinds(ns) {
  const head = `${PREFIX}chat.${ns}.`;
  const names = [];
  for (let i = 0; i < localStorage.length; i++) {
    const key = localStorage.key(i);
    if (key && key.startsWith(head)) names.push(decodeURIComponent(key.slice(head.length)));
  }
  return names;
}

export function lastMind(ns) {
  return read(`${PREFIX}last.${ns}`, "");
}

export function setLastMind(ns, mind) {
  write(`${PREFIX}last.${ns}`, mind);
}

export function loadSettings() {
  return read(`${PREFIX}settings`, {});
}

export function saveSettings(settings) {
  write(`${PREFIX}settings`, settings);
}
