// The caller's stored conversations (OpenAI Responses: `store`, `previous_response_id`,
// `conversation`) as /pages lists them under `stored`: each chain's mind beside the
// conversation it belongs to (or "chain" for a previous_response_id chain), its count of
// stored responses, its newest response id and its last use. Rows only; MindsView draws them.

import { cell, placeholderRow } from "./minds.js";

const time = (unixS) =>
  unixS ? new Date(unixS * 1000).toLocaleTimeString([], { hour12: false }) : "—";

export function storedRows(stored) {
  const conversations = new Map(((stored && stored.conversations) || []).map((c) => [c.mind, c]));
  const chains = (stored && stored.chains) || [];
  const rows = chains.map((c) => {
    const tr = document.createElement("tr");
    tr.dataset.mind = c.mind;
    const conv = conversations.get(c.mind);
    tr.append(
      cell(conv ? conv.id : "chain"),
      cell(c.mind),
      cell(String(c.n_responses), "num"),
      cell(c.head || "—"),
      cell(time(c.used_at)),
    );
    return tr;
  });
  // Conversations with no stored turn yet have no mind row: list them too.
  const withTurns = new Set(chains.map((c) => c.mind));
  for (const conv of conversations.values()) {
    if (withTurns.has(conv.mind)) continue;
    const tr = document.createElement("tr");
    tr.dataset.mind = conv.mind;
    tr.append(cell(conv.id), cell(conv.mind), cell("0", "num"), cell("—"), cell(time(conv.used_at)));
    rows.push(tr);
  }
  if (!rows.length) {
    rows.push(placeholderRow("none: POST /v1/responses stores every response (store: true)", 5));
  }
  return { rows, signature: JSON.stringify(stored || null) };
}
