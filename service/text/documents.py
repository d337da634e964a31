"""Documents: a file's prose as segments to translate, and the file rebuilt around their translations,
everything that is not prose kept as it came.

- Plain text (.txt): each line with words is a segment, translated sentence by sentence; blank lines,
  indentation and line endings are kept.
- HTML (.html, .htm): each run of prose between block boundaries is a segment, its inline markup
  carried over by the alignment (service/text/html_text.py); <script>, <style>, <code>, <pre> and what
  is marked not to translate stay as written.
- SubRip subtitles (.srt): each cue's text is a segment; its number and timing line stay, and the
  translation is wrapped over as many lines as the cue had. Inline tags (<i>, <b>) are carried over.
- WebVTT subtitles (.vtt): as SubRip's, a cue's identifier, timing and settings kept; the header, NOTE,
  STYLE and REGION blocks stay as written. Cue text is already markup in WebVTT (<v Speaker>, <c.class>,
  <i>, &amp;): it is translated as it is and written back as the translation gives it.
- OpenDocument text, presentations and spreadsheets (.odt, .odp, .ods): each paragraph, its spans and links
  carried over, as Office documents' (service/text/odf_text.py).
- EPUB books (.epub): each XHTML content document in reading order, as HTML (service/text/epub_text.py).
- XLIFF (.xlf, .xliff; 1.2 and 2.x): each untranslated segment's source, its inline codes carried over,
  written as the segment's target (service/text/xliff_text.py).
- Word, PowerPoint and Excel (.docx, .pptx, .xlsx): each paragraph (each text cell) is a segment, its
  runs' formatting and hyperlinks carried over as inline markup (service/text/ooxml_text.py). A zip that
  would unpack past MAX_UNZIPPED_BYTES, or a part past MAX_ZIP_RATIO times its packed size, is
  refused unopened; text parts past ooxml_text.MAX_XML_BYTES of XML, or MAX_ELEMENTS elements as they are
  parsed, as too large; a member that does not unpack (a method or flag the zip module refuses, a wrong
  CRC-32, a corrupt stream, overlapping members) or XML that does not parse, as invalid, by name.

Text files are read as UTF-8 (a byte-order mark kept); anything else is refused by name.
"""

from __future__ import annotations

import html
import io
import re
import unicodedata
import zipfile
from pathlib import PurePath

from service.errors import ApiError
from service.text.html_text import HtmlDocument, HtmlLimitError, HtmlSyntaxError
from service.text.parsed import Parsed

FORMATS = {
    "txt": "text/plain",
    "html": "text/html",
    "htm": "text/html",
    "srt": "application/x-subrip",
    "vtt": "text/vtt",
    "xlf": "application/x-xliff+xml",
    "xliff": "application/x-xliff+xml",
    "epub": "application/epub+zip",
    "odt": "application/vnd.oasis.opendocument.text",
    "odp": "application/vnd.oasis.opendocument.presentation",
    "ods": "application/vnd.oasis.opendocument.spreadsheet",
    "docx": "application/vnd.openxmlformats-officedocument.wordprocessingml.document",
    "pptx": "application/vnd.openxmlformats-officedocument.presentationml.presentation",
    "xlsx": "application/vnd.openxmlformats-officedocument.spreadsheetml.sheet",
}
MAX_UNZIPPED_BYTES = 100_000_000  # a zip-based document's parts, unpacked
MAX_ZIP_RATIO = 200  # unpacked over packed, per part: past it, a zip bomb
MAX_CHARACTERS = 500_000  # characters of prose in one document
BOM = "\ufeff"
# A document upload's file field, as the OpenAPI document types it.
FILE_FIELD = {"type": "string", "format": "binary", "description": ", ".join(f".{k}" for k in FORMATS)}


def extension(filename: str) -> str:
    return PurePath(filename).suffix.lower().lstrip(".")


