"""Documents (service/text/documents.py, service/routing/document_jobs.py): each format's prose found and put back
with everything else as it came, and DeepL's document API through the official `deepl` package on
the real server, a document's translation equal to its paragraphs translated on /v1."""

from __future__ import annotations

import asyncio
import contextlib
import io
import re
import time
import zipfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from service.errors import ApiError
from service.text import documents

TEXT = "\ufeffA man is riding a bike.\n\n  Two dogs play in the snow. They are happy.  \r\nA woman sings.\n"
HTML = (
    "<!DOCTYPE html><html><head><title>A dog</title><style>p {color: red}</style></head>"
    "<body><p>A man in a <b>red shirt</b> is riding a bike.</p><pre>keep = 1</pre>"
    "<p translate='no'>Acme <i>Cloud</i></p><p>A <span translate='no'>Acme <b>X</b></span> shirt.</p></body></html>"
)
SRT = (
    "1\n00:00:01,000 --> 00:00:03,500\n<i>A man is riding</i>\na bike.\n\n"
    "2\n00:00:04,000 --> 00:00:05,000\nTwo dogs & a cat.\n\n"
    "3\n00:00:06,000 --> 00:00:07,000\n\n"
)
VTT = (
    "WEBVTT - a film\n\nNOTE made by hand\n\nSTYLE\n::cue { color: yellow }\n\n"
    "intro\n00:01.000 --> 00:03.500 align:start\n<v Roger Bingham>A man is riding\na bike.\n\n"
    "00:00:04.000 --> 00:00:05.000\nTwo dogs &amp; a <i>cat</i>.\n"
)
XLIFF12 = (
    '<?xml version="1.0" encoding="UTF-8"?>\n<xliff version="1.2" xmlns="urn:oasis:names:tc:xliff:document:1.2">\n'
    '<file source-language="en" target-language="de" datatype="plaintext" original="app"><body>\n'
    '<trans-unit id="1"><source>A man in a <g id="1">red shirt</g> is riding a bike.<x id="2"/></source></trans-unit>\n'
    '<trans-unit id="2"><source>Two dogs play.</source><target>Zwei Hunde spielen.</target></trans-unit>\n'
    '<trans-unit id="3" translate="no"><source>Acme</source></trans-unit>\n'
    '<trans-unit id="4"><source>Click <ph id="3">&lt;b&gt;</ph>here.</source><target/></trans-unit>\n'
    "</body></file></xliff>"
)
XLIFF2 = (
    '<xliff xmlns="urn:oasis:names:tc:xliff:document:2.0" version="2.0" srcLang="en" trgLang="de">'
    '<file id="f"><unit id="u"><segment><source>A <pc id="1">small</pc> dog.</source></segment>'
    "<ignorable><source> </source></ignorable><segment><source>It runs.</source></segment></unit>"
    '<unit id="v" translate="no"><segment><source>Acme</source></segment></unit></file></xliff>'
)


def test_each_format_gives_back_what_it_took_when_nothing_is_translated() -> None:
    for name, text in (("a.txt", TEXT), ("a.html", HTML), ("a.HTM", HTML)):
        parsed = documents.parse(name, text.encode())
        assert parsed.rebuild(parsed.segments) == text.encode(), name
    parsed = documents.parse("a.txt", TEXT.encode())
    assert parsed.segments == [
        "A man is riding a bike.",
        "Two dogs play in the snow. They are happy.",
        "A woman sings.",
    ]
    html = documents.parse("a.html", HTML.encode())
    assert html.html and html.segments == [
        "A dog",
        "A man in a <b>red shirt</b> is riding a bike.",
        "A <span translate='no'>Acme <b>X</b></span> shirt.",
    ]
    srt = documents.parse("a.srt", SRT.encode())
    assert srt.segments == ["<i>A man is riding</i> a bike.", "Two dogs &amp; a cat."]
    out = srt.rebuild(["<i>Ein Mann fährt</i> Fahrrad.", "Zwei Hunde &amp; eine Katze."]).decode()
    # Numbers, timings and blank lines as they came; a cue's text over as many lines as it had, unescaped.
    assert out == (
        "1\n00:00:01,000 --> 00:00:03,500\n<i>Ein Mann fährt</i>\nFahrrad.\n\n"
        "2\n00:00:04,000 --> 00:00:05,000\nZwei Hunde & eine Katze.\n\n"
        "3\n00:00:06,000 --> 00:00:07,000\n\n"
    )


@pytest.mark.parametrize(
    ("name", "data", "code", "needle"),
    [
        ("report.pdf", b"%PDF-1.7", "unsupported_document", ".srt, .vtt, .xlf, .xliff, .epub, .odt, .odp, .ods"),
        ("notes", b"A dog.", "unsupported_document", "'notes'"),
        ("latin1.txt", "Caf\xe9".encode("latin-1"), "invalid_document", "not UTF-8 text (byte 3)"),
        ("a.srt", b"1\nA dog without a time.\n", "invalid_document", "subtitle 1 has no timing line"),
        ("a.html", b"<p>A dog <b", "invalid_document", "ends inside a tag"),
        ("a.vtt", b"1\n00:01.000 --> 00:02.000\nA dog.\n", "invalid_document", "does not begin with WEBVTT"),
        ("a.vtt", b"WEBVTT\n\nA dog without a time.\n", "invalid_document", "block 2 has no timing line"),
        ("a.xlf", b"<html><p>A dog.</p></html>", "invalid_document", "not an XLIFF file"),
        ("a.xlf", b"<xliff><unclosed>", "invalid_document", "XML does not parse"),
        ("a.xlf", b'<!DOCTYPE x [<!ENTITY a "b">]><xliff/>', "invalid_document", "declares a DTD"),
        ("big.txt", b"A dog runs.\n" * 50_000, "document_too_large", "at most 500000"),
    ],
)
def test_a_document_that_cannot_be_read_is_refused_by_name(name: str, data: bytes, code: str, needle: str) -> None:
    with pytest.raises(ApiError) as err:
        documents.parse(name, data)
    assert err.value.code == code and needle in err.value.detail, err.value.detail


# Subtitles as their formats' parsers read them: a cue starts at its timing line whether or not a blank line
# came before it, a line of spaces ends a cue as a blank one does, a line end is CR, LF or CR LF.
CUES = {
    "srt, a cue not followed by a blank line": (
        "a.srt",
        "1\n00:00:01,000 --> 00:00:02,000\nA dog runs.\n2\n00:00:03,000 --> 00:00:04,000\nA cat sleeps.\n",
    ),
    "srt, a line of spaces between cues": (
        "a.srt",
        "1\n00:00:01,000 --> 00:00:02,000\nA dog runs.\n   \n2\n00:00:03,000 --> 00:00:04,000\nA cat sleeps.\n",
    ),
    "srt, CR line ends": (
        "a.srt",
        "1\r00:00:01,000 --> 00:00:02,000\rA dog runs.\r\r2\r00:00:03,000 --> 00:00:04,000\rA cat sleeps.\r",
    ),
    "srt, CR LF line ends": (
        "a.srt",
        "1\r\n00:00:01,000 --> 00:00:02,000\r\nA dog runs.\r\n\r\n2\r\n00:00:03,000 --> 00:00:04,000\r\nA cat sleeps.",
    ),
    "vtt, CR line ends": (
        "a.vtt",
        "WEBVTT\r\r00:01.000 --> 00:02.000\rA dog runs.\r\r00:03.000 --> 00:04.000\rA cat sleeps.\r",
    ),
    "vtt, a cue not followed by a blank line": (
        "a.vtt",
        "WEBVTT\n\n00:01.000 --> 00:02.000\nA dog runs.\n00:03.000 --> 00:04.000\nA cat sleeps.\n",
    ),
    "vtt, a cue right after the header": (
        "a.vtt",
        "WEBVTT\n00:01.000 --> 00:02.000\nA dog runs.\n \t\n00:03.000 --> 00:04.000\nA cat sleeps.\n",
    ),
}


