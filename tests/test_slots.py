"""The static decode state (model/decode/slots.py) and its host side (model/decode/slot_decoder.py): the same
hypotheses as today's search and as Hugging Face, no host synchronisation in a step, a step that
traces whole, and state tensors that never move."""

from __future__ import annotations

import random
from pathlib import Path

import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode

from model import DecodeOptions, Translator
from model.decode.search import Hypothesis
from model.decode.slot_decoder import PoolShape, SlotDecoder, decode_all
from model.decode.slots import decode_step
from model.io import checkpoint
from model.options import max_length

from .conftest import read_lines

CPU = torch.device("cpu")
# Operators that make the host wait for the device (or that need data-dependent output shapes).
SYNCING = {
    "aten::_local_scalar_dense",
    "aten::item",
    "aten::is_nonzero",
    "aten::equal",
    "aten::nonzero",
    "aten::masked_select",
    "aten::repeat_interleave",
    "aten::unique_consecutive",
    "aten::_unique2",
}


class NoHostSync(TorchDispatchMode):
    """Fails on any operator that synchronises with the host."""

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):  # type: ignore[no-untyped-def]
        if func._overloadpacket._qualified_op_name in SYNCING:
            raise AssertionError(f"{func} synchronises with the host")
        return func(*args, **(kwargs or {}))


@pytest.fixture(scope="module")
def tr() -> Translator:
    return Translator.load("en-de", "cpu", num_threads=1)


def random_options(rng: random.Random, beams: int) -> DecodeOptions:
    return DecodeOptions(
        beam_size=beams,
        num_hypotheses=rng.choice([1, 2, beams]),
        length_penalty=rng.choice([1.0, 0.6, 2.0]),
        no_repeat_ngram_size=rng.choice([0, 0, 1, 2, 3]),
        min_decoding_length=rng.choice([0, 0, 6]),
        early_stopping=rng.choice([False, True]),
        max_decoding_length=rng.choice([256, 256, 9]),
    )


def assert_same(got: list[Hypothesis], alone: list[Hypothesis], what: object) -> None:
    assert [h.tokens for h in got] == [h.tokens for h in alone], what
    assert [h.score for h in got] == pytest.approx([h.score for h in alone], abs=1e-5), what


@pytest.mark.parametrize(("beams", "lag"), [(2, 0), (4, 0), (4, 1)])  # lag 1: results read a step late
def test_mixed_options_and_arrivals_equal_decoding_each_sentence_alone(tr: Translator, beams: int, lag: int) -> None:
    rng = random.Random(beams)
    texts = read_lines("test_2016_flickr.en.gz", 30)
    texts += [" ".join(texts[i : i + 3]) for i in (0, 9)]  # long sources next to short ones
    sources = [tr.encode(t) for t in texts]
    opts = [random_options(rng, beams) for _ in sources]
    # More slots than ever run at once after the last admission: free slots sit beside busy ones.
    decoder = SlotDecoder(tr.model, PoolShape(slots=12, beams=beams, target_len=96, source_len=96), device=CPU)
    with torch.inference_mode():
        got = decode_all(decoder, sources, opts, join_every=3, lag=lag)
    assert decoder.busy == 0 and not bool(decoder.state.active.any())
    for i, (ids, o) in enumerate(zip(sources, opts, strict=True)):
        assert_same(got[i], tr.decode_batch([ids], o)[0], (i, o))


def test_equals_hugging_face_generate(tiny_dir: Path, tmp_path: Path, sources: list[str]) -> None:
    transformers = pytest.importorskip("transformers")
    checkpoint.export_hf(tiny_dir, tmp_path)
    model = transformers.MarianMTModel.from_pretrained(tmp_path).eval()
    tok = transformers.MarianTokenizer.from_pretrained(tmp_path)
    ours = Translator.load(tiny_dir, "cpu")
    enc = tok(sources, return_tensors="pt", padding=True)
    with torch.inference_mode():
        out = model.generate(
            **enc,
            num_beams=4,
            num_return_sequences=2,
            max_new_tokens=30,
            do_sample=False,
            output_scores=True,
            return_dict_in_generate=True,
            length_penalty=0.6,
        )
        opts = DecodeOptions(
            beam_size=4, num_hypotheses=2, length_penalty=0.6, max_decoding_length=30, max_length_ratio=None
        )
        decoder = SlotDecoder(ours.model, PoolShape(slots=5, beams=4, target_len=32, source_len=64), device=CPU)
        got = decode_all(decoder, [ours.encode(s) for s in sources], [opts] * len(sources))
    eos, pad = ours.model.cfg.eos_token_id, ours.model.cfg.pad_token_id
    for i, hyps in enumerate(got):
        for j, h in enumerate(hyps):
            seq = [t for t in out.sequences[i * 2 + j].tolist()[1:] if t != pad]
            assert h.tokens == (seq[:-1] if seq and seq[-1] == eos else seq)
            assert h.score == pytest.approx(float(out.sequences_scores[i * 2 + j]), abs=1e-4)


