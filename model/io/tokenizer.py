"""SentencePiece tokenization with Marian's file layout (source.spm, target.spm and a joint vocab.json, or
vocab.json and target_vocab.json for a model with separate vocabularies), or with fairseq's as M2M100 and
NLLB have it (model/io/fairseq_vocab.py): one sentencepiece.bpe.model, and language tokens that name the
source language before each source sentence and the target language as the first generated token."""

from __future__ import annotations

import json
from pathlib import Path

import sentencepiece as spm

SPECIAL = ("</s>", "<unk>", "<pad>")


class LanguageError(ValueError):
    """A language a multilingual model's vocabulary has no token for, or none named where one is needed."""


class Tokenizer:
    """Text <-> ids exactly as Hugging Face's MarianTokenizer does it (so outputs match HF)."""

    def __init__(
        self,
        source_spm: Path,
        target_spm: Path,
        vocab: dict[str, int],
        target_vocab: dict[str, int] | None = None,
        *,
        languages: dict[str, int] | None = None,
        specials: tuple[str, ...] = SPECIAL,
        language_last: bool = False,
    ) -> None:
        self.source = spm.SentencePieceProcessor(model_file=str(source_spm))
        self.target = spm.SentencePieceProcessor(model_file=str(target_spm))
        self.vocab = vocab  # source pieces (and target ones, shared)
        self.target_vocab = target_vocab if target_vocab is not None else vocab
        self.separate = target_vocab is not None
        self.pieces = {i: p for p, i in self.target_vocab.items()}  # target ids -> pieces, for decode
        self.eos_id = vocab["</s>"]
        self.unk_id = vocab["<unk>"]
        self.pad_id = vocab["<pad>"]
        # A fairseq model's language tokens by language code ("eng_Latn", "de"): one before every source
        # sentence, and one forced as the first generated token; {} for Marian's layout.
        self.languages = languages or {}
        # NLLB's legacy_behaviour (its tokenizer config): a source's language token after its </s>, not before it.
        self.language_last = language_last and bool(self.languages)
        # Dropped from decoded text: the specials of both vocabularies (they share </s> and <unk>).
        self.special_ids = {v[s] for v in (vocab, self.target_vocab) for s in specials if s in v}
        self.special_ids |= set(self.languages.values())
        self.target_eos_id = self.target_vocab["</s>"]
        self.target_unk_id = self.target_vocab["<unk>"]

    @classmethod
    def load(cls, directory: Path) -> Tokenizer:
        """Marian's files in `directory` (checkpoint.tokenizer reads fairseq's layout too)."""
        vocab = json.loads((directory / "vocab.json").read_text(encoding="utf-8"))
        target = directory / "target_vocab.json"
        target_vocab = json.loads(target.read_text(encoding="utf-8")) if target.exists() else None
        return cls(directory / "source.spm", directory / "target.spm", vocab, target_vocab)

    def __len__(self) -> int:
        return max(self.vocab.values()) + 1

    def fingerprint(self) -> bytes:
        """What decides how text becomes ids and back: both SentencePiece models and the vocabularies."""
        vocabs = [self.vocab, *([self.target_vocab] if self.separate else [])]
        dumped = b"".join(json.dumps(v, sort_keys=True, ensure_ascii=False).encode() for v in vocabs)
        order = b"language last" if self.language_last else b""
        return self.source.serialized_model_proto() + self.target.serialized_model_proto() + dumped + order

    def language_id(self, code: str) -> int:
        """The token of language `code` in a fairseq multilingual vocabulary; LanguageError names the codes."""
        if code not in self.languages:
            known = sorted(self.languages)
            listed = ", ".join(known[:20]) + (f" and {len(known) - 20} more" if len(known) > 20 else "")
            raise LanguageError(f"no language token for {code!r}; this model's: {listed or 'none'}")
        return self.languages[code]

    def encode(self, text: str, lang: str | None = None) -> list[int]:
        """Source text -> ids ending in </s>; a leading >>xx<< language code stays one token. A fairseq
        multilingual model's sources start with their language's token (`lang` names it), or end with it after
        their </s> (`language_last`)."""
        if self.languages:
            if lang is None:
                raise LanguageError("this model translates from many languages: name the source language")
            ids = [self.vocab.get(p, self.unk_id) for p in self.source.encode(text, out_type=str)]
            if self.language_last:
                return [*ids, self.eos_id, self.language_id(lang)]
            return [self.language_id(lang), *ids, self.eos_id]
        code: list[str] = []
        if text.startswith(">>") and (end := text.find("<<")) != -1:
            code, text = [text[: end + 2]], text[end + 2 :]
        pieces = code + self.source.encode(text, out_type=str)
        return [self.vocab.get(p, self.unk_id) for p in pieces] + [self.eos_id]

    def truncated(self, ids: list[int], limit: int) -> list[int]:
        """A source's `encode` ids cut to `limit`, their ending kept (</s>, and a last language token)."""
        end = 2 if self.language_last else 1
        return [*ids[: limit - end], *ids[-end:]]

    def source_spans(self, text: str, lang: str | None = None) -> tuple[list[int], list[tuple[int, int]]]:
        """`spans` of a source, ended as `encode` ends it, each end token with an empty span at the text's end."""
        ids, spans = self.spans(text, lang=lang)
        end = [self.eos_id, self.language_id(lang or "")] if self.language_last else [self.eos_id]
        return ids + end, spans + [(len(text), len(text))] * len(end)

    def decode(self, ids: list[int]) -> str:
        """Target ids -> detokenized text; special tokens are dropped."""
        pieces = [self.pieces[i] for i in ids if i not in self.special_ids and i in self.pieces]
        # A lone word-boundary piece survives decode_pieces; Marian's tokenizer maps it to a space and strips.
        return str(self.target.decode_pieces(pieces)).replace("\u2581", " ").strip()

    def spans(
        self, text: str, *, target: bool = False, lang: str | None = None
    ) -> tuple[list[int], list[tuple[int, int]]]:
        """Ids of text as `encode` (or `encode_target`) gives them, </s> left off, and each token's character
        span in text without the whitespace before it; a lone word-boundary token has an empty span. With
        language tokens, `lang`'s comes first, with an empty span (a source's, or the target's forced one)."""
        code: list[tuple[int, int]] = []
        offset = 0
        if not target and not self.languages and text.startswith(">>") and (end := text.find("<<")) != -1:
            code, offset = [(0, end + 2)], end + 2
        rest = text[offset:]
        proto = (self.target if target else self.source).encode(rest, return_type="proto")
        vocab, unk = (self.target_vocab, self.target_unk_id) if target else (self.vocab, self.unk_id)
        chars = _char_index(rest)
        ids = [self.vocab.get(text[:offset], self.unk_id)] if code else []
        spans = list(code)
        if self.languages:
            if lang is None:
                raise LanguageError("this model translates between many languages: name the language")
            first = target or not self.language_last  # a legacy source's comes last (source_spans)
            ids, spans = ([self.language_id(lang)], [(0, 0)]) if first else ([], [])
        for piece in proto.pieces:
            ids.append(vocab.get(piece.piece, unk))
            begin, end = chars[piece.begin], chars[piece.end]
            spans.append((offset + begin + len(rest[begin:end]) - len(rest[begin:end].lstrip()), offset + end))
        return ids, spans

    def encode_target(self, text: str) -> list[int]:
        """Target text -> ids ending in </s> (training labels)."""
        pieces = self.target.encode(text, out_type=str)
        return [self.target_vocab.get(p, self.target_unk_id) for p in pieces] + [self.target_eos_id]


