"""The C kernels as PyTorch operators (model/kernels/ops.py): each held to its schema and fake implementation by
`torch.library.opcheck` (what it reads and writes, its results' shapes under torch.compile's fake tensors), each
giving the bits of the kernel it calls, and a model traced by torch.compile through them to eager's bits."""

from __future__ import annotations

import os
from collections.abc import Callable

import pytest
import torch

from model import Translator
from model.kernels import c_attention, c_gemm, c_layers, c_search, native, ops

WHY_NOT = f"turned off ({native.ENV}=0)" if os.environ.get(native.ENV) == "0" else "not built here"
pytestmark = pytest.mark.skipif(not native.built(), reason=f"the C kernels are {WHY_NOT}")
vnni = pytest.mark.skipif(not native.vnni(), reason="the VNNI kernels need AVX-512 VNNI")
f32 = pytest.mark.skipif(not native.f32(), reason="the float32 kernel needs AVX-512")

G = torch.Generator().manual_seed(0)


def _randn(*shape: int) -> torch.Tensor:
    return torch.randn(*shape, generator=G)


def _int8(*shape: int) -> torch.Tensor:
    return torch.randint(-127, 128, shape, generator=G, dtype=torch.int8)


def _samples() -> dict[str, tuple[object, ...]]:
    """Arguments each operator computes on: the kernels' own shapes, small."""
    M, K, N = 3, 64, 48
    acc = (_int8(M, K).int() @ _int8(N, K).int().t()).contiguous()
    k, v = _randn(2, 4, 10, 16), _randn(2, 4, 10, 16)
    b, beams, V, T = 2, 2, 20, 6
    state = (
        _randn(b, beams), torch.full((b, beams, T), -1, dtype=torch.int64), torch.full((b, beams), -1e9),
        torch.full((b, beams, T), -1, dtype=torch.int64), torch.zeros(b, beams, dtype=torch.bool),
        torch.ones(b, dtype=torch.bool),
    )  # fmt: skip
    pos, limits = torch.zeros(b, dtype=torch.int64), torch.full((b,), 5, dtype=torch.int64)
    return {
        "int8_gemm": (_int8(M, K), _int8(N, K)),
        "quantize_rows": (_randn(M, K),),
        "scale_back_": (acc.clone(), _randn(N).abs(), _randn(M, 1).abs(), _randn(N)),
        "scale_back_log_softmax_": (acc.clone(), _randn(N).abs(), _randn(M, 1).abs(), None),
        "log_softmax_": (_randn(M, N),),
        "rescale_log_softmax_": (_randn(M, N), _randn(M, 1).abs(), _randn(N)),
        "attend": (_randn(2, 4, 16), k, v, 7, None, None),
        "self_attend_step": (_randn(2, 3 * 64), k.clone(), v.clone(), 3, None, None),
        "layer_norm": (_randn(M, K), _randn(K), _randn(K), 1e-5),
        "embed": (torch.tensor([1, 5, 2]), _randn(10, K), 8.0, _randn(1, K)),
        "top_candidates": (torch.log_softmax(_randn(b, beams, V), -1), _randn(b, beams), 4),
        "beam_step": (
            torch.log_softmax(_randn(b, beams, V), -1), *state, pos, limits, torch.ones(b), 3, False
        ),
    }  # fmt: skip


def _packed_samples() -> dict[str, tuple[object, ...]]:
    M, K, N = 3, 64, 48
    w = _int8(N, K)
    packed: dict[str, tuple[object, ...]] = {}
    if native.vnni():
        form = c_gemm.VnniWeight(w, _randn(N).abs())
        packed["vnni_gemm"] = (_int8(M, K), form.packed, form.comp, N, K)
        packed["vnni_linear"] = (_randn(M, K), form.packed, form.comp, form.scale, N, K, _randn(N), _randn(M, N), False)
    if native.f32():
        f = c_gemm.F32Weight(_randn(N, K))
        packed["f32_linear"] = (_randn(M, K), f.packed, N, K, _randn(N), None)
    return packed


def _every_sample() -> dict[str, tuple[object, ...]]:
    return {**_samples(), **_packed_samples()}


@pytest.mark.parametrize("name", sorted(ops.SCHEMAS))
def test_each_operator_holds_to_its_schema_and_fake_implementation(name: str) -> None:
    samples = _every_sample()
    if name not in samples:
        pytest.skip(f"{name}'s kernel does not run on this CPU")
    torch.library.opcheck(getattr(torch.ops.beamserve, name).default, samples[name])


def _clone(args: tuple[object, ...]) -> tuple[object, ...]:
    return tuple(a.clone() if isinstance(a, torch.Tensor) else a for a in args)


