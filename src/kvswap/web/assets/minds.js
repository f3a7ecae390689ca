// Where the caller's minds live: the list to pick a mind from, the minds table (tier, tokens,
// bytes, last use) with its actions, the page store and disk bars, and the slots table, all
// redrawn from each poll. Only minds of the caller's namespace are shown.
//
// Actions use POST /minds/{name}?action=page_out|page_in|spill|drop, after a confirmation;
// the answer's tier (or the typed error's message) is shown in the action status line.

import { ApiError, mindAction } from "./api.js";
import { storedRows } from "./stored.js";

const UNKNOWN = "unknown"; // a mind's tier before the first /pages answer

const ACTIONS = [
  { action: "page_out", label: "Page out", effect: "moves from its slot into a RAM page" },
  { action: "page_in", label: "Page in", effect: "moves into a free slot" },
  { action: "spill", label: "Spill", effect: "is written to disk and leaves RAM" },
  {
    action: "drop",
    label: "Drop",
    effect: "is deleted from every tier of the server (this browser keeps its messages)",
  },
];

export function formatBytes(n) {
  if (!Number.isFinite(n)) return "—";
  const units = ["B", "KiB", "MiB", "GiB", "TiB"];
  let i = 0;
  let v = n;
  while (v >= 1024 && i < units.length - 1) {
    v /= 1024;
    i++;
  }
  return `${i ? v.toFixed(1) : v} ${units[i]}`;
}

export function cell(text, className) {
  const td = document.createElement("td");
  td.textContent = text;
  if (className) td.className = className;
  return td;
}

function tierBadge(tier) {
  const span = document.createElement("span");
  span.className = `tier tier-${tier}`;
  span.textContent = tier === UNKNOWN ? "…" : tier;
  if (tier === UNKNOWN) span.title = "waiting for the server's first answer";
  return span;
}

// One row across a table: what it shows before the first poll, or when there is nothing.
export function placeholderRow(text, colSpan) {
  const tr = document.createElement("tr");
  tr.className = "placeholder";
  const td = cell(text);
  td.colSpan = colSpan;
  tr.append(td);
  return tr;
}

// Ask before acting; resolves true on Confirm, false on Cancel or Escape.
function confirmDialog(text) {
  const dialog = document.getElementById("confirm-dialog");
  document.getElementById("confirm-text").textContent = text;
  return new Promise((resolve) => {
    const done = (ok) => {
      ok_.removeEventListener("click", onOk);
      cancel.removeEventListener("click", onCancel);
      dialog.removeEventListener("cancel", onCancel);
      if (dialog.open) dialog.close();
      resolve(ok);
    };
    const ok_ = document.getElementById("confirm-ok");
    const cancel = document.getElementById("confirm-cancel");
    const onOk = () => done(true);
    const onCancel = (event) => {
      event.preventDefault();
      done(false);
    };
    ok_.addEventListener("click", onOk);
    cancel.addEventListener("click", onCancel);
    dialog.addEventListener("cancel", onCancel);
    dialog.showModal();
    cancel.focus(); // the safe choice first
  });
}

export class MindsView {
  constructor({ namespace, onOpen, onActed, knownMinds }) {
    this.namespace = namespace;
    this.onOpen = onOpen; // (name) => void
    this.onActed = onActed; // () => void: poll again now
    this.knownMinds = knownMinds; // () => [name]: minds this browser has messages of
    this.current = "";
    this.loaded = false; // a /pages answer came
    this.minds = new Map(); // name -> the /pages entry, this namespace only
    this.signatures = {};
    this.status = document.getElementById("action-status");
  }

  tierOf(name) {
    const mind = this.minds.get(name);
    if (mind) return mind.tier;
    return this.loaded ? "new" : UNKNOWN;
  }

  // The namespace the server answered under (an API key may have been given meanwhile).
  setNamespace(namespace) {
    this.namespace = namespace;
    this.renderList();
  }

  setCurrent(name) {
    this.current = name;
    this.renderList();
  }

  update(snapshot) {
    const { pages, slots, errors } = snapshot;
    const pagesError = document.getElementById("pages-error");
    pagesError.textContent = errors.pages ? `/pages: ${errors.pages.describe()}` : "";
    if (pages) {
      this.loaded = true;
      const own = (pages.minds || []).filter((m) => m.namespace === this.namespace);
      this.minds = new Map(own.map((m) => [m.mind, m]));
      this.renderBars(pages);
      this.renderTable();
      const stored = storedRows(pages.stored);
      this.replaceRows("stored-table", stored.rows, stored.signature);
    }
    this.renderList();
    this.renderSlots(slots, errors.slots);
  }

  // Redraw `tbody` only when its rows changed, keeping the focused button focused.
  replaceRows(id, rows, signature) {
    if (this.signatures[id] === signature) return;
    this.signatures[id] = signature;
    const tbody = document.querySelector(`#${id} tbody`);
    const focused = tbody.contains(document.activeElement)
      ? document.activeElement.dataset.key
      : null;
    tbody.replaceChildren(...rows);
    if (focused) {
      const again = tbody.querySelector(`[data-key="${CSS.escape(focused)}"]`);
      if (again) again.focus();
    }
  }

