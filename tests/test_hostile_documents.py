"""Hostile documents (service/text/ooxml_text.py, service/text/documents.py): every malformed file a named
4xx, budgets that refuse an amplifying file before its XML is parsed whole, and no pass quadratic in a
paragraph's runs; a seeded mutation run over valid files (longer: `make fuzz`)."""

from __future__ import annotations

import io
import os
import random
import struct
import zipfile
import zlib
from pathlib import Path

import pytest

from service.errors import ApiError
from service.text import documents, ooxml_text

W = 'xmlns:w="http://schemas.openxmlformats.org/wordprocessingml/2006/main"'
NAMED = {"invalid_document", "document_too_large", "unsupported_document"}


def docx(parts: dict[str, bytes], method: int = zipfile.ZIP_DEFLATED) -> bytes:
    """A zip with word/document.xml (one paragraph) and `parts` beside it."""
    out = io.BytesIO()
    with zipfile.ZipFile(out, "w", method) as z:
        z.writestr("word/document.xml", body(b"<w:r><w:t>A dog runs.</w:t></w:r>"))
        for name, data in parts.items():
            z.writestr(name, data)
    return out.getvalue()


def body(runs: bytes) -> bytes:
    return f"<w:document {W}><w:body><w:p>".encode() + runs + b"</w:p></w:body></w:document>"


def refused(name: str, data: bytes) -> ApiError:
    with pytest.raises(ApiError) as err:
        documents.parse(name, data)
    return err.value


def test_a_paragraph_of_many_empty_runs_reads_and_rebuilds_in_one_pass_over_them() -> None:
    runs = b"<w:r><w:t>A man rides a bike.</w:t></w:r>" + b"<w:r/>" * 165_000
    out = io.BytesIO()
    with zipfile.ZipFile(out, "w", zipfile.ZIP_STORED) as z:  # stored: no ratio for the zip-bomb check to see
        z.writestr("word/document.xml", body(runs))
    parsed = documents.parse("runs.docx", out.getvalue())
    assert parsed.segments == ["A man rides a bike."]  # the empty runs hold no text
    again = documents.parse("runs.docx", parsed.rebuild(["Ein Mann fährt Fahrrad."]))
    assert again.segments == ["Ein Mann fährt Fahrrad."]


def test_text_parts_past_the_xml_budget_are_refused_from_the_zip_s_directory() -> None:
    # Forty headers of a megabyte of empty runs, stored (a ratio the zip-bomb check passes): 40 MB of XML
    # that no text needs, which lxml would hold in some 30 times that.
    header = body(b"<w:r/>" * 170_000)
    err = refused("headers.docx", docx({f"word/header{i}.xml": header for i in range(1, 41)}, zipfile.ZIP_STORED))
    assert err.code == "document_too_large" and "bytes of XML" in err.detail


def test_an_office_part_with_entities_is_refused_by_name_not_read_short() -> None:
    declared = b'<?xml version="1.0"?><!DOCTYPE w:document [<!ENTITY ent "a cat">]>' + body(
        b"<w:r><w:t>A dog &ent; runs after it.</w:t></w:r>"
    )
    out = io.BytesIO()
    with zipfile.ZipFile(out, "w") as z:
        z.writestr("word/document.xml", declared)
    err = refused("entities.docx", out.getvalue())
    assert err.code == "invalid_document" and "declares a DTD" in err.detail
    out = io.BytesIO()  # an entity no DTD declares: the part does not parse
    with zipfile.ZipFile(out, "w") as z:
        z.writestr("word/document.xml", body(b"<w:r><w:t>A dog &ent; runs.</w:t></w:r>"))
    err = refused("entities.docx", out.getvalue())
    assert err.code == "invalid_document" and "does not parse" in err.detail


def test_a_part_past_the_element_budget_is_refused_while_it_is_parsed() -> None:
    header = body(b"<w:r/>" * (ooxml_text.MAX_ELEMENTS + 10))
    err = refused("elements.docx", docx({"word/header1.xml": header}, zipfile.ZIP_STORED))
    assert err.code == "document_too_large" and f"more than {ooxml_text.MAX_ELEMENTS} XML elements" in err.detail


