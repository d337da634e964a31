"""A given target under the model, teacher-forced: each target token's alignment to the source token it attends to
most, and each target's log-probabilities (CTranslate2's score_batch), for the text pairs Translator.align and
Translator.score take."""

from __future__ import annotations

from collections.abc import Sequence

from model.decode.align import Link, attention_alignment
from model.decode.confidence import ScoringResult
from model.decode.scoring import token_log_probs
from model.errors import InputTooLongError, SourceError, check_text
from model.io.codec import TextCodec
from model.io.tokenizer import LanguageError, Tokenizer
from model.nn.transformer import Seq2Seq


def align(
    model: Seq2Seq,
    tokenizer: Tokenizer,
    pairs: Sequence[tuple[str, str]],
    *,
    batch_size: int = 64,
    src_lang: str | None = None,
    tgt_lang: str | None = None,
) -> list[list[Link]]:
    """Each target token of each (source, translation) pair linked to the source token it attends to most
    (model/decode/align.py); a pair with a blank side gets no links. Raises SourceError as `encode` does. A
    model with language tokens takes both languages, as `translate` does."""
    out: list[list[Link]] = [[] for _ in pairs]
    limit = model.cfg.max_position_embeddings
    live = []
    for i, (source, target) in enumerate(pairs):
        if not source.strip() or not target.strip():
            continue
        try:
            check_text(source)
            check_text(target)
        except SourceError as exc:
            raise type(exc)(exc.reason, i) from None
        src_ids, src_spans = tokenizer.source_spans(source, lang=src_lang)
        tgt_ids, tgt_spans = tokenizer.spans(target, target=True, lang=tgt_lang)
        if max(len(src_ids), len(tgt_ids)) > limit:
            raise InputTooLongError(
                f"pair has {len(src_ids)} source and {len(tgt_ids)} target tokens; this model accepts at most {limit}",
                i,
            )
        live.append((i, src_ids, src_spans, tgt_ids, tgt_spans))
    for start in range(0, len(live), batch_size):
        chunk = live[start : start + batch_size]
        best = attention_alignment(model, [c[1] for c in chunk], [c[3] for c in chunk])
        for (i, _, src_spans, _, tgt_spans), picks in zip(chunk, best, strict=True):
            out[i] = [Link(t, src_spans[s]) for t, s in zip(tgt_spans, picks, strict=True) if t[0] < t[1]]
    return out


def score(
    model: Seq2Seq,
    codec: TextCodec,
    name: str,
    sources: Sequence[str],
    targets: Sequence[str],
    *,
    batch_size: int = 32,
    src_lang: str | None = None,
    tgt_lang: str | None = None,
) -> list[ScoringResult]:
    """Each (source, target)'s tokens scored teacher-forced (model/decode/scoring.py), as CTranslate2's
    score_batch: the log-probability of every target token, </s> included (and, with language tokens,
    `tgt_lang`'s forced first), their total and length-normalised score; a blank source reads as </s> alone.
    Raises SourceError for a source or target the model cannot take (the index is the pair's), LanguageError
    as `translate` does."""
    tokenizer, limit, eos = codec.tokenizer, codec.max_source_tokens, model.cfg.eos_token_id
    if len(sources) != len(targets):
        raise ValueError(f"{len(sources)} sources and {len(targets)} targets: give one target per source")
    if batch_size < 1:
        raise ValueError(f"batch_size must be >= 1, got {batch_size}")
    if not tokenizer.languages and (src_lang or tgt_lang):
        raise LanguageError(f"{name or 'this model'} has no language tokens: give neither src_lang nor tgt_lang")
    if tokenizer.languages and tgt_lang is None:
        raise LanguageError("this model translates into many languages: name the target language (tgt_lang)")
    pairs = []
    for i, (source, target) in enumerate(zip(sources, targets, strict=True)):
        try:
            check_text(target)
            # A blank source is </s> alone (with its language token), as Hugging Face's tokenizer has it.
            src = codec.encode(source, lang=src_lang) or tokenizer.encode("", src_lang)
            tgt = [*tokenizer.spans(target, target=True, lang=tgt_lang)[0], eos]
            if len(tgt) > limit:
                raise InputTooLongError(f"the target has {len(tgt)} tokens; this model accepts at most {limit}")
        except SourceError as exc:
            raise type(exc)(exc.reason, i) from None
        pairs.append((src, tgt))
    out: list[list[float]] = [[] for _ in pairs]
    order = sorted(range(len(pairs)), key=lambda i: len(pairs[i][1]))  # like lengths together: less padding
    for start in range(0, len(order), batch_size):
        chunk = order[start : start + batch_size]
        found = token_log_probs(model, [pairs[i][0] for i in chunk], [pairs[i][1] for i in chunk])
        for i, log_probs in zip(chunk, found, strict=True):
            out[i] = log_probs
    forced = 1 if tgt_lang is not None else 0
    names = {i: code for code, i in tokenizer.languages.items()}
    return [
        ScoringResult([names.get(t) or tokenizer.pieces.get(t, "<unk>") for t in tgt], log_probs, forced)
        for (_, tgt), log_probs in zip(pairs, out, strict=True)
    ]