@pytest.mark.parametrize("case", CUES)
def test_every_cue_is_read_at_its_timing_line_whatever_its_line_ends(case: str) -> None:
    name, text = CUES[case]
    parsed = documents.parse(name, text.encode())
    assert parsed.segments == ["A dog runs.", "A cat sleeps."]
    out = parsed.rebuild(["Ein Hund rennt.", "Eine Katze schläft."]).decode()
    # Every other line, and every line end, as it came.
    assert out == text.replace("A dog runs.", "Ein Hund rennt.").replace("A cat sleeps.", "Eine Katze schläft.")


def test_webvtt_keeps_its_header_blocks_and_cue_settings_and_its_markup_as_markup() -> None:
    vtt = documents.parse("a.vtt", VTT.encode())
    assert vtt.segments == ["<v Roger Bingham>A man is riding a bike.", "Two dogs &amp; a <i>cat</i>."]
    # Lines balanced by what a viewer sees: the speaker's tag counts for nothing.
    assert vtt.rebuild(vtt.segments).decode() == VTT.replace("A man is riding\na bike", "A man is\nriding a bike")
    out = vtt.rebuild(["<v Roger Bingham>Ein Mann fährt Fahrrad.", "Zwei Hunde &amp; eine <i>Katze</i>."]).decode()
    # A tag is never cut between lines; escapes stay escaped, as WebVTT writes them.
    assert out.endswith(
        "intro\n00:01.000 --> 00:03.500 align:start\n<v Roger Bingham>Ein Mann fährt\nFahrrad.\n\n"
        "00:00:04.000 --> 00:00:05.000\nZwei Hunde &amp; eine <i>Katze</i>.\n"
    )
    assert out.startswith("WEBVTT - a film\n\nNOTE made by hand\n\nSTYLE\n::cue { color: yellow }\n\n")


def test_xliff_fills_the_targets_it_lacks_with_its_inline_codes_in_place() -> None:
    from lxml import etree

    v12 = documents.parse("app.xlf", XLIFF12.encode())
    assert v12.segments == [
        'A man in a <span data-x="0">red shirt</span> is riding a bike.<img data-x="1">',
        'Click <img data-x="0">here.',
    ]  # the translated unit and the translate="no" one are not asked
    out = etree.fromstring(v12.rebuild(['Ein Mann in einem <span data-x="0">roten Hemd</span> fährt.<img data-x="1">',
                                        'Klicken Sie <img data-x="0">hier.']))  # fmt: skip
    ns = {"x": "urn:oasis:names:tc:xliff:document:1.2"}
    targets = [etree.tostring(t, encoding=str) for t in out.iterfind(".//x:target", ns)]
    assert len(targets) == 3
    assert 'state="translated">Ein Mann in einem <g id="1">roten Hemd</g> fährt.<x id="2"/></target>' in targets[0]
    assert targets[1].endswith(">Zwei Hunde spielen.</target>")  # a person's translation kept
    assert 'state="translated">Klicken Sie <ph id="3">&lt;b&gt;</ph>hier.</target>' in targets[2]
    assert out.find(".//x:trans-unit[@id='3']/x:target", ns) is None
    v2 = documents.parse("app.xliff", XLIFF2.encode())
    assert v2.segments == ['A <span data-x="0">small</span> dog.', "It runs."]
    out = etree.fromstring(v2.rebuild(['Ein <span data-x="0">kleiner</span> Hund.', "Er rennt."]))
    ns = {"x": "urn:oasis:names:tc:xliff:document:2.0"}
    segments = out.findall(".//x:segment", ns)
    assert [s.get("state") for s in segments] == ["translated", "translated", None]
    assert etree.tostring(segments[0].find("x:target", ns), encoding=str).endswith(
        '>Ein <pc id="1">kleiner</pc> Hund.</target>'
    )
    assert out.find(".//x:ignorable/x:target", ns) is None
    assert v12.rebuild(v12.segments) != XLIFF12.encode()  # targets added, and nothing else:
    again = documents.parse("app.xlf", v12.rebuild(v12.segments))
    assert again.segments == []


def book(chapters: dict[str, str] | None = None) -> bytes:
    """An EPUB 3 book: its spine reads ch2 before ch1; a nav document, a style sheet and a picture beside them."""
    chapters = chapters or {
        "ch1.xhtml": "<h1>A dog</h1><p>A man in a <em>red shirt</em> rides a bike.</p>",
        "ch2.xhtml": "<p>Two dogs &amp; a cat.</p>",
        "nav.xhtml": '<nav epub:type="toc"><ol><li><a href="ch1.xhtml">A dog</a></li></ol></nav>',
    }
    page = (
        '<?xml version="1.0" encoding="UTF-8"?>\n<!DOCTYPE html>\n<html xmlns="http://www.w3.org/1999/xhtml" '
        'xmlns:epub="http://www.idpf.org/2007/ops"><head><title>Book</title></head><body>{}</body></html>'
    )
    opf = (
        '<?xml version="1.0"?><package xmlns="http://www.idpf.org/2007/opf" version="3.0" unique-identifier="id">'
        '<metadata xmlns:dc="http://purl.org/dc/elements/1.1/"><dc:identifier id="id">urn:uuid:0f1e2d3c</dc:identifier>'
        "<dc:title>Book</dc:title><dc:language>en</dc:language></metadata><manifest>"
        '<item id="nav" href="nav.xhtml" media-type="application/xhtml+xml" properties="nav"/>'
        '<item id="c1" href="ch1.xhtml" media-type="application/xhtml+xml"/>'
        '<item id="c2" href="ch2.xhtml" media-type="application/xhtml+xml"/>'
        '<item id="css" href="style.css" media-type="text/css"/></manifest>'
        '<spine><itemref idref="c2"/><itemref idref="c1"/></spine></package>'
    )
    container = (
        '<?xml version="1.0"?><container version="1.0" xmlns="urn:oasis:names:tc:opendocument:xmlns:container">'
        '<rootfiles><rootfile full-path="OEBPS/content.opf" media-type="application/oebps-package+xml"/>'
        "</rootfiles></container>"
    )
    out = io.BytesIO()
    with zipfile.ZipFile(out, "w", zipfile.ZIP_DEFLATED) as z:
        z.writestr("mimetype", "application/epub+zip", compress_type=zipfile.ZIP_STORED)
        z.writestr("META-INF/container.xml", container)
        z.writestr("OEBPS/content.opf", opf)
        z.writestr("OEBPS/style.css", "p { color: red }")
        for name, body in chapters.items():
            z.writestr(f"OEBPS/{name}", page.format(body))
    return out.getvalue()


