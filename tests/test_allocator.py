"""model.kernels.allocator: with freed memory retained, decoding a large vocabulary stops faulting pages in."""

from __future__ import annotations

import subprocess
import sys

import pytest

# Beam search over a random tiny model with a 40k vocabulary: each step's logits (256 rows x 40k floats,
# 41 MB) are past glibc's largest mmap threshold. Each step a call of its own (a run of steps in one call allocates
# its logits once). Prints the minor page faults of the third decode.
PROBE = """
import resource, sys
import torch
from model.kernels.allocator import retain_freed_memory
from model.nn.config import preset
from model.decode.decoding import generate
from model.decode.search import SearchOptions
from model.nn.transformer import Seq2Seq
if sys.argv[1] == "retain":
    assert retain_freed_memory()
torch.manual_seed(0)
torch.set_num_threads(1)
model = Seq2Seq(preset("tiny", 40000)).eval()
model.use_plan(model.plan.with_(steps_in_c=False))
src = torch.randint(4, 39000, (64, 8))
mask = torch.ones_like(src, dtype=torch.bool)
opts = SearchOptions(beam_size=4, min_decoding_length=8, eos_token_id=2, start_token_id=0)
with torch.inference_mode():
    for _ in range(3):
        before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
        generate(model, src, mask, torch.full((64,), 8), opts)
print(resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before)
"""


def _faults(mode: str) -> int:
    out = subprocess.run([sys.executable, "-c", PROBE, mode], capture_output=True, text=True, check=True)
    return int(out.stdout.strip())


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="mallopt is glibc's (Linux)")
def test_decoding_reuses_freed_memory_instead_of_faulting_pages_in() -> None:
    default, retained = _faults("default"), _faults("retain")
    logits_pages = 256 * 40000 * 4 // 4096
    # glibc maps and unmaps step after step's logits: a decode's 8-9 steps fault about 8 x logits_pages, and
    # under a busy host's other tests as few as 4 x
    assert default > 3 * logits_pages
    assert retained < default / 10


def test_it_can_be_turned_off(monkeypatch: pytest.MonkeyPatch) -> None:
    from model.kernels.allocator import ENV, retain_freed_memory

    monkeypatch.setenv(ENV, "0")
    assert not retain_freed_memory()