MAX_NAME_BYTES = 255  # a file name, UTF-8: what file systems take


def safe_name(filename: str) -> str:
    """The name a document is kept, answered and linked under: its last path part (no directory, no `..`),
    without control or format characters, at most MAX_NAME_BYTES of UTF-8 with its extension kept;
    "document" and the extension where nothing is left."""
    base = filename.replace("\\", "/").rsplit("/", 1)[-1]
    base = "".join(c for c in base if unicodedata.category(c) not in ("Cc", "Cf", "Zl", "Zp")).strip()
    if base in ("", ".", ".."):
        base = ""
    suffix = PurePath(base).suffix if base else ""
    if base.startswith(".") and not suffix:  # ".txt": an extension with no name before it
        suffix = base
    if len(suffix.encode()) > 16:  # not an extension beamserve reads: part of the name
        suffix = ""
    stem = base[: len(base) - len(suffix)] if suffix else base
    room = MAX_NAME_BYTES - len(suffix.encode())
    stem = stem.encode()[:room].decode(errors="ignore").strip()
    return (stem or "document") + suffix


def parse(filename: str, data: bytes) -> Parsed:
    """The document's segments; ApiError for a format it is not in, a file that is not what its
    name says, or more prose than one document may hold."""
    kind = extension(filename)
    if kind not in FORMATS:
        known = ", ".join(f".{k}" for k in FORMATS)
        raise ApiError("unsupported_document", f"{filename!r}: documents are {known}")
    if kind in ("docx", "pptx", "xlsx"):
        from service.text.ooxml_text import office_document  # lxml: loaded for Office documents only

        parsed = office_document(kind, unzipped_safely(filename, data))
    elif kind in ("odt", "odp", "ods"):
        from service.text.odf_text import odf_document

        parsed = odf_document(kind, unzipped_safely(filename, data))
    elif kind == "epub":
        from service.text.epub_text import epub_document

        parsed = epub_document(unzipped_safely(filename, data))
    elif kind in ("xlf", "xliff"):
        from service.text.xliff_text import xliff_document  # lxml, as Office documents

        parsed = xliff_document(data)
    else:
        try:
            text = data.decode("utf-8")
        except UnicodeDecodeError as exc:
            raise ApiError("invalid_document", f"{filename!r} is not UTF-8 text (byte {exc.start})") from None
        bom, text = (BOM, text[1:]) if text.startswith(BOM) else ("", text)
        parsed = {"txt": _text, "html": _html, "htm": _html, "srt": _subtitles, "vtt": _web_subtitles}[kind](text, bom)
    if parsed.characters > MAX_CHARACTERS:
        raise ApiError(
            "document_too_large", f"{parsed.characters} characters of text; a document holds at most {MAX_CHARACTERS}"
        )
    return parsed


def unzipped_safely(filename: str, data: bytes) -> bytes:
    """A zip-based document's bytes, once its directory shows it is a zip that unpacks to a bounded size
    (no part more than MAX_ZIP_RATIO times its packed size, all of them within MAX_UNZIPPED_BYTES)."""
    try:
        with zipfile.ZipFile(io.BytesIO(data)) as z:
            parts = z.infolist()
    except (zipfile.BadZipFile, zipfile.LargeZipFile, NotImplementedError, ValueError, OSError, EOFError) as exc:
        raise ApiError("invalid_document", f"{filename!r} is not a {extension(filename)} file ({exc})") from None
    unpacked = sum(p.file_size for p in parts)
    bomb = next(
        (p for p in parts if p.file_size > MAX_ZIP_RATIO * max(p.compress_size, 1) and p.file_size > 1_000_000), None
    )
    if unpacked > MAX_UNZIPPED_BYTES or bomb is not None:
        raise ApiError(
            "document_too_large",
            f"{filename!r} unpacks to {unpacked} bytes"
            + (
                f" ({bomb.filename} {bomb.file_size // max(bomb.compress_size, 1)} times its packed size)"
                if bomb
                else ""
            )
            + f"; a document unpacks to at most {MAX_UNZIPPED_BYTES}, each part at most {MAX_ZIP_RATIO} times",
        )
    return data