def test_an_epub_is_read_in_its_spines_order_and_rebuilt_around_its_translations() -> None:
    parsed = documents.parse("book.epub", book())
    # Each document's title, then its prose: the spine's order, then the nav document.
    assert parsed.segments == [
        "Book", "Two dogs &amp; a cat.",
        "Book", "A dog", "A man in a <em>red shirt</em> rides a bike.",
        "Book", '<a href="ch1.xhtml">A dog</a>',
    ]  # fmt: skip
    same = zipfile.ZipFile(io.BytesIO(parsed.rebuild(parsed.segments)))
    original = zipfile.ZipFile(io.BytesIO(book()))
    assert [i.filename for i in same.infolist()] == [i.filename for i in original.infolist()]
    assert same.infolist()[0].compress_type == zipfile.ZIP_STORED  # the mimetype first, and stored
    assert all(same.read(n) == original.read(n) for n in original.namelist())
    german = ["Buch", "Zwei Hunde &amp; eine Katze.", "Buch", "Ein Hund", "Ein Mann in einem <em>roten Hemd</em>.",
              "Buch", '<a href="ch1.xhtml">Ein Hund</a>']  # fmt: skip
    out = zipfile.ZipFile(io.BytesIO(parsed.rebuild(german)))
    assert "<p>Ein Mann in einem <em>roten Hemd</em>.</p>" in out.read("OEBPS/ch1.xhtml").decode()
    assert out.read("OEBPS/style.css") == b"p { color: red }"
    with pytest.raises(ApiError, match=re.escape("not an EPUB book: it has no META-INF/container.xml")):
        documents.parse("a.epub", word())


ODF_NS = (
    'xmlns:office="urn:oasis:names:tc:opendocument:xmlns:office:1.0" '
    'xmlns:text="urn:oasis:names:tc:opendocument:xmlns:text:1.0" '
    'xmlns:table="urn:oasis:names:tc:opendocument:xmlns:table:1.0" '
    'xmlns:draw="urn:oasis:names:tc:opendocument:xmlns:drawing:1.0" xmlns:xlink="http://www.w3.org/1999/xlink"'
)


def open_document(kind: str, body: str, styles: str = "") -> bytes:
    """An OpenDocument file as office suites write one: the mimetype first and stored, then its XML parts."""
    named = {"odt": "text", "odp": "presentation", "ods": "spreadsheet"}[kind]
    content = f"<office:document-content {ODF_NS}><office:body>{body}</office:body></office:document-content>"
    style = f"<office:document-styles {ODF_NS}>{styles}</office:document-styles>"
    out = io.BytesIO()
    with zipfile.ZipFile(out, "w", zipfile.ZIP_DEFLATED) as z:
        z.writestr("mimetype", f"application/vnd.oasis.opendocument.{named}", compress_type=zipfile.ZIP_STORED)
        z.writestr("content.xml", '<?xml version="1.0"?>' + content)
        z.writestr("styles.xml", '<?xml version="1.0"?>' + style)
        z.writestr("META-INF/manifest.xml", ODF_MANIFEST.format(named))
    return out.getvalue()


ODF_MANIFEST = (
    '<?xml version="1.0"?><manifest:manifest xmlns:manifest="urn:oasis:names:tc:opendocument:xmlns:manifest:1.0" '
    'manifest:version="1.2"><manifest:file-entry manifest:full-path="/" '
    'manifest:media-type="application/vnd.oasis.opendocument.{}"/>'
    '<manifest:file-entry manifest:full-path="content.xml" manifest:media-type="text/xml"/>'
    '<manifest:file-entry manifest:full-path="styles.xml" manifest:media-type="text/xml"/></manifest:manifest>'
)


ODT_BODY = (
    '<office:text><text:h>A dog</text:h><text:p>A man in a <text:span text:style-name="T1">red shirt</text:span>'
    '<text:s text:c="2"/>rides a <text:a xlink:href="https://example.com">bike</text:a>.'
    "<text:note><text:note-body><text:p>Two dogs play.</text:p></text:note-body></text:note></text:p>"
    "<text:p> </text:p></office:text>"
)

ODS_BODY = (
    '<office:spreadsheet><table:table><table:table-row><table:table-cell office:value-type="string">'
    '<text:p>A red bike</text:p></table:table-cell><table:table-cell office:value-type="float" office:value="3.5">'
    "<text:p>3.5</text:p></table:table-cell></table:table-row></table:table></office:spreadsheet>"
)
ODP_BODY = (
    "<office:presentation><draw:page><draw:frame><draw:text-box><text:p>Two dogs play in the snow.</text:p>"
    "</draw:text-box></draw:frame></draw:page></office:presentation>"
)


def test_opendocument_paragraphs_keep_their_spans_links_notes_and_numbers() -> None:
    from lxml import etree

    header = "<office:master-styles><text:p>A report.</text:p></office:master-styles>"
    odt = documents.parse("a.odt", open_document("odt", ODT_BODY, header))
    assert odt.segments == [
        "A dog",
        'A man in a <span data-x="0">red shirt</span><img data-x="1">rides a <span data-x="2">bike</span>.'
        '<img data-x="3">',
        "Two dogs play.",
        "A report.",  # styles.xml's header, after the body
    ]
    same = zipfile.ZipFile(io.BytesIO(odt.rebuild(odt.segments)))
    assert same.infolist()[0].filename == "mimetype" and same.infolist()[0].compress_type == zipfile.ZIP_STORED
    german = [
        "Ein Hund",
        'Ein Mann in einem <span data-x="0">roten Hemd</span><img data-x="1">fährt <span data-x="2">Rad</span>.'
        '<img data-x="3">',
        "Zwei Hunde spielen.",
        "Ein Bericht.",
    ]
    out = zipfile.ZipFile(io.BytesIO(odt.rebuild(german)))
    content = out.read("content.xml").decode()
    assert (
        'Ein Mann in einem <text:span text:style-name="T1">roten Hemd</text:span><text:s text:c="2"/>fährt '
        '<text:a xlink:href="https://example.com">Rad</text:a>.<text:note><text:note-body>'
        "<text:p>Zwei Hunde spielen.</text:p></text:note-body></text:note>"
    ) in content
    assert "<text:p>Ein Bericht.</text:p>" in out.read("styles.xml").decode()
    etree.fromstring(out.read("content.xml"))  # well formed
    assert documents.parse("a.ods", open_document("ods", ODS_BODY)).segments == ["A red bike"]
    assert documents.parse("a.odp", open_document("odp", ODP_BODY)).segments == ["Two dogs play in the snow."]
    with pytest.raises(ApiError, match=re.escape("not an OpenDocument .odt file")):
        documents.parse("a.odt", open_document("ods", ODS_BODY))


def test_the_page_offers_every_format_documents_read() -> None:
    page = (Path(documents.__file__).parent.parent / "api" / "ui" / "index.html").read_text()
    offered = re.search(r'<input type="file" id="file" name="file" accept="([^"]*)"', page)
    assert offered is not None and offered.group(1) == ",".join(f".{k}" for k in documents.FORMATS)


