"""A request's texts and decoding options held to the server's limits (max_texts, max_text_chars,
max_beam_size, max_decoding_length, request_timeout_s): ApiError for what is over them."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from model.errors import InvalidTextError, check_text
from model.options import DecodeOptions, user_options
from service.errors import ApiError
from service.schemas import TranslateRequest
from service.settings import Settings

OPTIONS_KEPT = 1024  # combinations of decoding options remembered as checked
Defaults = tuple[tuple[str, Any], ...]  # a model's decoding defaults by option name, sorted (a key of the checks)


class RequestChecks:
    def __init__(self, settings: Settings) -> None:
        self.settings = settings
        self._checked: dict[tuple[tuple[tuple[str, object], ...], ...], DecodeOptions] = {}

    def count(self, texts: list[str]) -> None:
        """ApiError too_many_texts for more texts than a request may hold."""
        if len(texts) > self.settings.max_texts:
            raise ApiError("too_many_texts", f"{len(texts)} texts; at most {self.settings.max_texts} per request")

    def texts(self, texts: list[str]) -> None:
        """ApiError for more texts than a request may hold, a text too long, or one no model can take."""
        self.count(texts)
        for i, text in enumerate(texts):
            if len(text) > self.settings.max_text_chars:
                raise ApiError(
                    "text_too_long",
                    f"texts[{i}] has {len(text)} characters; at most {self.settings.max_text_chars}",
                )
            try:
                check_text(text)
            except InvalidTextError as exc:
                raise ApiError("invalid_text", f"texts[{i}]: {exc}") from None

    def options(self, req: TranslateRequest, defaults: Defaults = ()) -> DecodeOptions:
        """The request's decoding options over the model's `defaults` (its generation_config.json's, as
        PairDecoder.model_defaults gives them; the beam within max_beam_size, the n-best the request's alone),
        within the server's limits; ApiError 422 otherwise. Requests repeat a few combinations: each is checked
        once (OPTIONS_KEPT remembered)."""
        named = req.model_fields_set  # what the request gave: the rest is the model's, else beamserve's default
        given = tuple(
            (f.name, v) for f in user_options("api") if f.name in named and (v := getattr(req, f.name)) is not None
        )
        found = self._checked.get((given, defaults))
        if found is None:
            found = self._within_limits(DecodeOptions(**{**self._base(defaults), **dict(given)}))
            if len(self._checked) >= OPTIONS_KEPT:
                self._checked.clear()
            self._checked[(given, defaults)] = found
        return found

    def _base(self, defaults: Defaults) -> dict[str, Any]:
        offered = {f.name for f in user_options("api")} - {"num_hypotheses"}
        base = {name: value for name, value in defaults if name in offered}
        if base.get("beam_size", 0) > self.settings.max_beam_size:  # the operator's limit over the model's default
            base["beam_size"] = self.settings.max_beam_size
        return base

    def _within_limits(self, opts: DecodeOptions) -> DecodeOptions:
        s = self.settings
        if opts.beam_size > s.max_beam_size:
            raise ApiError("invalid_request", f"beam_size must be between 1 and {s.max_beam_size}")
        opts = replace(opts, max_decoding_length=min(opts.max_decoding_length, s.max_decoding_length))
        try:
            opts.validate()
        except ValueError as exc:
            raise ApiError("invalid_request", str(exc)) from None
        return opts

    def timeout(self, timeout_s: float | None = None) -> float:
        """A request's timeout: its own when shorter than the server's."""
        return min(timeout_s or self.settings.request_timeout_s, self.settings.request_timeout_s)
