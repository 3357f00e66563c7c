"""``edge-infer tts DIR "text" -o out.wav``: speak text with a Qwen3-TTS checkpoint.

Runs the two-stage pipeline (Talker -> Code2Wav, each in its own process)
and writes the audio as it streams in. Prints the time to first audio and
the real-time factor.
"""
from __future__ import annotations

import argparse
import asyncio
import sys
from pathlib import Path
from typing import Any


def configure(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("model", help="Qwen3-TTS checkpoint directory (e.g. from edge-infer synth --family qwen3-tts)")
    parser.add_argument("text", nargs="?", help="the text to speak")
    parser.add_argument("-o", "--output", default="out.wav", help="audio file to write (.wav or .flac; default out.wav)")
    parser.add_argument("--voice", help="speaker of the checkpoint (default: the first one; --list-voices shows them)")
    parser.add_argument("--language", default="auto", help="language name (e.g. english, chinese) or auto")
    parser.add_argument("--instruct", help="style instruction (1.7B checkpoints only)")
    parser.add_argument("--seed", type=int, help="seed for sampling")
    parser.add_argument("--greedy", action="store_true", help="greedy decoding (temperature 0 for every codebook)")
    parser.add_argument("--max-tokens", type=int, help="at most this many frames (80 ms each)")
    parser.add_argument("--stage-overrides", help='JSON per stage id, e.g. \'{"0": {"engine": {"dtype": "float32"}}}\'')
    parser.add_argument("--list-voices", action="store_true", help="print the checkpoint's voices and languages, then exit")


def _speech_params(args: argparse.Namespace, voice: str) -> dict[str, Any]:
    params: dict[str, Any] = {"voice": voice, "language": args.language}
    if args.instruct:
        params["instruct"] = args.instruct
    if args.seed is not None:
        params["seed"] = args.seed
    if args.max_tokens is not None:
        params["max_tokens"] = args.max_tokens
    if args.greedy:
        params.update(temperature=0, subtalker_temperature=0)
    return params


async def speak(args: argparse.Namespace, voice: str) -> int:
    import soundfile

    from edge_infer.runtime.omni import AsyncOmni
    from edge_infer.tts.deploy import SpeechPipeline
    from edge_infer.tts.timing import SpeechTiming

    pipeline = SpeechPipeline.for_checkpoint(args.model, args.stage_overrides)
    out_path = Path(args.output)
    fmt = out_path.suffix.lstrip(".").upper()
    async with AsyncOmni(pipeline.config) as omni:
        timing = SpeechTiming()
        sink = None
        try:
            async for event in omni.generate(args.text, sampling_params_list=pipeline.params_list(_speech_params(args, voice))):
                if event.kind == "error":
                    print(f"error: {event.error}", file=sys.stderr)
                    return 1
                if event.kind == "output" and event.payload is not None:
                    rate = int(event.payload.metadata["sample_rate"])
                    if sink is None:
                        sink = soundfile.SoundFile(str(out_path), "w", rate, 1, subtype="PCM_16", format=fmt)
                    sink.write(event.payload.data)
                    timing.audio(len(event.payload.data), rate)
        finally:
            if sink is not None:
                sink.close()
    if sink is None:
        print("error: the Talker produced no frame (it ended on its first code)", file=sys.stderr)
        return 1
    print(f"wrote {out_path}: {timing.duration_s:.2f} s of audio at {timing.sample_rate} Hz, voice {voice}; "
          f"first audio after {timing.ttfp_s:.3f} s, real-time factor {timing.rtf:.2f}")
    return 0


def run(args: argparse.Namespace) -> int:
    from edge_infer.models.qwen3_tts.config import ConfigError, load_config
    from edge_infer.runtime.config import DeployConfigError
    from edge_infer.runtime.omni import DeployRefused

    try:
        talker = load_config(args.model).talker
    except ConfigError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    voices = sorted(talker.speakers)
    if args.list_voices:
        print("voices:", ", ".join(voices))
        print("languages:", ", ".join(["auto"] + sorted(n for n in talker.languages if "dialect" not in n)))
        return 0
    if not args.text:
        print("error: give the text to speak (edge-infer tts DIR \"text\" -o out.wav)", file=sys.stderr)
        return 2
    if Path(args.output).suffix.lower() not in (".wav", ".flac"):
        print(f"error: write a .wav or .flac file, not {args.output!r}", file=sys.stderr)
        return 2
    voice = args.voice or voices[0]
    try:
        return asyncio.run(speak(args, voice))
    except (DeployConfigError, DeployRefused, ValueError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