def test_subtitle_lines_are_balanced_between_words() -> None:
    assert documents._wrap("Zwei Hunde spielen im Schnee", 2) == ["Zwei Hunde", "spielen im Schnee"]
    assert documents._wrap("Hallo", 2) == ["Hallo"]
    assert documents._wrap("a b c", 3) == ["a", "b", "c"]


# -- on the real server ------------------------------------------------------------------------------


@pytest.fixture()
def client(server: str) -> Iterator[httpx.Client]:
    with httpx.Client(base_url=server, timeout=60) as c:
        yield c


def on_v1(client: httpx.Client, texts: list[str], **extra: object) -> list[str]:
    r = client.post("/v1/translate", json={"texts": texts, "source": "en", "target": "de", **extra})
    assert r.status_code == 200, r.text
    return [t["text"] for t in r.json()["translations"]]


def document(translator: Any, data: bytes, **options: Any) -> bytes:
    """translate_document's file, as the deepl package writes it."""
    out = io.BytesIO()
    translator.translate_document(data, out, **options)
    return out.getvalue()


def reopened(name: str, data: bytes) -> list[str]:
    """What a library of the format's own reads of a file: webvtt-py's cues, translate-toolkit's XLIFF 1.2 and 2.x
    targets, ebooklib's XHTML documents, odfpy's paragraphs and headings."""
    import ebooklib
    import webvtt
    from ebooklib import epub
    from odf import opendocument, teletype
    from odf import text as odf_text
    from translate.storage.xliff import xlifffile
    from translate.storage.xliff2 import Xliff2File

    suffix = name.rsplit(".", 1)[-1]
    if suffix == "vtt":
        return [cue.text for cue in webvtt.from_buffer(io.StringIO(data.decode("utf-8-sig")))]
    if suffix in ("xlf", "xliff"):
        store = xlifffile.parsestring(data) if suffix == "xlf" else Xliff2File.parsestring(data)
        return [str(unit.target) for unit in store.units if unit.istranslatable()]
    if suffix == "epub":
        read = epub.read_epub(io.BytesIO(data), {"ignore_ncx": True})
        return [item.get_content().decode() for item in read.get_items_of_type(ebooklib.ITEM_DOCUMENT)]
    doc = opendocument.load(io.BytesIO(data))
    return [teletype.extractText(p) for kind in (odf_text.H, odf_text.P) for p in doc.getElementsByType(kind)]


def test_every_cue_of_a_subtitle_file_comes_back_translated_whatever_its_line_ends(
    client: httpx.Client, server: str
) -> None:
    """The subtitle files a parser reading only blank-line blocks of LF lines got wrong (a cue lost into the one
    before it, a CR-only file `done` untranslated): each cue translated as /v1 translates it, in the file as it
    came."""
    import deepl

    translator = deepl.Translator("any-key", server_url=server)
    for case, (name, text) in CUES.items():
        parsed = documents.parse(name, text.encode())
        want = parsed.rebuild(on_v1(client, parsed.segments, **({"tag_handling": "html"} if parsed.html else {})))
        got = document(translator, text.encode(), source_lang="EN", target_lang="DE", filename=name)
        assert got == want, case
        assert b"A dog runs." not in got and b"A cat sleeps." not in got and got.count(b"-->") == 2, case


def test_the_served_upload_of_a_hostile_book_is_a_named_4xx(server: str) -> None:
    """On the real server, through DeepL's document route: the crowded book 413, the entity-declaring one 400, each
    answered at its upload with what is wrong."""
    from tests.test_hostile_documents import CROWDED, long_book

    key = {"Authorization": "DeepL-Auth-Key any-key"}
    for data, status, needle in (
        (long_book(120, CROWDED), 413, "tags"),
        (long_book(2, "<p>A man.</p>", doctype='<!DOCTYPE html [ <!ENTITY a "b"> ]>'), 400, "internal subset"),
    ):
        r = httpx.post(
            f"{server}/v2/document",
            files={"file": ("book.epub", data)},
            data={"target_lang": "DE", "source_lang": "EN"},
            headers=key,
            timeout=120,
        )
        assert r.status_code == status and needle in r.json()["message"], r.text


def test_the_deepl_client_translates_each_format_as_v1_translates_its_paragraphs(
    client: httpx.Client, server: str
) -> None:
    import deepl

    translator = deepl.Translator("any-key", server_url=server)
    for name, data in (
        ("notes.txt", TEXT.encode()),
        ("page.html", HTML.encode()),
        ("film.srt", SRT.encode()),
        ("film.vtt", VTT.encode()),
        ("app.xlf", XLIFF12.encode()),
        ("app.xliff", XLIFF2.encode()),
        ("book.epub", book()),
        ("report.odt", open_document("odt", ODT_BODY)),
        ("sheet.ods", open_document("ods", ODS_BODY)),
        ("deck.odp", open_document("odp", ODP_BODY)),
    ):
        parsed = documents.parse(name, data)
        want = parsed.rebuild(on_v1(client, parsed.segments, **({"tag_handling": "html"} if parsed.html else {})))
        got = document(translator, data, target_lang="DE", filename=name)
        assert got == want, name
        if name.endswith((".vtt", ".xlf", ".xliff", ".epub", ".odt", ".ods", ".odp")):  # by the format's own library
            read, before = reopened(name, got), reopened(name, data)
            assert len(read) == len(before) and read != before, name
    # A Word file (its zip's timestamps differ from one save to the next): its paragraphs and their runs.
    parsed = documents.parse("report.docx", word())
    want = parsed.rebuild(on_v1(client, parsed.segments, tag_handling="html"))
    got = document(translator, word(), target_lang="DE", filename="report.docx")
    assert runs_of(got) == runs_of(want) and runs_of(got) != runs_of(word())
    for name, data, read in (("deck.pptx", slides(), slide_texts), ("book.xlsx", workbook(), cells)):
        parsed = documents.parse(name, data)
        want = parsed.rebuild(on_v1(client, parsed.segments, tag_handling="html"))
        got = document(translator, data, target_lang="DE", filename=name)
        assert read(got) == read(want) != read(data), name
    handle = translator.translate_document_upload(TEXT.encode(), target_lang="DE", source_lang="EN", filename="a.txt")
    status = translator.translate_document_get_status(handle)
    assert status.done and status.billed_characters == documents.parse("a.txt", TEXT.encode()).characters
    # A glossary applies to a document as to a text.
    made = translator.create_glossary("d", "EN", "DE", {"bike": "Velo"})
    got = document(translator, TEXT.encode(), source_lang="EN", target_lang="DE", filename="a.txt", glossary=made)
    first = got.decode().removeprefix(documents.BOM).splitlines()[0]
    assert first == on_v1(client, ["A man is riding a bike."], glossary=made.glossary_id)[0] and "Velo" in first
    translator.delete_glossary(made)