  renderList() {
    const names = new Set([...this.minds.keys(), ...this.knownMinds()]);
    if (this.current) names.add(this.current);
    const sorted = [...names].sort((a, b) => a.localeCompare(b));
    const list = document.getElementById("mind-list");
    const signature = JSON.stringify([this.current, sorted.map((n) => [n, this.tierOf(n)])]);
    if (list.dataset.signature === signature) return;
    list.dataset.signature = signature;
    const focused = list.contains(document.activeElement)
      ? document.activeElement.dataset.key
      : null;
    list.replaceChildren(
      ...sorted.map((name) => {
        const li = document.createElement("li");
        const button = document.createElement("button");
        button.type = "button";
        button.dataset.key = name;
        button.dataset.mind = name;
        button.setAttribute("aria-current", String(name === this.current));
        const label = document.createElement("span");
        label.textContent = name;
        button.append(label, tierBadge(this.tierOf(name)));
        button.addEventListener("click", () => this.onOpen(name));
        li.append(button);
        return li;
      }),
    );
    if (focused) list.querySelector(`[data-key="${CSS.escape(focused)}"]`)?.focus();
  }

  renderBars(pages) {
    const store = document.getElementById("store-meter");
    const storeText = document.getElementById("store-text");
    store.max = Math.max(1, pages.ceiling_bytes);
    store.value = pages.n_bytes;
    storeText.textContent = `${formatBytes(pages.n_bytes)} of ${formatBytes(pages.ceiling_bytes)} (--page-ram-bytes)`;
    const disk = document.getElementById("disk-meter");
    const diskText = document.getElementById("disk-text");
    const used = pages.disk_n_bytes || 0;
    const ceiling = pages.disk_ceiling_bytes;
    disk.hidden = !pages.disk_tier || !ceiling;
    if (!pages.disk_tier) {
      diskText.textContent = "no disk tier (start with --slot-save-path)";
    } else if (ceiling) {
      disk.max = ceiling;
      disk.value = used;
      diskText.textContent = `${formatBytes(used)} of ${formatBytes(ceiling)} (--page-disk-bytes)`;
    } else {
      diskText.textContent = `${formatBytes(used)} on disk (no --page-disk-bytes bound)`;
    }
  }

  renderTable() {
    const minds = [...this.minds.values()].sort((a, b) => a.mind.localeCompare(b.mind));
    const rows = minds.map((m) => {
      const tr = document.createElement("tr");
      tr.dataset.mind = m.mind;
      const tier = document.createElement("td");
      tier.append(tierBadge(m.tier));
      if (m.tier === "slot") tier.append(` ${m.id_slot}`);
      const lastUse = m.last_used_unix_s
        ? new Date(m.last_used_unix_s * 1000).toLocaleTimeString([], { hour12: false })
        : "—";
      const actions = document.createElement("div");
      actions.className = "actions";
      for (const a of ACTIONS) {
        const button = document.createElement("button");
        button.type = "button";
        button.textContent = a.label;
        button.dataset.key = `${a.action}:${m.mind}`; // unique: no action has a colon
        button.dataset.action = a.action;
        button.setAttribute("aria-label", `${a.label} ${m.mind}`);
        button.addEventListener("click", () => this.act(m.mind, a));
        actions.append(button);
      }
      // A resident mind's bytes are in the slot, not counted as a page.
      const bytes = m.tier === "slot" ? "in slot" : formatBytes(m.n_bytes);
      const actionsCell = document.createElement("td");
      actionsCell.append(actions);
      tr.append(cell(m.mind), tier, cell(String(m.n_tokens), "num"), cell(bytes, "num"));
      tr.append(cell(lastUse), actionsCell);
      return tr;
    });
    if (!rows.length) {
      rows.push(placeholderRow("no minds yet: open one, or name one in a request (X-Mind-Id)", 6));
    }
    const signature = JSON.stringify(
      minds.map((m) => [m.mind, m.tier, m.id_slot, m.n_tokens, m.n_bytes, m.last_used_unix_s]),
    );
    this.replaceRows("minds-table", rows, signature);
  }

  renderSlots(slots, error) {
    if (!slots) {
      const tr = placeholderRow(error ? `/slots: ${error.describe()}` : "—", 5);
      tr.className = "error";
      this.replaceRows("slots-table", [tr], `error:${error && error.message}`);
      return;
    }
    const bySlot = new Map(
      [...this.minds.values()].filter((m) => m.tier === "slot").map((m) => [m.id_slot, m.mind]),
    );
    const rows = slots.map((s) => {
      const tr = document.createElement("tr");
      tr.dataset.slot = String(s.id);
      tr.dataset.processing = String(Boolean(s.is_processing));
      const next = (s.next_token && s.next_token[0]) || {};
      tr.append(
        cell(String(s.id)),
        cell(s.is_processing ? "processing" : "idle"),
        cell(bySlot.get(s.id) || "—"),
        cell(String(s.n_ctx), "num"),
        cell(s.is_processing ? String(next.n_decoded ?? 0) : "—", "num"),
      );
      return tr;
    });
    const signature = JSON.stringify(
      slots.map((s) => [s.id, s.is_processing, s.n_ctx, bySlot.get(s.id), s.next_token]),
    );
    this.replaceRows("slots-table", rows, signature);
  }

  async act(name, a) {
    if (!(await confirmDialog(`${a.label} mind “${name}”? Its state ${a.effect}.`))) return;
    this.status.classList.remove("error");
    this.status.textContent = `${a.label} ${name}…`;
    try {
      const answer = await mindAction(name, a.action);
      this.status.textContent = `${a.label} ${name}: done, now ${answer.tier}.`;
    } catch (err) {
      this.status.classList.add("error");
      const why = err instanceof ApiError ? err.describe() : String(err);
      this.status.textContent = `${a.label} ${name} failed: ${why}`;
    }
    this.onActed();
  }
}
