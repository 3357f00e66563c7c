"""Build the tiny Qwen3-TTS checkpoint and the reference outputs the parity tests compare against.

Runs in a separate virtual environment that holds the reference package
(``qwen-tts`` 0.1.1 pins ``transformers==4.57.3``, which the project's own
environment does not use). From the repository root::

    python3 -m venv .venv-ref
    .venv-ref/bin/pip install torch==2.13.0
    .venv-ref/bin/pip install numpy safetensors transformers==4.57.3
    .venv-ref/bin/pip install qwen-tts==0.1.1 --no-deps
    PYTHONPATH=src .venv-ref/bin/python scripts/make_tts_fixtures.py

``qwen_tts/__init__.py`` imports the end-to-end wrappers, which need
librosa, sox, onnxruntime and torchaudio. The model code itself does not, so
this script registers the package directories without running their
``__init__`` and stubs the two names the modelling module imports for the
speaker encoder (librosa's mel filter bank) and for its own ``from_pretrained``
(the speech-tokenizer wrapper); neither is used here.

Writes (all small, fixed seeds):
    tests/fixtures/qwen3_tts/tiny/          the checkpoint, in the real layout
    tests/fixtures/qwen3_tts/reference.json token ids, prompts, greedy and sampled codes
    tests/fixtures/qwen3_tts/reference_prompts.npz  the talker's prefill embeddings and trailing text
    tests/fixtures/qwen3_tts/reference_pcm.npz  Code2Wav PCM: whole and chunked decode
"""
from __future__ import annotations

import importlib.machinery
import json
import shutil
import sys
import types
from pathlib import Path

import numpy as np
import torch
from safetensors.torch import load_file, save_file

from edge_infer.models.qwen3_tts.layout import SPEECH_TOKENIZER_DIR, write_configs
from edge_infer.models.qwen3_tts.presets import checkpoint_spec
from edge_infer.models.qwen3_tts.synth import random_tensor

ROOT = Path(__file__).resolve().parents[1]
OUT = ROOT / "tests" / "fixtures" / "qwen3_tts"
CKPT = OUT / "tiny"

TALKER_SEED = 1
CODEC_SEED = 2
CODES_SEED = 3
SAMPLING_SEED = 1234


def import_reference():
    """Load qwen_tts model modules without running the package __init__."""
    site = Path(sys.prefix) / "lib" / f"python{sys.version_info.major}.{sys.version_info.minor}" / "site-packages"
    base = site / "qwen_tts"
    if not base.is_dir():
        raise SystemExit(f"qwen_tts is not installed in {sys.prefix}; see this script's docstring")
    for name, path in (("qwen_tts", base), ("qwen_tts.core", base / "core"), ("qwen_tts.inference", base / "inference")):
        module = types.ModuleType(name)
        module.__path__ = [str(path)]
        sys.modules[name] = module

    def no_mel(*_args, **_kwargs):
        raise RuntimeError("mel filters belong to the speaker encoder, which CustomVoice does not use")

    librosa = types.ModuleType("librosa")
    filters = types.ModuleType("librosa.filters")
    librosa.__spec__ = importlib.machinery.ModuleSpec("librosa", None)
    filters.__spec__ = importlib.machinery.ModuleSpec("librosa.filters", None)
    filters.mel = no_mel
    librosa.filters = filters
    sys.modules["librosa"] = librosa
    sys.modules["librosa.filters"] = filters
    wrapper = types.ModuleType("qwen_tts.inference.qwen3_tts_tokenizer")
    wrapper.Qwen3TTSTokenizer = type("Qwen3TTSTokenizer", (), {})
    sys.modules[wrapper.__name__] = wrapper

    from qwen_tts.core.models.configuration_qwen3_tts import Qwen3TTSConfig
    from qwen_tts.core.models.modeling_qwen3_tts import Qwen3TTSForConditionalGeneration
    from qwen_tts.core.tokenizer_12hz.configuration_qwen3_tts_tokenizer_v2 import Qwen3TTSTokenizerV2Config
    from qwen_tts.core.tokenizer_12hz.modeling_qwen3_tts_tokenizer_v2 import Qwen3TTSTokenizerV2Model

    return Qwen3TTSConfig, Qwen3TTSForConditionalGeneration, Qwen3TTSTokenizerV2Config, Qwen3TTSTokenizerV2Model


def randomize(module: torch.nn.Module, seed: int) -> None:
    """Replace the library's near-zero init (std 0.02) by the scales ``synth`` uses.

    With the library's init the talker's logits would be nearly flat and
    greedy choices would hinge on rounding; these scales give clear winners.
    """
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, param in sorted(module.named_parameters()):
            param.copy_(random_tensor(name, tuple(param.shape), gen))


def quiet_output(codec_model) -> None:
    """Scale Code2Wav's last conv so the waveform sits mostly inside the [-1, 1] clamp."""
    last = codec_model.decoder.decoder[-1].conv
    captured = []
    handle = last.register_forward_hook(lambda _m, _i, out: captured.append(out))
    probe = torch.randint(0, codec_model.config.decoder_config.codebook_size, (1, 8, 16),
                          generator=torch.Generator().manual_seed(CODEC_SEED))
    with torch.no_grad():
        codec_model.decoder(probe.transpose(1, 2))
        handle.remove()
        factor = 0.3 / captured[0].std()
        last.weight.mul_(factor)
        last.bias.mul_(factor)


