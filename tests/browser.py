"""A real headless Chromium (Debian's chromium and chromedriver, installed by `make test`; nothing is
downloaded at run time) driven by Selenium, for the translation page at `/` (service/api/ui/)."""

from __future__ import annotations

import os
import shutil
from collections.abc import Iterator
from pathlib import Path

from selenium import webdriver
from selenium.webdriver.chrome.service import Service
from selenium.webdriver.remote.webdriver import WebDriver
from selenium.webdriver.remote.webelement import WebElement
from selenium.webdriver.support.ui import Select, WebDriverWait

WAIT_S = 30.0


def chromium(*extra: str) -> Iterator[WebDriver]:
    """The browser, quit after (tests/conftest.py's `browser` fixture); `extra`: more command-line switches."""
    binary, driver = shutil.which("chromium"), shutil.which("chromedriver")
    assert binary and driver, "chromium and chromedriver are not installed: `make test` installs them (apt)"
    options = webdriver.ChromeOptions()
    options.binary_location = binary
    for arg in ("--headless=new", "--no-sandbox", "--disable-dev-shm-usage", "--window-size=1200,900", *extra):
        options.add_argument(arg)
    options.set_capability("goog:loggingPrefs", {"browser": "ALL"})  # the console, CSP refusals included
    b = webdriver.Chrome(options=options, service=Service(driver))
    try:
        yield b
    finally:
        b.quit()


def open_page(b: WebDriver, url: str) -> None:
    """The page at url, once it has the server's languages."""
    b.get(f"{url}/")
    until(b, lambda: len(Select(b.find_element("id", "target")).options) > 0, "the target languages listed")


def console_errors(b: WebDriver) -> list[str]:
    """The console's errors since the last call (a resource the page's policy refused is one)."""
    return [e["message"] for e in b.get_log("browser") if e["level"] == "SEVERE"]


def until(b: WebDriver, condition: object, what: str) -> None:
    WebDriverWait(b, WAIT_S).until(lambda _: condition(), message=f"not within {WAIT_S:g} s: {what}")  # type: ignore[operator]


def by_id(b: WebDriver, name: str) -> WebElement:
    return b.find_element("id", name)


def type_text(b: WebDriver, text: str) -> None:
    box = by_id(b, "text")
    box.clear()
    box.send_keys(text)


def screenshot(b: WebDriver, name: str) -> None:
    """A screenshot into BEAMSERVE_SCREENSHOTS (docs/ when the docs' pictures are made again)."""
    where = os.environ.get("BEAMSERVE_SCREENSHOTS")
    if where:
        b.save_screenshot(str(Path(where) / name))
