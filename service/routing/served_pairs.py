"""The language pairs a gateway serves: each with a model, and each through the pivot language where
both of its halves have one (src -> en -> tgt)."""

from __future__ import annotations

from collections.abc import Iterable

from service.errors import ApiError
from service.text.language_tags import served_code

PIVOT = "en"
MAX_LISTED_PAIRS = 60  # an error message lists the served pairs up to this many


class ServedPairs:
    def __init__(self, pairs: Iterable[str]) -> None:
        self.direct = sorted(pairs)
        into = {p.split("-")[0] for p in self.direct if p.split("-")[1] == PIVOT}
        out_of = {p.split("-")[1] for p in self.direct if p.split("-")[0] == PIVOT}
        self.pivoted = sorted({f"{s}-{t}" for s in into for t in out_of if s != t} - set(self.direct))
        self._all = frozenset(self.direct) | frozenset(self.pivoted)
        # Every language of a pair with a model, source or target: what detection chooses among.
        self.languages = frozenset(lang for pair in self.direct for lang in pair.split("-"))

    def everything(self) -> list[str]:
        """Every pair served, directly or through the pivot, sorted."""
        return sorted(self._all)

    def code(self, tag: str) -> str:
        """A client's language tag as the served code (service/text/language_tags.py)."""
        return served_code(tag, self.languages)

    def serves(self, pair: str) -> bool:
        return pair in self._all

    def legs(self, pair: str) -> list[str]:
        """The pairs with a model that `pair` goes through: itself, or its two halves through the pivot."""
        if pair not in self.pivoted:
            return [pair]
        source, target = pair.split("-")
        return [f"{source}-{PIVOT}", f"{PIVOT}-{target}"]

    def listed(self) -> str:
        """The served pairs for an error message: listed, or past MAX_LISTED_PAIRS (a model of many
        languages serves thousands) counted, with their languages."""
        if len(self.direct) <= MAX_LISTED_PAIRS:
            return f"served pairs: {', '.join(self.direct)}"
        languages = ", ".join(sorted(self.languages))
        return f"{len(self.direct)} pairs served, among: {languages} (GET /languages lists each one's targets)"

    def check(self, source: str, target: str) -> None:
        """ApiError unsupported_pair, naming the pairs served, when no model (nor the pivot) translates it."""
        if not self.serves(f"{source}-{target}"):
            raise ApiError(
                "unsupported_pair",
                f"no model for {source} -> {target}; {self.listed()}"
                + (f"; through {PIVOT}: {', '.join(self.pivoted)}" if self.pivoted else ""),
            )