def save_weights(module: torch.nn.Module, path: Path) -> None:
    tensors = {k: v.detach().contiguous() for k, v in module.state_dict().items()}
    save_file(tensors, str(path), metadata={"format": "pt"})
    reloaded = load_file(str(path))
    missing = set(tensors) ^ set(reloaded)
    if missing:
        raise SystemExit(f"saved weights do not round-trip: {sorted(missing)}")


# (name, text, speaker, language, instruct, non_streaming_mode, max_new_tokens)
GREEDY_CASES = (
    ("english_ryan", "Hello world, the cat is here.", "ryan", "english", None, True, 24),
    ("auto_vivian_cjk", "你好，世界。It's 42!", "vivian", "auto", None, True, 20),
    ("dialect_dylan", "the weather in Beijing", "dylan", "chinese", None, True, 20),
    ("streaming_text_serena", "Streaming text is fed one token per frame, so this sentence is long.",
     "serena", "english", None, False, 40),
    ("instruct_aiden", "Speak up now.", "aiden", "english", "Very happy, fast.", True, 16),
)
SAMPLED_CASE = ("sampled_sohee", "Sampling with a fixed seed.", "sohee", "korean", None, True, 16)

TOKENIZER_SAMPLES = (
    "Hello world",
    "It's the weather, isn't it? I'd say we'll see.",
    "CamelCaseWords and snake_case 12345 numbers",
    "你好，世界。こんにちは",
    "tabs\tand\nnewlines  and   spaces ",
    "émigré café naïve",
)


def assistant_text(text: str) -> str:
    return f"<|im_start|>assistant\n{text}<|im_end|>\n<|im_start|>assistant\n"


def instruct_text(text: str) -> str:
    return f"<|im_start|>user\n{text}<|im_end|>\n"


class TalkerInputs:
    """Records what Qwen3TTSForConditionalGeneration.generate hands to the talker's generate."""

    def __init__(self, model):
        self.calls: list[dict] = []
        original = model.talker.generate

        def recording_generate(**kwargs):
            self.calls.append({k: kwargs[k] for k in ("inputs_embeds", "trailing_text_hidden", "tts_pad_embed")})
            return original(**kwargs)

        model.talker.generate = recording_generate


def run_talker(model, tokenizer, case, sample: bool, arrays: dict | None = None) -> dict:
    name, text, speaker, language, instruct, non_streaming, max_new_tokens = case
    input_ids = tokenizer(assistant_text(text), return_tensors="pt")["input_ids"]
    instruct_ids = tokenizer(instruct_text(instruct), return_tensors="pt")["input_ids"] if instruct else None
    sampling = dict(do_sample=True, top_k=50, top_p=1.0, temperature=0.9,
                    subtalker_dosample=True, subtalker_top_k=50, subtalker_top_p=1.0, subtalker_temperature=0.9)
    greedy = dict(do_sample=False, subtalker_dosample=False)
    if sample:
        torch.manual_seed(SAMPLING_SEED)
    codes, _hidden = model.generate(
        input_ids=[input_ids], instruct_ids=[instruct_ids], languages=[language], speakers=[speaker],
        non_streaming_mode=non_streaming, max_new_tokens=max_new_tokens, repetition_penalty=1.05,
        **(sampling if sample else greedy),
    )
    if arrays is not None:
        recorded = model.talker_inputs.calls[-1]
        arrays[f"{name}.prefill_embeds"] = recorded["inputs_embeds"][0].numpy()
        arrays[f"{name}.trailing_text"] = recorded["trailing_text_hidden"][0].numpy()
        arrays[f"{name}.pad_embed"] = recorded["tts_pad_embed"][0, 0].numpy()
    return {
        "name": name, "text": text, "speaker": speaker, "language": language, "instruct": instruct,
        "non_streaming_mode": non_streaming, "max_new_tokens": max_new_tokens, "sampled": sample,
        "sampling_seed": SAMPLING_SEED if sample else None,
        "input_ids": input_ids[0].tolist(),
        "instruct_ids": instruct_ids[0].tolist() if instruct_ids is not None else None,
        "codes": codes[0].tolist(),
    }


