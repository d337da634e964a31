"""The vocabularies of M2M100 and NLLB (fairseq's layout, as Hugging Face saves it) read into a Tokenizer.

Both models tokenize with one SentencePiece model (`sentencepiece.bpe.model`) and map its pieces to ids
of their own: fairseq's four specials first (<s> 0, <pad> 1, </s> 2, <unk> 3), then the pieces, then a
token per language (NLLB's "eng_Latn", M2M100's "__en__"). Where the ids are written down, they are read:
NLLB's `tokenizer.json` (every piece and added token with its id), M2M100's `vocab.json` (the pieces;
the language tokens follow in the order its tokenizer config lists them). A directory holding NLLB's
SentencePiece model alone gets fairseq's own numbering: piece i of the model at i + 1, then the
languages its tokenizer config lists, then <mask>.
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import sentencepiece as spm

from model.io.tokenizer import Tokenizer

SPM = "sentencepiece.bpe.model"
# The files that make the tokenizer, whichever the directory has (copied beside a converted checkpoint).
FILES = (SPM, "tokenizer.json", "vocab.json", "tokenizer_config.json", "special_tokens_map.json")
SPECIAL_IDS = {"<s>": 0, "<pad>": 1, "</s>": 2, "<unk>": 3}  # fixed in every fairseq dictionary
SPECIALS = (*SPECIAL_IDS, "<mask>")
NLLB_CODE = re.compile(r"^[a-z]{3}_[A-Z][a-z]{3}$")  # eng_Latn, zho_Hans: the code is the token
M2M100_CODE = re.compile(r"^__([a-z]{2,3})__$")  # __en__: the code is inside
# M2M100's languages in the order of their tokens; its tokenizer config may name the set ("language_codes":
# "m2m100") instead of listing the tokens.
# fmt: off
M2M100_LANGUAGES = [
    "af", "am", "ar", "ast", "az", "ba", "be", "bg", "bn", "br", "bs", "ca", "ceb", "cs", "cy", "da",
    "de", "el", "en", "es", "et", "fa", "ff", "fi", "fr", "fy", "ga", "gd", "gl", "gu", "ha", "he",
    "hi", "hr", "ht", "hu", "hy", "id", "ig", "ilo", "is", "it", "ja", "jv", "ka", "kk", "km", "kn",
    "ko", "lb", "lg", "ln", "lo", "lt", "lv", "mg", "mk", "ml", "mn", "mr", "ms", "my", "ne", "nl",
    "no", "ns", "oc", "or", "pa", "pl", "ps", "pt", "ro", "ru", "sd", "si", "sk", "sl", "so", "sq",
    "sr", "ss", "su", "sv", "sw", "ta", "th", "tl", "tn", "tr", "uk", "ur", "uz", "vi", "wo", "xh",
    "yi", "yo", "zh", "zu",
]
# fmt: on


def is_fairseq(directory: Path) -> bool:
    return (directory / SPM).is_file()


def load(directory: Path) -> Tokenizer:
    vocab = read_vocab(directory)
    languages = language_tokens(vocab)
    if not languages:
        raise ValueError(f"{directory}: a fairseq vocabulary without language tokens (eng_Latn or __en__)")
    model = directory / SPM
    config = directory / "tokenizer_config.json"
    legacy = config.is_file() and bool(json.loads(config.read_text(encoding="utf-8")).get("legacy_behaviour"))
    return Tokenizer(model, model, vocab, languages=languages, specials=SPECIALS, language_last=legacy)


def language_tokens(vocab: dict[str, int]) -> dict[str, int]:
    """Language code -> token id, for every language token of the vocabulary."""
    out = {}
    for token, i in vocab.items():
        if NLLB_CODE.match(token):
            out[token] = i
        elif m := M2M100_CODE.match(token):
            out[m.group(1)] = i
    return out


def read_vocab(directory: Path) -> dict[str, int]:
    """Every token of the model's vocabulary with its id."""
    saved = directory / "tokenizer.json"
    if saved.is_file():
        data = json.loads(saved.read_text(encoding="utf-8"))
        pieces = data["model"]["vocab"]
        # A BPE model keeps {piece: id}, a Unigram one [[piece, score], ...] in id order.
        vocab = dict(pieces) if isinstance(pieces, dict) else {p[0]: i for i, p in enumerate(pieces)}
        vocab.update({t["content"]: t["id"] for t in data.get("added_tokens", [])})
        return vocab
    listed = _listed_tokens(directory)
    if (directory / "vocab.json").is_file():
        vocab = json.loads((directory / "vocab.json").read_text(encoding="utf-8"))
        size = len(vocab)
        return vocab | {token: size + i for i, token in enumerate(listed)}
    model = spm.SentencePieceProcessor(model_file=str(directory / SPM))
    # Fairseq's numbering: its specials, then the model's pieces one up (its own <unk>, <s>, </s> at 0-2).
    vocab = dict(SPECIAL_IDS)
    vocab |= {model.id_to_piece(i): i + 1 for i in range(3, model.get_piece_size())}
    size = model.get_piece_size() + 1
    vocab |= {token: size + i for i, token in enumerate(listed)}
    vocab.setdefault("<mask>", size + len(listed))
    return vocab


def _listed_tokens(directory: Path) -> list[str]:
    """The additional special tokens (the language tokens, in id order) of the tokenizer's config."""
    for name in ("tokenizer_config.json", "special_tokens_map.json"):
        path = directory / name
        if not path.is_file():
            continue
        config: dict[str, Any] = json.loads(path.read_text(encoding="utf-8"))
        tokens = config.get("additional_special_tokens") or config.get("extra_special_tokens")
        if tokens:
            return [t["content"] if isinstance(t, dict) else str(t) for t in tokens]
        if config.get("language_codes") == "m2m100":
            return [f"__{code}__" for code in M2M100_LANGUAGES]
    raise ValueError(
        f"{directory}: no tokenizer.json, and no language tokens listed (additional_special_tokens) in "
        "tokenizer_config.json or special_tokens_map.json, nor M2M100's language_codes"
    )


def train_spm(texts: list[str], directory: Path, vocab_size: int) -> Path:
    """Train a BPE SentencePiece model numbered as NLLB's (<unk> 0, <s> 1, </s> 2) on texts, as
    directory/sentencepiece.bpe.model (the test and benchmark models of NLLB's layout)."""
    spm.SentencePieceTrainer.train(
        sentence_iterator=iter(texts),
        model_prefix=str(directory / "sp"),
        vocab_size=vocab_size,
        model_type="bpe",
        character_coverage=1.0,
        unk_id=0,
        bos_id=1,
        eos_id=2,
        pad_id=-1,
        num_threads=2,
        minloglevel=2,
    )
    (directory / "sp.vocab").unlink()
    return (directory / "sp.model").rename(directory / SPM)