CALLS: dict[str, Callable[..., object]] = {
    "int8_gemm": native.int8_gemm,
    "quantize_rows": c_gemm.quantize_rows,
    "layer_norm": native.layer_norm,
    "embed": c_layers.embed,
    "top_candidates": c_search.top_candidates,
}


@pytest.mark.parametrize("name", sorted(CALLS))
def test_an_operator_gives_its_kernels_bits(name: str) -> None:
    args = _samples()[name]
    got, want = getattr(ops, name)(*_clone(args)), CALLS[name](*_clone(args))
    got, want = (r if isinstance(r, tuple) else (r,) for r in (got, want))
    assert len(got) == len(want) and all(torch.equal(g, w) for g, w in zip(got, want, strict=True))


def test_the_in_place_operators_write_what_their_kernels_write() -> None:
    acc, col, row, bias = _samples()["scale_back_"]
    assert isinstance(acc, torch.Tensor)
    got, want = acc.clone(), acc.clone()
    assert torch.equal(ops.scale_back_(got, col, row, bias), c_gemm.scale_back_(want, col, row, bias))  # type: ignore[arg-type]
    (x,) = _samples()["log_softmax_"]
    assert isinstance(x, torch.Tensor)
    assert torch.equal(ops.log_softmax_(x.clone()), native.log_softmax_(x.clone()))
    y, rows, bias = _samples()["rescale_log_softmax_"]
    assert isinstance(y, torch.Tensor) and isinstance(rows, torch.Tensor) and isinstance(bias, torch.Tensor)
    want = torch.log_softmax(torch.addcmul(bias, y, rows), -1)  # the two passes it makes one
    got = ops.rescale_log_softmax_(y.clone(), rows, bias)
    assert torch.equal(got, c_gemm.rescale_log_softmax_(y.clone(), rows, bias))
    torch.testing.assert_close(got, want)  # its log-softmax's own bits (csrc/search.c), near PyTorch's
    assert torch.equal(
        c_gemm.rescale_log_softmax_(y.clone(), rows, bias), native.log_softmax_(torch.addcmul(bias, y, rows))
    )
    qkv, k, v, at, _, _ = _samples()["self_attend_step"]
    assert isinstance(k, torch.Tensor) and isinstance(v, torch.Tensor) and isinstance(qkv, torch.Tensor)
    k1, v1, k2, v2 = k.clone(), v.clone(), k.clone(), v.clone()
    assert torch.equal(ops.self_attend_step(qkv, k1, v1, at, None), c_attention.self_attend_step(qkv, k2, v2, at, None))  # type: ignore[arg-type]
    assert torch.equal(k1, k2) and torch.equal(v1, v2) and not torch.equal(k1, k)  # the step's keys written


@vnni
def test_a_packed_form_of_another_size_is_refused_before_the_kernel_reads_it() -> None:
    form, op = c_gemm.VnniWeight(_int8(48, 64), torch.ones(48)), torch.ops.beamserve.vnni_linear.default
    with pytest.raises(ValueError, match="packed"):
        op(_randn(3, 64), form.packed[:-64], form.comp, form.scale, 48, 64, None, None, False)
    with pytest.raises(ValueError, match="packed"):
        op(_randn(3, 64), form.packed, form.comp, form.scale, 64, 64, None, None, False)


@pytest.fixture(scope="module")
def int8() -> Translator:
    return Translator.load("en-de", "cpu", compute_type="int8")


def test_torch_compile_traces_the_int8_output_projection_through_the_operators_to_eagers_bits(
    int8: Translator,
) -> None:
    model = int8.model
    h = _randn(4, model.cfg.d_model)
    graphs: list[torch.fx.GraphModule] = []

    def backend(gm: torch.fx.GraphModule, inputs: list[torch.Tensor]) -> Callable[..., object]:
        graphs.append(gm)
        return gm.forward

    torch._dynamo.reset()
    traced = torch.compile(lambda h: model.output(h, log_probs=True), backend=backend, fullgraph=True)
    with torch.no_grad():
        assert torch.equal(traced(h), model.output(h, log_probs=True))
    called = {str(n.target) for g in graphs for n in g.graph.nodes if n.op == "call_function"}
    assert any(t.startswith("beamserve.") for t in called), called


def test_torch_compile_runs_an_encoder_with_the_fused_calls_outside_its_graphs_to_eagers_bits(
    int8: Translator,
) -> None:
    ids = torch.tensor([[5, 17, 230, 44, 9, 0], [8, 31, 7, 0, 0, 0]])
    mask = ids != 0
    torch._dynamo.reset()
    traced = torch.compile(int8.model.encode, backend="aot_eager")
    with torch.no_grad():
        assert torch.equal(traced(ids, mask), int8.model.encode(ids, mask))
