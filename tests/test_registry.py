"""The model registry: entries parsed and checked, and a real server that serves what it lists: a
shipped model with a setting of its own (int8), a multilingual Marian model (built here with
transformers) that answers two pairs, routed by target language through its >>xx<< tokens, a de-en
model, so that German to French and Spanish go through English (pivoting), and an en-it model whose
weights are corrupt: the server starts and serves the others, en-it answers its own requests 503
(pair_unavailable) at once, and /readyz stays 200 for the pod and reports each pair, cheaply."""

from __future__ import annotations

import json
import shutil
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from model import Translator
from service.registry import ModelEntry, entries

from .conftest import REPO, serving, wait_for

NLLB = {  # languages no other entry serves; zt: Chinese in traditional script
    "name": "nllb",
    "sources": ["ru", "zh", "ko", "hi", "ar"],
    "targets": ["ru", "zh", "ko", "zt"],
    "language_tokens": {"zt": "zho_Hant"},
}
ROMANCE = {
    "name": "en-multi",
    "sources": ["en"],
    "targets": ["fr", "es"],
    "target_tokens": {"fr": ">>fra<<", "es": ">>spa<<"},
}


def test_models_alone_make_one_entry_per_pair() -> None:
    found = entries("en-de, en-fr", "")
    assert [(e.name, e.path, e.pairs) for e in found] == [("en-de", "en-de", ["en-de"]), ("en-fr", "en-fr", ["en-fr"])]


def test_a_registry_lists_languages_tokens_and_settings(tmp_path: Path) -> None:
    registry = [
        {**ROMANCE, "path": "/models/opus-mt-en-ROMANCE", "settings": {"compute_type": "int8", "max_batch_size": 8}},
        {"name": "de-en", "path": "/models/opus-mt-de-en", "sources": ["DE"], "targets": ["en"]},
    ]
    for given in (json.dumps(registry), registry):  # inline JSON (the environment) or a list (Serve config)
        found = entries("ignored", given)
        assert [e.pairs for e in found] == [["en-fr", "en-es"], ["de-en"]]
    path = tmp_path / "models.yaml"
    path.write_text("- " + json.dumps(registry[1]) + "\n")  # YAML, from a file
    assert entries("", str(path))[0].sources == ["de"]


@pytest.mark.parametrize(
    ("entry", "message"),
    [
        ({"targets": ["fr", "es"], "target_tokens": {"fr": ">>fra<<"}}, "needs a token for each; none for ['es']"),
        ({"target_tokens": {"fr": "fra", "es": ">>spa<<"}}, "looks like >>fra<<"),
        ({"target_tokens": {"fr": ">>fra<<", "es": ">>spa<<", "it": ">>ita<<"}}, "does not list as targets"),
        ({"sources": ["english"]}, "2 or 3 letters"),
        ({"settings": {"api_keys": "x"}}, "settings an entry cannot set: ['api_keys']"),
        ({"name": "Bad Name"}, "name"),
    ],
)
def test_a_bad_entry_is_refused_with_what_is_wrong(entry: dict[str, object], message: str) -> None:
    with pytest.raises(ValueError, match=message.replace("[", r"\[").replace("]", r"\]")):
        entries("", [{**ROMANCE, "path": "x", **entry}])


def test_two_models_for_one_pair_are_refused() -> None:
    with pytest.raises(ValueError, match="en-fr is answered by two models: en-multi and en-fr"):
        entries("", [{**ROMANCE, "path": "x"}, {"name": "en-fr", "path": "y", "sources": ["en"], "targets": ["fr"]}])


