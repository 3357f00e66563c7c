"""One request's output as its frontend folds the core's deltas in: the one place that does it.

``RequestFold`` is used by every frontend of the engine core (``LLM``,
``AsyncEngine`` under ``LocalTextEngine`` and the server, the text stage of
the omni runtime): it decodes text incrementally, matches stop strings,
collects token ids, logprobs, timing and errors, and says when a stop string
ended a request the core is still running (the caller aborts it there).

Stop strings are matched on the decoded text, so they are found even when
they span token boundaries. While a request runs, the last
``len(longest stop) - 1`` characters are held back from the consumer: they
could be the start of a stop string that the next token completes, and text
once streamed cannot be taken back.
"""
from __future__ import annotations

import time
from dataclasses import dataclass, field

from edge_infer.engine.protocol import TokenDelta, TokenLogprobs
from edge_infer.engine.sampling_params import SamplingParams
from edge_infer.models.tokenizer import Tokenizer


@dataclass
class TextUpdate:
    text: str  # newly releasable text
    token_ids: list[int]
    finished: bool
    finish_reason: str | None
    stop_reason: int | str | None
    stop_string_hit: bool  # the core does not know yet; the caller must abort it there


class RequestText:
    def __init__(self, tokenizer: Tokenizer | None, params: SamplingParams):
        self.params = params
        self.decoder = tokenizer.decode_stream(params.skip_special_tokens) if tokenizer is not None else None
        self.stops = params.stop if self.decoder is not None else []
        self.holdback = max((len(s) for s in self.stops), default=1) - 1
        self.text = ""
        self.released = 0
        self.token_ids: list[int] = []
        self.finished = False
        self.finish_reason: str | None = None
        self.stop_reason: int | str | None = None

    def _find_stop(self, new_chars: int) -> tuple[int, str] | None:
        window_start = max(0, len(self.text) - new_chars - self.holdback)
        best = None
        for s in self.stops:
            i = self.text.find(s, window_start)
            if i != -1 and (best is None or i < best[0]):
                best = (i, s)
        return best

    def apply(self, delta: TokenDelta) -> TextUpdate:
        """Fold one core delta in; returns what to tell the consumer."""
        new_ids: list[int] = []
        stop_hit = False
        if self.finished:
            return TextUpdate("", [], True, self.finish_reason, self.stop_reason, False)
        if delta.token_id is not None:
            new_ids.append(delta.token_id)
            self.token_ids.append(delta.token_id)
            if self.decoder is not None:
                piece = self.decoder.step(delta.token_id)
                self.text += piece
                found = self._find_stop(len(piece)) if self.stops else None
                if found is not None:
                    i, s = found
                    self.text = self.text[: i + len(s)] if self.params.include_stop_str_in_output else self.text[:i]
                    self.finished, self.finish_reason, self.stop_reason = True, "stop", s
                    stop_hit = True
        if delta.finished and not self.finished:
            if self.decoder is not None:
                self.text += self.decoder.flush(self.token_ids)
            self.finished = True
            self.finish_reason = delta.finish_reason
            self.stop_reason = delta.stop_reason
        end = len(self.text) if self.finished else max(self.released, len(self.text) - self.holdback)
        out = self.text[self.released : end]
        self.released = max(self.released, end)
        return TextUpdate(out, new_ids, self.finished, self.finish_reason, self.stop_reason, stop_hit and not delta.finished)


@dataclass
class FoldStep:
    """What one core delta changed, for the consumer."""

    text: str  # newly releasable text
    token_ids: list[int]
    logprobs: list[TokenLogprobs]  # for token_ids, when the request asked for logprobs
    prompt_logprobs: list[TokenLogprobs] | None  # prompt tokens 1.., on the delta that completed them
    finished: bool
    finish_reason: str | None
    stop_reason: int | str | None
    error: str | None
    abort_in_core: bool  # a stop string ended the request; the core still runs it until told


@dataclass
class RequestFold:
    text: RequestText
    logprobs: list[TokenLogprobs] | None = None  # one per generated token, when asked for
    prompt_logprobs: list[TokenLogprobs] | None = None  # prompt tokens 1.., once the prefill scored them
    first_token_at: float | None = None
    num_preemptions: int = 0
    num_cached_tokens: int = 0  # prompt tokens the prefix cache held
    encode_s: float = 0.0  # seconds the core spent encoding its media
    error: str | None = None
    token_ids: list[int] = field(default_factory=list)

    @classmethod
    def start(cls, tokenizer: Tokenizer | None, params: SamplingParams) -> "RequestFold":
        return cls(RequestText(tokenizer, params), [] if params.logprobs is not None else None)

    @property
    def finished(self) -> bool:
        return self.text.finished or self.error is not None

    @property
    def finish_reason(self) -> str | None:
        return "error" if self.error is not None else self.text.finish_reason

    @property
    def cumulative_logprob(self) -> float | None:
        return None if self.logprobs is None else sum(lp for lp, _ in self.logprobs)

    def apply(self, delta: TokenDelta) -> FoldStep:
        self.num_preemptions = delta.num_preemptions
        self.num_cached_tokens = delta.num_cached_tokens
        self.encode_s = max(self.encode_s, delta.encode_s)
        update = self.text.apply(delta)
        logprobs: list[TokenLogprobs] = []
        if delta.token_id is not None:
            self.token_ids.append(delta.token_id)
            self.first_token_at = self.first_token_at or time.time()
            if self.logprobs is not None and delta.logprob is not None:
                logprobs.append((delta.logprob, list(delta.top_logprobs or [])))
                self.logprobs += logprobs
        if delta.error and self.error is None:
            self.error = delta.error
        if delta.prompt_logprobs is not None:
            self.prompt_logprobs = delta.prompt_logprobs
        return FoldStep(update.text, update.token_ids, logprobs, delta.prompt_logprobs, update.finished or self.error is not None,
                        self.finish_reason, update.stop_reason, self.error, update.stop_string_hit)
