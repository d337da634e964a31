"""A model's licence as its card's front matter names it (model/io/model_card.py), and whether it forbids
commercial use."""

from __future__ import annotations

from pathlib import Path

import pytest

from model import Translator
from model.io import model_card

CARDS = {
    "---\nlanguage: en\nlicense: cc-by-nc-4.0\n---\n# NLLB\n": "cc-by-nc-4.0",
    "---\nlicense:\n- apache-2.0\ntags:\n- translation\n---\n": "apache-2.0",  # a list: its first
    "---\nlicense: 'cc-by-4.0'\n---\n": "cc-by-4.0",
    "---\nlicense: other\nlicense_name: research only\n---\n": "other: research only",
    "# A card without front matter\nlicense: mit\n": None,
    "---\ntags:\n- license: mit\n---\n": None,  # not the card's own field
    "---\nlicense: mit\n": "mit",  # front matter never closed: what it holds still counts
}


@pytest.mark.parametrize(("text", "expected"), CARDS.items())
def test_the_licence_is_the_front_matter_s(tmp_path: Path, text: str, expected: str | None) -> None:
    (tmp_path / "README.md").write_text(text)
    assert model_card.licence(tmp_path) == expected


def test_non_commercial_licences_are_told_apart() -> None:
    for name in ("cc-by-nc-4.0", "CC-BY-NC-SA-4.0", "cc-by-nc-nd-3.0", "other: non-commercial research"):
        assert model_card.non_commercial(name), name
    for name in ("cc-by-4.0", "apache-2.0", "mit", "openrail", "bigscience-openrail-m", None, ""):
        assert not model_card.non_commercial(name), name


def test_the_shipped_models_name_their_data_s_terms() -> None:
    for name in ("en-de", "en-fr"):
        tr = Translator.load(name, "cpu")
        assert tr.licence is not None and tr.licence.startswith("other: non-commercial research")
        assert model_card.non_commercial(tr.licence)
