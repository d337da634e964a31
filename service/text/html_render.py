"""HTML documents put back together from their runs' translations: which (sentence, translation) pairs
need an alignment (the sentences of runs holding inline markup, for every rank asked), and each
document's renderings with the markup carried over by those alignments, best first."""

from __future__ import annotations

from service.text.html_text import HtmlDocument, Link, join_aligned
from service.text.sentences import ranked

NBest = list[tuple[str, float]]  # (text, score) hypotheses, best first
Pieces = tuple[list[str], list[str]]  # a run's sentences and the separators between them


def alignments_wanted(
    docs: list[HtmlDocument], pieces: list[Pieces], per_run: list[list[NBest]], n: int
) -> list[tuple[str, str]]:
    """The distinct (sentence, translation) pairs whose alignment rendering needs, in the order met: for
    each of the n ranks, every sentence of a run that holds inline markup with its translation of that rank."""
    needs = [needs for doc in docs for needs in doc.needs_alignment]
    wanted: dict[tuple[str, str], None] = {}
    for aligned, (sents, _), hyps in zip(needs, pieces, per_run, strict=True):
        for r in range(n if aligned else 0):
            for sentence, (translation, _) in zip(sents, ranked(hyps, r), strict=True):
                wanted.setdefault((sentence, translation), None)
    return list(wanted)


def rendered(
    docs: list[HtmlDocument],
    pieces: list[Pieces],
    per_run: list[list[NBest]],
    aligned: dict[tuple[str, str], list[Link]],
    n: int,
) -> list[NBest]:
    """Each document's n renderings with scores, best first: rank r joins every sentence's r-th
    hypothesis, its runs' markup placed by `aligned` (the links of each pair alignments_wanted named);
    its score is the mean of its sentences' scores, as for a paragraph."""
    needs = [needs for doc in docs for needs in doc.needs_alignment]
    renders, k = [], 0
    for doc in docs:
        ranks = []
        for r in range(n):
            run_texts, run_links, scores = [], [], []
            for j in range(k, k + len(doc.texts)):
                (sents, seps), picked = pieces[j], ranked(per_run[j], r)
                words = [t for t, _ in picked]
                found = [aligned[p] for p in zip(sents, words, strict=True)] if needs[j] else []
                text, joined = join_aligned(sents, seps, words, found or [[] for _ in sents])
                run_texts.append(text)
                run_links.append(joined)
                scores += [score for _, score in picked]
            ranks.append((doc.render(run_texts, run_links), sum(scores) / len(scores) if scores else 0.0))
        renders.append(ranks)
        k += len(doc.texts)
    return renders