def with_local_header(data: bytes, name: bytes, change: dict[str, int]) -> bytes:
    """data with the local and central headers of member `name` changed: flags, method or CRC-32."""
    out = bytearray(data)
    for signature, fields in (
        (b"PK\x03\x04", {"flags": 6, "method": 8, "crc": 14}),
        (b"PK\x01\x02", {"flags": 8, "method": 10, "crc": 16}),
    ):
        at = 0
        while (at := out.find(signature, at)) >= 0:
            name_at = at + (30 if signature == b"PK\x03\x04" else 46)
            if out[name_at : name_at + len(name)] == name:
                for field, value in change.items():
                    size = 4 if field == "crc" else 2
                    out[at + fields[field] : at + fields[field] + size] = value.to_bytes(size, "little")
            at += 4
    return bytes(out)


@pytest.mark.parametrize(
    ("case", "change"),
    [
        ("deflate64 (a method the zip module does not unpack)", {"method": 9}),
        ("an unknown method", {"method": 99}),
        ("the encrypted flag", {"flags": 1}),
        ("a wrong CRC-32", {"crc": 0x12345678}),
    ],
)
def test_a_member_the_zip_module_cannot_unpack_is_a_named_400(case: str, change: dict[str, int]) -> None:
    data = with_local_header(docx({"word/media/image1.png": b"\x89PNG" + bytes(300)}), b"word/document.xml", change)
    err = refused("broken.docx", data)
    assert err.code == "invalid_document" and "word/document.xml" in err.detail, (case, err.detail)
    other = with_local_header(
        docx({"word/media/image1.png": b"\x89PNG" + bytes(300)}), b"word/media/image1.png", change
    )
    err = refused("broken.docx", other)  # a part without text too: the rebuild would copy it
    assert err.code == "invalid_document" and "image1.png" in err.detail, (case, err.detail)


def test_a_corrupt_deflate_stream_and_overlapping_members_are_named_400s() -> None:
    data = bytearray(docx({}))
    start = data.find(b"PK\x03\x04") + 30 + len("word/document.xml")
    data[start + 4 : start + 12] = b"\xff" * 8  # inside the compressed stream
    assert refused("corrupt.docx", bytes(data)).code == "invalid_document"
    # Two central directory entries pointing at one local header (a zip bomb's trick)
    plain = docx({}, zipfile.ZIP_STORED)
    central = plain.find(b"PK\x01\x02")
    end = plain.find(b"PK\x05\x06")
    entry = plain[central:end]
    twin = entry.replace(b"word/document.xml", b"word/footer1.xml\x00"[: len("word/document.xml")])
    count = struct.unpack("<H", plain[end + 10 : end + 12])[0]
    eocd = bytearray(plain[end:])
    eocd[8:10] = eocd[10:12] = struct.pack("<H", count + 1)
    eocd[12:16] = struct.pack("<I", len(entry) + len(twin))
    overlapping = plain[:central] + entry + twin + bytes(eocd)
    err = refused("overlap.docx", overlapping)
    assert err.code in NAMED, err.detail


def mutations(seed: int, count: int) -> list[tuple[str, bytes]]:
    """Valid Office, OpenDocument, EPUB, XLIFF, WebVTT and SubRip files (tests/test_documents.py's) with bytes flipped,
    runs of bytes zeroed, members duplicated or truncated, headers' methods and flags changed: `count` of them."""
    from tests.test_documents import ODT_BODY, SRT, VTT, XLIFF2, XLIFF12, book, open_document, slides, word, workbook

    rng = random.Random(seed)
    files = [
        ("a.docx", word()),
        ("a.pptx", slides()),
        ("a.xlsx", workbook()),
        ("a.odt", open_document("odt", ODT_BODY)),
        ("a.epub", book()),
        ("a.xlf", XLIFF12.encode()),
        ("a.xliff", XLIFF2.encode()),
        ("a.vtt", VTT.encode()),
        ("a.srt", SRT.encode()),
    ]
    out = []
    for _ in range(count):
        name, data = rng.choice(files)
        b = bytearray(data)
        kind = rng.randrange(5)
        if kind == 0:
            for _ in range(rng.randint(1, 8)):
                b[rng.randrange(len(b))] = rng.randrange(256)
        elif kind == 1:
            at = rng.randrange(len(b))
            b[at : at + rng.randint(1, 64)] = bytes(rng.randint(1, 64))
        elif kind == 2:
            b = b[: rng.randrange(len(b))]
        elif kind == 3:
            at = b.find(b"PK\x03\x04", rng.randrange(len(b)))
            if at >= 0:
                b[at + 8 : at + 10] = rng.choice([9, 12, 14, 98, 99]).to_bytes(2, "little")
                b[at + 6] |= rng.choice([1, 8, 64])
        else:
            at, size = rng.randrange(len(b)), rng.randint(16, 4096)
            b = b[:at] + b[at : at + size] * rng.randint(2, 4) + b[at + size :]
        out.append((name, bytes(b)))
    return out


