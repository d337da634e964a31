"""The translation page at `/` in a real headless Chromium against the shared server (en-de, en-fr):
typed text translated as the API translates it, the language detected, alternatives, an error shown
as the API says it, a file translated and offered for download, labels for every control, the
keyboard, and a phone's width. The API's page (`/docs`) shown from this server's files alone."""

from __future__ import annotations

import contextlib
import math
import re
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from selenium.webdriver.common.action_chains import ActionChains
from selenium.webdriver.common.keys import Keys
from selenium.webdriver.remote.webdriver import WebDriver
from selenium.webdriver.support.ui import Select

from .browser import by_id, console_errors, open_page, screenshot, type_text, until
from .conftest import REPO, free_port

pytestmark = pytest.mark.slow

TEXT = "A dog is running in the snow."


def api(url: str, **body: object) -> dict[str, object]:
    r = httpx.post(f"{url}/v1/translate", json={"texts": [TEXT], "target": "de", **body}, timeout=60)
    assert r.status_code == 200, r.text
    return r.json()["translations"][0]  # type: ignore[no-any-return]


def test_the_page_is_served_with_its_own_files_only(server: str) -> None:
    r = httpx.get(f"{server}/", timeout=10)
    assert r.status_code == 200 and r.headers["content-type"].startswith("text/html")
    assert "default-src 'self'" in r.headers["content-security-policy"]
    assert "frame-ancestors 'none'" in r.headers["content-security-policy"] and r.headers["x-frame-options"] == "DENY"
    assert r.headers["referrer-policy"] == "no-referrer" and r.headers["x-content-type-options"] == "nosniff"
    assert "http" not in r.text.replace("http-equiv", "")  # no CDN: every resource from this server
    assert httpx.get(f"{server}/ui/app.js", timeout=10).headers["content-type"].startswith("text/javascript")
    missing = httpx.get(f"{server}/ui/other.js", timeout=10)
    assert missing.status_code == 404 and missing.json()["error"] == "not_found"


def test_the_api_page_is_served_with_its_own_files_only(server: str) -> None:
    r = httpx.get(f"{server}/docs", timeout=10)
    assert r.status_code == 200 and r.headers["content-type"].startswith("text/html")
    policy = r.headers["content-security-policy"]
    assert "default-src 'self'" in policy and "frame-ancestors 'none'" in policy and "script-src" not in policy
    assert r.headers["x-frame-options"] == "DENY" and r.headers["referrer-policy"] == "no-referrer"
    assert "http" not in r.text and "<script>" not in r.text  # no CDN, no inline script
    files = re.findall(r'(?:src|href)="([^"]+)"', r.text)
    assert files and all(f.startswith("docs/assets/") for f in files)
    for name in files:
        got = httpx.get(f"{server}/{name}", timeout=10)
        assert got.status_code == 200 and got.headers["x-content-type-options"] == "nosniff", name
        assert got.headers["content-type"].split("/")[0] in ("text", "image") and len(got.content) > 100, name
    missing = httpx.get(f"{server}/docs/assets/other.js", timeout=10)
    assert missing.status_code == 404 and missing.json()["error"] == "not_found"


def test_swagger_ui_shows_the_routes_with_nothing_refused(browser: WebDriver, server: str) -> None:
    console_errors(browser)
    browser.get(f"{server}/docs")
    operation = '.opblock-summary-path[data-path="/v1/translate"]'
    until(browser, lambda: browser.find_elements("css selector", operation), "Swagger UI's /v1/translate")
    assert console_errors(browser) == []  # a resource the policy refused would be one
    assert httpx.get(f"{server}/redoc", timeout=10).status_code == 404


def test_typing_translates_as_the_api_does_and_shows_the_language_detected(browser: WebDriver, server: str) -> None:
    open_page(browser, server)
    Select(by_id(browser, "target")).select_by_value("de")
    type_text(browser, TEXT)  # translated as typed (debounced), no button
    expected = api(server)
    until(browser, lambda: by_id(browser, "translation").get_attribute("value") == expected["text"], "the translation")
    assert "English" in by_id(browser, "detected").text
    percent = math.floor(float(expected["confidence"]) * 100 + 0.5)  # type: ignore[arg-type]  # as Math.round
    assert by_id(browser, "confidence").text.startswith(f"Model confidence: {percent}%")
    assert by_id(browser, "count").text == f"{len(TEXT)} / 2000 characters"
    screenshot(browser, "page.png")


