"""The web page at `/` in a real headless Chromium, against a real `kvswap serve` (SmolLM2).

A user's session: open the page (small, and nothing fetched beyond the server), create minds
"alice" and "bob" and chat (answers stream in token by token), return to alice (her answer
prefills only the new tokens, and the minds view shows her move from RAM back to the slot),
reload (the messages are still there), stop a long answer (the server frees the slot), see
HTML and `<script>` from the model shown as text, use a mind action with its confirmation,
and, behind `--api-key`, give a wrong key (a clear error) and then the right one. Every step
leaves a screenshot in the folder printed at the end of the run.
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Iterator, Sequence
from typing import Any

import pytest
from selenium.common.exceptions import NoAlertPresentException, TimeoutException
from selenium.webdriver.common.keys import Keys

from tests.server.browser import Browser
from tests.server.harness import ServerProcess

pytestmark = [pytest.mark.model, pytest.mark.slow, pytest.mark.timeout(150)]

# One slot, so a second mind pages the first out to RAM; one thread for a 2-core machine.
PAGE_ARGS = ("-c", "2048", "-np", "1", "-t", "1", "-tb", "1", "--metrics")
KEYED_ARGS = ("-c", "1024", "-np", "1", "-t", "1", "--api-key", "right-key,other-key")
FIRST_LOAD_LIMIT_BYTES = 300_000


def _server(tmp_path_factory: pytest.TempPathFactory, args: Sequence[str]) -> ServerProcess:
    return ServerProcess(list(args), tmp_path_factory.mktemp("log") / "server.log")


@pytest.fixture(scope="module")
def page_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    server = _server(tmp_path_factory, PAGE_ARGS)  # stopped with the module, not the session
    yield server
    server.stop()


def open_page(b: Browser, server: ServerProcess, path: str = "/") -> None:
    b.driver.get("about:blank")
    b.requests()  # the browser's own start page is not the page's
    b.driver.get(server.url + path)
    b.wait("the page to connect", lambda: b.css("#conn").text.startswith("connected"))


def set_settings(b: Browser, max_tokens: str, temperature: str) -> None:
    """Through the settings panel, with the keyboard (Tab commits each field)."""
    b.css(".settings summary").click()
    for selector, value in (("#max-tokens", max_tokens), ("#temperature", temperature)):
        field = b.css(selector)
        field.clear()
        field.send_keys(value, Keys.TAB)
    b.css(".settings summary").click()


def open_mind(b: Browser, name: str) -> None:
    b.css("#new-mind-name").send_keys(name, Keys.ENTER)
    b.wait(f"the chat with {name}", lambda: b.css("#chat-heading").text == f"Chat with {name}")


def chat_page(b: Browser, server: ServerProcess, mind: str, max_tokens: str) -> None:
    """The page open on `mind`'s chat, answering at temperature 0 (SmolLM2 is deterministic)."""
    open_page(b, server)
    set_settings(b, max_tokens=max_tokens, temperature="0")
    open_mind(b, mind)


def watch_answers(b: Browser) -> None:
    """Record each distinct text the answer being written shows (window.partials)."""
    b.js(
        """
        window.partials = [];
        const list = document.getElementById("messages");
        new MutationObserver(() => {
          const last = list.lastElementChild;
          if (!last || !last.classList.contains("assistant")) return;
          const text = last.querySelector(".body").textContent;
          if (text && window.partials[window.partials.length - 1] !== text) window.partials.push(text);
        }).observe(list, { subtree: true, childList: true, characterData: true });
        """
    )


def _texts(b: Browser, seen: list[list[str]]) -> list[str]:
    """The chat's message bodies as shown, read in one script (kept in `seen`)."""
    texts: list[str] = b.js(
        'return Array.from(document.querySelectorAll("#messages .msg .body"), e => e.innerText)'
    )
    seen.append(texts)
    return texts


def last_answer(b: Browser) -> dict[str, Any]:
    result: dict[str, Any] = b.js(
        """
        const items = document.querySelectorAll("#messages .msg.assistant");
        const last = items[items.length - 1];
        return last && {
          text: last.querySelector(".body").textContent,
          meta: last.querySelector(".meta") ? last.querySelector(".meta").textContent : "",
        };
        """
    )
    return result


