"""The shipped Multi30k models translate out of the box."""

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from model import Translator
from model.shipped import shipped_models

from .conftest import REPO


@pytest.fixture(scope="module")
def en_de() -> Translator:
    return Translator.load("en-de", "cpu")


def test_both_pairs_ship() -> None:
    assert shipped_models() == ["en-de", "en-fr"]
    for name in shipped_models():
        weights = REPO / "model" / "pretrained" / name / "model.safetensors"
        assert weights.stat().st_size <= 20 * 1024 * 1024
        assert (REPO / "model" / "pretrained" / name / "MODEL_CARD.md").is_file()


@pytest.mark.parametrize(
    ("source", "keywords"),
    [
        ("A man is riding a bike.", ["Mann", "Fahrrad"]),
        ("A dog is running in the snow.", ["Hund", "Schnee"]),
        ("Two children are playing on the beach.", ["Kinder", "Strand"]),
        ("A woman in a red dress is singing.", ["Frau", "rot"]),
    ],
)
def test_en_de_translates_simple_sentences(en_de: Translator, source: str, keywords: list[str]) -> None:
    text = en_de.translate([source], beam_size=4)[0].hypotheses[0]
    for word in keywords:
        assert word in text, f"{word!r} missing from {text!r}"


def test_en_fr_translates_a_simple_sentence() -> None:
    text = Translator.load("en-fr", "cpu").translate(["A dog is running on the grass."])[0].hypotheses[0]
    assert "chien" in text and "herbe" in text, text


def test_evaluate_command_prints_bleu_chrf_signature_and_speed(tmp_path: Path) -> None:
    src, ref = tmp_path / "src.en", tmp_path / "ref.de"
    src.write_text("A man is riding a bike.\nA dog is running in the snow.\n")
    ref.write_text("Ein Mann fährt Fahrrad.\nEin Hund rennt im Schnee.\n")
    out = subprocess.run(
        [
            sys.executable,
            "-m",
            "service.cli",
            "evaluate",
            "--model",
            "en-de",
            "--src",
            str(src),
            "--ref",
            str(ref),
            "--device",
            "cpu",
        ],
        capture_output=True,
        text=True,
        check=True,
        cwd=REPO,
    ).stdout
    assert "BLEU = " in out and "case:mixed|eff:no|tok:13a" in out
    assert "chrF = " in out and "sentences/s" in out


def test_translate_command_reads_stdin_and_writes_one_line_each() -> None:
    proc = subprocess.run(
        [sys.executable, "-m", "service.cli", "translate", "--model", "en-de", "--device", "cpu", "--beam-size", "2"],
        input="A dog.\n\nA man is sleeping.\n",
        capture_output=True,
        text=True,
        check=True,
        cwd=REPO,
    )
    lines = proc.stdout.splitlines()
    assert len(lines) == 3 and lines[1] == "" and "Hund" in lines[0] and "Mann" in lines[2]
    assert "sent" in proc.stderr  # the progress bar


def test_translate_verbose_says_the_execution_plan() -> None:
    from model.kernels import native

    for env, kernels, step in (
        ({}, native.in_use(), "c (one call)"),
        ({native.ENV: "0"}, f"none ({native.ENV}=0)", "pytorch"),
    ):
        proc = subprocess.run(
            [sys.executable, "-m", "service.cli", "translate", "--model", "en-de", "--quiet", "--verbose"],
            input="A dog.\n",
            capture_output=True,
            text=True,
            check=True,
            cwd=REPO,
            env={**os.environ, **env},
        )
        assert "en-de (digest " in proc.stderr and f"cpu, float32, {kernels}; decode step {step}" in proc.stderr
        # Which GEMM multiplies a shape: oneDNN's, or the C kernel where it gives oneDNN's bits here
        assert re.search(
            r"output projection \(8000 x 256\): (C up to \d+ rows where it gives oneDNN's bits here, )?oneDNN",
            proc.stderr,
        )