def test_the_about_line_names_each_model_s_licence_and_warns_of_non_commercial_ones(
    browser: WebDriver, server: str
) -> None:
    models = httpx.get(f"{server}/v1/models", timeout=10).json()["models"]
    open_page(browser, server)
    until(browser, lambda: by_id(browser, "licences").text, "the about line")
    line = by_id(browser, "licences").text
    assert all(m["name"] in line and m["license"] in line for m in models), line
    assert "(not for commercial use)" in line and "warning" in by_id(browser, "licences").get_attribute("class")


def test_alternatives_are_the_api_s_n_best(browser: WebDriver, server: str) -> None:
    open_page(browser, server)
    Select(by_id(browser, "source")).select_by_value("en")
    Select(by_id(browser, "target")).select_by_value("fr")
    Select(by_id(browser, "alternatives")).select_by_value("2")
    type_text(browser, TEXT)
    expected = api(server, source="en", target="fr", num_hypotheses=3, beam_size=4)
    items = lambda: [li.text for li in browser.find_elements("css selector", "#alternatives-list li")]  # noqa: E731
    until(browser, lambda: items() == expected["hypotheses"][1:], "the alternatives")  # type: ignore[index]
    assert by_id(browser, "translation").get_attribute("value") == expected["text"]


def test_an_error_is_shown_as_the_api_says_it(browser: WebDriver, server: str) -> None:
    open_page(browser, server)
    by_id(browser, "live").click()  # off: the button (or Ctrl+Enter) translates
    by_id(browser, "html").click()
    type_text(browser, "A dog <b")
    by_id(browser, "text").send_keys(Keys.CONTROL, Keys.ENTER)
    r = httpx.post(
        f"{server}/v1/translate", json={"texts": ["A dog <b"], "target": "de", "tag_handling": "html"}, timeout=30
    )
    assert r.status_code == 422
    until(browser, lambda: by_id(browser, "error").text == r.json()["detail"], "the API's message")


def test_a_file_is_translated_as_its_lines_are_and_offered_for_download(
    browser: WebDriver, server: str, tmp_path: Path
) -> None:
    from service.text import documents

    text = "A dog is running in the snow.\n\nTwo men are playing soccer.\n"
    path = tmp_path / "notes.txt"
    path.write_text(text)
    parsed = documents.parse("notes.txt", text.encode())
    r = httpx.post(
        f"{server}/v1/translate", json={"texts": parsed.segments, "source": "en", "target": "fr"}, timeout=60
    )
    want = parsed.rebuild([t["text"] for t in r.json()["translations"]])
    open_page(browser, server)
    Select(by_id(browser, "source")).select_by_value("en")
    Select(by_id(browser, "target")).select_by_value("fr")
    by_id(browser, "file").send_keys(str(path))
    by_id(browser, "file-go").click()
    until(browser, lambda: by_id(browser, "file-link").is_displayed(), "the download link")
    assert by_id(browser, "file-status").text == "notes.txt is translated."
    assert httpx.get(str(by_id(browser, "file-link").get_attribute("href")), timeout=10).content == want
    # A file the server does not read: its message.
    (tmp_path / "report.pdf").write_bytes(b"%PDF-1.7")
    by_id(browser, "file").send_keys(str(tmp_path / "report.pdf"))
    by_id(browser, "file-go").click()
    until(browser, lambda: "documents are .txt" in by_id(browser, "file-status").text, "the API's message")
    assert not by_id(browser, "file-link").is_displayed()