FUZZ_SEED = int(os.environ.get("BEAMSERVE_FUZZ_SEED", "20261128"))
FUZZ_CASES = int(os.environ.get("BEAMSERVE_FUZZ_CASES", "300"))


def test_mutated_files_read_or_are_refused_by_name() -> None:
    """Every mutation parses and rebuilds, or is refused with a named code: no other exception escapes."""
    for name, data in mutations(FUZZ_SEED, FUZZ_CASES):
        try:
            parsed = documents.parse(name, data)
        except ApiError as exc:
            assert exc.code in NAMED, (name, exc.code, exc.detail)
            continue
        parsed.rebuild(parsed.segments)


def test_zlib_errors_are_among_those_named() -> None:
    assert zlib.error in ooxml_text._UNREADABLE


def with_lying_member(data: bytes, name: str, body: bytes, claimed: int, method: int) -> bytes:
    """A zip document with one member more, `body` compressed by `method`, whose local and central headers
    claim it unpacks to `claimed` bytes."""
    out = io.BytesIO()
    with zipfile.ZipFile(io.BytesIO(data)) as z, zipfile.ZipFile(out, "w") as new:
        for info in z.infolist():
            new.writestr(info, z.read(info), compress_type=info.compress_type)
        new.writestr(name, body, compress_type=method)
    b = bytearray(out.getvalue())
    local = b.rfind(b"PK\x03\x04")
    central = b.rfind(b"PK\x01\x02")
    b[local + 22 : local + 26] = struct.pack("<I", claimed)
    b[central + 24 : central + 28] = struct.pack("<I", claimed)
    return bytes(b)


def lying_files() -> list[tuple[str, bytes]]:
    from tests.test_documents import ODT_BODY, book, open_document, word

    return [
        ("a.docx", word()),
        ("a.odt", open_document("odt", ODT_BODY)),
        ("a.epub", book()),
    ]


@pytest.mark.parametrize("method", [zipfile.ZIP_BZIP2, zipfile.ZIP_LZMA])
def test_a_member_compressed_by_bzip2_or_lzma_is_refused_before_it_is_inflated(method: int) -> None:
    for name, data in lying_files():
        lying = with_lying_member(data, "media/picture.png", bytes(2_000_000), 200, method)
        assert len(lying) < 100_000
        err = refused(name, lying)
        assert err.code == "invalid_document" and "stored or deflated" in err.detail, (name, err.detail)


def test_a_deflated_member_that_lies_about_its_size_is_inflated_no_further_than_it_claims(tmp_path: Path) -> None:
    """A 350 MB deflate stream (350 KB packed) whose headers claim 200 bytes, in each zip-based format: the
    parse, in a process of its own, grows by less than 100 MB (it inflated 350 MB before) and refuses the
    file by name (its CRC-32 is the whole stream's)."""
    import subprocess
    import sys

    zeros = bytes(350_000_000)
    for name, data in lying_files():
        (tmp_path / name).write_bytes(with_lying_member(data, "media/picture.png", zeros, 200, zipfile.ZIP_DEFLATED))
    del zeros
    script = (
        "import resource, sys\n"
        "from pathlib import Path\n"
        "from service.errors import ApiError\n"
        "from service.text import documents\n"
        "data = Path(sys.argv[1]).read_bytes()\n"
        "before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss\n"
        "try:\n"
        "    documents.parse(Path(sys.argv[1]).name, data)\n"
        "    print('read', end=' ')\n"
        "except ApiError as exc:\n"
        "    print(exc.code, end=' ')\n"
        "print((resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - before) // 1024)\n"
    )
    for name, _ in lying_files():
        run = subprocess.run(
            [sys.executable, "-c", script, str(tmp_path / name)], capture_output=True, text=True, timeout=120
        )
        assert run.returncode == 0, run.stderr
        outcome, grown_mb = run.stdout.split()
        assert outcome == "invalid_document" and int(grown_mb) < 100, (name, run.stdout)


def python_steps(name: str, data: bytes) -> int:
    """The lines of Python one parse and rebuild runs (a loop's every pass counted, as sys.settrace reports
    them): a count of the work, the same on any machine under any load, where a time is neither."""
    import sys
    from types import FrameType
    from typing import Any

    steps = 0

    def count(frame: FrameType, event: str, arg: Any) -> Any:
        nonlocal steps
        steps += 1
        return count

    sys.settrace(count)
    try:
        parsed = documents.parse(name, data)
        parsed.rebuild(parsed.segments)
    finally:
        sys.settrace(None)
    return steps