def test_a_model_with_language_tokens_reads_its_languages_from_its_vocabulary(nllb_dir: Path) -> None:
    [every] = entries("", [{"name": "nllb", "path": str(nllb_dir), "sources": ["*"], "targets": ["*"]}])
    assert len(every.sources) == len(every.targets) == 196  # NLLB-200's 202 tokens, 6 of them second scripts
    assert len(every.pairs) == 196 * 195
    tokens = every.language_tokens
    assert (tokens["en"], tokens["zh"], tokens["ar"], tokens["ms"], tokens["ace"]) == (
        "eng_Latn",
        "zho_Hans",
        "arb_Arab",
        "zsm_Latn",
        "ace_Latn",
    )
    given = {"sources": ["en"], "targets": ["de", "zt"], "language_tokens": {"zt": "zho_Hant"}}
    [some] = entries("", [{"name": "nllb", "path": str(nllb_dir), **given}])
    assert some.language_tokens == {"en": "eng_Latn", "de": "deu_Latn", "zt": "zho_Hant"}
    assert ModelEntry.model_validate(some.model_dump()) == some  # as a replica receives it
    nllb = {"name": "nllb", "path": str(nllb_dir), "sources": ["en"]}
    for entry, message in [
        ({**nllb, "targets": ["xx"]}, r"targets the model has no language token for: \['xx'\]"),
        ({**nllb, "targets": ["zt"], "language_tokens": {"zt": "zho_Hent"}}, "codes the model does not have"),
        ({**nllb, "targets": ["de"], "target_tokens": {"de": ">>deu<<"}}, "takes language_tokens, not target_tokens"),
        ({"name": "de", "path": "en-de", "sources": ["en"], "targets": ["*"]}, "are for models with language tokens"),
    ]:
        with pytest.raises(ValueError, match=message):
            entries("", [entry])


def test_a_router_of_every_nllb_pair_shares_the_model_s_admission_and_names_pairs_briefly(nllb_dir: Path) -> None:
    """38,220 pairs on one deployment: no pivot to search (every pair is direct), one admission level for
    the deployment, and an error message that counts the pairs instead of listing them."""
    from service.routing.pair_router import PairRouter
    from service.settings import Settings

    [every] = entries("", [{"name": "nllb", "path": str(nllb_dir), "sources": ["*"], "targets": ["*"]}])
    deployment = object()  # one deployment's handle, which every pair of the entry shares; never called here
    router = PairRouter(dict.fromkeys(every.pairs, deployment), Settings())  # type: ignore[arg-type]
    assert not router.pairs.pivoted
    assert len({id(a) for a in router.decoder.admission.values()}) == 1
    message = router.pairs.listed()
    assert message.startswith("38220 pairs served, among: ") and len(message) < 2000


