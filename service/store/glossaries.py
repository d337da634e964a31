"""Glossaries as the routes use them (service/store/records.py keeps them): a key reaches only its own
glossaries (another key's id is not found, as an unknown one), and each glossary's terms are
compiled once per content."""

from __future__ import annotations

import asyncio
import re
from collections import OrderedDict
from typing import Any

import orjson

from service.errors import ApiError
from service.store.records import Records
from service.text.glossary import MAX_GLOSSARIES, Glossary, Terms, checked, digest, v3_info

KIND = "glossary"
# Each glossary's DeepL v3 object (Glossary.info(), a few hundred bytes) as a record of its own: a listing reads
# these, never the entries (a key's thousand glossaries of ten thousand entries are about 3 GB).
INFO_KIND = "glossary_info"
ID = re.compile(r"[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}")  # a glossary id: a UUID
TERMS_KEPT = 256  # glossaries whose compiled terms a gateway replica keeps, least recently used out first
TERMS_KEPT_BYTES = 64_000_000  # and at most about this much memory of them (Terms.bytes)


class Glossaries:
    def __init__(self, records: Records) -> None:
        self.records = records
        self._terms: OrderedDict[str, Terms] = OrderedDict()
        self.kept_bytes = 0

    async def create(self, glossary: Glossary) -> Glossary:
        if await self.records.count(KIND, glossary.owner) >= MAX_GLOSSARIES:
            raise ApiError("too_many_glossaries", f"this key has {MAX_GLOSSARIES} glossaries; delete one first")
        await self.records.put(KIND, glossary.glossary_id, glossary.owner, glossary.dumps().encode())
        await self._put_info(glossary)  # after the glossary: an info record always has its glossary
        return glossary

    async def get(self, glossary_id: str, owner: str) -> Glossary:
        found = await self.records.get(KIND, glossary_id) if ID.fullmatch(glossary_id) else None
        if found is None or found.owner != owner:
            raise ApiError("glossary_not_found", f"no glossary {glossary_id[:64]!r}")
        return Glossary.loads(found.body)

    async def update(self, glossary: Glossary) -> Glossary:
        """A glossary of the owner's changed (its name, its dictionaries): stored in place of the old."""
        await self.records.put(KIND, glossary.glossary_id, glossary.owner, glossary.dumps().encode())
        await self._put_info(glossary)
        return glossary

    async def listing(self, owner: str) -> list[dict[str, Any]]:
        """The owner's glossaries as DeepL's v3 objects, oldest first, from their info records alone (a v2
        object stored by an earlier server read as one dictionary's). Glossaries stored without one (by a
        server before INFO_KIND) get theirs here: that one listing reads the entries, parsed off the event
        loop."""
        infos = [v3_info(orjson.loads(b)) for b in await self.records.owned(INFO_KIND, owner)]
        if len(infos) < await self.records.count(KIND, owner):
            bodies = await self.records.owned(KIND, owner)
            listed = {info["glossary_id"] for info in infos}
            missing = await asyncio.to_thread(
                lambda: [g for g in map(Glossary.loads, bodies) if g.glossary_id not in listed]
            )
            for glossary in missing:
                await self._put_info(glossary)
            infos += [g.info() for g in missing]
        return sorted(infos, key=lambda info: (str(info["creation_time"]), str(info["glossary_id"])))

    async def delete(self, glossary_id: str, owner: str) -> None:
        found = (await self.get(glossary_id, owner)).glossary_id
        await self.records.delete(INFO_KIND, found)
        await self.records.delete(KIND, found)

    async def _put_info(self, glossary: Glossary) -> None:
        await self.records.put(INFO_KIND, glossary.glossary_id, glossary.owner, orjson.dumps(glossary.info()))

    async def terms(self, given: str | dict[str, str] | None, source: str, target: str, owner: str) -> Terms | None:
        """A request's glossary (an id, or its own entries) as Terms; ApiError when the id is unknown
        or the glossary is for another language pair."""
        if given is None:
            return None
        if isinstance(given, dict):
            entries = checked(given)
        else:
            glossary = await self.get(given, owner)
            dictionary = glossary.dictionary(source, target)
            if dictionary is None:
                own = ", ".join(pair.replace("-", " -> ") for pair in glossary.dictionaries)
                raise ApiError(
                    "glossary_mismatch", f"glossary {given} is for {own}; it has no dictionary for {source} -> {target}"
                )
            entries = dictionary
        key = digest(entries)
        if (found := self._terms.get(key)) is not None:
            self._terms.move_to_end(key)
            return found
        found = self._terms[key] = Terms(entries)
        self.kept_bytes += found.bytes
        while len(self._terms) > TERMS_KEPT or (self.kept_bytes > TERMS_KEPT_BYTES and len(self._terms) > 1):
            _, gone = self._terms.popitem(last=False)  # the least recently used
            self.kept_bytes -= gone.bytes
        return found
