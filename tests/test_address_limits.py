"""Per-address limits while keys are off (Settings.address_*, LibreTranslate's per-client limits), end to end:
`beamserve serve` behind its HAProxy, clients on three loopback addresses (127.0.0.1, .2 and .3; the whole of
127/8 is this host's), one of them a trusted proxy whose X-Forwarded-For names the client."""

from __future__ import annotations

import subprocess
from collections.abc import Iterator

import httpx
import pytest

from service.api.client_address import client_address, trusted_networks

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