def send(b: Browser, text: str) -> dict[str, Any]:
    """Type a message, Enter; wait for the whole answer. The answer's text, meta and partials."""
    n_before = len(b.driver.find_elements("css selector", "#messages .msg.assistant"))
    watch_answers(b)
    b.wait("the mind's history from the server", lambda: b.css("#prompt").is_enabled())
    b.css("#prompt").send_keys(text, Keys.ENTER)
    b.wait("the answer to start", lambda: b.css("#stop").is_displayed())
    b.wait("the answer to end", lambda: not b.css("#stop").is_displayed(), timeout_s=90)
    n_after = len(b.driver.find_elements("css selector", "#messages .msg.assistant"))
    assert n_after == n_before + 1, b.css("#chat-status").text
    answer = last_answer(b)
    answer["partials"] = b.js("return window.partials")
    return answer


def timings(meta: str) -> tuple[int, int]:
    found = re.search(r"cache_n (\d+) · prompt_n (\d+)", meta)
    assert found is not None, meta
    return int(found.group(1)), int(found.group(2))


def tier_shown(b: Browser, mind: str) -> str:
    tier: str = b.js(
        """
        for (const row of document.querySelectorAll("#minds-table tbody tr")) {
          if (row.dataset.mind === arguments[0]) return row.querySelector(".tier").textContent;
        }
        return "";
        """,
        mind,
    )
    return tier


def n_tokens_of(server: ServerProcess, mind: str, api_key: str = "") -> int:
    headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
    minds = server.client.get("/pages", headers=headers).json()["minds"]
    return next(m["n_tokens"] for m in minds if m["mind"] == mind)


def test_first_load_is_small_and_asks_only_the_server(
    browser: Browser, page_server: ServerProcess
) -> None:
    open_page(browser, page_server)
    browser.shot("first-load")
    requests = browser.requests()
    urls = [r.url for r in requests]
    assert any(u.endswith("/web/main.js") for u in urls) and any(u.endswith("/pages") for u in urls)
    beyond = [u for u in urls if not u.startswith(page_server.url + "/")]
    assert beyond == [], f"the page asked beyond the server: {beyond}"
    n_bytes = sum(r.n_bytes for r in requests)
    print(f"first load: {len(requests)} requests, {n_bytes} bytes")
    assert 0 < n_bytes < FIRST_LOAD_LIMIT_BYTES, [(r.url, r.n_bytes) for r in requests]


def test_chat_with_two_minds_and_watch_them_move(
    browser: Browser, page_server: ServerProcess
) -> None:
    b = browser
    chat_page(b, page_server, "alice", max_tokens="24")
    first = send(b, "Tell me about cats.")
    b.shot("alice-answered")
    # Streamed: the answer grew through several texts before its last one.
    assert len(first["partials"]) >= 3, first["partials"]
    assert first["partials"][-1] == first["text"] and len(first["partials"][0]) < len(first["text"])
    assert "tier before: new" in first["meta"]
    cache_1, prompt_1 = timings(first["meta"])
    assert cache_1 == 0 and prompt_1 > 0
    b.wait("alice in the slot", lambda: tier_shown(b, "alice") == "slot")

    open_mind(b, "bob")
    second = send(b, "Name a fruit.")
    assert "tier before: new" in second["meta"]
    b.wait("alice paged out to RAM", lambda: tier_shown(b, "alice") == "ram")
    assert tier_shown(b, "bob") == "slot"
    b.shot("bob-answered-alice-in-ram")

    b.click("#mind-list button[data-mind='alice']")
    b.wait(
        "alice's messages",
        lambda: len(b.driver.find_elements("css selector", "#messages .msg")) == 2,
    )
    new_text = "And dogs?"
    third = send(b, new_text)
    b.shot("alice-back")
    assert "tier before: ram" in third["meta"]
    cache_3, prompt_3 = timings(third["meta"])
    # Her first turn's whole prompt came back with the page; only the new turn was prefilled.
    n_new = len(page_server.post("/tokenize", {"content": new_text}).json()["tokens"])
    assert cache_3 >= prompt_1, third["meta"]
    assert prompt_3 <= n_new + 16, (third["meta"], n_new)
    b.wait("alice back in the slot", lambda: tier_shown(b, "alice") == "slot")
    b.wait("bob paged out", lambda: tier_shown(b, "bob") == "ram")
    assert b.css("#plot").get_attribute("data-n-tps") == "3"

    b.driver.refresh()
    b.wait("alice's chat after a reload", lambda: b.css("#chat-heading").text == "Chat with alice")
    # The page paints the chat it kept, then the history the server holds (a redraw): the
    # messages are read in one script, and waited for, never from elements a redraw replaced.
    expected = ["Tell me about cats.", first["text"], new_text, third["text"]]
    seen: list[list[str]] = []
    try:
        b.wait("alice's four messages after a reload", lambda: _texts(b, seen) == expected)
    except TimeoutException:
        raise AssertionError(f"after a reload the chat shows {seen[-1]}, not {expected}") from None
    b.wait("the last answer's meta", lambda: last_answer(b)["meta"] == third["meta"])
    b.shot("after-reload")

    b.driver.set_window_size(390, 844)  # a phone
    b.wait("the narrow layout", lambda: b.js("return window.innerWidth") <= 400)
    assert b.js("return document.documentElement.scrollWidth <= window.innerWidth")
    b.shot("phone-width")