@contextlib.contextmanager
def tls_proxy(server: str, prefix: str, tmp_path: Path) -> Iterator[str]:
    """HAProxy (the binary Serve runs) terminating TLS with a self-signed certificate on 127.0.0.1 and
    forwarding `prefix`/... to the server as /..., as an ingress under a path prefix does; its address."""
    from ray.serve._private.haproxy import get_haproxy_binary

    key, cert = tmp_path / "key.pem", tmp_path / "cert.pem"
    subprocess.run(
        ["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "1", "-subj", "/CN=127.0.0.1",
         "-keyout", str(key), "-out", str(cert)],
        check=True,
        capture_output=True,
    )  # fmt: skip
    (tmp_path / "both.pem").write_bytes(cert.read_bytes() + key.read_bytes())
    port, backend = free_port(), server.removeprefix("http://")
    (tmp_path / "proxy.cfg").write_text(
        "defaults\n  mode http\n  timeout connect 5s\n  timeout client 60s\n  timeout server 60s\n"
        f"frontend tls\n  bind 127.0.0.1:{port} ssl crt {tmp_path / 'both.pem'}\n"
        f"  http-request redirect location {prefix}/ code 301 if {{ path {prefix} }}\n"
        "  http-request set-header X-Forwarded-Proto https\n"
        f"  http-request replace-path ^{prefix}(/.*)$ \\1\n"
        "  default_backend app\n"
        f"backend app\n  server gateway {backend}\n"
    )
    proc = subprocess.Popen([get_haproxy_binary(), "-db", "-f", str(tmp_path / "proxy.cfg")], stderr=subprocess.PIPE)
    try:
        url = f"https://127.0.0.1:{port}{prefix}"
        deadline = time.monotonic() + 10
        while True:
            try:
                if httpx.get(f"{url}/healthz", verify=False, timeout=2).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            assert proc.poll() is None and time.monotonic() < deadline, "the TLS proxy did not come up"
            time.sleep(0.1)
        yield url
    finally:
        proc.kill()
        proc.wait()


def test_the_page_works_behind_tls_under_a_path_prefix(server: str, tmp_path: Path) -> None:
    """Behind an https reverse proxy at /mt: the page loads its files and languages, translates as typed,
    and its download link, fetched by the browser through the proxy, is the translated file."""
    from .browser import chromium

    text = "A dog is running in the snow.\n"
    (tmp_path / "notes.txt").write_text(text)
    expected = api(server)["text"]
    with tls_proxy(server, "/mt", tmp_path) as url, contextlib.closing(chromium("--ignore-certificate-errors")) as gen:
        b = next(gen)
        open_page(b, url)
        Select(by_id(b, "target")).select_by_value("de")
        type_text(b, TEXT)
        until(b, lambda: by_id(b, "translation").get_attribute("value") == expected, "the translation")
        Select(by_id(b, "source")).select_by_value("en")
        by_id(b, "file").send_keys(str(tmp_path / "notes.txt"))
        by_id(b, "file-go").click()
        until(b, lambda: by_id(b, "file-link").is_displayed(), "the download link")
        link = str(by_id(b, "file-link").get_attribute("href"))
        assert link.startswith(f"{url}/download_file/"), link
        fetched = b.execute_async_script(
            "const done = arguments[arguments.length - 1];"
            "fetch(arguments[0]).then(async (r) => done([r.status, await r.text()]), (e) => done([0, String(e)]));",
            link,
        )
        assert fetched[0] == 200 and fetched[1].strip() and fetched[1] != text, fetched
        assert console_errors(b) == []


# Deque's axe-core (npm), put beside the virtual environment by `make test`; injected into the page by the test.
AXE = REPO / ".venv" / "axe" / "axe.min.js"


def test_axe_finds_nothing_serious_on_the_page_with_a_right_to_left_result(browser: WebDriver, server: str) -> None:
    assert AXE.is_file(), f"{AXE} is missing: `make test` installs axe-core from npm"
    open_page(browser, server)
    Select(by_id(browser, "target")).select_by_value("de")
    type_text(browser, TEXT)
    until(browser, lambda: by_id(browser, "translation").get_attribute("value"), "the translation")
    assert by_id(browser, "translation").get_attribute("lang") == "de"
    assert by_id(browser, "translation").get_attribute("dir") == "ltr"
    browser.execute_script(AXE.read_text(encoding="utf-8"))
    found = browser.execute_async_script(
        "const done = arguments[arguments.length - 1];"
        "axe.run(document, {resultTypes: ['violations']}).then((r) => done(r.violations.map("
        "(v) => [v.id, v.impact, v.nodes.map((n) => n.target.join(' ')).join('; ')])));"
    )
    serious = [v for v in found if v[1] in ("serious", "critical")]
    assert serious == [], serious
    # An Arabic result (as an NLLB entry answers one) is laid out right to left, and announced.
    browser.execute_script("show('مرحبا بكم في بيتنا', 'ar')")
    out = by_id(browser, "translation")
    assert (out.get_attribute("lang"), out.get_attribute("dir")) == ("ar", "rtl")
    assert browser.execute_script("return getComputedStyle(arguments[0]).direction", out) == "rtl"
    assert by_id(browser, "announce").get_attribute("textContent") == "مرحبا بكم في بيتنا"