def test_documents_are_refused_by_name_and_read_only_with_their_key(client: httpx.Client, server: str) -> None:
    import deepl

    translator = deepl.Translator("any-key", server_url=server)
    with pytest.raises(
        deepl.DeepLException, match=re.escape("documents are .txt, .html, .htm, .srt, .vtt, .xlf, .xliff, .epub, .odt")
    ):
        translator.translate_document_upload(b"%PDF-1.7", target_lang="DE", filename="report.pdf")
    with pytest.raises(deepl.DeepLException, match="a document comes back in its own format"):
        translator.translate_document_upload(TEXT.encode(), target_lang="DE", filename="a.txt", output_format="docx")
    handle = translator.translate_document_upload(TEXT.encode(), target_lang="DE", filename="a.txt")
    r = client.post(f"/v2/document/{handle.document_id}", json={"document_key": "0" * 48})
    assert r.status_code == 403 and "document_key" in r.json()["message"]
    r = client.post("/v2/document/ABC123/result", json={"document_key": handle.document_key})
    assert r.status_code == 404
    r = client.post(f"/v2/document/{handle.document_id}/result", data={"document_key": handle.document_key})
    assert r.status_code == 200 and r.headers["content-type"].startswith("text/plain")
    assert "filename*=UTF-8''a.txt" in r.headers["content-disposition"]
    r = client.post("/v2/document", data={"target_lang": "DE"})
    assert r.status_code == 415
    # A 20,000-character name (DeepL's filename field) is kept as 255 bytes with its extension: the result's
    # header stays small enough for every proxy on its way.
    files = {"file": ("a.txt", TEXT.encode(), "text/plain")}
    r = client.post("/v2/document", files=files, data={"target_lang": "DE", "filename": "n" * 20_000 + ".txt"})
    assert r.status_code == 200, r.text
    handle = deepl.DocumentHandle(r.json()["document_id"], r.json()["document_key"])
    translator.translate_document_wait_until_done(handle)
    r = client.post(f"/v2/document/{handle.document_id}/result", data={"document_key": handle.document_key})
    assert (
        r.status_code == 200
        and r.headers["content-disposition"] == "attachment; filename*=UTF-8''" + "n" * 251 + ".txt"
    )


def gateways_resident_bytes() -> int:
    """The resident memory of the shared server's gateway replicas (Ray's processes are this one's)."""
    import psutil

    found = 0
    for p in psutil.Process().children(recursive=True):
        with contextlib.suppress(psutil.Error):
            if "ServeReplica:beamserve:Gateway" in " ".join(p.cmdline()):
                found += p.memory_info().rss
    assert found, "no gateway replica among this process's children"
    return found


def test_hostile_uploads_are_refused_by_name_and_leave_the_gateway_as_it_was(client: httpx.Client) -> None:
    from .test_hostile_documents import body, docx, with_local_header

    hostile = [
        # 170 KB of zip, 99 MB of XML in parts under a megabyte each (no zip-bomb ratio to see)
        ("amplifying.docx", docx({f"word/header{i}.xml": body(b"<w:r/>" * 166_000) for i in range(1, 100)}), 413),
        # 800,000 elements in five headers: refused once 500,000 are parsed
        ("elements.docx", docx({f"word/header{i}.xml": body(b"<w:r/>" * 160_000) for i in range(1, 6)}), 413),
        ("broken.docx", with_local_header(docx({}), b"word/document.xml", {"method": 9}), 400),
    ]

    def upload(i: int) -> None:
        name, data, status = hostile[i % len(hostile)]
        files = {"file": (name, data)}
        start = time.monotonic()
        if i % 2:
            r = client.post("/translate_file", files=files, data={"source": "en", "target": "de"})
        else:
            r = client.post("/v2/document", files=files, data={"source_lang": "EN", "target_lang": "DE"})
        assert r.status_code == status and r.json()["code"] in ("document_too_large", "invalid_document"), r.text
        # Refused as soon as its budget is past, not at a timeout: the amplifying one from the zip's directory.
        assert time.monotonic() - start < (2 if name == "amplifying.docx" else 5), name

    r = client.post("/v2/document", files={"file": ("a.docx", word())}, data={"target_lang": "DE"})
    assert r.status_code == 200, r.text  # a document's modules imported, its first allocations made
    before = gateways_resident_bytes()
    for i in range(20):
        upload(i)
    grown = gateways_resident_bytes() - before
    # Within 40 MB (a few MB measured; 64 MB when the freed heap stays in glibc's arenas).
    assert grown < 40 * 2**20, f"the gateway grew {grown >> 20} MB over 20 hostile uploads"
    assert client.get("/readyz").status_code == 200


def test_libretranslate_s_file_route_answers_the_address_of_the_translation(client: httpx.Client) -> None:
    parsed = documents.parse("notes.txt", TEXT.encode())
    want = parsed.rebuild(on_v1(client, parsed.segments))
    files = {"file": ("notes.txt", TEXT.encode(), "text/plain")}
    r = client.post("/translate_file", files=files, data={"source": "auto", "target": "de"})
    assert r.status_code == 200, r.text
    url = r.json()["translatedFileUrl"]
    assert url.startswith(str(client.base_url)) and url.endswith("/notes.txt")
    got = httpx.get(url)
    assert got.status_code == 200 and got.content == want
    # The address is the secret: another key in it finds nothing.
    handle = url.split("/download_file/")[1].split("/")[0]
    doc, key = handle.split("-")
    assert client.get(f"/download_file/{doc}-{'0' * len(key)}/notes.txt").status_code == 404
    r = client.post("/translate_file", files={"file": ("a.pdf", b"%PDF", "application/pdf")}, data={"target": "de"})
    assert r.status_code == 400 and "documents are .txt" in r.json()["error"]
    # A name with a directory, or thousands of characters, is kept as its safe base name; the link names the
    # server as it is configured, not as the request's Host header says.
    for name, kept in (("../../etc/notes.txt", "notes.txt"), ("n" * 400 + ".txt", "n" * 251 + ".txt")):
        r = client.post(
            "/translate_file",
            files={"file": (name, TEXT.encode(), "text/plain")},
            data={"target": "de"},
            headers={"Host": "evil.example"},
        )
        assert r.status_code == 200, r.text
        url = r.json()["translatedFileUrl"]
        assert url.startswith(str(client.base_url)) and url.endswith(f"/{kept}"), url
        got = httpx.get(url)
        assert got.status_code == 200 and got.content == want
        assert got.headers["content-disposition"] == f"attachment; filename*=UTF-8''{kept}"


def word(header: str = "A dog report.") -> bytes:
    """A Word document: a paragraph with a bold run and a hyperlink, an empty one, a table, a header."""
    import docx
    from docx.oxml import OxmlElement
    from docx.oxml.ns import qn

    d = docx.Document()
    d.sections[0].header.is_linked_to_previous = False
    d.sections[0].header.paragraphs[0].text = header
    p = d.add_paragraph("A man in a ")
    p.add_run("red shirt").bold = True
    p.add_run(" is riding a ")
    link = OxmlElement("w:hyperlink")
    rid = d.part.relate_to("https://bikes.example", docx.opc.constants.RELATIONSHIP_TYPE.HYPERLINK, is_external=True)
    link.set(qn("r:id"), rid)
    run = OxmlElement("w:r")
    text = OxmlElement("w:t")
    text.text = "bike"
    run.append(text)
    link.append(run)
    p._p.append(link)
    p.add_run(".")
    d.add_paragraph("")
    table = d.add_table(rows=1, cols=2)
    table.cell(0, 0).text = "Two dogs play in the snow."
    table.cell(0, 1).text = "A woman sings."
    out = io.BytesIO()
    d.save(out)
    return out.getvalue()


