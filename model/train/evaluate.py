"""Translation quality (cased, detokenized sacreBLEU and chrF) and decoding speed of a Translator."""

from __future__ import annotations

import time
from dataclasses import dataclass

from sacrebleu.metrics.bleu import BLEU
from sacrebleu.metrics.chrf import CHRF

from model.translator import DecodeOptions, Translator


@dataclass(frozen=True)
class Evaluation:
    bleu: float
    chrf: float
    bleu_signature: str
    chrf_signature: str
    sentences: int
    seconds: float
    target_tokens: int

    def report(self) -> str:
        return (
            f"BLEU = {self.bleu:.2f}  ({self.bleu_signature})\n"
            f"chrF = {self.chrf:.2f}  ({self.chrf_signature})\n"
            f"speed: {self.sentences} sentences in {self.seconds:.1f}s = {self.sentences / self.seconds:.1f} "
            f"sentences/s, {self.target_tokens / self.seconds:.0f} target tokens/s"
        )


def evaluate(
    translator: Translator,
    sources: list[str],
    references: list[str],
    options: DecodeOptions | None = None,
    *,
    src_lang: str | None = None,
    tgt_lang: str | None = None,
) -> tuple[Evaluation, list[str]]:
    """Translate sources and score against references -> (scores, hypotheses); the languages for a model
    with language tokens (Translator.translate)."""
    if len(sources) != len(references):
        raise ValueError(f"{len(sources)} source lines but {len(references)} reference lines")
    start = time.perf_counter()
    results = translator.translate(sources, options or DecodeOptions(), src_lang=src_lang, tgt_lang=tgt_lang)
    seconds = time.perf_counter() - start
    hyps = [r.hypotheses[0] for r in results]
    bleu, chrf = BLEU(), CHRF()
    b = bleu.corpus_score(hyps, [references])
    c = chrf.corpus_score(hyps, [references])
    tokens = sum(len(r.token_ids[0]) + 1 for r in results)
    return Evaluation(
        b.score, c.score, str(bleu.get_signature()), str(chrf.get_signature()), len(sources), seconds, tokens
    ), hyps