def test_a_mind_made_through_the_api_opens_with_its_history_and_grows(
    browser: Browser, page_server: ServerProcess
) -> None:
    """The page showed an empty chat for a mind made through the API, and its first message
    replaced the mind's 147 tokens with a 95-token conversation, saying nothing (the
    newcomer's second hour, finding 4). Now it shows the history the server holds, and its
    next turn extends the mind: only the new message is prefilled."""
    b = browser
    ask = "Hi, I am Gina. I keep bees and grow plums by the river."
    made = page_server.post(
        "/v1/chat/completions",
        {"messages": [{"role": "user", "content": ask}], "max_tokens": 12, "temperature": 0},
        headers={"X-Mind-Id": "gina"},
    )
    assert made.status_code == 200, made.text
    reply = made.json()["choices"][0]["message"]["content"]
    n_made = n_tokens_of(page_server, "gina")
    chat_page(b, page_server, "gina", max_tokens="8")
    b.wait("gina's history", lambda: b.css("#prompt").is_enabled())
    b.shot("gina-history")
    texts = [e.text for e in b.driver.find_elements("css selector", "#messages .msg .body")]
    assert len(texts) == 2 and texts[0] == ask, texts
    # The answer as the mind holds it: a cut answer's last token was never decoded into it.
    assert texts[1] and reply.startswith(texts[1]), (texts, reply)
    assert f"{n_made} tokens, as the server holds them" in b.css("#chat-status").text

    question = "What do I grow?"
    answer = send(b, question)
    b.shot("gina-extended")
    cache_n, prompt_n = timings(answer["meta"])
    n_new = len(page_server.post("/tokenize", {"content": question}).json()["tokens"])
    assert cache_n >= n_made and prompt_n <= n_new + 16, (answer["meta"], n_made, n_new)
    assert "diverged" not in answer["meta"], answer["meta"]
    assert n_tokens_of(page_server, "gina") > n_made

    # A mind made of a raw prompt is no chat: shown as text, and a message says it replaces it.
    raw = {"prompt": "The bees of the river hum", "n_predict": 4, "mind": "hum"}
    assert page_server.post("/completion", raw).status_code == 200
    open_mind(b, "hum")
    b.wait("hum's text", lambda: b.css("#prompt").is_enabled())
    assert b.css("#messages .msg.history .body").text.startswith("The bees of the river hum")
    assert "not a chat" in b.css("#chat-status").text
    replaced = send(b, "Hello")
    assert "diverged from its history at token 0" in replaced["meta"], replaced["meta"]
    assert b.driver.find_elements("css selector", "#messages .msg.history") == []
    b.shot("hum-replaced")


def test_stop_cancels_the_answer_and_frees_the_slot(
    browser: Browser, page_server: ServerProcess
) -> None:
    b = browser
    chat_page(b, page_server, "storyteller", max_tokens="")  # no limit: it would fill the slot
    b.css("#prompt").send_keys(
        "Write a very long story about a dragon, with many chapters.", Keys.ENTER
    )
    b.wait("the story to be under way", lambda: len((last_answer(b) or {}).get("text", "")) > 40)
    slots = page_server.client.get("/slots").json()
    assert slots[0]["is_processing"], slots
    b.shot("story-streaming")
    b.css("#stop").click()
    b.wait("the stop to show", lambda: "stopped" in last_answer(b)["meta"])
    b.wait(
        "the slot to be free",
        lambda: not any(s["is_processing"] for s in page_server.client.get("/slots").json()),
    )
    b.wait(
        "the slots table to say idle",
        lambda: (
            b.js("return document.querySelector('#slots-table tbody tr').dataset.processing")
            == "false"
        ),
    )
    b.shot("story-stopped")
    # The server stopped with the page: the mind holds far less than its 2048-token window.
    assert n_tokens_of(page_server, "storyteller") < 1000
    assert not b.css("#stop").is_displayed() and b.css("#send").is_enabled()