def runs_of(data: bytes) -> list[list[tuple[str, bool | None]]]:
    import docx

    d = docx.Document(io.BytesIO(data))
    paragraphs = [*d.paragraphs, *(p for c in d.tables[0].rows[0].cells for p in c.paragraphs)]
    return [[(r.text, r.bold) for r in p.runs] + [(h.text, None) for h in p.hyperlinks] for p in paragraphs]


def test_a_word_document_gives_back_what_it_took_and_keeps_its_runs_formatting() -> None:
    import docx

    data = word()
    parsed = documents.parse("a.docx", data)
    assert parsed.segments == [
        'A man in a <span data-r="1">red shirt</span> is riding a <a data-h="0">bike</a>.',
        "Two dogs play in the snow.",
        "A woman sings.",
        "A dog report.",
    ]
    assert parsed.characters == len("A man in a red shirt is riding a bike.") + 26 + 14 + 13  # text, not markup
    same = docx.Document(io.BytesIO(parsed.rebuild(parsed.segments)))
    assert [(r.text, r.bold) for r in same.paragraphs[0].runs] == [
        ("A man in a ", None),
        ("red shirt", True),
        (" is riding a ", None),
        (".", None),
    ]
    translated = [
        'Ein Mann in einem <span data-r="1">roten Hemd</span> fährt ein <a data-h="0">Fahrrad</a>.',
        "Zwei Hunde spielen im Schnee.",
        "Eine Frau singt.",
        "Ein Hundebericht.",
    ]
    out = docx.Document(io.BytesIO(parsed.rebuild(translated)))
    first = out.paragraphs[0]
    assert first.text == "Ein Mann in einem roten Hemd fährt ein Fahrrad."
    assert [r.text for r in first.runs if r.bold] == ["roten Hemd"]
    [link] = first.hyperlinks
    assert link.text == "Fahrrad" and link.address == "https://bikes.example"
    assert [c.text for c in out.tables[0].rows[0].cells] == ["Zwei Hunde spielen im Schnee.", "Eine Frau singt."]
    assert out.sections[0].header.paragraphs[0].text == "Ein Hundebericht."
    assert out.paragraphs[1].text == ""  # an empty paragraph stays


def test_a_zip_bomb_or_a_broken_zip_is_refused_unopened() -> None:
    import zipfile

    bomb = io.BytesIO()
    with zipfile.ZipFile(bomb, "w", zipfile.ZIP_DEFLATED) as z:
        z.writestr("word/document.xml", b"0" * 20_000_000)
    with pytest.raises(ApiError) as err:
        documents.parse("bomb.docx", bomb.getvalue())
    assert err.value.code == "document_too_large" and "word/document.xml" in err.value.detail
    with pytest.raises(ApiError) as err:
        documents.parse("broken.docx", b"PK\x03\x04 not a zip")
    assert err.value.code == "invalid_document"
    plain_zip = io.BytesIO()
    with zipfile.ZipFile(plain_zip, "w") as z:
        z.writestr("notes.txt", b"A dog.")
    with pytest.raises(ApiError) as err:
        documents.parse("zip.docx", plain_zip.getvalue())
    assert err.value.code == "invalid_document" and "not a Word document" in err.value.detail


def slides() -> bytes:
    """A presentation: a title, a text box with a bold run and a line break, a table, speaker notes."""
    from pptx import Presentation
    from pptx.util import Inches

    deck = Presentation()
    slide = deck.slides.add_slide(deck.slide_layouts[5])  # title only
    slide.shapes.title.text = "A dog report"
    paragraph = slide.shapes.add_textbox(Inches(1), Inches(2), Inches(6), Inches(1)).text_frame.paragraphs[0]
    paragraph.add_run().text = "A man in a "
    bold = paragraph.add_run()
    bold.text, bold.font.bold = "red shirt", True
    paragraph.add_run().text = " is riding a bike."
    table = slide.shapes.add_table(1, 2, Inches(1), Inches(4), Inches(6), Inches(1)).table
    table.cell(0, 0).text, table.cell(0, 1).text = "Two dogs.", "42"
    slide.notes_slide.notes_text_frame.text = "A woman sings."
    out = io.BytesIO()
    deck.save(out)
    return out.getvalue()


def workbook() -> bytes:
    """A workbook: text cells, a number, a formula, a second sheet."""
    import openpyxl

    book = openpyxl.Workbook()
    sheet = book.active
    sheet["A1"], sheet["B1"], sheet["C1"], sheet["A2"] = "A man is riding a bike.", 7, "=B1*2", "Two dogs."
    book.create_sheet("Notes")["A1"] = "A woman sings."
    out = io.BytesIO()
    book.save(out)
    return out.getvalue()


def slide_texts(data: bytes) -> list[list[tuple[str, bool | None]]]:
    from pptx import Presentation

    deck = Presentation(io.BytesIO(data))
    out = []
    for slide in deck.slides:
        for shape in slide.shapes:
            frames = [c.text_frame for row in shape.table.rows for c in row.cells] if shape.has_table else []
            for frame in [shape.text_frame] if shape.has_text_frame else frames:
                out += [[(r.text, r.font.bold) for r in p.runs] for p in frame.paragraphs]
        out.append([(slide.notes_slide.notes_text_frame.text, None)])
    return out


def cells(data: bytes) -> list[tuple[str, object]]:
    import openpyxl

    book = openpyxl.load_workbook(io.BytesIO(data))
    return [(f"{s.title}!{c.coordinate}", c.value) for s in book.worksheets for row in s.iter_rows() for c in row]


def test_a_presentation_and_a_workbook_give_back_what_they_took_and_keep_what_is_not_text() -> None:
    presentation = slides()
    deck = documents.parse("deck.pptx", presentation)
    assert deck.segments == [
        "A dog report",
        'A man in a <span data-r="1">red shirt</span> is riding a bike.',
        "Two dogs.",
        "42",
        "A woman sings.",
    ]
    assert slide_texts(deck.rebuild(deck.segments)) == slide_texts(presentation)
    out = deck.rebuild(
        [
            "Ein Hundebericht",
            'Ein Mann in einem <span data-r="1">roten Hemd</span> fährt Rad.',
            "Zwei Hunde.",
            "42",
            "Eine Frau singt.",
        ]
    )
    assert slide_texts(out) == [
        [("Ein Hundebericht", None)],
        [("Ein Mann in einem ", None), ("roten Hemd", True), (" fährt Rad.", None)],
        [("Zwei Hunde.", None)],
        [("42", None)],
        [("Eine Frau singt.", None)],
    ]
    original = workbook()
    book = documents.parse("book.xlsx", original)
    assert book.segments == ["A man is riding a bike.", "Two dogs.", "A woman sings."]
    assert cells(book.rebuild(book.segments)) == cells(original)
    assert cells(book.rebuild(["Ein Mann fährt Rad.", "Zwei Hunde.", "Eine Frau singt."])) == [
        ("Sheet!A1", "Ein Mann fährt Rad."),
        ("Sheet!B1", 7),
        ("Sheet!C1", "=B1*2"),
        ("Sheet!A2", "Zwei Hunde."),
        ("Sheet!B2", None),
        ("Sheet!C2", None),
        ("Notes!A1", "Eine Frau singt."),
    ]
    # Everything but the parts with text comes back byte for byte (serialised again: the parts with text).
    import zipfile

    rebuilt = book.rebuild(book.segments)
    with zipfile.ZipFile(io.BytesIO(original)) as before, zipfile.ZipFile(io.BytesIO(rebuilt)) as after:
        assert before.namelist() == after.namelist()
        changed = [n for n in before.namelist() if before.read(n) != after.read(n)]
    assert all(n.startswith(("xl/sharedStrings", "xl/worksheets/")) for n in changed)


