"""A translation memory's lookup: a sentence's exact match, after normalising whitespace and placeholders,
else its nearest unit by rapidfuzz's `fuzz.ratio` (the Indel similarity CAT tools' fuzzy matches are
scored by) at or above a minimum match in [0, 1].

Normalising: Unicode NFC, runs of whitespace as one space, the ends trimmed, and each placeholder
(`{name}`, `${name}`, `%s`, `%1$s`, `%d`) as `{}`. An exact match whose placeholders are named differently
from the sentence's gets the sentence's placeholders in the target, in their order: "Hello {user}"
answered from the unit "Hello {name}" -> "Hallo {name}" is "Hallo {user}".

A match is a translation of another sentence, so it answers only what it can carry over (`carried`): the
sentence's numbers and placeholders put in the unit's target in place of the unit's own, where each of those
stands in the target as often as in the unit's source (else the match is not used). With no other difference
the carried target answers; with any other (a word added, dropped or changed: "not", "two", a name), the
model decides (service/routing/pair_decoder.py): the target is scored against the sentence and answers only
where the model finds it about as likely as its own translation. A match not used is offered beside the
model's translation (`Suggestion`) for a person to edit.

A fuzzy lookup in a small memory (SCAN_ALL units or fewer) scores every unit whose length can reach the
minimum (a ratio r between strings of lengths a and b needs |a - b| <= (1 - r)(a + b): the units are
kept sorted by length, the window a slice). In a larger one it scores the CANDIDATES units of that
window sharing the most words with the sentence (an inverted index of words, those in more than a
fifth of the units left out as they tell nothing): the unit a sentence nearly repeats shares most of its
words, and scoring a few hundred units keeps a lookup in 100,000 within a millisecond or two
(loadtests/bench_memory_lookup.py). Either way a lookup scores at most WORK pairs of characters (a long
text against long units: those sharing the most words, as many as fit), and scores them without holding
the GIL, so a lookup on a thread leaves the gateway's event loop free.
"""

from __future__ import annotations

import bisect
import functools
import re
import sys
import unicodedata
from dataclasses import dataclass

import numpy as np
from rapidfuzz import fuzz, process

PLACEHOLDER = re.compile(r"\$?\{[^{}\s]{0,64}\}|%(?:\d{1,2}\$)?[sd]")
# What a match carries over from the sentence: its placeholders and its numbers (digits, with the group and
# decimal separators between them), each standing alone, not inside a word ("3rd", "A4").
SLOT = re.compile(rf"{PLACEHOLDER.pattern}|(?<!\w)\d+(?:[.,]\d+)*(?!\w)")
WORD = re.compile(r"\w+")
SCAN_ALL = 5_000
CANDIDATES = 256
FUZZY_TOP = 0.9999  # the highest fuzzy match: 1.0 is exact alone
# Character pairs a fuzzy lookup scores at most (a ratio costs about 0.02 ns a pair on a 2020s core: some 5 ms),
# so a long text against long units costs what a sentence does, whatever the memory holds.
WORK = 250_000_000


@dataclass(frozen=True)
class Match:
    source: str  # the unit's source segment
    target: str  # its translation, the sentence's placeholders in it where the match is exact
    score: float  # 1.0 exact (after normalising); else the fuzzy ratio in [0, 1)


@dataclass(frozen=True)
class Carried:
    target: str  # the unit's target with the sentence's numbers and placeholders in place of the unit's
    same: bool  # nothing else differs: the sentence is the unit's source but for those


@dataclass(frozen=True)
class Suggestion:
    """A unit near a sentence that did not answer it: offered beside the model's translation, to edit."""

    source: str
    target: str
    match: float  # its fuzzy ratio (1.0: an exact match whose numbers or placeholders could not be carried)


@dataclass(frozen=True)
class Recall:
    """A request's memory: its index, and the least match that answers a sentence."""

    index: MemoryIndex
    min_match: float


def normal(text: str) -> str:
    return PLACEHOLDER.sub("{}", " ".join(unicodedata.normalize("NFC", text).split()))