@pytest.fixture(scope="module")
def multilingual_dir(tiny_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    from .test_marian_layouts import save_marian, small_config

    vocab = json.loads((tiny_dir / "vocab.json").read_text(encoding="utf-8"))
    vocab.pop("<pad>")
    for code in (">>fra<<", ">>spa<<"):
        vocab[code] = len(vocab)
    vocab["<pad>"] = len(vocab)
    config = small_config(vocab_size=len(vocab), pad_token_id=vocab["<pad>"], decoder_start_token_id=vocab["<pad>"])
    return save_marian(config, tmp_path_factory.mktemp("multi") / "opus-mt-en-multi", tiny_dir, vocab)


@pytest.mark.slow
def test_a_target_token_the_vocabulary_lacks_fails_the_load_and_is_named(multilingual_dir: Path) -> None:
    from service.engine.served_model import ServedModel
    from service.settings import Settings

    # opus-mt-en-ROMANCE's spelling on a model whose vocabulary spells them >>fra<< and >>spa<<.
    entry = ModelEntry(**{**ROMANCE, "path": str(multilingual_dir), "target_tokens": {"fr": ">>fr<<", "es": ">>spa<<"}})
    wanted = "en-multi: target tokens not in the model's vocabulary: fr >>fr<<; its language tokens: >>fra<<, >>spa<<"
    with pytest.raises(ValueError, match=wanted):
        ServedModel(entry, Settings(threads=1))


@pytest.fixture(scope="module")
def german_dir(tiny_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    import torch
    import transformers

    from .test_marian_layouts import save_marian, small_config

    vocab = json.loads((tiny_dir / "vocab.json").read_text(encoding="utf-8"))
    config = small_config(vocab_size=len(vocab), pad_token_id=vocab["<pad>"], decoder_start_token_id=vocab["<pad>"])
    path = save_marian(config, tmp_path_factory.mktemp("de") / "opus-mt-de-en", tiny_dir, vocab)
    torch.manual_seed(23)  # weights of its own, not the multilingual model's
    transformers.MarianMTModel(config).save_pretrained(path)
    (path / "README.md").write_text("---\nlanguage:\n- de\n- en\nlicense: cc-by-nc-4.0\n---\n\n# A test model\n")
    generation = json.loads((path / "generation_config.json").read_text())
    (path / "generation_config.json").write_text(json.dumps({**generation, "num_beams": 2}))  # not beamserve's 4
    return path


@pytest.fixture(scope="module")
def log(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return Path(tmp_path_factory.mktemp("log")) / "stderr.txt"


@pytest.fixture(scope="module")
def served(
    multilingual_dir: Path, german_dir: Path, nllb_dir: Path, log: Path, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[str]:
    registry = tmp_path_factory.mktemp("registry") / "models.json"
    half = {"replica_cpus": 0.4}  # five models on two CPUs (the NLLB model 0.2)
    shipped = {"name": "en-de", "path": "en-de", "sources": ["en"], "targets": ["de"]}
    german = {"name": "de-en", "path": str(german_dir), "sources": ["de"], "targets": ["en"], "settings": half}
    broken = tmp_path_factory.mktemp("broken") / "en-it"
    shutil.copytree(REPO / "model" / "pretrained" / "en-fr", broken)
    weights = broken / "model.safetensors"
    weights.write_bytes(weights.read_bytes()[:1000])  # a truncated download
    registry.write_text(
        json.dumps(
            [
                {**shipped, "settings": {"compute_type": "int8", **half}},
                {**ROMANCE, "path": str(multilingual_dir), "settings": half},
                german,
                {"name": "en-it", "path": str(broken), "sources": ["en"], "targets": ["it"], "settings": half},
                {**NLLB, "path": str(nllb_dir), "settings": {"replica_cpus": 0.2}},
            ]
        )
    )
    with serving(
        # Five models, each decoding in its replica's process: five processes less to start, and these tests
        # are not the engine's own process's.
        {"BEAMSERVE_MODEL_REGISTRY": str(registry), "BEAMSERVE_ENGINE_PROCESS": "false"},
        stderr=log,
        ready=lambda r: r.json().get("pairs", {}).get("en-es") == "ready",
    ) as (url, _):
        yield url


@pytest.mark.slow
def test_the_server_serves_what_the_registry_lists(served: str, multilingual_dir: Path, sources: list[str]) -> None:
    models = {m["name"]: m for m in httpx.get(f"{served}/v1/models", timeout=10).json()["models"]}
    nllb_pairs = {f"{a}-{b}" for a in NLLB["sources"] for b in NLLB["targets"] if a != b}
    assert len(nllb_pairs) == 17
    assert set(models) == {"en-de", "en-fr", "en-es", "de-en", "en-it", *nllb_pairs}
    assert (models["en-de"]["model"], models["en-de"]["compute_type"]) == ("en-de", "int8")  # its own setting
    assert models["en-fr"]["model"] == models["en-es"]["model"] == "en-multi"
    assert models["en-fr"]["digest"] == models["en-es"]["digest"] != models["en-de"]["digest"]
    # Each model's licence as its card names it: a hub card's, the shipped models' (trained on Multi30k), none.
    assert (models["de-en"]["license"], models["de-en"]["non_commercial"]) == ("cc-by-nc-4.0", True)
    assert models["en-de"]["license"].startswith("other: non-commercial") and models["en-de"]["non_commercial"]
    assert (models["en-fr"]["license"], models["en-fr"]["non_commercial"]) == (None, False)
    languages = {lang["code"]: lang["targets"] for lang in httpx.get(f"{served}/languages", timeout=10).json()}
    assert languages["en"] == ["de", "es", "fr", "it"]
    assert languages["de"] == ["en", "es", "fr", "it"]  # es, fr and it through English
    deepl = {lang["language"] for lang in httpx.get(f"{served}/v2/languages?type=target", timeout=10).json()}
    assert {"DE", "ES", "FR"} <= deepl

    # Each target through its token: the same as the model given the token itself.
    local = Translator.load(multilingual_dir, "cpu")
    texts = sources[:4]
    for target, token in ROMANCE["target_tokens"].items():  # type: ignore[attr-defined]
        body = {"texts": texts, "source": "en", "target": target, "beam_size": 4, "split_sentences": False}
        r = httpx.post(f"{served}/v1/translate", json=body, timeout=60)
        assert r.status_code == 200, r.text
        expected = [x.hypotheses[0] for x in local.translate([f"{token} {t}" for t in texts], beam_size=4)]
        assert [t["text"] for t in r.json()["translations"]] == expected
    fr, es = (
        httpx.post(f"{served}/v1/translate", json={"texts": texts, "source": "en", "target": t}, timeout=60).json()
        for t in ("fr", "es")
    )
    assert fr["translations"] != es["translations"]
    # Markup placed by alignment: the target token is the model's, the spans are the text's.
    html = {"texts": ["A <b>man</b> runs."], "source": "en", "target": "fr", "tag_handling": "html"}
    r = httpx.post(f"{served}/v1/translate", json=html, timeout=60)
    assert r.status_code == 200 and r.json()["translations"][0]["text"].count("<b>") == 1
    unknown = httpx.post(f"{served}/v1/translate", json={"texts": ["x"], "source": "en", "target": "nl"}, timeout=10)
    assert unknown.status_code == 400 and "en-es, en-fr" in unknown.json()["detail"]


@pytest.mark.slow
def test_one_nllb_entry_serves_each_pair_through_its_language_tokens(served: str, nllb_dir: Path) -> None:
    """The source's token before each sentence, the target's forced first: as the library translates."""
    local = Translator.load(nllb_dir, "cpu")
    texts = ["Ein Hund rennt im Park.", "A man is riding a bike."]
    codes = {"ru": "rus_Cyrl", "zh": "zho_Hans", "zt": "zho_Hant", "ko": "kor_Hang"}
    for source, target in [("ru", "zh"), ("ru", "zt"), ("ko", "ru")]:
        body = {"texts": texts, "source": source, "target": target, "beam_size": 2, "split_sentences": False}
        r = httpx.post(f"{served}/v1/translate", json=body, timeout=60)
        assert r.status_code == 200, r.text
        want = local.translate(texts, beam_size=2, src_lang=codes[source], tgt_lang=codes[target])
        assert [t["text"] for t in r.json()["translations"]] == [w.hypotheses[0] for w in want]
    languages = {lang["code"]: lang["targets"] for lang in httpx.get(f"{served}/languages", timeout=10).json()}
    assert languages["ko"] == ["ru", "zh", "zt"]
    deepl = {lang["language"] for lang in httpx.get(f"{served}/v2/languages?type=source", timeout=10).json()}
    assert {"RU", "ZH", "KO"} <= deepl
    # Markup placed by the alignment, which reads both language tokens.
    html = {"texts": ["A <b>man</b> runs."], "source": "ko", "target": "zh", "tag_handling": "html"}
    r = httpx.post(f"{served}/v1/translate", json=html, timeout=60)
    assert r.status_code == 200 and r.json()["translations"][0]["text"].count("<b>") == 1, r.text


@pytest.mark.slow
def test_a_hindi_and_an_arabic_paragraph_are_translated_sentence_by_sentence(served: str, nllb_dir: Path) -> None:
    """Three sentences ended by the Devanagari danda, and by Arabic's full stop and question mark: each translated
    on its own (service/text/sentences.py knows both scripts' marks), as the library translates each."""
    local = Translator.load(nllb_dir, "cpu")
    paragraphs = {
        "hi": ["मैं घर जा रहा हूँ।", "आज मौसम अच्छा है।", "वह किताब पढ़ रही है।"],
        "ar": ["ذهب الولد إلى المدرسة.", "هل تحب القهوة؟", "الجو جميل اليوم."],
    }
    codes = {"hi": "hin_Deva", "ar": "arb_Arab"}
    for source, sentences in paragraphs.items():
        body = {"texts": [" ".join(sentences)], "source": source, "target": "ru", "beam_size": 2}
        r = httpx.post(f"{served}/v1/translate", json=body, timeout=60)
        assert r.status_code == 200, r.text
        each = local.translate(sentences, beam_size=2, src_lang=codes[source], tgt_lang="rus_Cyrl")
        assert r.json()["translations"][0]["text"] == " ".join(e.hypotheses[0] for e in each)
        whole = local.translate([" ".join(sentences)], beam_size=2, src_lang=codes[source], tgt_lang="rus_Cyrl")
        assert whole[0].hypotheses[0] != r.json()["translations"][0]["text"]  # not decoded as one sentence


@pytest.mark.slow
def test_a_request_without_options_decodes_with_the_model_s_generation_config(served: str, german_dir: Path) -> None:
    models = {m["name"]: m for m in httpx.get(f"{served}/v1/models", timeout=10).json()["models"]}
    assert models["de-en"]["defaults"] == {"beam_size": 2} and models["en-de"]["defaults"] == {}
    local = Translator.load(german_dir, "cpu")
    texts = ["Ein Hund rennt im Park.", "Zwei Männer sitzen auf einer Bank.", "Eine Frau liest ein Buch."]
    body = {"texts": texts, "source": "de", "target": "en", "split_sentences": False, "cache": False}
    scores = {}
    for given in ({}, {"beam_size": 4}):  # the model's beam, then the request's
        r = httpx.post(f"{served}/v1/translate", json={**body, **given}, timeout=60)
        assert r.status_code == 200, r.text
        expected = local.translate(texts, **given)
        assert [t["text"] for t in r.json()["translations"]] == [e.hypotheses[0] for e in expected]
        scores[str(given)] = [t["score"] for t in r.json()["translations"]]
        assert scores[str(given)] == pytest.approx([e.scores[0] for e in expected], abs=1e-4)
    assert scores["{}"] != scores["{'beam_size': 4}"]  # the two beams decode apart: the model's default was used


@pytest.mark.slow
def test_a_pair_with_no_model_goes_through_english(served: str, german_dir: Path, multilingual_dir: Path) -> None:
    texts = ["Ein Hund rennt im Park.", "Zwei Männer sitzen auf einer Bank."]
    german, multi = Translator.load(german_dir, "cpu"), Translator.load(multilingual_dir, "cpu")
    english = [r.hypotheses[0] for r in german.translate(texts, beam_size=4)]
    expected = [r.hypotheses[0] for r in multi.translate([f">>spa<< {e}" for e in english], beam_size=4)]
    body = {"texts": texts, "source": "de", "target": "es", "beam_size": 4, "split_sentences": False}
    r = httpx.post(f"{served}/v1/translate", json=body, timeout=60)
    assert r.status_code == 200, r.text
    assert [t["text"] for t in r.json()["translations"]] == expected
    assert all(t["pivot"] == "en" for t in r.json()["translations"])  # marked as such
    direct = httpx.post(f"{served}/v1/translate", json={**body, "source": "en", "texts": english}, timeout=60)
    assert all(t["pivot"] is None for t in direct.json()["translations"])
    # LibreTranslate's route and markup (aligned through both models) take the same way.
    libre = httpx.post(f"{served}/translate", json={"q": texts[0], "source": "de", "target": "es"}, timeout=60)
    assert libre.status_code == 200 and libre.json()["translatedText"] == expected[0]
    html = {"texts": ["Ein <b>Hund</b> rennt."], "source": "de", "target": "fr", "tag_handling": "html"}
    r = httpx.post(f"{served}/v1/translate", json=html, timeout=60)
    assert r.status_code == 200 and r.json()["translations"][0]["text"].count("<b>") == 1


def test_entries_carry_settings_over_the_servers() -> None:
    from service.settings import Settings

    settings = Settings(model_registry=[{**ROMANCE, "path": "x", "settings": {"compute_type": "int8"}}])
    [entry] = settings.entries()
    assert isinstance(entry, ModelEntry)
    own = settings.for_entry(entry)
    assert (own.compute_type, settings.compute_type, own.max_texts) == ("int8", None, settings.max_texts)
    bad = Settings(model_registry=[{**ROMANCE, "path": "x", "settings": {"compute_type": "int4"}}])
    with pytest.raises(ValueError, match="compute_type"):  # an entry's values are checked as the server's
        bad.for_entry(bad.entries()[0])


@pytest.mark.slow
def test_a_pair_that_cannot_load_is_named_and_the_server_serves_the_others(served: str, log: Path) -> None:
    wait_for(lambda: "model-en-it failed to deploy" in log.read_text(), "the broken model named", timeout_s=60)
    assert "SafetensorError" in log.read_text()
    r = httpx.post(
        f"{served}/v1/translate", json={"texts": ["A dog runs."], "source": "en", "target": "de"}, timeout=30
    )
    assert r.status_code == 200 and r.json()["translations"][0]["text"]


@pytest.mark.slow
def test_the_broken_pair_fails_its_own_requests_with_503_at_once(served: str) -> None:
    body = {"texts": ["A dog runs."], "source": "en", "target": "it"}
    start = time.monotonic()
    r = httpx.post(f"{served}/v1/translate", json=body, timeout=30)
    assert time.monotonic() - start < 2.0  # not the request timeout
    assert r.status_code == 503 and r.json()["error"] == "pair_unavailable" and r.headers["retry-after"] == "5"
    assert r.json()["request_id"] == r.headers["x-request-id"]
    libre = httpx.post(f"{served}/translate", json={"q": "A dog runs.", "source": "en", "target": "it"}, timeout=30)
    assert libre.status_code == 503 and "en-it" in libre.json()["error"]
    models = {m["name"]: m for m in httpx.get(f"{served}/v1/models", timeout=10).json()["models"]}
    assert models["en-de"]["ready"] and models["en-de"]["digest"]
    assert models["en-it"] == {**models["en-it"], "ready": False, "digest": None}


@pytest.mark.slow
def test_readyz_reports_each_pair_and_answers_fast(served: str) -> None:
    pairs = {"de-en": "ready", "en-de": "ready", "en-es": "ready", "en-fr": "ready", "en-it": "unavailable"}
    pairs |= {f"{s}-{t}": "ready" for s in NLLB["sources"] for t in NLLB["targets"] if s != t}
    for _ in range(5):  # each within Kubernetes' default probe timeout (httpx raises past it)
        r = httpx.get(f"{served}/readyz", timeout=1.0)
        assert r.status_code == 200
        assert r.json() == {"status": "ready", "pairs": pairs}
    assert httpx.get(f"{served}/readyz", params={"pair": "en-de"}, timeout=1.0).status_code == 200
    assert httpx.get(f"{served}/readyz", params={"pair": "en-it"}, timeout=1.0).status_code == 503
    assert httpx.get(f"{served}/readyz", params={"pair": "xx-yy"}, timeout=1.0).status_code == 404


@pytest.mark.slow
def test_the_page_swaps_the_languages_and_the_translation_becomes_the_text(served: str, browser: Any) -> None:
    from selenium.webdriver.support.ui import Select

    from .browser import by_id, open_page, type_text, until

    open_page(browser, served)
    Select(by_id(browser, "source")).select_by_value("en")
    Select(by_id(browser, "target")).select_by_value("de")
    type_text(browser, "A dog is running in the snow.")
    until(browser, lambda: by_id(browser, "translation").get_attribute("value"), "the en-de translation")
    german = by_id(browser, "translation").get_attribute("value")
    by_id(browser, "swap").click()  # de-en is served here
    assert Select(by_id(browser, "source")).first_selected_option.get_attribute("value") == "de"
    assert Select(by_id(browser, "target")).first_selected_option.get_attribute("value") == "en"
    assert by_id(browser, "text").get_attribute("value") == german
    back = httpx.post(f"{served}/v1/translate", json={"texts": [german], "source": "de", "target": "en"}, timeout=60)
    until(
        browser,
        lambda: by_id(browser, "translation").get_attribute("value") == back.json()["translations"][0]["text"],
        "the de-en translation",
    )