def test_html_from_the_model_is_text(browser: Browser, page_server: ServerProcess) -> None:
    b = browser
    chat_page(b, page_server, "html", max_tokens="40")
    prompt = "Print this HTML snippet verbatim: <img src=x onerror=alert(1)><script>window.pwned=1</script>"
    answer = send(b, prompt)
    b.shot("html-as-text")
    assert "<script>" in answer["text"], answer["text"]  # SmolLM2 repeats it at temperature 0
    injected = b.driver.find_elements(
        "css selector", "#messages script, #messages img, #messages [onerror]"
    )
    assert injected == []
    assert b.js("return window.pwned") is None
    with pytest.raises(NoAlertPresentException):
        b.driver.switch_to.alert.text  # noqa: B018 (raises when no alert opened)


RENDER_CASES = [
    "<script>window.pwned = 1</script>",
    "<img src=x onerror=alert(1)>",
    "[click](javascript:alert(1))",
    '[x](https://example.com/"onmouseover="alert(1))',
    "`</code><script>alert(1)</script>`",
    "```html\n</code></pre><script>alert(1)</script>\n```",
    "**<i>bold</i>** _<b>it</b>_",
    "- <a href='javascript:alert(1)'>x</a>\n- two",
    "# <svg onload=alert(1)>",
    "&lt;script&gt; stays as typed",
]
# fmt: off
ALLOWED_TAGS = frozenset(
    ["P", "BR", "PRE", "CODE", "H3", "H4", "H5", "H6", "UL", "OL", "LI", "STRONG", "EM", "A"]
)
# fmt: on


def test_markdown_renderer_writes_only_its_subset(
    browser: Browser, page_server: ServerProcess
) -> None:
    """markdown.js in the page's own browser: hostile input gives only the subset's markup."""
    b = browser
    open_page(b, page_server)
    rendered: list[dict[str, Any]] = b.driver.execute_async_script(
        """
        const [cases, done] = arguments;
        Promise.all([import("./web/markdown.js"), import("./web/sha256.js")]).then(([md, sha]) => {
          done(cases.map((src) => {
            const t = document.createElement("template");
            t.innerHTML = md.renderMarkdown(src);
            const elements = [...t.content.querySelectorAll("*")];
            return {
              text: t.content.textContent,
              tags: elements.map((e) => e.tagName),
              attrs: elements.flatMap((e) => [...e.attributes].map((a) => [a.name, a.value])),
              sha: sha.sha256Hex(src),
            };
          }));
        });
        """,
        [*RENDER_CASES, "**b** *i* `c` [l](https://example.com/a_b)\n\n1. x\n2. y"],
    )
    for src, out in zip(RENDER_CASES, rendered, strict=False):
        assert set(out["tags"]) <= ALLOWED_TAGS, (src, out)
        for name, value in out["attrs"]:
            assert name in ("href", "rel", "target", "class"), (src, out)
            if name == "href":
                assert value.startswith(("https://", "http://")), (src, out)
            if name == "class":
                assert re.fullmatch(r"lang-[\w+#.-]+", value), (src, out)
        assert out["sha"] == hashlib.sha256(src.encode()).hexdigest()
    assert "<script>" in rendered[0]["text"] and "onerror" in rendered[1]["text"]
    assert rendered[9]["text"] == "&lt;script&gt; stays as typed"
    positive = rendered[-1]
    assert positive["tags"] == ["P", "STRONG", "EM", "CODE", "A", "OL", "LI", "LI"]
    assert ["href", "https://example.com/a_b"] in positive["attrs"]


def test_mind_action_asks_first_and_shows_the_answer(
    browser: Browser, page_server: ServerProcess
) -> None:
    b = browser
    chat_page(b, page_server, "carol", max_tokens="4")
    send(b, "Hi.")
    b.wait("carol in the minds table", lambda: tier_shown(b, "carol") == "slot")
    button = "#minds-table tr[data-mind='carol'] button[data-action='page_out']"
    b.requests()  # forget what came before

    b.click(button)
    assert b.css("#confirm-dialog").is_displayed()
    b.shot("confirm-page-out")
    b.css("#confirm-cancel").click()
    assert not b.css("#confirm-dialog").is_displayed()
    b.press(button, Keys.ENTER)  # the keyboard's way in, and Escape's way out
    b.wait("the dialog again", lambda: b.css("#confirm-dialog").is_displayed())
    assert b.js("return document.activeElement.id") == "confirm-cancel"  # the safe choice first
    b.driver.switch_to.active_element.send_keys(Keys.ESCAPE)
    b.wait("Escape to cancel", lambda: not b.css("#confirm-dialog").is_displayed())
    assert [r for r in b.requests() if "/minds/" in r.url] == []  # cancelled: nothing sent

    b.click(button)
    b.css("#confirm-ok").click()
    status = b.wait(
        "the action's outcome",
        lambda: (
            re.search(r"(done|failed)", b.css("#action-status").text)
            and b.css("#action-status").text
        ),
    )
    b.shot("page-out-outcome")
    posts = [r for r in b.requests() if "/minds/" in r.url]
    assert [(r.method, r.url) for r in posts] == [
        ("POST", f"{page_server.url}/minds/carol?action=page_out")
    ]
    assert "done" in status, status
    b.wait("the tier the route answered", lambda: tier_shown(b, "carol") == "ram")
    # A typed error is shown with its message: carol is no longer in a slot to page out from,
    # so paging out an unknown mind answers 404, which the page words as the server did.
    error = page_server.client.post("/minds/nobody?action=page_out").json()["error"]
    assert error["code"] == 404 and "nobody" in error["message"]


