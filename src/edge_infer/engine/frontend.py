"""What every frontend (LLM, LocalTextEngine, the server) shares.

A ``Frontend`` resolves the model directory, loads the tokenizer and the
generation defaults, plans memory (refusing a plan that does not fit) and
turns user prompts into validated ``EngineRequest``s. It never imports torch:
the weights live in the engine core.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Union

from edge_infer.config import EngineConfig
from edge_infer.engine import media_prompt
from edge_infer.engine.grammar import MAX_JSON_DEPTH, compile_grammar, nesting_depth
from edge_infer.engine.protocol import (EngineRequest, MediaInput, context_problem, media_problem, mrope_positions,
                                        request_problem)
from edge_infer.engine.sampling_params import SamplingParams, token_id_list
from edge_infer.errors import CheckpointError, ContextLengthError, InvalidRequestError, MediaError, PlanRefusedError
from edge_infer.media.config import MediaProcessing
from edge_infer.media.limits import MediaLimits
from edge_infer.media.sources import MediaPolicy
from edge_infer.memory.plan import TextPlan, plan_text_session
from edge_infer.models.checkpoint import vision_demo_model_dir
from edge_infer.models.config import ModelConfig
from edge_infer.models.generation_config import GenerationDefaults
from edge_infer.models.tokenizer import Tokenizer

# Normalization (NFC, NFKC) can compose up to this many input characters into one (Hangul jamo: 3).
_CHARS_PER_NORMALIZED_CHAR = 4

# A prompt: text, token ids, or {"prompt": ...} / {"prompt_token_ids": [...]}; either dict may add
# "media": [MediaInput, ...] placed at the prompt's placeholder tokens (a multimodal model).
PromptInput = Union[str, list[int], dict[str, Any]]


def resolve_model(model: str | Path | None) -> str:
    """A checkpoint directory; None means the embedded vision demo (the text demo with eyes)."""
    if model is None:
        path = vision_demo_model_dir()
        if not (path / "config.json").is_file():
            raise CheckpointError(f"the embedded demo model is missing from {path}; run scripts/train_demo_vision.py")
        return str(path)
    path = Path(model).expanduser()
    if not path.is_dir():
        raise CheckpointError(
            f"model {model!r} is not a directory; pass a local Hugging Face checkpoint directory "
            f"(edge-infer does not download models)"
        )
    return str(path)


@dataclass
class PreparedPrompt:
    prompt: str | None
    token_ids: list[int]
    media: list[MediaInput] = field(default_factory=list)


@dataclass
class RenderedChat:
    """A chat prompt before its media are loaded: the template's text and tokens, one placeholder per part."""

    text: str
    token_ids: list[int]
    parts: list[media_prompt.MediaPart]
    audio_in_video: bool


def _text_chars(value: Any) -> int:
    """Characters of all the strings in ``value`` (messages or tools), however deeply nested."""
    chars, stack = 0, [value]
    while stack:
        item = stack.pop()
        if isinstance(item, str):
            chars += len(item)
        elif isinstance(item, dict):
            stack.extend(item.values())
        elif isinstance(item, (list, tuple)):
            stack.extend(item)
    return chars


