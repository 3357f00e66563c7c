"""The Talker's prompt: text, speaker and language turned into input embeddings.

Every Talker position is the sum of a text-side embedding (projected text
token) and a codec-side embedding (codec control token, speaker row, or a
frame's codes). The prefill is::

    [instruct tokens]                       text only (optional style instruction)
    <|im_start|> assistant \\n              text only (the role)
    tts_pad ... tts_pad  tts_bos            + codec: think/nothink, think_bos, [language], think_eos, [speaker], pad
    then, non-streaming text mode:
        text tokens..., tts_eos             + codec pad each
        tts_pad                             + codec bos
    or streaming text mode:
        first text token                    + codec bos

After the prefill, decode step ``s`` adds text embedding ``s`` of the
trailing text (streaming mode: the remaining text tokens then tts_eos;
non-streaming: nothing) or tts_pad once that is exhausted.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from edge_infer.models.qwen3_tts.config import Qwen3TTSConfig

if TYPE_CHECKING:  # pragma: no cover
    import torch

    from edge_infer.models.qwen3_tts.talker import Talker

ROLE_TOKENS = 3   # <|im_start|> assistant \n
TAIL_TOKENS = 5   # <|im_end|> \n <|im_start|> assistant \n


@dataclass(frozen=True)
class VoiceRequest:
    """What to say, in whose voice: token ids come from ``TextTokenizer``."""

    input_ids: list[int]                 # assistant-formatted text (TextTokenizer.assistant_ids)
    speaker: str
    language: str = "auto"
    instruct_ids: list[int] | None = None  # TextTokenizer.instruct_ids, or None
    non_streaming_text: bool = True      # whole text in the prefill (the CustomVoice default)


@dataclass
class TalkerPrompt:
    prefill: torch.Tensor        # [L, hidden]
    trailing_text: torch.Tensor  # [N, hidden]: text embeddings added at decode steps 0..N-1
    pad: torch.Tensor            # [hidden]: tts_pad, added once the trailing text is used up

    def text_for_step(self, step: int) -> torch.Tensor:
        return self.trailing_text[step] if step < self.trailing_text.shape[0] else self.pad


def resolve_language(config: Qwen3TTSConfig, speaker: str, language: str) -> int | None:
    """The codec language id, or None for 'auto'; Chinese/auto with a dialect speaker uses the dialect."""
    talker = config.talker
    lang = language.lower()
    if lang == "auto":
        language_id = None
    elif lang in talker.languages and "dialect" not in lang:
        language_id = talker.languages[lang]
    else:
        names = ", ".join(["auto"] + sorted(n for n in talker.languages if "dialect" not in n))
        raise ValueError(f"unknown language {language!r}; this checkpoint supports: {names}")
    dialect = talker.speaker_dialects.get(speaker.lower())
    if dialect and lang in ("chinese", "auto"):
        language_id = talker.languages[dialect]
    return language_id


def resolve_speaker(config: Qwen3TTSConfig, speaker: str) -> int:
    speakers = config.talker.speakers
    try:
        return speakers[speaker.lower()]
    except KeyError:
        raise ValueError(f"unknown speaker {speaker!r}; this checkpoint has: {', '.join(sorted(speakers))}") from None


def _check_layout(config: Qwen3TTSConfig, ids: list[int]) -> None:
    text = config.text
    if len(ids) < ROLE_TOKENS + TAIL_TOKENS + 1 or ids[0] != text.im_start or ids[-TAIL_TOKENS] != text.im_end:
        raise ValueError(
            "input_ids must be '<|im_start|>assistant\\n{text}<|im_end|>\\n<|im_start|>assistant\\n' "
            "with a non-empty text; build them with TextTokenizer.assistant_ids"
        )


def prompt_length(config: Qwen3TTSConfig, request: VoiceRequest) -> int:
    """The Talker positions ``build_prompt`` makes for ``request``, without building it (admission checks)."""
    _check_layout(config, request.input_ids)
    think = 3 if resolve_language(config, request.speaker, request.language) is None else 4
    body = len(request.input_ids) - ROLE_TOKENS - TAIL_TOKENS
    text = body + 2 if request.non_streaming_text else 1
    return len(request.instruct_ids or ()) + ROLE_TOKENS + think + 2 + text


def build_prompt(talker: Talker, config: Qwen3TTSConfig, request: VoiceRequest) -> TalkerPrompt:
    import torch  # here, not at import: the server reads VoiceRequest and prompt_length without torch

    _check_layout(config, request.input_ids)
    codec = config.talker.codec
    text_ids = config.text
    ids = request.input_ids
    language_id = resolve_language(config, request.speaker, request.language)
    speaker_id = resolve_speaker(config, request.speaker)

    tts_bos, tts_eos, tts_pad = talker.embed_text([text_ids.tts_bos, text_ids.tts_eos, text_ids.tts_pad])
    think = [codec.nothink, codec.think_bos, codec.think_eos] if language_id is None else \
        [codec.think, codec.think_bos, language_id, codec.think_eos]
    codec_prefix = talker.embed_codec(think + [speaker_id, codec.pad, codec.bos])

    # Text side of the codec prefix: tts_pad under the control tokens, tts_bos under codec pad;
    # codec bos (the last prefix entry) goes with the first text position below.
    control = codec_prefix.shape[0] - 1
    text_side = torch.cat((tts_pad.expand(control - 1, -1), tts_bos[None]))
    parts = []
    if request.instruct_ids:
        parts.append(talker.embed_text(request.instruct_ids))
    parts += [talker.embed_text(ids[:ROLE_TOKENS]), text_side + codec_prefix[:-1]]
    codec_pad, codec_bos = codec_prefix[-2], codec_prefix[-1]
    body = ids[ROLE_TOKENS:-TAIL_TOKENS]
    if request.non_streaming_text:
        text = torch.cat((talker.embed_text(body), tts_eos[None]))
        parts += [text + codec_pad, (tts_pad + codec_bos)[None]]
        trailing = tts_pad[None]
    else:
        parts.append(talker.embed_text(body[:1]) + codec_bos)
        trailing = torch.cat((talker.embed_text(body[1:]), tts_eos[None]))
    return TalkerPrompt(prefill=torch.cat(parts), trailing_text=trailing, pad=tts_pad)
