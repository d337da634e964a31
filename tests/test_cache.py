"""The gateway's translation cache (service/routing/cache.py): LRU bounds and keys; equality with a fresh answer is
tested through the real server in tests/test_service.py."""

from __future__ import annotations

from dataclasses import replace

from model.options import DecodeOptions
from service.routing.cache import Entry, TranslationCache

OPTS = DecodeOptions(beam_size=4, length_penalty=1.0)


def entry(text: str) -> Entry:
    return Entry([(text, -0.5)], 3, 4)


def test_a_hit_returns_what_was_put_under_the_same_key_only() -> None:
    cache = TranslationCache(10, 10**6)
    key = cache.key("d1", "en-de", OPTS, "A dog.")
    assert cache.get(key) is None
    cache.put(key, entry("Ein Hund."))
    assert cache.get(key) == entry("Ein Hund.")
    # Another model, pair, option value, sentence or long-sentence rule is another key.
    for other in (
        cache.key("d2", "en-de", OPTS, "A dog."),
        cache.key("d1", "en-fr", OPTS, "A dog."),
        cache.key("d1", "en-de", replace(OPTS, beam_size=2), "A dog."),
        cache.key("d1", "en-de", OPTS, "A dog. "),
        cache.key("d1", "en-de", OPTS, "A dog.", pieces=True),  # a long one is refused without pieces
    ):
        assert cache.get(other) is None
    assert cache.key("d1", "en-de", DecodeOptions(length_penalty=1.0, beam_size=4), "A dog.") == key  # equal options
    assert (cache.stats.hits, cache.stats.misses) == (1, 6)
    assert cache.lookups("en-de") == (1, 5) and cache.lookups("en-fr") == (0, 1) and cache.lookups("de-en") == (0, 0)


def test_least_recently_used_goes_first_past_the_entry_bound() -> None:
    cache = TranslationCache(2, 10**6)
    a, b, c = (cache.key("d", "en-de", OPTS, s) for s in "abc")
    cache.put(a, entry("A"))
    cache.put(b, entry("B"))
    assert cache.get(a) is not None  # a is now the most recent
    cache.put(c, entry("C"))
    assert cache.get(b) is None and cache.get(a) is not None and cache.get(c) is not None
    assert cache.stats.evictions == 1 and len(cache.entries) == 2


def test_the_byte_bound_holds_and_an_entry_larger_than_it_is_not_kept() -> None:
    cache = TranslationCache(1000, 3000)
    for i in range(50):
        cache.put(cache.key("d", "en-de", OPTS, f"sentence {i}"), entry(f"Satz {i}"))
        assert cache.bytes <= 3000
    assert 0 < len(cache.entries) < 50
    assert cache.bytes == sum(size for _, size in cache.entries.values())
    big = cache.key("d", "en-de", OPTS, "x" * 5000)
    cache.put(big, entry("y"))
    assert cache.get(big) is None


def test_zero_turns_it_off() -> None:
    cache = TranslationCache(0, 10**6)
    key = cache.key("d", "en-de", OPTS, "a")
    cache.put(key, entry("A"))
    assert not cache.enabled and cache.get(key) is None