def test_swap_without_a_model_back_says_so(browser: WebDriver, server: str) -> None:
    open_page(browser, server)
    Select(by_id(browser, "source")).select_by_value("en")
    by_id(browser, "swap").click()  # no de-en here: the registry's server swaps for real (test_registry.py)
    until(browser, lambda: "no model translates back" in by_id(browser, "error").text, "the swap refused")


def test_every_control_has_a_label_and_the_keyboard_reaches_it(browser: WebDriver, server: str) -> None:
    open_page(browser, server)
    unlabelled = browser.execute_script(
        "return [...document.querySelectorAll('select, textarea, input')]"
        ".filter(e => !e.labels.length && !e.getAttribute('aria-label')).map(e => e.id)"
    )
    assert unlabelled == []
    assert all(b.text or b.get_attribute("aria-label") for b in browser.find_elements("tag name", "button"))
    reached = []
    by_id(browser, "source").click()
    keys = ActionChains(browser)  # Tab pressed on the page: a file input takes keys sent to it as a path
    for _ in range(16):
        reached.append(browser.switch_to.active_element.get_attribute("id"))
        keys.send_keys(Keys.TAB).perform()
    for control in (
        "source",
        "swap",
        "target",
        "text",
        "copy",
        "live",
        "html",
        "alternatives",
        "go",
        "file",
        "file-go",
    ):
        assert control in reached, (control, reached)


def test_the_page_fits_a_phone(browser: WebDriver, server: str) -> None:
    browser.set_window_size(390, 844)
    try:
        open_page(browser, server)
        assert browser.execute_script("return document.documentElement.scrollWidth <= window.innerWidth")
        screenshot(browser, "page_phone.png")
    finally:
        browser.set_window_size(1200, 900)


def test_a_sentence_from_the_chosen_memory_is_marked_and_an_approved_translation_answers_next(
    browser: WebDriver, server: str
) -> None:
    from .test_memory import TMX

    memory = httpx.post(
        f"{server}/v1/memories",
        files={"file": ("page.tmx", TMX)},
        data={"name": "page memory", "source_lang": "EN", "target_lang": "DE"},
    ).json()["memory_id"]
    console_errors(browser)  # the log from here on
    open_page(browser, server)
    Select(by_id(browser, "source")).select_by_value("en")
    Select(by_id(browser, "target")).select_by_value("de")
    until(browser, lambda: memory in [o.get_attribute("value") for o in Select(by_id(browser, "memory")).options], "it")
    Select(by_id(browser, "memory")).select_by_value(memory)
    type_text(browser, TEXT)
    until(browser, lambda: by_id(browser, "translation").get_attribute("value") == "Ein Hund rennt im Schnee.", "it")
    assert by_id(browser, "origin").text == "From the translation memory"
    assert not by_id(browser, "approve").is_displayed()
    other = "Two men are sitting on a bench."
    type_text(browser, other)
    until(browser, lambda: by_id(browser, "approve").is_displayed(), "the approve button for the model's translation")
    approved = by_id(browser, "translation").get_attribute("value")
    by_id(browser, "approve").click()
    until(browser, lambda: by_id(browser, "origin").text == "Approved into the translation memory", "the approval")
    units = httpx.get(f"{server}/v1/memories/{memory}/tmx").content
    from service.text import tmx

    assert tmx.read(units, "en", "de")[other] == approved
    type_text(browser, other + " ")
    until(browser, lambda: by_id(browser, "origin").text == "From the translation memory", "the approved unit")
    # A near match that says something else: the model's translation, the unit offered beside it.
    by_id(browser, "fuzzy").click()
    near = "Two men are not sitting on a bench."
    asked = {"texts": [near], "source": "en", "target": "de"}
    model = httpx.post(f"{server}/v1/translate", json=asked).json()["translations"][0]["text"]
    type_text(browser, near)
    until(browser, lambda: by_id(browser, "suggestions-section").is_displayed(), "the near match offered")
    assert by_id(browser, "translation").get_attribute("value") == model != approved
    assert approved in by_id(browser, "suggestions-list").text and "% match" in by_id(browser, "suggestions-list").text
    assert by_id(browser, "origin").text == ""
    assert console_errors(browser) == []