def test_a_document_whose_replica_stopped_is_refunded_once_to_its_key(tmp_path: Path) -> None:
    """A translating document whose status went unrenewed for STALE_S (its replica died): the first read of it
    on any replica refunds the key that uploaded it, once; one settled first (finished) is not refunded."""
    import asyncio
    from dataclasses import replace

    from service.routing import document_jobs
    from service.routing.document_jobs import DocumentJobs, DocumentStatus
    from service.store.records import open_records

    refunds: list[tuple[str, int]] = []

    async def refund_owner(owner: str, characters: int) -> None:
        refunds.append((owner, characters))

    async def check() -> None:
        records = open_records(f"sqlite:///{tmp_path}/records.sqlite3")
        # Two replicas' views of one store; the router is not asked (no document is translated here).
        first, second = (DocumentJobs(records, None, refund_owner, None) for _ in range(2))  # type: ignore[arg-type]
        key = "k" * 48
        gone = time.time() - document_jobs.STALE_S - 5
        status = DocumentStatus("D1", document_jobs._digest(key), "key-alice", "a.txt", "text/plain", 120)
        await first._save(replace(status, status="translating", updated=gone))
        assert (await second.status("D1", key, "key-alice")).answer()["status"] == "error"
        assert (await first.status("D1", key, "key-alice")).answer()["status"] == "error"
        assert refunds == [("key-alice", 120)]
        finished = replace(status, document_id="D2", status="translating", updated=gone)
        await first._save(finished)
        assert await first._settle(finished)  # its replica finishes it (billed) as another reads it stale
        await second.status("D2", key, "key-alice")
        assert refunds == [("key-alice", 120)]  # not refunded
        await first._save(replace(finished, status="done", updated=time.time()))
        assert (await second.status("D2", key, "key-alice")).answer()["status"] == "done"

    asyncio.run(check())


def test_a_document_s_name_is_its_safe_base_name() -> None:
    assert documents.safe_name("C:\\Users\\me\\report.docx") == "report.docx"
    assert documents.safe_name("../../") == "document" and documents.safe_name("..") == "document"
    assert documents.safe_name("\x00\u202e.txt") == "document.txt"  # nothing left of the name but its extension
    long = documents.safe_name("é" * 300 + ".pptx")  # two bytes a character: cut between characters
    assert long == "é" * 125 + ".pptx" and len(long.encode()) <= documents.MAX_NAME_BYTES


def test_sixteen_documents_uploaded_at_once_all_complete(server: str) -> None:
    """More sentences at once than the pair's queue holds (16 documents of 20 lines, the queue 256): the
    documents wait their turn (two translate at a time on a gateway replica) and a refused chunk is sent
    again, so every one completes."""
    from concurrent.futures import ThreadPoolExecutor

    import deepl

    from .conftest import read_lines

    lines = read_lines("test_2016_flickr.en.gz")[500:820]
    texts = ["\n".join(lines[i * 20 : (i + 1) * 20]) + "\n" for i in range(16)]
    translator = deepl.Translator("any-key", server_url=server)

    def upload(text: str) -> bytes:
        return document(translator, text.encode(), source_lang="EN", target_lang="DE", filename="folder.txt")

    with ThreadPoolExecutor(16) as pool:
        done = list(pool.map(upload, texts))
    assert [len(d.decode().splitlines()) for d in done] == [20] * 16


def test_waiting_documents_say_their_place_and_past_a_key_s_share_an_upload_is_refused_at_once(server: str) -> None:
    """60 documents at once from one key: two translate, the rest wait in order with their place in their
    status, past WAITING_PER_KEY waiting an upload is refused at once (DeepL's 429 with Retry-After,
    nothing billed), and every one accepted completes."""
    from concurrent.futures import ThreadPoolExecutor

    from service.routing import document_jobs

    from .conftest import read_lines

    lines = read_lines("test_2016_flickr.en.gz")[:1200]
    texts = ["\n".join(lines[i * 20 : (i + 1) * 20]) + "\n" for i in range(60)]
    key = {"Authorization": "DeepL-Auth-Key any-key"}
    used = httpx.get(f"{server}/v2/usage", headers=key).json()["character_count"]

    def status(document_id: str, document_key: str) -> dict[str, Any]:
        return httpx.post(f"{server}/v2/document/{document_id}", json={"document_key": document_key}).json()

    def upload(text: str) -> tuple[httpx.Response, dict[str, Any] | None]:
        """The upload's answer and, where accepted, its status at once: the queue drains while the other
        uploads still arrive, so a document's place is first asked as it is accepted."""
        files = {"file": ("part.txt", text.encode())}
        form = {"source_lang": "EN", "target_lang": "DE"}
        r = httpx.post(f"{server}/v2/document", files=files, data=form, headers=key, timeout=60)
        return r, status(r.json()["document_id"], r.json()["document_key"]) if r.status_code == 200 else None

    with ThreadPoolExecutor(60) as pool:
        uploads = list(pool.map(upload, texts))
    answers = [r for r, _ in uploads]
    refused = [r for r in answers if r.status_code == 429]
    accepted = [(r.json(), text) for r, text in zip(answers, texts, strict=True) if r.status_code == 200]
    assert len(accepted) + len(refused) == 60 and refused, [r.status_code for r in answers]
    assert all(r.headers["retry-after"] == "5" and "of one key's" in r.json()["message"] for r in refused)
    places: dict[str, list[int]] = {h["document_id"]: [] for h, _ in accepted}  # each one's, as polled
    for r, first in uploads:  # a place is said once the document joins the queue, a moment after its upload
        if first is not None and first["status"] == "queued" and "queue_position" in first:
            places[r.json()["document_id"]].append(first["queue_position"])
    pending = {h["document_id"]: h["document_key"] for h, _ in accepted}
    ended: list[dict[str, Any]] = []
    deadline = time.monotonic() + 120
    while pending and time.monotonic() < deadline:  # those ended polled no more: the last few, polled often
        for document_id, document_key in list(pending.items()):
            st = status(document_id, document_key)
            if st["status"] == "queued" and "queue_position" in st:
                places[document_id].append(st["queue_position"])
            elif st["status"] != "translating":
                ended.append(st)
                del pending[document_id]
        time.sleep(0.02)
    assert not pending and all(st["status"] == "done" for st in ended), (pending, ended)
    queued = [p for p in places.values() if p]
    assert len(queued) >= document_jobs.WAITING_PER_KEY // 2  # a queue, polled before it drained
    assert all(p == sorted(p, reverse=True) and p[-1] >= 1 for p in queued), places  # places only move up
    assert max(max(p) for p in queued) <= document_jobs.WAITING_PER_KEY and min(p[-1] for p in queued) == 1
    billed = sum(documents.parse("part.txt", text.encode()).characters for _, text in accepted)
    assert httpx.get(f"{server}/v2/usage", headers=key).json()["character_count"] - used == billed