@pytest.fixture(scope="module")
def keyed_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    server = _server(tmp_path_factory, KEYED_ARGS)
    # A mind of another key: the page must not list it.
    other = {"Authorization": "Bearer other-key", "X-Mind-Id": "someone-else"}
    body = {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 1}
    assert server.post("/v1/chat/completions", body, headers=other).status_code == 200
    yield server
    server.stop()


def test_api_key_is_asked_for_and_a_wrong_one_is_refused(
    browser: Browser, keyed_server: ServerProcess
) -> None:
    b = browser
    assert keyed_server.client.get("/").status_code == 200  # the page itself needs no key
    assert keyed_server.client.get("/pages").status_code == 401
    b.driver.get(keyed_server.url + "/")
    b.wait("the key dialog", lambda: b.css("#key-dialog").is_displayed())
    b.shot("key-asked")
    b.css("#key-input").send_keys("wrong-key", Keys.ENTER)
    error = b.wait("the refusal", lambda: b.css("#key-error").text)
    assert error == "The server refused this key: Invalid API Key (401 authentication_error)"
    assert b.css("#key-dialog").is_displayed()
    b.shot("key-refused")

    b.css("#key-input").clear()
    b.css("#key-input").send_keys("right-key", Keys.ENTER)
    b.wait("the page to connect", lambda: b.css("#conn").text.startswith("connected"))
    assert not b.css("#key-dialog").is_displayed()
    set_settings(b, max_tokens="4", temperature="0")
    open_mind(b, "zoë ü")  # not ASCII: named in the body, as no header can carry it
    answer = send(b, "Hello!")
    assert answer["text"] and "cache_n" in answer["meta"]
    b.wait("the mind in the key's namespace", lambda: tier_shown(b, "zoë ü") == "slot")
    listed = b.js(
        "return [...document.querySelectorAll('#minds-table tbody tr')].map(r => r.dataset.mind)"
    )
    assert listed == ["zoë ü"]  # someone-else belongs to another key
    b.shot("key-accepted")
    assert b.js("return sessionStorage.getItem('kvswap.apiKey')") == "right-key"
    stored = b.js("return Object.keys(localStorage).map(k => k + localStorage.getItem(k)).join()")
    assert "right-key" not in stored


def test_the_disk_tier_and_its_budget_are_shown(
    browser: Browser, tmp_path_factory: pytest.TempPathFactory
) -> None:
    """A mind spilled at exit is on disk after a restart: the page shows it and the disk bar."""
    save = tmp_path_factory.mktemp("slots")
    args = (*PAGE_ARGS, "--slot-save-path", str(save), "--page-disk-bytes", "64M")
    first = _server(tmp_path_factory, args)
    body = {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 2}
    assert first.post("/v1/chat/completions", body, headers={"X-Mind-Id": "archived"}).is_success
    first.stop()  # SIGTERM: every mind is spilled before the exit
    server = _server(tmp_path_factory, args)
    try:
        pages = server.client.get("/pages").json()
        assert [(m["mind"], m["tier"]) for m in pages["minds"]] == [("archived", "disk")]
        assert pages["disk_ceiling_bytes"] == 64 << 20
        assert pages["disk_n_bytes"] == pages["minds"][0]["n_bytes"] > 0
        open_page(browser, server)
        browser.wait("the spilled mind", lambda: tier_shown(browser, "archived") == "disk")
        meter = browser.js(
            "const m = document.getElementById('disk-meter'); return [m.value, m.max, m.hidden]"
        )
        assert meter == [pages["disk_n_bytes"], 64 << 20, False]
        assert browser.css("#disk-text").text.endswith("of 64.0 MiB (--page-disk-bytes)")
        browser.shot("disk-tier")
    finally:
        server.stop()
