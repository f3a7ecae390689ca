"""The web page before and at its first answer, in a real headless Chromium against `kvswap serve`.

A newcomer's screenshot of the first paint showed "connecting…" over empty tables and an empty
plot. Here the page's API calls are held back (a script DevTools adds to the page before its
own, wrapping `fetch`), so the first paint is seen for as long as the test wants: it must show
the layout, the minds this browser knows, the plot's labelled frame and an explicit connecting
state naming the server. Released, the page names the model and says "connected" at its first
poll. The plot's labels and legend are all inside it and none covers another. The disk line
says whether the server has a disk tier at all.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import pytest

from tests.server.browser import Browser
from tests.server.harness import ServerProcess
from tests.server.test_web_page import open_page

pytestmark = [pytest.mark.model, pytest.mark.slow, pytest.mark.timeout(150)]

ARGS = ("-c", "1024", "-np", "1", "-t", "1", "--metrics")
API_PATHS = ("props", "pages", "slots", "metrics")

# Run before the page's own scripts on every load: API calls wait for window.__release(), and
# window.__calls counts them by path.
HOLD = """
(() => {
  const realFetch = window.fetch.bind(window);
  let release;
  const held = new Promise((resolve) => { release = resolve; });
  window.__release = () => release();
  window.__calls = {};
  window.fetch = (input, init) => {
    const path = new URL(String(input instanceof Request ? input.url : input)).pathname;
    const name = path.split("/").pop();
    if (!API_PATHS.includes(name)) return realFetch(input, init);
    window.__calls[name] = (window.__calls[name] || 0) + 1;
    return held.then(() => realFetch(input, init));
  };
})();
""".replace("API_PATHS", json.dumps(API_PATHS))

# The /pages calls made when #conn first said "connected" (set up before the release).
WATCH_CONNECTED = """
const conn = document.getElementById("conn");
window.__pagesWhenConnected = null;
new MutationObserver(() => {
  if (window.__pagesWhenConnected === null && conn.textContent.startsWith("connected")) {
    window.__pagesWhenConnected = window.__calls.pages || 0;
  }
}).observe(conn, { childList: true, characterData: true, subtree: true });
"""


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    save = tmp_path_factory.mktemp("slots")
    log = tmp_path_factory.mktemp("log") / "server.log"
    proc = ServerProcess([*ARGS, "--slot-save-path", str(save)], log)
    yield proc
    proc.stop()


def _texts(b: Browser, selector: str) -> list[str]:
    return [e.text for e in b.driver.find_elements("css selector", selector)]


def test_the_first_paint_is_the_page_and_it_connects_at_the_first_poll(
    browser: Browser, server: ServerProcess
) -> None:
    b = browser
    open_page(b, server)  # a browser that chatted with alice before
    b.js(
        "localStorage.setItem('kvswap.v1.chat.public.alice', JSON.stringify(arguments[0]))",
        [{"role": "user", "content": "Hi, I am Alice."}, {"role": "assistant", "content": "Hi!"}],
    )
    b.driver.execute_cdp_cmd("Page.addScriptToEvaluateOnNewDocument", {"source": HOLD})
    b.driver.get(server.url + "/")
    b.wait("the page to ask for /props", lambda: b.js("return window.__calls.props"))

    b.shot("first-paint")
    host = server.url.removeprefix("http://")
    assert b.css("#conn").text == f"connecting to {host}…"
    assert "waiting" in (b.css("#conn").get_attribute("class") or "")
    assert b.css("#model").text == ""  # the model's name comes with /props
    assert b.css("#mind-list button[data-mind='alice']").text.split() == ["alice", "…"]
    for table in ("#minds-table", "#slots-table"):
        assert _texts(b, f"{table} tbody tr") == ["waiting for the server…"]
    titles = _texts(b, "#plot .axis-title")
    assert titles == ["tokens/s", "ms per switch", "time (last 5 minutes)"]
    assert _texts(b, "#plot .legend text") == [
        "tokens/s of this page's answers",
        "ms per mind switch",
    ]
    assert _texts(b, "#plot .label")[2] == "—"  # the switch axis has no scale before /props
    assert_plot_labels_apart(b)
    assert b.js("return window.__calls") == {"props": 1}  # nothing else asked meanwhile

    b.js(WATCH_CONNECTED)
    b.js("window.__release()")
    b.wait("connected", lambda: b.css("#conn").text.startswith("connected"))
    assert b.js("return window.__pagesWhenConnected") == 1  # the first poll settled it
    assert b.css("#conn").text == "connected · 1 slot"
    assert b.css("#model").text == server.client.get("/props").json()["model_alias"]
    b.wait("alice's tier", lambda: b.css("#mind-list button[data-mind='alice'] .tier").text)
    assert b.css("#mind-list button[data-mind='alice'] .tier").text == "NEW"  # CSS upper case
    assert _texts(b, "#minds-table tbody tr") == [
        "no minds yet: open one, or name one in a request (X-Mind-Id)"
    ]
    b.shot("connected")


def assert_plot_labels_apart(b: Browser) -> None:
    """Every text of the plot lies inside it, and no two of them overlap."""
    boxes: dict[str, Any] = b.js(
        """
        const box = (e) => {
          const r = e.getBoundingClientRect();
          return { text: e.textContent, left: r.left, right: r.right, top: r.top, bottom: r.bottom };
        };
        const texts = [...document.querySelectorAll("#plot text")].map(box);
        return { frame: box(document.getElementById("plot")), texts };
        """
    )
    frame, texts = boxes["frame"], boxes["texts"]
    for t in texts:
        assert t["right"] > t["left"] and t["bottom"] > t["top"], t
        assert frame["left"] <= t["left"] and t["right"] <= frame["right"], (t, frame)
        assert frame["top"] <= t["top"] and t["bottom"] <= frame["bottom"], (t, frame)
    for i, one in enumerate(texts):
        for other in texts[i + 1 :]:
            apart = (
                one["right"] <= other["left"]
                or other["right"] <= one["left"]
                or one["bottom"] <= other["top"]
                or other["bottom"] <= one["top"]
            )
            assert apart, (one, other)


def test_the_plot_has_labelled_axes_and_a_legend(browser: Browser, server: ServerProcess) -> None:
    b = browser
    open_page(b, server)
    assert _texts(b, "#plot .axis-title") == ["tokens/s", "ms per switch", "time (last 5 minutes)"]
    assert _texts(b, "#plot .legend text") == [
        "tokens/s of this page's answers",
        "ms per mind switch",
    ]
    assert _texts(b, "#plot .label")[:6] == ["1", "0", "1.0", "0", "-5 min", "now"]
    assert_plot_labels_apart(b)
    # plot.js itself, drawing wide figures into the page's plot: its scales still fit.
    b.driver.execute_async_script(
        """
        const done = arguments[0];
        import("./web/plot.js").then(({ Plot }) => {
          const plot = new Plot(document.getElementById("plot"),
                                document.getElementById("plot-caption"), { metrics: true });
          const metric = (ms, n) => ({ "llamacpp:mind_switch_ms_total": ms,
                                       "llamacpp:mind_hits_ram_total": n });
          plot.addAnswer(1234.5);
          plot.addMetrics(metric(0, 0), Date.now() - 1000);
          plot.addMetrics(metric(98.76, 1), Date.now());
          done();
        });
        """
    )
    assert b.css("#plot").get_attribute("data-n-tps") == "1"
    assert b.css("#plot").get_attribute("data-n-switch") == "1"
    assert _texts(b, "#plot .label")[:3] == ["1235", "0", "98.8"]
    assert_plot_labels_apart(b)
    b.shot("plot")


def test_the_disk_line_says_whether_there_is_a_disk_tier(
    browser: Browser, server: ServerProcess, tmp_path_factory: pytest.TempPathFactory
) -> None:
    b = browser
    open_page(b, server)  # --slot-save-path, no --page-disk-bytes
    b.wait("the disk line", lambda: b.css("#disk-text").text != "…")
    assert b.css("#disk-text").text == "0 B on disk (no --page-disk-bytes bound)"
    diskless = ServerProcess(ARGS, tmp_path_factory.mktemp("log") / "diskless.log")
    try:
        open_page(b, diskless)
        b.wait("the disk line", lambda: b.css("#disk-text").text != "…")
        b.shot("no-disk-tier")
        assert b.css("#disk-text").text == "no disk tier (start with --slot-save-path)"
        assert b.js("return document.getElementById('disk-meter').hidden") is True
    finally:
        diskless.stop()
