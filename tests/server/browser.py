"""A real headless Chromium for the web page's tests, driven by Selenium through chromedriver.

Debian's `chromium` and `chromium-driver` (installed by scripts/setup.sh). The browser gets a
fresh profile each time and the flags that keep it off the network (this machine has none);
its DevTools network log tells what the page requested and how many bytes came back.
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

import pytest
from selenium import webdriver
from selenium.common.exceptions import StaleElementReferenceException
from selenium.webdriver.chrome.service import Service
from selenium.webdriver.remote.webelement import WebElement
from selenium.webdriver.support.ui import WebDriverWait

CHROMIUM_FLAGS = (
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--disable-dev-shm-usage",
)

T = TypeVar("T")


def chromium_paths() -> tuple[str, str]:
    """(chromium, chromedriver); fails under CI when they are missing, else skips."""
    chromium = shutil.which("chromium")
    driver = shutil.which("chromedriver")
    if chromium and driver:
        return chromium, driver
    message = "chromium and chromium-driver are missing: run scripts/setup.sh"
    if os.environ.get("CI"):
        pytest.fail(message)
    pytest.skip(message)


@dataclass(frozen=True)
class Request:
    """One request the page made, from the DevTools network log."""

    url: str
    method: str
    n_bytes: int  # bytes received for it (headers and body, as sent); 0 if it did not finish


class Browser:
    """One headless Chromium window; `shot` saves numbered screenshots into `shots`."""

    def __init__(self, driver: webdriver.Chrome, shots: Path, prefix: str) -> None:
        self.driver = driver
        self.shots = shots
        self.prefix = prefix
        self.n_shots = 0

    def shot(self, name: str) -> Path:
        self.n_shots += 1
        path = self.shots / f"{self.prefix}-{self.n_shots:02d}-{name}.png"
        self.driver.save_screenshot(str(path))
        return path

    def js(self, script: str, *args: Any) -> Any:
        return self.driver.execute_script(script, *args)

    def wait(self, what: str, probe: Callable[[], T | None], timeout_s: float = 60) -> T:
        """Poll `probe` until it returns something truthy; fails naming `what`."""
        result: list[T] = []

        def ready(_: object) -> bool:
            value = probe()
            if value:
                result.append(value)
                return True
            return False

        WebDriverWait(self.driver, timeout_s, poll_frequency=0.05).until(
            ready, f"waited for {what}"
        )
        return result[-1]

    def css(self, selector: str) -> WebElement:
        return self.driver.find_element("css selector", selector)

    def click(self, selector: str) -> None:
        """Click what `selector` finds, again if the page redrew it meanwhile (a poll)."""
        self._on(selector, "a click", lambda e: e.click())

    def press(self, selector: str, key: str) -> None:
        """Focus what `selector` finds and press `key`, again if the page redrew it."""
        self._on(selector, f"key {key!r}", lambda e: e.send_keys(key))

    def _on(self, selector: str, what: str, act: Callable[[WebElement], None]) -> None:
        def done() -> bool:
            try:
                act(self.css(selector))
            except StaleElementReferenceException:
                return False
            return True

        self.wait(f"{what} on {selector}", done, timeout_s=10)

    def requests(self) -> list[Request]:
        """Every request since the last call (reading the log empties it)."""
        sent: dict[str, tuple[str, str]] = {}
        received: dict[str, int] = {}
        for entry in self.driver.get_log("performance"):
            message = json.loads(entry["message"])["message"]
            params = message.get("params", {})
            if message["method"] == "Network.requestWillBeSent":
                req = params["request"]
                sent[params["requestId"]] = (req["url"], req["method"])
            elif message["method"] == "Network.loadingFinished":
                received[params["requestId"]] = int(params["encodedDataLength"])
        return [Request(url, method, received.get(rid, 0)) for rid, (url, method) in sent.items()]


@contextmanager
def open_browser(
    shots: Path, prefix: str, width: int = 1400, height: int = 900
) -> Iterator[Browser]:
    chromium, chromedriver = chromium_paths()
    options = webdriver.ChromeOptions()
    options.binary_location = chromium
    for arg in CHROMIUM_FLAGS:
        options.add_argument(arg)
    options.add_argument(f"--window-size={width},{height}")
    profile = tempfile.mkdtemp(prefix="kvswap-chromium-")
    options.add_argument(f"--user-data-dir={profile}")
    options.set_capability("goog:loggingPrefs", {"performance": "ALL", "browser": "ALL"})
    driver = webdriver.Chrome(service=Service(chromedriver), options=options)
    try:
        yield Browser(driver, shots, prefix)
    finally:
        driver.quit()
        shutil.rmtree(profile, ignore_errors=True)