def _text(text: str, bom: str) -> Parsed:
    lines = text.splitlines(keepends=True)
    at = [i for i, line in enumerate(lines) if line.strip()]

    def rebuild(translations: list[str]) -> bytes:
        out = list(lines)
        for i, translation in zip(at, translations, strict=True):
            line = lines[i]
            body = line.rstrip("\r\n")
            lead, trail = body[: len(body) - len(body.lstrip())], body[len(body.rstrip()) :]
            out[i] = lead + translation + trail + line[len(body) :]
        return (bom + "".join(out)).encode()

    return Parsed([lines[i].strip() for i in at], False, rebuild)


def _html(text: str, bom: str) -> Parsed:
    try:
        doc = HtmlDocument(text)
    except (HtmlLimitError, HtmlSyntaxError) as exc:
        raise ApiError("invalid_document", f"the HTML document: {exc}") from None
    return Parsed(
        ["".join(run.original) for run in doc.runs], True, lambda done: (bom + doc.with_fragments(done)).encode()
    )


_CUE_TIMING = re.compile(r"^\s*\d\d:\d\d:\d\d[,.]\d{3}\s*-->\s*\d\d:\d\d:\d\d[,.]\d{3}")
_VTT_TIMING = re.compile(r"^\s*(?:\d+:)?\d\d:\d\d\.\d{3}[ \t]+-->[ \t]+(?:\d+:)?\d\d:\d\d\.\d{3}")
_LINE = re.compile(r"[^\r\n]*(?:\r\n|\r|\n)|[^\r\n]+$")  # a line with its end: CR LF, CR or LF (WebVTT's)
_VTT_KEPT = re.compile(r"(?:WEBVTT|NOTE|STYLE|REGION)(?:[ \t]|$)")  # the header and blocks that are not cues
_TAG = re.compile(r"(<[^<>]*>|\{\\[^{}]*\})")  # <i>, </b>, <font ...>, and ASS overrides such as {\an8}


def _subtitles(text: str, bom: str) -> Parsed:
    return _cues(text, bom, web=False)


def _web_subtitles(text: str, bom: str) -> Parsed:
    if not re.match(r"WEBVTT(?:[ \t\r\n]|$)", text):
        raise ApiError("invalid_document", "not a WebVTT file: it does not begin with WEBVTT")
    return _cues(text, bom, web=True)