def plant_eos(model, tokenizer, eos_id: int) -> int:
    """Give the codec head's eos row a copy (x0.97) of a token greedy decoding revisits.

    Random weights almost never emit eos. With the copy, eos loses to that
    token the first time, then wins the next time the token would be
    chosen (the repetition penalty has lowered the token, not eos), so the
    fixtures also cover stopping on eos. The token is picked so that the
    first case stops after several frames and the others stop late or not
    at all (they then cover the max_new_tokens limit).
    """
    probes = [[frame[0] for frame in run_talker(model, tokenizer, case, sample=False)["codes"]]
              for case in GREEDY_CASES]

    def stop_frame(firsts: list[int], token: int) -> int | None:
        # eos is masked for the first two tokens (min_new_tokens=2).
        seen = False
        for i, t in enumerate(firsts):
            if t == token and seen and i >= 2:
                return i
            seen = seen or t == token
        return None

    def score(token: int) -> tuple[int, int]:
        stops = [stop_frame(firsts, token) for firsts in probes]
        if stops[0] is None or stops[0] < 8:
            return (-1, 0)
        others = [s if s is not None else 1000 for s in stops[1:]]
        return (min(others), -stops[0])

    token = max(set(probes[0]), key=score)
    if score(token)[0] < 0:
        raise SystemExit("no first-codebook token gives an eos after >= 8 frames; change TALKER_SEED")
    head = model.talker.codec_head.weight
    with torch.no_grad():
        head[eos_id] = 0.97 * head[token]
    return token


def main() -> int:
    Config, Model, CodecConfig, CodecModel = import_reference()
    from transformers import Qwen2TokenizerFast

    spec = checkpoint_spec("tiny")
    if CKPT.exists():
        shutil.rmtree(CKPT)
    write_configs(CKPT, spec)
    # Load the tokenizer directly: the reference wrapper's AutoProcessor path
    # also swaps in a Mistral pre-tokenizer regex for local checkpoints saved
    # by transformers 4.57.3 (see docs/qwen3-tts.md); the Qwen2 one is the
    # tokenizer's own.
    tokenizer = Qwen2TokenizerFast.from_pretrained(str(CKPT))
    role = tokenizer("<|im_start|>assistant\n")["input_ids"]
    if len(role) != 3:
        raise SystemExit(f"the role prefix must be 3 tokens (the prompt layout slices it), got {role}")

    torch.manual_seed(0)
    talker_model = Model(Config(**spec.config)).eval()
    randomize(talker_model, TALKER_SEED)
    eos_copy_of = plant_eos(talker_model, tokenizer, spec.config["talker_config"]["codec_eos_token_id"])
    save_weights(talker_model, CKPT / "model.safetensors")

    talker_model.talker_inputs = TalkerInputs(talker_model)
    arrays: dict[str, np.ndarray] = {}
    cases = [run_talker(talker_model, tokenizer, case, sample=False, arrays=arrays) for case in GREEDY_CASES]
    cases.append(run_talker(talker_model, tokenizer, SAMPLED_CASE, sample=True))

    codec_model = CodecModel(CodecConfig(**spec.speech_tokenizer_config)).eval()
    randomize(codec_model, CODEC_SEED)
    quiet_output(codec_model)
    save_weights(codec_model, CKPT / SPEECH_TOKENIZER_DIR / "model.safetensors")

    decoder_cfg = spec.speech_tokenizer_config["decoder_config"]
    gen = torch.Generator().manual_seed(CODES_SEED)
    random_codes = torch.randint(0, decoder_cfg["codebook_size"], (1, 16, decoder_cfg["num_quantizers"]), generator=gen)
    talker_codes = torch.tensor(cases[0]["codes"])[None]
    chunk_size, left_context = 5, 3
    with torch.no_grad():
        whole = codec_model.decode(random_codes).audio_values[0]
        chunked = codec_model.decoder.chunked_decode(
            random_codes.transpose(1, 2), chunk_size=chunk_size, left_context_size=left_context)[0, 0]
        talker_pcm = codec_model.decode(talker_codes).audio_values[0]

    reference = {
        "generated_by": "scripts/make_tts_fixtures.py with qwen-tts 0.1.1, transformers 4.57.3",
        "eos_row_copied_from_token": eos_copy_of,
        "tokenizer_samples": [
            {"text": t, "ids": tokenizer(t)["input_ids"]} for t in TOKENIZER_SAMPLES
        ],
        "talker_cases": cases,
        "code2wav": {
            "random_codes": random_codes[0].tolist(),
            "chunked_decode": {"chunk_size": chunk_size, "left_context": left_context},
            "talker_case": cases[0]["name"],
        },
    }
    (OUT / "reference.json").write_text(json.dumps(reference, indent=1, ensure_ascii=False) + "\n", encoding="utf-8")
    np.savez_compressed(OUT / "reference_prompts.npz", **arrays)
    np.savez_compressed(
        OUT / "reference_pcm.npz",
        whole=whole.numpy().astype(np.float32),
        chunked=chunked.numpy().astype(np.float32),
        talker_case=talker_pcm.numpy().astype(np.float32),
    )
    for case in cases:
        stop = "eos" if len(case["codes"]) < case["max_new_tokens"] - 1 else "max_new_tokens"
        print(f"{case['name']}: {len(case['codes'])} frames ({stop})")
    print(f"pcm: whole std={whole.std():.3f} max|x|={whole.abs().max():.3f}, "
          f"|whole-chunked| max={torch.max(torch.abs(whole - chunked)):.2e}")
    total = sum(p.stat().st_size for p in OUT.rglob("*") if p.is_file())
    print(f"fixtures: {total / 1e6:.2f} MB in {OUT.relative_to(ROOT)}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