def admitted(tr: Translator, shape: PoolShape, texts: list[str], **options: object) -> SlotDecoder:
    decoder = SlotDecoder(tr.model, shape, device=CPU)
    opts = DecodeOptions(beam_size=shape.beams, **options)  # type: ignore[arg-type]
    sources = [tr.encode(t) for t in texts]
    decoder.admit(sources, [opts] * len(sources), [max_length(opts, len(s), 512) for s in sources])
    return decoder


def test_a_step_never_synchronises_with_the_host(tr: Translator) -> None:
    shape = PoolShape(slots=4, beams=4, target_len=48, source_len=32)
    with torch.inference_mode():
        decoder = admitted(tr, shape, ["A dog runs in the snow.", "Two men sit."], no_repeat_ngram_size=2)
        for _ in range(12):  # past the first finishes: finishing is device-side too
            with NoHostSync():
                decode_step(decoder.model, decoder.state, decoder.opts)
        with pytest.raises(AssertionError, match="synchronises"), NoHostSync():  # the guard can fail
            decoder.state.active.any().item()


def test_a_step_traces_whole_and_equals_the_eager_step(tr: Translator) -> None:
    shape = PoolShape(slots=3, beams=2, target_len=40, source_len=32)
    texts = ["A man is riding a bike.", "A woman sings."]
    eager, traced = admitted(tr, shape, texts), admitted(tr, shape, texts)  # normal tensors, as for a graph
    step = torch.compile(decode_step, fullgraph=True, backend="eager")  # a graph break would raise
    with torch.no_grad():
        for _ in range(6):
            decode_step(eager.model, eager.state, eager.opts)
            step(traced.model, traced.state, traced.opts)
    for name, t in eager.state.tensors().items():
        torch.testing.assert_close(traced.state.tensors()[name], t, msg=name)