def test_translate_command_decoding_options_give_the_library_s_n_best(en_de: Translator) -> None:
    lines = ["A dog.", "A man is sleeping."]
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "service.cli",
            "translate",
            "--model",
            "en-de",
            "--device",
            "cpu",
            "--quiet",
            "--num-hypotheses",
            "2",
            "--min-decoding-length",
            "8",
            "--early-stopping",
            "--no-repeat-ngram-size",
            "3",
        ],
        input="\n".join(lines) + "\n",
        capture_output=True,
        text=True,
        check=True,
        cwd=REPO,
        timeout=120,
    )
    want = en_de.translate(
        lines, beam_size=4, num_hypotheses=2, min_decoding_length=8, early_stopping=True, no_repeat_ngram_size=3
    )
    assert proc.stdout.splitlines() == [" ||| ".join(r.hypotheses) for r in want]
    assert all(len(ids) >= 8 for r in want for ids in r.token_ids)  # the option reached the search


def test_translate_command_with_worker_processes_writes_the_same_lines() -> None:
    text = "A dog.\n\nA man is sleeping.\nTwo children play football in a park.\n"
    base = [
        sys.executable,
        "-m",
        "service.cli",
        "translate",
        "--model",
        "en-de",
        "--device",
        "cpu",
        "--threads",
        "1",
        "--max-batch-size",
        "1",
        "--quiet",
    ]
    alone = subprocess.run(base, input=text, capture_output=True, text=True, check=True, cwd=REPO).stdout
    pooled = subprocess.run(
        [*base, "--inter-threads", "2"], input=text, capture_output=True, text=True, check=True, cwd=REPO, timeout=120
    ).stdout
    assert pooled == alone and len(pooled.splitlines()) == 4


@pytest.mark.parametrize(
    ("stdin", "needle"),
    [
        (b"A dog.\n" + b"dog " * 600 + b"\n", "stdin line 2: source has"),
        (b"A dog.\n\xff\xfe bytes that are not UTF-8\n", "stdin line 2: character 0 is a lone surrogate U+DCFF"),
    ],
)
def test_translate_command_names_the_line_it_cannot_take_and_exits_2(stdin: bytes, needle: str) -> None:
    env = {**os.environ, "LC_ALL": "C.UTF-8"}  # a UTF-8 locale, where Python's own stdin would raise
    proc = subprocess.run(
        [sys.executable, "-m", "service.cli", "translate", "--model", "en-de", "--device", "cpu", "--quiet"],
        input=stdin,
        capture_output=True,
        cwd=REPO,
        env=env,
        timeout=120,
    )
    err = proc.stderr.decode()
    assert proc.returncode == 2 and needle in err, err
    assert "Traceback" not in err and proc.stdout == b""


@pytest.mark.parametrize(
    ("args", "needle"),
    [
        (["translate", "--model", "no-such-model"], "beamserve translate: error: no model directory 'no-such-model'"),
        (
            ["translate", "--model", "en-de", "--beam-size", "2", "--num-hypotheses", "3"],
            "beamserve translate: error: num_hypotheses must be between 1 and beam_size (2)",
        ),
        (
            ["evaluate", "--model", "en-de", "--src", "/no/such.en", "--ref", "/no/such.de"],
            "beamserve evaluate: error: [Errno 2] No such file or directory: '/no/such.en'",
        ),
    ],
)
def test_commands_report_user_errors_in_one_line_with_exit_2(args: list[str], needle: str) -> None:
    proc = subprocess.run(
        [sys.executable, "-m", "service.cli", *args],
        input="A dog.\n",
        capture_output=True,
        text=True,
        cwd=REPO,
        timeout=120,
    )
    assert proc.returncode == 2 and needle in proc.stderr, proc.stderr
    assert "Traceback" not in proc.stderr


def test_asking_for_cuda_without_a_gpu_is_a_clear_error() -> None:
    if torch.cuda.is_available():
        pytest.skip("this machine has CUDA: nothing to refuse")
    with pytest.raises(ValueError, match="sees no CUDA GPU"):
        Translator.load("en-de", "cuda")
