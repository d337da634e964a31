"""The paper's building blocks: attention, multi-head attention, feed-forward, positions."""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence

import torch
import torch.nn.functional as F
from torch import nn

from model.kernels import c_layers, c_linears, execution, ops
from model.kernels.gemm import ACTIVATIONS, FUSED_ACTIVATIONS, INPLACE_ACTIVATIONS, Linear, linear
from model.kernels.onednn import version
from model.kernels.quant import INT8_SLOT, Int8Weight, int8_of, int8_weight


def attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    mask: torch.Tensor | None = None,
    *,
    causal: bool = False,
    dropout: float = 0.0,
) -> torch.Tensor:
    """Scaled dot-product attention softmax(QK^T / sqrt(D)) V; mask is True where attending is allowed.

    q: (B, H, T, D), k and v: (B, H, S, D), mask broadcastable to (B, H, T, S) -> (B, H, T, D)
    """
    if q.device.type == "cpu" and q.shape[-2] <= 8 and not causal and not dropout:
        return _step_formula(q, k, v, mask)
    return F.scaled_dot_product_attention(q, k, v, attn_mask=mask, dropout_p=dropout, is_causal=causal)


def _step_formula(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: torch.Tensor | None) -> torch.Tensor:
    """`attention` as two batched matmuls: on decode steps (a query or a few beams) PyTorch's CPU flash
    kernel is 2-4x slower (measured on the decode shapes)."""
    scores = _batched_matmul(q, k.transpose(-1, -2)) * (q.shape[-1] ** -0.5)  # (B, H, T, S)
    if mask is not None:
        scores = scores.masked_fill(~mask, float("-inf"))
    return _batched_matmul(softmax_(scores), v)


def softmax_(scores: torch.Tensor) -> torch.Tensor:
    """Softmax over the last dimension; on CPU outside autograd, in place and padding-blind: a row's
    result does not change, to the bit, with how many masked (-inf) positions follow its last real one.

    ATen's softmax sums a row in vector lanes grouped by the row's width (and below 16 wide runs a
    scalar loop, 234 us on 1024 x 15 against 16 us at 16 wide), so a sentence's attention weights
    would depend on how far its batch pads it. Here the sum runs in position order (cumsum
    accumulates sequentially, in double), which trailing zeros leave unchanged.
    """
    if scores.device.type != "cpu" or scores.requires_grad:
        return torch.softmax(scores, dim=-1)
    e = scores.sub_(scores.amax(-1, keepdim=True)).exp_()
    return e.div_(e.cumsum(-1)[..., -1:])


# ATen's CPU bmm runs matrices of fewer multiply-adds than this through a scalar loop, 3-10x slower
# than its GEMM path or a broadcast product on the decoder's first steps (1-6 cached positions x 64).
NAIVE_BMM_MACS = 400