def test_a_compiled_step_without_a_compiler_stops_at_construction(
    tr: Translator, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Inductor would fail at the first step, deep in a decode; the pool says why when it is built.
    monkeypatch.setenv("PATH", "/nonexistent")
    monkeypatch.delenv("CXX", raising=False)
    monkeypatch.delenv("CC", raising=False)
    shape = PoolShape(slots=2, beams=2, target_len=16, source_len=16)
    with pytest.raises(RuntimeError, match="needs a C\\+\\+ compiler"):
        SlotDecoder(tr.model, shape, device=CPU, compiled=True)
    SlotDecoder(tr.model, shape, device=CPU)  # eager needs none


def test_no_state_tensor_moves_over_admit_step_finish_cycles(tr: Translator) -> None:
    shape = PoolShape(slots=3, beams=2, target_len=40, source_len=48)
    decoder = SlotDecoder(tr.model, shape, device=CPU)
    before = {name: t.data_ptr() for name, t in decoder.state.tensors().items()}
    texts = read_lines("test_2016_flickr.en.gz", 7)
    opts = [DecodeOptions(beam_size=2, no_repeat_ngram_size=i % 3) for i in range(len(texts))]
    with torch.inference_mode():
        got = decode_all(decoder, [tr.encode(t) for t in texts], opts, join_every=2)
    assert all(got)  # every sentence went through a slot, several slots twice
    assert {name: t.data_ptr() for name, t in decoder.state.tensors().items()} == before


def test_the_pool_says_which_sentences_it_can_host(tr: Translator) -> None:
    decoder = SlotDecoder(tr.model, PoolShape(slots=2, beams=4, target_len=64, source_len=32), device=CPU)
    assert decoder.fits(DecodeOptions(beam_size=4, no_repeat_ngram_size=3), source_len=20, max_len=50)
    assert not decoder.fits(DecodeOptions(beam_size=5, num_hypotheses=1), source_len=20, max_len=50)
    assert not decoder.fits(DecodeOptions(beam_size=4), source_len=40, max_len=50)
    assert not decoder.fits(DecodeOptions(beam_size=4), source_len=20, max_len=65)
    assert not decoder.fits(DecodeOptions(beam_size=4, no_repeat_ngram_size=5), source_len=20, max_len=50)
    with pytest.raises(ValueError, match="free slots"), torch.inference_mode():
        decoder.admit([[5, 2]] * 3, [DecodeOptions()] * 3, [10] * 3)


def test_steps_read_the_smallest_bucket_that_holds_every_busy_slot(tr: Translator) -> None:
    shape = PoolShape(slots=2, beams=2, target_len=100, source_len=40)
    with torch.inference_mode():
        decoder = admitted(tr, shape, ["A dog."])
        assert decoder.bucket() == (16, 16)
        for _ in range(16):
            decoder.launch()
            decoder.collect()
        if decoder.busy:  # still decoding at position 16: the next step reads 32 positions
            assert decoder.bucket()[0] == 32
        long_source = " ".join(read_lines("test_2016_flickr.en.gz", 2))
        decoder.admit([tr.encode(long_source)], [DecodeOptions(beam_size=2)], [20])
        assert decoder.bucket()[1] == min(40, 1 << (len(tr.encode(long_source)) - 1).bit_length())
    with pytest.raises(ValueError, match="CUDA"):
        SlotDecoder(tr.model, shape, device=CPU, graphs=True)


def replays_without_sync(graphed: SlotDecoder, sources: list[list[int]], opts: list[DecodeOptions]) -> None:
    """Admit `sources`, launch once (their bucket's graph made), then three replays under sync debug mode "error":
    the replay and the pinned copy of the flags wait on nothing from the host."""
    graphed.admit(sources, opts, [max_length(o, len(s), 512) for o, s in zip(opts, sources, strict=True)])
    graphed.launch()
    graphed.collect()
    torch.cuda.set_sync_debug_mode("error")
    try:
        for _ in range(3):
            graphed.launch()
    finally:
        torch.cuda.set_sync_debug_mode("default")


@pytest.mark.cuda
def test_graph_replay_equals_the_eager_step_without_host_sync() -> None:
    tr = Translator.load("en-de", "cuda", dtype="float16")
    texts = read_lines("test_2016_flickr.en.gz", 24)
    sources = [tr.encode(t) for t in texts]
    opts = [DecodeOptions(beam_size=4, num_hypotheses=2, no_repeat_ngram_size=i % 3) for i in range(len(texts))]
    shape = PoolShape(slots=16, beams=4, target_len=96, source_len=96)
    cuda = torch.device("cuda")
    eager, graphed = SlotDecoder(tr.model, shape, device=cuda), SlotDecoder(tr.model, shape, device=cuda, graphs=True)
    free_before = torch.cuda.mem_get_info()[0]
    with torch.inference_mode():
        want = decode_all(eager, sources, opts, join_every=2)
        got = decode_all(graphed, sources, opts, join_every=2)  # captures each bucket on first use
        assert graphed._graphs, "no graph was captured"
        replays_without_sync(graphed, sources[:4], opts[:4])
    used = (free_before - torch.cuda.mem_get_info()[0]) / 2**20
    print(f"{len(graphed._graphs)} bucket graphs captured; device memory taken since: {used:.0f} MiB")
    assert used < 1024, f"capturing {len(graphed._graphs)} buckets took {used:.0f} MiB"  # graphs reuse the state
    for g, w in zip(got, want, strict=True):
        assert [h.tokens for h in g] == [h.tokens for h in w]
        assert [h.score for h in g] == pytest.approx([h.score for h in w], abs=1e-3)


def test_a_stale_finished_flag_is_not_taken_for_the_slot_s_next_sentence(tr: Translator) -> None:
    shape = PoolShape(slots=1, beams=2, target_len=32, source_len=32)
    decoder = SlotDecoder(tr.model, shape, device=CPU)
    opts = DecodeOptions(beam_size=2)
    first, second = tr.encode("A dog."), tr.encode("Two men are sitting on a bench.")
    with torch.inference_mode():
        [slot] = decoder.admit([first], [opts], [3])  # stops at its third token
        for _ in range(3):
            decoder.launch()  # not collected: the last step's flags say the slot finished
        assert bool(decoder.state.finished[slot])
        decoder.cancel([slot])  # the client left before its result was read; the slot takes another
        decoder.admit([second], [opts], [max_length(opts, len(second), 512)])
        got = {}
        while decoder.busy:
            got.update(decoder.collect())
            decoder.launch()
        got.update(decoder.collect())
    assert_same(got[slot], tr.decode_batch([second], opts)[0], "the second sentence")


@pytest.mark.cuda
def test_the_fused_triton_step_graphed_decodes_as_the_operators_eager_step_without_host_sync() -> None:
    """The Triton set (model/plan.py) compiled, captured in CUDA graphs: the tokens of PyTorch's operators'
    eager step in float16 (scores within the float16 tolerance above), and no replay waits on the host."""
    from model.plan import step_kernels

    tr = Translator.load("en-de", "cuda", dtype="float16")
    texts = read_lines("test_2016_flickr.en.gz", 24)
    sources = [tr.encode(t) for t in texts]
    opts = [DecodeOptions(beam_size=4, num_hypotheses=2, no_repeat_ngram_size=i % 3) for i in range(len(texts))]
    shape = PoolShape(slots=16, beams=4, target_len=96, source_len=96)
    cuda = torch.device("cuda")
    eager = SlotDecoder(tr.model, shape, device=cuda)
    fused = SlotDecoder(tr.model, shape, device=cuda, graphs=True, kernels=step_kernels("triton"))
    with torch.inference_mode():
        want = decode_all(eager, sources, opts, join_every=2)
        got = decode_all(fused, sources, opts, join_every=2)
        replays_without_sync(fused, sources[:4], opts[:4])
    same = sum([h.tokens for h in g] == [h.tokens for h in w] for g, w in zip(got, want, strict=True))
    assert same == len(want), f"{same} of {len(want)} sentences decode alike"
    for g, w in zip(got, want, strict=True):
        assert [h.score for h in g] == pytest.approx([h.score for h in w], abs=1e-3)