def test_deep_nesting_costs_an_xliff_or_odf_file_its_elements_not_elements_times_depth() -> None:
    """What a segment inherits (translate="no", the table cell it is in) is passed down the tree once: 20,000
    units under 250 nested groups run the Python steps of 20,000 flat ones. Asking each paragraph of an ODF
    file its ancestors for a table cell (a generator over iterancestors()) ran 6 times as many."""
    from tests.test_documents import open_document

    units = '<trans-unit id="u"><source>A dog runs.</source></trans-unit>' * 20_000

    def xliff(depth: int) -> bytes:
        body = '<group id="g">' * depth + units + "</group>" * depth
        head = '<xliff version="1.2" xmlns="urn:oasis:names:tc:xliff:document:1.2"><file source-language="en">'
        return f"{head}<body>{body}</body></file></xliff>".encode()

    def odt(depth: int) -> bytes:
        body = "<text:section>" * depth + "<text:p>A dog runs.</text:p>" * 20_000 + "</text:section>" * depth
        return open_document("odt", f"<office:text>{body}</office:text>")

    for name, build in (("deep.xlf", xliff), ("deep.odt", odt)):
        flat, deep = python_steps(name, build(1)), python_steps(name, build(250))
        assert deep < 1.1 * flat, (name, flat, deep)


def long_book(chapters: int, body: str, doctype: str = "<!DOCTYPE html>") -> bytes:
    """An EPUB of `chapters` XHTML documents, each of `body`, all in its spine."""
    items = "".join(f'<item id="c{i}" href="c{i}.xhtml" media-type="application/xhtml+xml"/>' for i in range(chapters))
    spine = "".join(f'<itemref idref="c{i}"/>' for i in range(chapters))
    opf = (
        '<?xml version="1.0"?><package xmlns="http://www.idpf.org/2007/opf" version="3.0" unique-identifier="id">'
        '<metadata xmlns:dc="http://purl.org/dc/elements/1.1/"><dc:identifier id="id">urn:uuid:1</dc:identifier>'
        f"<dc:title>Book</dc:title></metadata><manifest>{items}</manifest><spine>{spine}</spine></package>"
    )
    container = (
        '<?xml version="1.0"?><container version="1.0" xmlns="urn:oasis:names:tc:opendocument:xmlns:container">'
        '<rootfiles><rootfile full-path="content.opf" media-type="application/oebps-package+xml"/></rootfiles>'
        "</container>"
    )
    page = f'<?xml version="1.0"?>\n{doctype}\n<html xmlns="http://www.w3.org/1999/xhtml"><body>{body}</body></html>'
    out = io.BytesIO()
    with zipfile.ZipFile(out, "w", zipfile.ZIP_DEFLATED) as z:
        z.writestr("mimetype", "application/epub+zip", compress_type=zipfile.ZIP_STORED)
        z.writestr("META-INF/container.xml", container)
        z.writestr("content.opf", opf)
        for i in range(chapters):
            z.writestr(f"c{i}.xhtml", page)
    return out.getvalue()


# 4,900 tags a chapter, within the 5,000 one HTML document may hold.
CROWDED = "<p><b>A</b></p>" * 1225


def test_an_epub_s_tags_are_bounded_per_book_not_per_chapter() -> None:
    """A book of chapters each within one HTML document's 5,000 tags is refused once its chapters hold more than
    500,000 in all (900 such chapters took 29 s and 1.4 GB to read), while the tags are counted."""
    assert len(documents.parse("a.epub", long_book(100, CROWDED)).segments) == 100 * 1225
    err = refused("a.epub", long_book(120, CROWDED))
    assert err.code == "document_too_large" and "more than 500000 tags" in err.detail, err.detail


def test_an_epub_chapter_whose_doctype_declares_entities_is_refused_by_name() -> None:
    """HTML's parser reads a DOCTYPE to its first ">": an internal subset's entities would be translated as text
    and the chapter would come back no longer XHTML."""
    subset = '<!DOCTYPE html [ <!ENTITY who "a man"> ]>'
    err = refused("a.epub", long_book(2, "<p>&who; rides a bike.</p>", doctype=subset))
    assert err.code == "invalid_document" and "c0.xhtml" in err.detail and "internal subset" in err.detail, err.detail