def _char_index(text: str) -> list[int]:
    """UTF-8 byte offset -> character offset in text (SentencePiece reports byte offsets)."""
    index = []
    for i, ch in enumerate(text):
        index += [i] * len(ch.encode("utf-8", "surrogatepass"))
    return [*index, len(text)]


def train_joint_spm(texts: list[str], prefix: Path, vocab_size: int) -> tuple[Path, dict[str, int]]:
    """Train one SentencePiece model on both languages; ids follow Marian (</s>=0, <unk>=1, <pad>=last)."""
    prefix.parent.mkdir(parents=True, exist_ok=True)
    spm.SentencePieceTrainer.train(
        sentence_iterator=iter(texts),
        model_prefix=str(prefix),
        vocab_size=vocab_size - 1,
        model_type="unigram",
        character_coverage=1.0,
        eos_id=0,
        unk_id=1,
        bos_id=-1,
        pad_id=-1,
        eos_piece="</s>",
        unk_piece="<unk>",
        input_sentence_size=len(texts),
        shuffle_input_sentence=True,
        num_threads=2,
        minloglevel=2,
    )
    model = spm.SentencePieceProcessor(model_file=f"{prefix}.model")
    vocab = {model.id_to_piece(i): i for i in range(model.get_piece_size())}
    vocab["<pad>"] = model.get_piece_size()
    return Path(f"{prefix}.model"), vocab