def _batched_matmul(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """a (..., M, K) @ b (..., K, N) -> (..., M, N); tiny matrices as a broadcast product and sum."""
    M, K = a.shape[-2:]
    N = b.shape[-1]
    if M * K * N >= NAIVE_BMM_MACS:
        return a @ b
    return (a[..., :, :, None] * b[..., None, :, :]).sum(-2)  # (..., M, K, N) summed over K


# A decode step's attention on CPU sums each query row in an order that does not depend on its batch (how
# many key positions the batch pads to, how many rows) only while every batch takes the same kernel of
# ATen's batched GEMM (MKL). MKL picks kernels by the matrix shape, differently by CPU: a lone query row
# would be a matrix-vector product, below NAIVE_BMM_MACS ATen multiplies in a scalar loop, on AMD's
# Zen 4, 2-3 query rows, 4 and more, a key count that is not a multiple of 4, and fewer than 12 keys
# beside 4 or more rows each take a kernel of their own, and in MKL's AVX2 kernels (MKL_ENABLE_INSTRUCTIONS=
# AVX2, as on CPUs without AVX-512) 4 or 8 query rows against 4 or 8 keys past a multiple of 16 take another
# than against more keys. So a step's shapes are canonical: self-attention
# queries (one a row) come MIN_QUERIES to a matrix (zero rows beside them), cross-attention queries (a
# sentence's beams, whose count varies within a continuous batch) a multiple of CROSS_QUERY_MULTIPLE, and
# keys number a multiple of KEY_MULTIPLE, at least least_keys(D) (masked ones after the real ones).
MIN_QUERIES = 2
CROSS_QUERY_MULTIPLE = 4
KEY_MULTIPLE = 16
LEAST_KEYS = 12


def least_keys(head_dim: int) -> int:
    return _round_up(max(LEAST_KEYS, -(-NAIVE_BMM_MACS // (MIN_QUERIES * head_dim))), KEY_MULTIPLE)


def attended_keys(keys: int, head_dim: int) -> int:
    """Key positions a CPU decode step attends over for `keys` real ones (masked ones after them)."""
    return max(least_keys(head_dim), _round_up(keys, KEY_MULTIPLE))


def _round_up(n: int, multiple: int) -> int:
    return -(-n // multiple) * multiple


def step_attention(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: torch.Tensor | None, *, cross: bool = False
) -> torch.Tensor:
    """`attention` for decode steps, padding-blind on CPU (above). q: (B, H, T, D), k, v: (B, H, S, D),
    mask broadcastable to (B, H, T, S) or None -> (B, H, T, D). `cross`: q holds each sentence's beams.
    Callers hand over keys already at attended_keys(S) (the caches keep them so); others are padded here."""
    if q.device.type != "cpu":
        return attention(q, k, v, mask)
    B, H, T, D = q.shape
    rows = _round_up(T, CROSS_QUERY_MULTIPLE) if cross else max(T, MIN_QUERIES)
    if rows > T:
        q = torch.cat([q, q.new_zeros(B, H, rows - T, D)], dim=2)
    keys = k.shape[2]
    attended = attended_keys(keys, D)
    if keys < attended:
        k, v = (F.pad(x, (0, 0, 0, attended - keys)) for x in (k, v))
        real = torch.arange(attended, device=q.device) < keys  # (S',)
        mask = real if mask is None else F.pad(mask.expand(*mask.shape[:-1], keys), (0, attended - keys), value=False)
    return _step_formula(q, k, v, mask)[:, :, :T]


def weights_state(module: nn.Module, names: tuple[str, ...]) -> tuple[tuple[int, ...], list[object]]:
    """What forms made from submodules `names`' weights and biases depend on (a fused weight, C structs): each
    weight's int8 form where it has one (a new form is a new object), else the weight and its version, and each
    bias with its version; as a tuple of ints that compares in one step, and the objects themselves, which the
    caller holds beside the forms (so no id it compares is reused). Read through the modules' dicts, not
    attribute lookups: a decode step asks this for every sublayer."""
    key: list[int] = []
    held: list[object] = []
    for name in names:
        params = module._modules[name]._parameters  # type: ignore[union-attr]
        w: torch.Tensor = params["weight"]  # type: ignore[assignment]
        bias = params["bias"]
        q = module._modules[name]._modules.get(INT8_SLOT)  # type: ignore[union-attr]
        key += (id(q), id(w), -1 if q is not None else version(w), id(bias), -1 if bias is None else version(bias))
        held += (q, w, bias)
    return tuple(key), held


def weights_states(
    modules: Sequence[tuple[nn.Module, tuple[str, ...]]],
) -> tuple[tuple[int, ...], list[object]]:
    """weights_state of each (module, names), joined: one key to compare, and every object it names."""
    key: list[int] = []
    held: list[object] = []
    for module, names in modules:
        found, objects = weights_state(module, names)
        key += found
        held += objects
    return tuple(key), held


def side_by_side(parts: Sequence[nn.Module]) -> tuple[torch.Tensor, torch.Tensor | None, Int8Weight | None]:
    """Linear layers over one input as one: their weights (sum of N, K) and biases side by side; in int8, one int8
    form of them all (model/kernels/quant.py) and no float weight. One quantisation of the input and one product
    instead of one each (int8), or one GEMM call (float32), to the same bits: each output element is the same sum
    over the same K, whatever columns lie beside it."""
    biases: list[torch.Tensor] = [p.bias if p.bias is not None else torch.zeros(p.out_features) for p in parts]  # type: ignore[misc]
    bias = None if all(p.bias is None for p in parts) else torch.cat(biases).float().detach()
    q8 = [int8_of(p) for p in parts]
    int8 = None
    if all(q is not None for q in q8):  # one int8 weight of them all
        weight = torch.empty(0)
        int8 = int8_weight(torch.cat([q.qweight for q in q8]), torch.cat([q.scale for q in q8]))  # type: ignore[union-attr]
    else:
        weight = torch.cat([p.weight for p in parts]).detach()  # type: ignore[misc]
    return weight, bias, int8


def layer_norm(norm: nn.LayerNorm, x: torch.Tensor) -> torch.Tensor:
    """norm(x): ATen's layer norm itself, without the module call, F.layer_norm's dispatch or attribute lookups
    (a decode step makes nine; 3 us each against 8)."""
    p = norm._parameters
    return torch.native_layer_norm(x, norm.normalized_shape, p["weight"], p["bias"], norm.eps)[0]


def dropped(dropout: nn.Dropout, x: torch.Tensor) -> torch.Tensor:
    """dropout(x), not called where it is the identity (inference): a decode step would dispatch a dozen."""
    return dropout(x) if dropout.training else x


def subsequent_mask(size: int, device: torch.device | None = None) -> torch.Tensor:
    """(T, T) boolean mask: position i may attend to positions <= i."""
    return torch.ones(size, size, dtype=torch.bool, device=device).tril()


class MultiHeadAttention(nn.Module):
    """Multi-head attention with separate q/k/v/out projections (Marian's parameter layout)."""

    def __init__(self, d_model: int, heads: int, dropout: float = 0.0) -> None:
        super().__init__()
        self.heads = heads
        self.head_dim = d_model // heads
        self.dropout = dropout
        self.q_proj = Linear(d_model, d_model)
        self.k_proj = Linear(d_model, d_model)
        self.v_proj = Linear(d_model, d_model)
        self.out_proj = Linear(d_model, d_model)
        self.plan = execution.probe()  # which kernels compute (Seq2Seq.use_plan hands the model's)

    def split_heads(self, x: torch.Tensor) -> torch.Tensor:
        B, T, _ = x.shape
        return x.view(B, T, self.heads, self.head_dim).transpose(1, 2)  # (B, H, T, D)

    def merge_heads(self, x: torch.Tensor, residual: torch.Tensor | None = None) -> torch.Tensor:
        """x (B, H, T, D) -> out_proj of the heads side by side (B, T, C), plus `residual` (B, T, C) where given."""
        B, H, T, D = x.shape
        return self.out_proj(x.transpose(1, 2).reshape(B, T, H * D), residual)  # (B, T, C)

    def project_q(self, x: torch.Tensor) -> torch.Tensor:
        return self.split_heads(self.q_proj(x))  # (B, H, T, D)

    def project_kv(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        return self.split_heads(self.k_proj(x)), self.split_heads(self.v_proj(x))  # 2 x (B, H, S, D)

    def project_qkv(self, x: torch.Tensor) -> torch.Tensor:
        """x (N, C) through the q, k and v projections as one GEMM -> (N, 3 C): each row's query, key and value.
        One quantisation of x and one product instead of three (int8), or one oneDNN call (float32), to the same
        bits: each output element is the same sum over the same K, whatever columns lie beside it."""
        weight, bias, int8 = self._fused_qkv()
        return linear(x, weight, bias, int8=int8)

    def _fused_qkv(self) -> tuple[torch.Tensor, torch.Tensor | None, Int8Weight | None]:
        """The q, k and v projections' weights (3 C, C) and biases (3 C,) side by side, made once for the weights
        as they are; in int8, one int8 form of the three (model/kernels/quant.py) and no float weight."""
        key, held = weights_state(self, ("q_proj", "k_proj", "v_proj"))
        fused = self.__dict__.get("_qkv")
        if fused is not None and fused[0] == key:
            return fused[2], fused[3], fused[4]
        weight, bias, int8 = side_by_side((self.q_proj, self.k_proj, self.v_proj))
        # Derived from the three layers' forms and kept with them: not a submodule or buffer of its own
        self.__dict__["_qkv"] = (key, held, weight, bias, int8)
        return weight, bias, int8

    def c_sublayer(self, rows: int, *, fused: bool) -> tuple[c_layers.LinearC, c_layers.LinearC] | None:
        """The weights of c_layers.self_sublayer (`fused`: q, k and v as one projection) or c_layers.cross_sublayer (q
        alone) and of the output projection, for a step of `rows` rows: where both compute in C at that row
        count (int8 by the VNNI kernel where int8_choice takes it; float32 by f32_gemm's kernel where it gives
        oneDNN's bits); None otherwise. Made once for the weights as they are, which a call checks by identity
        and version (module dicts, not attribute lookups: a decode step asks for every sublayer)."""
        names = ("q_proj", "k_proj", "v_proj", "out_proj") if fused else ("q_proj", "out_proj")
        key, objects = weights_state(self, names)
        held = self.__dict__.setdefault("_c_sublayer", {}).get(fused)
        if held is None or held[0] != key:
            w_in, b_in, q_in = (
                self._fused_qkv() if fused else (self.q_proj.weight, self.q_proj.bias, int8_of(self.q_proj))
            )
            out = (self.out_proj.weight, self.out_proj.bias, int8_of(self.out_proj))
            held = (key, objects, c_linears.structs(((w_in, b_in, q_in), out)))
            self.__dict__["_c_sublayer"][fused] = held
        found = c_linears.serving(held[2], rows)
        return None if found is None else (found[0], found[1])

    def forward(
        self,
        x: torch.Tensor,
        source: torch.Tensor,
        mask: torch.Tensor | None = None,
        *,
        causal: bool = False,
        residual: torch.Tensor | None = None,
    ) -> torch.Tensor:
        """Full (non-incremental) attention of x (B, T, C) over source (B, S, C) -> (B, T, C), plus `residual`
        (B, T, C) where given."""
        k, v = self.project_kv(source)
        if source is x and mask is not None and not causal and self.plan.attends(x, self.head_dim):
            return self._each_in_c(x, k, v, mask, residual)
        q = self.project_q(x)
        if source is x and mask is not None and not causal and not self.training and x.device.type == "cpu":
            return self.merge_heads(self._each_unpadded(q, k, v, mask), residual)
        p = self.dropout if self.training else 0.0
        return self.merge_heads(attention(q, k, v, mask, causal=causal, dropout=p), residual)

    def _each_in_c(
        self, x: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: torch.Tensor, residual: torch.Tensor | None
    ) -> torch.Tensor:
        """Self-attention of each right-padded sequence over its own length, in C (model/kernels/native.py): every
        query row of x (B, S, C) against its sequence's keys and values k, v (B, H, S, D), mask broadcastable
        to (B, 1, 1, S), True on real tokens -> (B, S, C). Padded rows attend too; nothing reads them."""
        B, S, C = x.shape
        lengths = mask.reshape(B, -1).sum(-1)  # (B,)
        sequence = torch.arange(B, device=x.device).repeat_interleave(S)  # (B * S,) each query row's
        q = self.q_proj(x).view(B * S, self.heads, self.head_dim)
        out = ops.attend(q, k, v, lengths.repeat_interleave(S), sequence[:, None].expand(B * S, S))
        return self.out_proj(out.view(B, S, C), residual)

    @staticmethod
    def _each_unpadded(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        """Self-attention of each right-padded sequence over its own length: q, k, v (B, H, S, D), mask
        broadcastable to (B, 1, 1, S), True on real tokens -> (B, H, S, D), padded rows 0.

        Over the padded batch, a sequence's attention would sum in another order than alone (and take
        another kernel by the batch's longest length): its result would depend on its batch, in the
        last bit, which an int8 activation's rounding can carry into another word. The loop costs a
        few milliseconds per batch of 64, once per sentence (the encoder).
        """
        lengths = mask.reshape(mask.shape[0], -1).sum(-1).tolist()
        out = torch.zeros_like(q)
        for b, n in enumerate(lengths):
            if not n:
                continue
            one = (slice(b, b + 1), slice(None), slice(0, int(n)))
            out[one] = attention(q[one].contiguous(), k[one].contiguous(), v[one].contiguous())
        return out


class FeedForward(nn.Module):
    """Position-wise feed-forward: fc2(act(fc1(x)))."""

    def __init__(self, d_model: int, ffn_dim: int, activation: str, dropout: float = 0.0) -> None:
        super().__init__()
        self.fc1 = Linear(d_model, ffn_dim)
        self.fc2 = Linear(ffn_dim, d_model)
        self.activation = activation
        self.act = ACTIVATIONS[activation]
        self.dropout = nn.Dropout(dropout)
        self.plan = execution.probe()  # which kernels compute (Seq2Seq.use_plan hands the model's)

    def forward(self, x: torch.Tensor, residual: torch.Tensor | None = None) -> torch.Tensor:
        """x (..., C) -> (..., C), plus `residual` where given."""
        structs = self._c_linears(x.shape[0]) if rows_of_a_step(x, residual, self.plan) else None
        if structs is not None:  # a decode step's rows: each GEMM in C, one call of a few pointers
            return feed_forward_in_c(x, residual, *structs, (self.fc1.weight, self.fc1.bias), self.activation)  # type: ignore[arg-type]
        if self.activation in FUSED_ACTIVATIONS:  # the activation as the GEMM's epilogue where it can be
            h = linear(x, self.fc1.weight, self.fc1.bias, self.activation, int8=int8_of(self.fc1))
        else:
            h = self.act(self.fc1(x))
        return self.fc2(dropped(self.dropout, h), residual)

    def _c_linears(self, rows: int) -> tuple[c_layers.LinearC | None, c_layers.LinearC] | None:
        """fc1's and fc2's structs for c_layers.linear_forward where both compute in C at `rows` rows (fc1 None:
        float32, whose activation oneDNN fuses), and fc1's activation runs in place; None otherwise
        (MultiHeadAttention.c_sublayer says how they are made and checked)."""
        if self.activation not in INPLACE_ACTIVATIONS or self.training:
            return None
        key, objects = weights_state(self, ("fc1", "fc2"))
        held = self.__dict__.get("_c_pair")
        if held is None or held[0] != key:
            fc1, fc2 = (
                (self.fc1.weight, self.fc1.bias, int8_of(self.fc1)),
                (self.fc2.weight, self.fc2.bias, int8_of(self.fc2)),
            )
            fc2_alone = fc1[2] is None  # float32: fc1 stays oneDNN's, fc2 in C
            held = (key, objects, c_linears.structs((fc2,) if fc2_alone else (fc1, fc2)), fc2_alone)
            self.__dict__["_c_pair"] = held
        found = c_linears.serving(held[2], rows)
        if found is None:
            return None
        return (None, found[0]) if held[3] else (found[0], found[1])


def feed_forward_in_c(
    x: torch.Tensor,
    residual: torch.Tensor,
    fc1: c_layers.LinearC | None,
    fc2: c_layers.LinearC,
    fc1_float: tuple[torch.Tensor, torch.Tensor | None],
    activation: str,
    call: Callable[[c_layers.LinearC, torch.Tensor, torch.Tensor | None], torch.Tensor] = c_layers.linear_forward,
) -> torch.Tensor:
    """FeedForward of a decode step's rows by FeedForward._c_linears' structs: fc1 in C with its activation in
    place, or (fc1 None: float32) oneDNN's fc1 with the activation fused in its epilogue (f32_gemm.py says why);
    then fc2 in C with the residual. `call`: c_layers.linear_forward, or its unchecked form where the caller
    checked the rows once for many calls (model/nn/c_step.py)."""
    h = hidden_rows(x, None if fc1 is None else call(fc1, x, None), fc1_float, activation)
    return call(fc2, h, residual)


def hidden_rows(
    x: torch.Tensor, f: torch.Tensor | None, fc1_float: tuple[torch.Tensor, torch.Tensor | None], activation: str
) -> torch.Tensor:
    """A feed-forward's hidden rows for its input rows x: f = fc1(x), computed in C, activated in place; or, where
    f is None (float32), oneDNN's fc1 of x with the activation fused in its epilogue (f32_gemm.py says why)."""
    return linear(x, *fc1_float, activation) if f is None else INPLACE_ACTIVATIONS[activation](f)


def rows_of_a_step(x: torch.Tensor, residual: torch.Tensor | None, plan: execution.Plan) -> bool:
    """Whether x and its residual are a decode step's rows in C's terms: (N, C) float32 on CPU, outside autograd,
    with the plan's C kernels (each call checks the rest)."""
    return residual is not None and x.dim() == 2 and plan.takes(x) and not torch.is_grad_enabled()


def sinusoidal_table(positions: int, dim: int) -> torch.Tensor:
    """(P, C) sinusoids of the paper; Marian stores all sines first, then all cosines (not interleaved)."""
    pos = torch.arange(positions, dtype=torch.float64)[:, None]
    freq = torch.pow(10000.0, torch.arange(0, dim, 2, dtype=torch.float64) / dim)  # (C/2,)
    angles = pos / freq
    half = (dim + 1) // 2
    table = torch.empty(positions, dim, dtype=torch.float64)
    table[:, :half] = torch.sin(angles)
    table[:, half:] = torch.cos(angles[:, : dim // 2])
    return table.float()


def fairseq_sinusoidal_table(positions: int, dim: int, offset: int) -> torch.Tensor:
    """(P, C) the sinusoids of fairseq's M2M100 and NLLB: tensor2tensor's frequencies 10000^(-i / (C/2 - 1)),
    sines then cosines, position p taken from row offset + p (offset: the padding id + 1). Computed in
    float32 in fairseq's order of operations, so the table has the bits their models were trained with."""
    half = dim // 2
    step = math.log(10000) / (half - 1)
    freq = torch.exp(torch.arange(half, dtype=torch.int64).float() * -step)  # (C/2,)
    angles = torch.arange(offset, offset + positions, dtype=torch.int64).float()[:, None] * freq[None, :]
    table = torch.cat([torch.sin(angles), torch.cos(angles)], dim=1)  # (P, 2 * (C/2))
    return F.pad(table, (0, dim - 2 * half))  # an odd width's last column is 0


class PositionalEncoding(nn.Module):
    """Fixed sinusoidal position signals, looked up by position index."""

    table: torch.Tensor  # (P, C)

    def __init__(self, max_positions: int, d_model: int, style: str = "marian", pad_token_id: int = 0) -> None:
        super().__init__()
        # On the CPU whatever device the model is built on: a model built on the meta device to load
        # weights into still needs the real table (and meta ops import torch._dynamo, seconds of CPU).
        with torch.device("cpu"):
            if style == "fairseq":
                table = fairseq_sinusoidal_table(max_positions, d_model, pad_token_id + 1)
            else:
                table = sinusoidal_table(max_positions, d_model)
        # Not persistent: it is a function of the config, so checkpoints need not carry it.
        self.register_buffer("table", table, persistent=False)
        self.max_positions = max_positions

    def forward(self, positions: torch.Tensor) -> torch.Tensor:
        return self.table[positions]  # (..., C)


def embedding_scale(d_model: int, enabled: bool) -> float:
    return math.sqrt(d_model) if enabled else 1.0