def test_a_document_past_the_json_body_limit_translates(server: str) -> None:
    """A 3 MB .docx (a photo in it, as a report has) is over max_body_bytes, within max_document_bytes:
    translated through DeepL's client as its text is, its other parts kept."""
    import os
    import zipfile

    import deepl

    from .conftest import SETTINGS

    source = io.BytesIO(word())
    packed = io.BytesIO()
    photo = os.urandom(3_000_000)  # incompressible
    with zipfile.ZipFile(source) as zin, zipfile.ZipFile(packed, "w", zipfile.ZIP_DEFLATED) as zout:
        for item in zin.infolist():
            zout.writestr(item, zin.read(item.filename))
        zout.writestr("word/media/photo.bin", photo)
    data = packed.getvalue()
    assert len(data) > 3 * int(SETTINGS["max_body_bytes"])  # type: ignore[call-overload]
    translator = deepl.Translator("any-key", server_url=server)
    out = document(translator, data, source_lang="EN", target_lang="DE", filename="report.docx")
    plain = document(translator, word(), source_lang="EN", target_lang="DE", filename="report.docx")
    with zipfile.ZipFile(io.BytesIO(out)) as big, zipfile.ZipFile(io.BytesIO(plain)) as small:
        assert big.read("word/media/photo.bin") == photo
        assert big.read("word/document.xml") == small.read("word/document.xml")


def test_a_paragraph_longer_than_the_model_takes_is_translated_in_pieces(client: httpx.Client, server: str) -> None:
    """A paragraph of 660 tokens with no sentence break (under max_text_chars): a document translates
    it in pieces cut between words, their translations joined, where the API answers input_too_long."""
    import deepl

    paragraph = ("a dog a cat a man " * 110).strip()  # 1,979 characters, 660 tokens of a model that takes 512
    r = client.post(
        "/v1/translate", json={"texts": [paragraph], "source": "en", "target": "de", "split_sentences": False}
    )
    assert r.status_code == 422 and r.json()["error"] == "input_too_long"
    translator = deepl.Translator("any-key", server_url=server)
    text = f"A dog.\n{paragraph}\nA cat.\n"
    got = document(translator, text.encode(), source_lang="EN", target_lang="DE", filename="long.txt").decode()
    lines = got.removeprefix(documents.BOM).splitlines()
    assert len(lines) == 3 and lines[0] == on_v1(client, ["A dog."])[0] and lines[2] == on_v1(client, ["A cat."])[0]
    # The paragraph as the replica cuts it: pieces that each fit, whole words, the paragraph again when joined;
    # its translation theirs, joined by spaces.
    from model.options import DecodeOptions
    from service.engine.served_model import ServedModel
    from service.registry import entries
    from service.settings import Settings

    [entry] = entries("en-de", "")
    model = ServedModel(entry, Settings(threads=1))
    try:
        pieces = [p for p in model.pieces("en-de", paragraph) if p.strip()]
        assert len(pieces) == 2 and "".join(model.pieces("en-de", paragraph)) == paragraph
        assert all(set(p.split()) <= {"a", "dog", "cat", "man"} for p in pieces)  # cut between words
        alone = asyncio.run(model.translate("en-de", [p.strip() for p in pieces], DecodeOptions(), 60))
        assert lines[1] == " ".join(n[0][0] for n in alone.nbest)
    finally:
        asyncio.run(model.close())


def test_a_document_goes_on_through_another_server_when_its_server_stops(client: httpx.Client) -> None:
    """A second server on the shared server's records store takes an upload and is stopped (SIGTERM) mid-way: its
    gateway hands the document over, and the shared server, reading its status, translates the rest from the
    last chunk saved; every line there, those of both servers as /v1 translates them, billed once, its upload
    then forgotten."""
    from service.routing import document_parts
    from service.store.records import open_records

    from .conftest import SETTINGS, read_lines, serving

    lines = [line for line in read_lines("test_2016_flickr.en.gz") if line][:800]
    data = ("\n".join(lines) + "\n").encode()
    env = {
        "BEAMSERVE_MODELS": "en-de",
        "BEAMSERVE_RECORDS_STORAGE": str(SETTINGS["records_storage"]),
        "BEAMSERVE_ENGINE_PROCESS": "false",  # one process less to start: the handover is the gateway's
        # One sentence's beams at a time, in chunks of 2 (400 chunks, each saved): slow enough that the document
        # is still translating when the SIGTERM comes, however idle the machine, which hands it over at once
        # (Gateway.drain).
        "BEAMSERVE_MAX_TEXTS": "2",
        "BEAMSERVE_DECODE_SLOTS": "4",
    }
    with serving(env) as (other, proc):
        r = httpx.post(
            f"{other}/v2/document",
            files={"file": ("captions.txt", data)},
            data={"source_lang": "EN", "target_lang": "DE"},
        )
        assert r.status_code == 200, r.text
        document_id, key = r.json()["document_id"], r.json()["document_key"]
        deadline = time.monotonic() + 120
        while (status := httpx.post(f"{other}/v2/document/{document_id}", data={"document_key": key}).json())[
            "status"
        ] != "translating" or not 0 < _done(document_id) < len(lines):
            assert status["status"] in ("queued", "translating") and time.monotonic() < deadline, status
            time.sleep(0.1)
        proc.terminate()
        proc.wait(60)
    stopped = time.monotonic()
    assert _done(document_id) < len(lines)  # what is left is the shared server's to translate
    while (status := client.post(f"/v2/document/{document_id}", data={"document_key": key}).json())["status"] != "done":
        # Taken over at once, not after the STALE_S a server that died without a word leaves behind.
        assert status["status"] in ("queued", "translating") and time.monotonic() - stopped < 50, status
        time.sleep(0.2)
    assert status["billed_characters"] == documents.parse("captions.txt", data).characters
    got = client.post(f"/v2/document/{document_id}/result", data={"document_key": key})
    assert got.status_code == 200
    out = got.content.decode().splitlines()
    assert len(out) == len(lines)
    sample = [0, 1, len(lines) // 2, len(lines) - 1]  # the stopped server's chunks and the shared server's
    assert [out[i] for i in sample] == on_v1(client, [lines[i] for i in sample])
    records = open_records(str(SETTINGS["records_storage"]))
    assert asyncio.run(records.get(document_parts.SOURCE, document_id)) is None


def _done(document_id: str) -> int:
    """The document's segments translated so far, as its record in the shared store says."""
    import json

    from service.routing.document_jobs import KIND
    from service.store.records import open_records

    from .conftest import SETTINGS

    found = asyncio.run(open_records(str(SETTINGS["records_storage"])).get(KIND, document_id))
    return int(json.loads(found.body)["done_segments"]) if found is not None else 0