class Frontend:
    def __init__(self, plan: TextPlan, tokenizer: Tokenizer | None, defaults: GenerationDefaults):
        if not plan.admitted:
            raise PlanRefusedError("memory plan refused:\n" + plan.table(), plan)
        self.plan = plan
        self.tokenizer = tokenizer
        self.defaults = defaults
        self.specials_in_content = False  # the server's --parse-special-tokens-in-content
        self.engine_config: EngineConfig = plan.engine_config
        self.vocab_size = plan.model_config.vocab_size
        self.model_name = Path(plan.model).name  # how messages name the model (the server sets its served name)
        # Where media parts may come from (the server's --allowed-media-dir, --allow-remote-media, ...): data:
        # URLs only unless the operator allows more.
        self.media_policy = MediaPolicy()
        # A thinker's preprocessing settings, read (and checked) once; a text model has none.
        multimodal = plan.model_config.multimodal is not None
        self.media_processing = MediaProcessing.from_dir(plan.model) if multimodal else MediaProcessing()

    @classmethod
    def create(cls, model: str | Path | None = None, skip_tokenizer_init: bool = False, **settings: Any) -> "Frontend":
        """Resolve, tokenize and plan; raises PlanRefusedError when the plan does not fit."""
        model_dir = resolve_model(model)
        ModelConfig.from_dir(model_dir)  # a directory that is not a checkpoint is the first thing to report (parsed once: models/config.py)
        tokenizer = None if skip_tokenizer_init else Tokenizer(model_dir)
        defaults = GenerationDefaults.from_dir(model_dir, tokenizer.eos_token_id if tokenizer else None)
        plan = plan_text_session(model_dir, eos_token_ids=defaults.eos_token_ids, **settings)
        return cls(plan, tokenizer, defaults)

    @classmethod
    def from_plan(cls, plan: TextPlan, skip_tokenizer_init: bool = False) -> "Frontend":
        tokenizer = None if skip_tokenizer_init else Tokenizer(plan.model)
        defaults = GenerationDefaults.from_dir(plan.model, tokenizer.eos_token_id if tokenizer else None)
        if plan.engine_config is not None and not plan.engine_config.eos_token_ids:
            from dataclasses import replace

            plan.engine_config = replace(plan.engine_config, eos_token_ids=defaults.eos_token_ids)
        return cls(plan, tokenizer, defaults)

    @property
    def max_model_len(self) -> int:
        return self.engine_config.max_model_len

    def runtime_summary(self) -> dict[str, Any]:
        """What the plan runs this model on: dtype, quantization, the CPU's ISA and the kernel of each linear kind."""
        plan = self.plan
        return {
            "dtype": plan.settings["dtype"],
            "quantization": plan.settings["quantization"],
            "cpu_isa": plan.cpu.isa_summary if plan.cpu else None,
            "kernels": {c.kind: c.label for c in plan.kernels.choices} if plan.kernels else None,
        }

    def default_params(self, **overrides: Any) -> SamplingParams:
        """SamplingParams from the checkpoint's generation_config.json, then ``overrides``."""
        return SamplingParams(**{**self.defaults.sampling, **overrides})

    def prepare(self, prompt: PromptInput) -> PreparedPrompt:
        if isinstance(prompt, dict):
            media = list(prompt.get("media") or ())
            if "prompt_token_ids" in prompt:
                return PreparedPrompt(prompt.get("prompt"), token_id_list(prompt["prompt_token_ids"], "prompt_token_ids"),
                                      media)
            if "prompt" in prompt:
                prepared = self.prepare(prompt["prompt"])
                prepared.media = media
                return prepared
            raise InvalidRequestError("a prompt dict needs 'prompt' or 'prompt_token_ids'")
        if isinstance(prompt, (list, tuple)) or hasattr(prompt, "tolist"):  # numpy arrays and tensors too
            return PreparedPrompt(None, token_id_list(prompt, "the prompt's token ids"))
        if not isinstance(prompt, str):
            raise InvalidRequestError(f"a prompt must be a string, a list of token ids or a dict, not {type(prompt).__name__}")
        self.check_text_fits(len(prompt), "the prompt")
        return PreparedPrompt(prompt, self.require_tokenizer().encode(prompt))

    @property
    def media_limits(self) -> MediaLimits | None:
        """What one request may carry (images, pixels, clips, audio seconds, videos, frames): the limits the memory
        plan sized the encoders and media buffers for (``plan.media_limits``), so that every frontend refuses what
        the plan did not size; None for a text model, which takes no media."""
        return self.plan.media_limits

    def prepare_chat(self, messages: list[dict[str, Any]], mm_processor_kwargs: dict[str, Any] | None = None,
                     **template_kwargs: Any) -> PreparedPrompt:
        """A conversation rendered by the chat template with its media loaded: ``load_media(render_chat(...))``."""
        return self.load_media(self.render_chat(messages, mm_processor_kwargs, **template_kwargs))

    def render_chat(self, messages: list[dict[str, Any]], mm_processor_kwargs: dict[str, Any] | None = None,
                    **template_kwargs: Any) -> RenderedChat:
        """A conversation rendered by the chat template and tokenized, its media parts checked (kinds, counts,
        placeholders) but not read; special-token text in messages and tools stays text unless
        ``specials_in_content`` is set on this frontend (models.tokenizer says why). ``mm_processor_kwargs``:
        vLLM's, ``use_audio_in_video``."""
        chat = media_prompt.split_messages(messages)
        self.check_text_fits(_text_chars(chat.messages) + _text_chars(template_kwargs.get("tools")),
                             "the messages (with tools)")
        for what, value in (("the messages", chat.messages), ("the tools", template_kwargs.get("tools"))):
            if (depth := nesting_depth(value)) > MAX_JSON_DEPTH:  # the template's walks would recurse past Python's limit
                raise InvalidRequestError(f"{what} nest {depth} levels deep, more than the {MAX_JSON_DEPTH} edge-infer "
                                          "takes; flatten them")
        mm = self.plan.model_config.multimodal
        media_prompt.check_parts(chat.parts, mm, self.model_name, self.media_limits, self.plan.media_kinds)
        audio_in_video = media_prompt.use_audio_in_video(mm_processor_kwargs)
        text, ids = self.require_tokenizer().encode_chat(chat.messages, specials_in_content=self.specials_in_content,
                                                         **template_kwargs)
        if chat.parts:
            media_prompt.check_placeholders(ids, chat.parts, mm)
        return RenderedChat(text, ids, chat.parts, audio_in_video)

    def load_media(self, chat: RenderedChat) -> PreparedPrompt:
        """The rendered chat with its media parts read under ``media_policy``, decoded within ``media_limits`` and
        placed at their expanded placeholders: this can take seconds, so callers with an event loop run it on a
        thread, and callers that queue requests load a request's media only when the worker has room for them
        (engine/media_gate.py)."""
        if not chat.parts:
            return PreparedPrompt(chat.text, chat.token_ids)
        loaded = [media_prompt.load_part(part, self.media_processing, self.media_policy, self.media_limits,
                                         chat.audio_in_video) for part in chat.parts]
        ids, media = media_prompt.expand(chat.token_ids, loaded, self.plan.model_config.multimodal)
        return PreparedPrompt(chat.text, ids, media)

    def check_text_fits(self, chars: int, what: str) -> None:
        """Refuse text that cannot fit max_model_len tokens whatever it says, before tokenizing it (a large
        body would otherwise cost seconds of tokenizer time to be refused)."""
        longest = self.require_tokenizer().max_token_chars
        limit = self.max_model_len * longest * _CHARS_PER_NORMALIZED_CHAR
        if chars > limit:
            raise ContextLengthError(
                f"{what} has {chars:,} characters, more than max_model_len={self.max_model_len} tokens can hold with "
                f"this tokenizer (at most {limit:,} characters: its longest token covers {longest}); shorten it"
            )

    def require_tokenizer(self) -> Tokenizer:
        if self.tokenizer is None:
            raise InvalidRequestError("the tokenizer was not loaded (skip_tokenizer_init); pass prompt_token_ids")
        return self.tokenizer

    def request(
        self, request_id: str, prompt: PreparedPrompt, params: SamplingParams, credits: int | None = None
    ) -> EngineRequest:
        """Validate (protocol.request_problem) and build the core request; max_tokens defaults to what fits."""
        limit = self.max_model_len
        if params.max_tokens is None:
            params = params.clone(max_tokens=max(1, limit - len(prompt.token_ids)))
        if prompt.token_ids and (problem := context_problem(len(prompt.token_ids), params.max_tokens, limit)):
            raise ContextLengthError(problem)
        cfg = self.plan.model_config
        problem = request_problem(prompt.token_ids, params.max_tokens, limit, self.vocab_size, params.logit_bias or ())
        if problem is not None:
            raise InvalidRequestError(problem)
        problem = media_problem(prompt.token_ids, prompt.media, cfg.multimodal, cfg.architecture)
        if problem is not None:
            raise MediaError(problem)
        spec = params.structured_outputs
        grammar = None if spec is None else compile_grammar(spec)
        request = EngineRequest(request_id, prompt.token_ids, params, credits, grammar=grammar, media=prompt.media)
        if prompt.media:  # positions computed here, beside the worker's loop
            request.mrope_positions, request.mrope_delta = mrope_positions(prompt.token_ids, prompt.media, cfg.multimodal)
        return request