class MemoryIndex:
    def __init__(self, units: dict[str, str]) -> None:
        """units: {source segment: target segment}, as a memory stores them."""
        self.exact: dict[str, tuple[str, str]] = {}
        for source, target in units.items():
            self.exact[normal(source)] = (source, target)
        self.keys = sorted(self.exact, key=len)  # the normal forms, shortest first
        self.lengths = [len(k) for k in self.keys]
        self.starts = np.cumsum([0, *self.lengths])  # (n + 1,) the characters of the keys before each
        lists: dict[str, list[int]] = {}
        for i, key in enumerate(self.keys):
            for word in set(WORD.findall(key.lower())):
                lists.setdefault(word, []).append(i)
        common = len(self.keys) // 5 if len(self.keys) > SCAN_ALL else len(self.keys)
        # word -> the keys' positions holding it
        self.postings = {w: np.array(ids, dtype=np.int32) for w, ids in lists.items() if len(ids) <= common}

    def __len__(self) -> int:
        return len(self.keys)

    @functools.cached_property
    def nbytes(self) -> int:
        """About the memory this index holds: its strings, lists, word index and dictionaries."""
        strings = sum(sys.getsizeof(k) + sys.getsizeof(s) + sys.getsizeof(t) for k, (s, t) in self.exact.items())
        words = sum(sys.getsizeof(w) + a.nbytes + 112 for w, a in self.postings.items())  # 112: an array's header
        tables = sys.getsizeof(self.exact) + sys.getsizeof(self.postings) + 16 * len(self.keys) + 72 * len(self.exact)
        return strings + words + tables + self.starts.nbytes

    def lookup(self, sentence: str, min_match: float, *, apart: bool = False) -> Match | None:
        """The sentence's match at min_match or above (1.0: exact matches alone), or None. `apart`: on a thread of
        its own, scored without holding the GIL (cdist; 0.1 ms slower a lookup than extractOne, which holds it)."""
        key = normal(sentence)
        found = self.exact.get(key)
        if found is not None:
            carry = carried(found[0], found[1], sentence)
            if carry is not None:  # its placeholders renamed as the sentence's
                return Match(found[0], carry.target, 1.0)
            # The target holds a placeholder other than as often as the source: no exact match.
            return Match(found[0], found[1], FUZZY_TOP) if min_match < 1.0 else None
        if min_match >= 1.0 or not key:
            return None
        n = len(key)
        lo = bisect.bisect_left(self.lengths, n * min_match / (2 - min_match))
        hi = bisect.bisect_right(self.lengths, n * (2 - min_match) / max(min_match, 1e-9))
        choices = self._choices(key, lo, hi)
        if not choices:
            return None
        least = min_match * 100
        if apart:  # cdist releases the GIL: the event loop runs meanwhile
            ratios = process.cdist([key], choices, scorer=fuzz.ratio, score_cutoff=least, workers=1, dtype=np.float64)[
                0
            ]
            best = int(np.argmax(ratios))  # the first of the best, as extractOne
            winner = (choices[best], float(ratios[best])) if ratios[best] >= least and ratios[best] > 0 else None
        else:
            one = process.extractOne(key, choices, scorer=fuzz.ratio, score_cutoff=least)
            winner = (one[0], float(one[1])) if one is not None else None
        if winner is None:
            return None
        source, target = self.exact[winner[0]]
        return Match(source, target, min(winner[1] / 100, FUZZY_TOP))  # exact is 1.0 alone

    def work(self, sentences: list[str], min_match: float) -> int:
        """About how many character pairs fuzzy lookups of the sentences score (each at most WORK): what
        decides whether they are worth a thread."""
        total = 0
        for sentence in dict.fromkeys(sentences):
            n = len(sentence)
            lo = bisect.bisect_left(self.lengths, n * min_match / (2 - min_match))
            hi = bisect.bisect_right(self.lengths, n * (2 - min_match) / max(min_match, 1e-9))
            chars = int(self.starts[hi] - self.starts[lo])
            if hi - lo > CANDIDATES and len(self.keys) > SCAN_ALL:
                chars = chars * CANDIDATES // (hi - lo)
            total += min(WORK, n * chars)
        return total

    def find(self, sentences: list[str], min_match: float, *, apart: bool = False) -> dict[str, Match]:
        """Each distinct sentence the memory answers, with its match (`apart`: as `lookup`)."""
        found = {s: self.lookup(s, min_match, apart=apart) for s in dict.fromkeys(sentences)}
        return {s: m for s, m in found.items() if m is not None}

    def _choices(self, key: str, lo: int, hi: int) -> list[str]:
        """The keys to score: the length window's, or in a large memory or where those are more work than
        WORK, those of it sharing most words with key, at most CANDIDATES and WORK's worth."""
        if lo >= hi:
            return []
        chars = WORK // max(1, len(key))  # the characters of keys a lookup of key may score
        if len(self.keys) <= SCAN_ALL and self.starts[hi] - self.starts[lo] <= chars:
            return self.keys[lo:hi]
        found = [self.postings[w] for w in set(WORD.findall(key.lower())) if w in self.postings]
        if not found:
            return []
        shared = np.bincount(np.concatenate(found), minlength=len(self.keys))[lo:hi]  # (window,) words in common
        above = np.cumsum(np.bincount(shared)[::-1])[::-1]  # above[t]: the keys sharing t words or more
        fits = np.flatnonzero(above[1:] <= CANDIDATES)  # the fewest words in common that keeps to CANDIDATES
        least = int(fits[0]) + 1 if fits.size else len(above) - 1
        picked = lo + np.flatnonzero(shared >= least)[:CANDIDATES]
        sizes = self.starts[picked + 1] - self.starts[picked]  # (picked,) their lengths
        if sizes.sum() > chars:  # long keys: those sharing the most words, as many as WORK scores
            ranked = np.argsort(-shared[picked - lo], kind="stable")
            picked = np.sort(picked[ranked][np.cumsum(sizes[ranked]) <= chars])
        return [self.keys[int(i)] for i in picked]


def carried(source: str, target: str, sentence: str) -> Carried | None:
    """The unit (source -> target) carried over to the sentence: each of its numbers and placeholders that
    the sentence has otherwise replaced in the target (in order: the unit's k-th is the sentence's k-th), or
    None where that cannot be done (the sentence has more or fewer of them, one of the unit's stands for two
    of the sentence's, or the target holds it a different number of times than the source)."""
    theirs, ours = _slots(source), _slots(sentence)
    if len(theirs[1]) != len(ours[1]):
        return None
    swap: dict[str, str] = {}
    for old, new in zip(theirs[1], ours[1], strict=True):
        if swap.setdefault(old, new) != new:
            return None
    swap = {old: new for old, new in swap.items() if old != new}
    in_target = SLOT.findall(target)
    if any(in_target.count(old) != theirs[1].count(old) for old in swap):
        return None
    out = SLOT.sub(lambda m: swap.get(m.group(0), m.group(0)), target) if swap else target
    return Carried(out, theirs[0] == ours[0])


def _slots(text: str) -> tuple[str, list[str]]:
    """The text (NFC, whitespace runs as one space) with its numbers and placeholders as NUL, and those."""
    flat = " ".join(unicodedata.normalize("NFC", text).split())
    return SLOT.sub("\x00", flat), SLOT.findall(flat)
