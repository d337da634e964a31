"""Decoding options are defined once (model/options.py): the API schema and the CLI derive from them."""

from __future__ import annotations

import subprocess
import sys
from typing import Any

import pytest

from model.options import DecodeOptions, user_options
from service.cli import build_parser, decode_options
from service.schemas import TranslateRequest

from .conftest import REPO


def test_api_schema_offers_each_api_option_with_its_default_and_description() -> None:
    fields = TranslateRequest.model_fields
    for f in user_options("api"):
        assert f.name in fields, f.name
        assert fields[f.name].description == f.metadata["help"]
        expected = None if f.name == "max_decoding_length" else f.default  # absent: the server's cap
        assert fields[f.name].default == expected, f.name
    assert "max_batch_size" not in fields and "truncate" not in fields  # the server's, not a client's


def test_cli_offers_each_cli_option_and_a_flag_not_given_takes_the_model_s_default() -> None:
    args = build_parser().parse_args(["translate", "--model", "en-de"])
    for f in user_options("cli"):
        assert getattr(args, f.name) is None, f.name  # unset: the model's (generation_config.json), else ours
    model = DecodeOptions(beam_size=2, early_stopping=True, length_penalty=0.6)
    assert decode_options(args) == DecodeOptions() and decode_options(args, model) == model
    args = build_parser().parse_args(["translate", "--model", "en-de", "--beam-size", "3", "--no-early-stopping"])
    assert decode_options(args, model) == DecodeOptions(beam_size=3, early_stopping=False, length_penalty=0.6)
    args = build_parser().parse_args(["translate", "--model", "en-de", "--beam-size", "2", "--early-stopping"])
    assert args.beam_size == 2 and args.early_stopping is True


@pytest.mark.parametrize(
    ("bad", "message"),
    [
        ({"beam_size": 0}, "beam_size must be >= 1"),
        ({"beam_size": 2, "num_hypotheses": 3}, "num_hypotheses must be between 1 and beam_size"),
        ({"min_decoding_length": 9, "max_decoding_length": 9}, "min_decoding_length must be below"),
        ({"no_repeat_ngram_size": -1}, "no_repeat_ngram_size must be >= 0"),
        ({"length_penalty": float("nan")}, "finite"),
    ],
)
def test_validate_names_the_option(bad: dict[str, Any], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        DecodeOptions(**bad).validate()


def test_options_and_errors_import_without_torch_and_workers_without_the_translator() -> None:
    code = (
        "import sys, model.options, model.errors; assert 'torch' not in sys.modules; "
        "import model.workers; assert 'model.translator' not in sys.modules"
    )
    proc = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr[-500:]
