"""Every error code a client can get and its one HTTP status, with what it means (docs/operations.md's
table of errors is service/api/error_table.py's, tested). A meaning names the limits it states by their
constants ({MAX_ENTRIES:,}), which error_table.py fills in: each limit has one value, where it is enforced. The
compatible APIs' routes answer some codes with the status their own clients expect (deepl.error,
libretranslate.error): 400 for a 422, 429 for overloaded.

Import-light: HAProxy's configuration (service/api/front.py), built in every Ray worker, reads it.
"""

# Error code -> its HTTP status and what it means (docs/operations.md's table is this one, tested).
CODES: dict[str, tuple[int, str]] = {
    "malformed_request": (400, "not a valid HTTP request, or a body the framework cannot read"),
    "invalid_header": (400, "a header that is not UTF-8"),
    "invalid_json": (400, "the body is not JSON, or nested deeper than it may be"),
    "unsupported_pair": (400, "no model for the (named or detected) source and target"),
    "unsupported_option": (400, "an option of a compatible API that beamserve does not have"),
    "detection_unavailable": (400, "no served language can be detected: the source must be named"),
    "ambiguous_source": (400, "a detected source that may be the target language: the source must be named"),
    "invalid_glossary": (
        400,
        "glossary entries that do not parse; an empty, overlong or repeated term; an empty name; "
        "a lone surrogate in a term or the name",
    ),
    "glossary_mismatch": (400, "a glossary for another language pair than the request's"),
    "unsupported_document": (
        400,
        "a document format beamserve does not read (it reads {FORMATS})",
    ),
    "invalid_document": (
        400,
        "a document that is not what its name says: not UTF-8, HTML ending inside markup, a zip member that "
        "does not unpack, XML that does not parse or declares a DTD, ...",
    ),
    "too_many_glossaries": (400, "the key holds as many glossaries as it may ({MAX_GLOSSARIES:,})"),
    "invalid_memory": (
        400,
        "a TMX file that does not parse, declares a DTD or is not TMX; a unit with an empty side or over "
        "{MAX_SEGMENT_CHARS:,} characters",
    ),
    "memory_mismatch": (400, "a translation memory for another language pair than the request's"),
    "too_many_memories": (400, "the key holds as many translation memories as it may ({MAX_MEMORIES:,})"),
    "missing_api_key": (401, "the server needs an API key and none was sent"),
    "invalid_api_key": (403, "the API key is not known"),
    "not_found": (404, "no such route"),
    "invalid_document_key": (403, "a document_key that is not the document's"),
    "document_not_found": (404, "no document of the calling key has this id, or it has expired"),
    "glossary_not_found": (404, "no glossary of the calling key has this id"),
    "memory_not_found": (404, "no translation memory of the calling key has this id"),
    "unknown_pair": (404, "/readyz?pair= names a pair the server does not serve"),
    "method_not_allowed": (405, "the route does not take this method"),
    "body_timeout": (408, "the body did not arrive in time"),
    "body_too_large": (413, "the body is over max_body_bytes (a document upload's over max_document_bytes)"),
    "document_too_large": (
        413,
        "over {MAX_CHARACTERS:,} characters of text, a paragraph over max_text_chars, a zip bomb, or Office text "
        "parts over {MAX_XML_BYTES:,} bytes of XML or {MAX_ELEMENTS:,} elements",
    ),
    "glossary_too_large": (
        413,
        "a glossary over {MAX_ENTRIES:,} entries or {MAX_ENTRIES_CHARS:,} characters of entries",
    ),
    "memory_too_large": (
        413,
        "a translation memory of over {MAX_UNITS:,} units, or a TMX file of over {MAX_TMX_ELEMENTS:,} XML elements",
    ),
    "uri_too_long": (414, "a URL over {MAX_URL_BYTES:,} bytes"),
    "unsupported_media_type": (415, "a content type the route does not read"),
    "invalid_request": (422, "a field missing, of the wrong type or out of range"),
    "invalid_text": (422, "a text that is not text (a lone surrogate, a NUL)"),
    "text_too_long": (422, "a text over max_text_chars characters"),
    "input_too_long": (422, "a sentence over the model's source tokens"),
    "too_many_texts": (422, "over max_texts texts, or more sentences than the replica queues"),
    "html_too_complex": (422, "HTML past the nesting or element limits"),
    "html_malformed": (422, "HTML that ends inside markup"),
    "document_failed": (422, "the document's translation failed: its status says why"),
    "rate_limited": (429, "the key's requests per minute used up"),
    "quota_exceeded": (429, "the key's characters per month used up"),
    "headers_too_large": (431, "over {MAX_HEADERS} header fields, or over {MAX_HEADER_BYTES:,} bytes of headers"),
    "internal_error": (500, "a bug: logged with its traceback"),
    "overloaded": (503, "more work than the server can start within max_queue_wait_s, or its queues full"),
    "shutting_down": (503, "the server is draining on SIGTERM"),
    "starting": (503, "the HTTP front has no application's routes yet"),
    "pair_unavailable": (503, "the pair's model is down, loading, or failed to load"),
    "replica_unavailable": (503, "the pair's or the gateway's replica died or restarts"),
    "limits_unavailable": (503, "the API keys' limits store cannot be reached"),
    "document_not_ready": (503, "the document is still being translated"),
    "store_unavailable": (503, "the glossary and document store cannot be reached"),
    "timeout": (504, "no answer within the request's deadline"),
}

# The codes that say when to retry, without the error itself telling (an overload's estimate does): seconds, as
# every answer of the code says them in Retry-After, from the gateway, HAProxy or Serve's proxy alike.
RETRY_AFTER_S: dict[str, int] = {
    "replica_unavailable": 2,  # Serve replaces a dead replica in about this long on one node
    "starting": 2,  # the front before its routes arrive: the application is deploying
    "pair_unavailable": 5,  # a pair's model that would not load, or one whose replicas are all down
    "shutting_down": 5,  # a draining server: another replica, or this one restarted
    "store_unavailable": 5,  # the glossary and document store
    "limits_unavailable": 5,  # the API keys' limits store
    "overloaded": 1,
    "timeout": 1,
    "document_not_ready": 1,  # a document still translating, asked for its result
}


def status_of(code: str) -> int:
    return CODES[code][0]
