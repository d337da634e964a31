"""Per-address limits while keys are off (Settings.address_*, LibreTranslate's per-client limits), end to end:
`beamserve serve` behind its HAProxy, clients on three loopback addresses (127.0.0.1, .2 and .3; the whole of
127/8 is this host's), one of them a trusted proxy whose X-Forwarded-For names the client."""

from __future__ import annotations

import subprocess
from collections.abc import Iterator

import httpx
import pytest

from service.api.client_address import client_address, reached_base, trusted_networks

from .conftest import serving

BODY = {"texts": ["A dog runs."], "source": "en", "target": "de"}
PROXY = "127.0.0.3"


def test_the_address_is_the_front_s_view_and_a_trusted_proxy_s_forwarded_one() -> None:
    trusted = trusted_networks(f"{PROXY}, 10.0.0.0/8")
    front = {"x-beamserve-peer": "198.51.100.4"}
    assert client_address("127.0.0.1", front, trusted) == "198.51.100.4"  # the front on this host says
    assert client_address("192.0.2.9", front, trusted) == "192.0.2.9"  # not from the front: not believed
    forwarded = {"x-beamserve-peer": "10.1.2.3", "x-beamserve-forwarded-for": "203.0.113.7, 10.9.9.9"}
    assert client_address("127.0.0.1", forwarded, trusted) == "203.0.113.7"  # past every trusted hop
    assert client_address("127.0.0.1", {"x-forwarded-for": "203.0.113.7"}, ()) == "127.0.0.1"
    with pytest.raises(ValueError, match="trusted_proxies: 'nine' is not"):
        trusted_networks("10.0.0.0/8, nine")


@pytest.fixture(scope="module")
def limited() -> Iterator[tuple[str, subprocess.Popen[str]]]:
    env = {
        "BEAMSERVE_MODELS": "en-de",
        "BEAMSERVE_ADDRESS_REQUESTS_PER_MINUTE": "3",
        "BEAMSERVE_ADDRESS_CHARACTERS_PER_DAY": "1000",
        "BEAMSERVE_TRUSTED_PROXIES": PROXY,
        "BEAMSERVE_ENGINE_PROCESS": "false",  # one process less to start: these tests are not the engine's
    }
    with serving(env) as running:
        yield running


def _from(address: str) -> httpx.Client:
    return httpx.Client(transport=httpx.HTTPTransport(local_address=address), timeout=60)


@pytest.mark.slow
def test_each_address_has_its_own_limits_and_a_client_cannot_name_another(
    limited: tuple[str, subprocess.Popen[str]],
) -> None:
    url, _ = limited
    with _from("127.0.0.1") as one, _from("127.0.0.2") as two, _from(PROXY) as proxy:
        assert [one.post(f"{url}/v1/translate", json=BODY).status_code for _ in range(3)] == [200] * 3
        refused = one.post(f"{url}/v1/translate", json=BODY)
        assert (
            refused.status_code == 429 and refused.json()["error"] == "rate_limited" and refused.headers["retry-after"]
        )
        # Another address counts on its own; what it says of itself (a forwarded address, the front's header)
        # is not believed from an address that is not a trusted proxy.
        forged = [{"X-Forwarded-For": f"198.51.100.{i}", "X-Beamserve-Peer": f"192.0.2.{i}"} for i in range(4)]
        answers = [two.post(f"{url}/v1/translate", json=BODY, headers=h).status_code for h in forged]
        assert answers == [200, 200, 200, 429]
        usage = two.get(f"{url}/v1/usage").json()
        assert usage["client"] == "address-127.0.0.2" and usage["characters_day_limit"] == 1000
        assert usage["characters_day"] == 3 * len(BODY["texts"][0])  # the refused request not charged
        # Behind a trusted proxy, each forwarded client counts on its own.
        for client in ("203.0.113.5", "203.0.113.6"):
            sent = [
                proxy.post(f"{url}/v1/translate", json=BODY, headers={"X-Forwarded-For": client}).status_code
                for _ in range(4)
            ]
            assert sent == [200, 200, 200, 429], client
        # LibreTranslate's route and its clients see the same limit, in their shape.
        libre = one.post(f"{url}/translate", json={"q": "A dog.", "source": "en", "target": "de"})
        assert libre.status_code == 429


def test_a_trusted_proxy_says_the_address_the_client_reached_and_nothing_else_does() -> None:
    trusted = trusted_networks(PROXY)
    via = {"x-forwarded-proto": "https", "x-forwarded-host": "translate.example.com", "x-forwarded-prefix": "/mt/"}
    assert reached_base(PROXY, via, trusted) == "https://translate.example.com/mt"
    assert reached_base("127.0.0.1", {**via, "x-beamserve-peer": PROXY}, trusted) == "https://translate.example.com/mt"
    assert reached_base("127.0.0.2", via, trusted) is None  # not a trusted proxy
    rfc = {"forwarded": 'for=203.0.113.5;proto=https;host="mt.example.org:8443", for=10.0.0.1'}
    assert reached_base(PROXY, rfc, trusted) == "https://mt.example.org:8443"
    assert reached_base(PROXY, {"x-forwarded-host": "a.example, b.example"}, trusted) == "http://a.example"
    for hostile in (
        {"x-forwarded-host": "evil.example/path"},
        {"x-forwarded-host": "a@evil.example"},
        {"x-forwarded-host": "a.example", "x-forwarded-proto": "javascript"},
        {"x-forwarded-host": "a.example", "x-forwarded-prefix": "//evil.example"},
        {"x-forwarded-host": "a.example", "x-forwarded-prefix": "/a b"},
        {"x-forwarded-proto": "https"},  # no host
    ):
        assert reached_base(PROXY, hostile, trusted) is None, hostile


@pytest.mark.slow
def test_a_file_s_link_is_the_address_a_trusted_proxy_says_the_client_reached(
    limited: tuple[str, subprocess.Popen[str]],
) -> None:
    url, _ = limited
    files = {"file": ("notes.txt", b"A dog runs in the snow.\n", "text/plain")}
    data = {"source": "en", "target": "de"}
    via = {"X-Forwarded-Proto": "https", "X-Forwarded-Host": "translate.example.com", "X-Forwarded-Prefix": "/mt"}
    with _from(PROXY) as proxy, _from("127.0.0.4") as direct:
        r = proxy.post(
            f"{url}/translate_file", files=files, data=data, headers={**via, "X-Forwarded-For": "203.0.113.20"}
        )
        link = r.json()["translatedFileUrl"]
        assert link.startswith("https://translate.example.com/mt/download_file/") and link.endswith("/notes.txt"), link
        # The proxy, taking the prefix off, reaches the translation on the server.
        assert proxy.get(url + link.removeprefix("https://translate.example.com/mt")).status_code == 200
        # A client that is not a trusted proxy names nothing: the link is the server's own address.
        r = direct.post(f"{url}/translate_file", files=files, data=data, headers=via)
        assert r.json()["translatedFileUrl"].startswith(f"{url}/download_file/")
