// The page's start. Its first paint waits for no answer: the layout, the minds this browser
// knows, the plot's frame and an explicit "connecting" state. Then it reaches the server
// (/props, which names the model; it asks for the API key when the server answers 401 and
// waits while the model loads), wires the chat and the live view, and the first poll fills in
// the rest and says "connected".

import { ApiError, apiKey, getJson, namespace, setApiKey } from "./api.js";
import { ChatView } from "./chat.js";
import { MindsView } from "./minds.js";
import { Plot } from "./plot.js";
import { Poller } from "./poll.js";
import { knownMinds, lastMind } from "./store.js";

const POLL_MS = 1000;
const conn = document.getElementById("conn");

function showConn(text, { bad = false, waiting = false } = {}) {
  conn.textContent = text;
  conn.classList.toggle("bad", bad);
  conn.classList.toggle("waiting", waiting);
}

const pause = (ms) => new Promise((resolve) => setTimeout(resolve, ms));

// Ask for a key until the server takes one; resolves to /props read with it.
function askKey(why) {
  const dialog = document.getElementById("key-dialog");
  const form = document.getElementById("key-form");
  const input = document.getElementById("key-input");
  const error = document.getElementById("key-error");
  error.textContent = why;
  showConn("API key needed", { bad: true });
  return new Promise((resolve) => {
    const onSubmit = async (event) => {
      event.preventDefault();
      setApiKey(input.value);
      error.textContent = "";
      try {
        const props = await getJson("props");
        form.removeEventListener("submit", onSubmit);
        dialog.close();
        input.value = "";
        resolve(props);
      } catch (err) {
        setApiKey("");
        error.textContent =
          err instanceof ApiError && err.status === 401
            ? `The server refused this key: ${err.describe()}`
            : `Could not check the key: ${err instanceof ApiError ? err.describe() : err}`;
        input.select();
      }
    };
    form.addEventListener("submit", onSubmit);
    dialog.addEventListener("cancel", (event) => event.preventDefault()); // nothing works without it
    dialog.showModal();
    input.focus();
  });
}

async function connect() {
  for (;;) {
    try {
      return await getJson("props");
    } catch (err) {
      if (!(err instanceof ApiError)) throw err;
      if (err.status === 401) {
        const why = apiKey() ? `The server refused the key of this tab: ${err.describe()}` : "";
        setApiKey("");
        return askKey(why);
      }
      const why = err.status === 503 ? `${err.message}…` : `${err.describe()}, retrying…`;
      showConn(why, { bad: true });
      await pause(err.status === 503 ? 500 : 2000);
    }
  }
}

// What the first paint shows, before any answer.
const plot = new Plot(document.getElementById("plot"), document.getElementById("plot-caption"), {
  metrics: null, // known once /props answers
});
plot.draw();
let chat = null;
let poller = null;
let wanted = ""; // a mind opened before the server answered: opened once it does
const minds = new MindsView({
  namespace: namespace(),
  onOpen: (name) => {
    minds.setCurrent(name);
    if (chat) chat.open(name);
    else wanted = name;
  },
  onActed: () => poller && poller.refresh(),
  knownMinds: () => knownMinds(minds.namespace),
});
minds.renderList();
showConn(`connecting to ${location.host}…`, { waiting: true });

document.getElementById("new-mind").addEventListener("submit", (event) => {
  event.preventDefault();
  const input = document.getElementById("new-mind-name");
  const name = input.value.trim();
  if (!name) return;
  input.value = "";
  minds.onOpen(name);
});

// In a cluster started by `kvswap cluster up`: this replica, and each replica's state and
// restarts as the supervisor reports them ("r2 restarting (1 restart)").
function clusterText(pages) {
  const tier = pages && pages.shared_tier;
  if (!tier) return "";
  const others = (tier.replicas || []).map((r) => {
    const restarts = r.n_restarts ? ` (${r.n_restarts} restart${r.n_restarts === 1 ? "" : "s"})` : "";
    return `${r.id} ${r.state}${restarts}`;
  });
  return ` · replica ${tier.replica_id}${others.length ? ` · ${others.join(", ")}` : ""}`;
}

function start(props) {
  const ns = namespace(); // an API key may have been given meanwhile
  minds.setNamespace(ns);
  document.getElementById("model").textContent = props.model_alias || "";
  showConn(`reached ${location.host}, reading where minds live…`, { waiting: true });
  const keyButton = document.getElementById("key-button");
  keyButton.hidden = !apiKey();
  keyButton.addEventListener("click", () => {
    setApiKey(""); // the next load asks for another key
    location.reload();
  });

  const metrics = Boolean(props.endpoint_metrics);
  plot.setMetrics(metrics);
  poller = new Poller({ intervalMs: POLL_MS, metrics });
  chat = new ChatView({ namespace: ns, refresh: () => poller.refresh(), plot });

  poller.subscribe((snapshot) => {
    const refused = Object.values(snapshot.errors).find((e) => e && e.status === 401);
    if (refused) {
      poller.stop();
      setApiKey("");
      askKey(`The server no longer takes this key: ${refused.describe()}`).then(() =>
        location.reload(),
      );
      return;
    }
    minds.update(snapshot);
    plot.addMetrics(snapshot.metrics, snapshot.at);
    const down = Object.values(snapshot.errors).find(
      (e) => e && (e.status === 0 || e.status === 503),
    );
    if (down) showConn(down.describe(), { bad: true });
    else showConn(`connected · ${props.total_slots} slot${props.total_slots === 1 ? "" : "s"}${clusterText(snapshot.pages)}`);
  });

  poller.start();
  const first = wanted || lastMind(ns);
  if (first) minds.onOpen(first);
}

connect().then(start);