def _cues(text: str, bom: str, *, web: bool) -> Parsed:
    """SubRip's or WebVTT's cues, read line by line as WebVTT's parser reads them: a line end is CR, LF or CR LF;
    a cue starts at its timing line (the line before it its number or identifier) and its text runs to a blank
    line (or one of spaces), or to the next timing line. Each cue's text is a segment (SubRip's escaped into
    markup, WebVTT's markup already); every other line, its line end and each blank line stay as they came.
    ApiError invalid_document for a line outside a cue that is no cue's number, header or note."""
    lines = _LINE.findall(text)
    timing = _VTT_TIMING if web else _CUE_TIMING
    kept: list[str | int] = []  # the file's lines as they came, and in place of each cue's text its index
    cues: list[tuple[list[str], list[str]]] = []  # each cue's text lines and their line ends
    i, block = 0, 1
    if web:  # the header: WEBVTT and the lines after it up to a blank one, or to a timing line (a cue's start)
        while i < len(lines) and _content(lines[i]).strip() and (i == 0 or "-->" not in lines[i]):
            kept.append(lines[i])
            i += 1
    while i < len(lines):
        line = _content(lines[i])
        if not line.strip():
            kept.append(lines[i])
            i += 1
            block += 0 if i >= 2 and not _content(lines[i - 2]).strip() else 1  # a run of them ends one block
        elif web and _VTT_KEPT.match(line):  # NOTE, STYLE, REGION: up to a blank line
            while i < len(lines) and _content(lines[i]).strip():
                kept.append(lines[i])
                i += 1
        elif timing.match(line) or (i + 1 < len(lines) and timing.match(_content(lines[i + 1]))):
            if not timing.match(line):  # its number or identifier
                kept.append(lines[i])
                i += 1
            kept.append(lines[i])
            i += 1
            said: list[str] = []
            ends: list[str] = []
            while i < len(lines) and _content(lines[i]).strip() and not _starts_cue(lines, i, timing, web):
                said.append(_content(lines[i]))
                ends.append(lines[i][len(said[-1]) :])
                i += 1
            kept.append(len(cues))
            cues.append((said, ends))
        else:
            example = "00:00:01.000 --> 00:00:02.000" if web else "00:00:01,000 --> 00:00:02,000"
            raise ApiError(
                "invalid_document", f"{'block' if web else 'subtitle'} {block} has no timing line ({example})"
            )
    spoken = [c for c, (said, _) in enumerate(cues) if any(w.strip() for w in said)]

    def rebuild(translations: list[str]) -> bytes:
        done = dict(zip(spoken, translations, strict=True))
        out = []
        for piece in kept:
            if isinstance(piece, str):
                out.append(piece)
                continue
            said, ends = cues[piece]
            if piece in done:
                said = _wrap(done[piece] if web else _plain(done[piece]), len(said))
            out += [w + end for w, end in zip(said, ends[len(ends) - len(said) :], strict=True)]  # the last lines' ends
        return (bom + "".join(out)).encode()

    def segment(c: int) -> str:
        said = " ".join(w.strip() for w in cues[c][0] if w.strip())
        return said if web else _markup(said)

    return Parsed([segment(c) for c in spoken], True, rebuild)


def _content(line: str) -> str:
    """A line without its line end."""
    return line.rstrip("\r\n")


def _starts_cue(lines: list[str], i: int, timing: re.Pattern[str], web: bool) -> bool:
    """Whether line i begins the next cue though no blank line came before it: a timing line (WebVTT: any line
    with -->), or a SubRip cue's number right before one."""
    line = _content(lines[i])
    if timing.match(line) or (web and "-->" in line):
        return True
    return not web and line.strip().isdigit() and i + 1 < len(lines) and bool(timing.match(_content(lines[i + 1])))


def _markup(text: str) -> str:
    """A cue's text as an HTML fragment: its tags as they are, the rest escaped."""
    return "".join(p if _TAG.fullmatch(p) else html.escape(p, quote=False) for p in _TAG.split(text) if p)


def _plain(fragment: str) -> str:
    """A translated fragment back as a cue's text: its tags as they are, the rest unescaped."""
    return "".join(p if _TAG.fullmatch(p) else html.unescape(p) for p in _TAG.split(fragment) if p)


def _wrap(text: str, lines: int) -> list[str]:
    """The text over `lines` lines (at least one) of about equal length, broken between words, never inside
    a tag (<v Roger>, <font color="red">)."""
    words = re.findall(r"(?:<[^<>]*>|[^\s<]|<)+", text)
    if lines <= 1 or len(words) < 2:
        return [" ".join(words)]
    lines = min(lines, len(words))
    shown = {w: len(re.sub(r"<[^<>]*>", "", w)) for w in words}  # what a viewer sees of each word
    out, left = [], words
    for k in range(lines, 1, -1):
        goal = sum(shown[w] + 1 for w in left) / k
        taken, size = 0, 0
        while taken < len(left) - (k - 1) and (taken == 0 or size + shown[left[taken]] / 2 < goal):
            size += shown[left[taken]] + 1
            taken += 1
        out.append(" ".join(left[:taken]))
        left = left[taken:]
    out.append(" ".join(left))
    return out
