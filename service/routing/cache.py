"""The gateway's translation cache: a sentence's answer, kept for the next time it is asked.

Web pages and UI strings repeat; decoding is deterministic and a sentence's translation does not
depend on what it is batched with (tests/test_inflight.py), so a cached answer equals a fresh one
exactly. The key is everything that decides the answer: the model's content digest (weights and
tokenizer, model/translator.py), the pair, every decoding option, and the exact sentence. Bounded
in entries and in bytes, least recently used out first; one per gateway replica (its hit rate is
that replica's share of the traffic).
"""

from __future__ import annotations

import sys
from collections import OrderedDict
from dataclasses import dataclass, field

from model.options import DecodeOptions

Key = tuple[str, str, DecodeOptions, str, bool]  # (digest, pair, options, sentence, in pieces)
# Bytes an entry costs beyond its strings: the key and option tuples, the entry, its list, floats and
# the dict slot (tracemalloc over 10,000 entries with 8 options: 1,240 bytes each, 240 of them strings).
ENTRY_OVERHEAD = 1000


@dataclass(frozen=True)
class Entry:
    nbest: list[tuple[str, float]]  # the sentence's hypotheses (text, score), best first
    source_tokens: int
    target_tokens: int


@dataclass
class CacheStats:
    hits: int = 0
    misses: int = 0
    evictions: int = 0
    by_pair: dict[str, list[int]] = field(default_factory=dict)  # pair -> [hits, misses]


class TranslationCache:
    """LRU of sentence -> Entry, at most max_entries entries and max_bytes bytes (0 turns it off)."""

    def __init__(self, max_entries: int, max_bytes: int) -> None:
        self.max_entries, self.max_bytes = max_entries, max_bytes
        self.entries: OrderedDict[Key, tuple[Entry, int]] = OrderedDict()  # entry and its size, oldest first
        self.bytes = 0
        self.stats = CacheStats()

    @property
    def enabled(self) -> bool:
        return self.max_entries > 0 and self.max_bytes > 0

    @staticmethod
    def key(digest: str, pair: str, options: DecodeOptions, sentence: str, pieces: bool = False) -> Key:
        """A sentence's key: the model, the pair, every option, the sentence, and whether one longer than the
        model takes may be translated in pieces (refused otherwise: a cached translation must not answer it)."""
        return digest, pair, options, sentence, pieces

    def get(self, key: Key) -> Entry | None:
        found = self.entries.get(key)
        counts = self.stats.by_pair.setdefault(key[1], [0, 0])
        if found is None:
            self.stats.misses += 1
            counts[1] += 1
            return None
        self.entries.move_to_end(key)
        self.stats.hits += 1
        counts[0] += 1
        return found[0]

    def put(self, key: Key, entry: Entry) -> None:
        if not self.enabled:
            return
        size = ENTRY_OVERHEAD + _text_bytes(key[3]) + sum(_text_bytes(t) for t, _ in entry.nbest)
        if size > self.max_bytes:
            return
        old = self.entries.pop(key, None)
        if old is not None:
            self.bytes -= old[1]
        self.entries[key] = (entry, size)
        self.bytes += size
        while len(self.entries) > self.max_entries or self.bytes > self.max_bytes:
            _, (_, evicted) = self.entries.popitem(last=False)
            self.bytes -= evicted
            self.stats.evictions += 1

    def lookups(self, pair: str) -> tuple[int, int]:
        """(hits, misses) of one pair's sentences."""
        hits, misses = self.stats.by_pair.get(pair, (0, 0))
        return hits, misses

    def summary(self) -> dict[str, int]:
        s = self.stats
        return {
            "entries": len(self.entries),
            "bytes": self.bytes,
            "max_entries": self.max_entries,
            "max_bytes": self.max_bytes,
            "hits": s.hits,
            "misses": s.misses,
            "evictions": s.evictions,
        }


def _text_bytes(text: str) -> int:
    return sys.getsizeof(text)
