"""``edge-infer bench tts``: time to first audio packet and real-time factor of the speech pipeline.

The bundled two-stage pipeline (Talker -> Code2Wav, each in its stage
process) runs through ``AsyncOmni``, no HTTP. For each length band (frames
of audio, ``ignore_eos`` so that random weights speak exactly that many)
and each concurrency level (1, 2, 4 by default), ``c`` clients each send
``--requests`` requests one after another. Warm-up requests (one per band,
alone) come first and are not counted.

Per request, at the consumer: TTFP (submission to the first PCM chunk) and
RTF (submission to the last chunk, over the audio's duration); per stage,
its time on the request (first input to last output, from the stage's own
metrics). Reported per band and level: p50/p95 of TTFP and RTF, p50 of each
stage's time, and audio seconds produced per wall second.

One arm: a table to stderr, the metrics as one JSON line to stdout (for
``edge-infer bench grid``), with the settings the stages actually ran.
"""
from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import sys
from dataclasses import dataclass, field

from edge_infer.config import QUANTIZATION_CHOICES

DEFAULT_BANDS = "short:25,medium:75,long:200"
# About five frames (0.4 s) of speech per word; the text grows with the band.
_WORDS = "the quick brown fox jumps over a lazy dog near the quiet river bank at dawn".split()


def configure(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("model", help="Qwen3-TTS checkpoint directory (edge-infer synth --family qwen3-tts ...)")
    g = parser.add_argument_group("workload")
    g.add_argument("--concurrency", default="1,2,4", help="comma-separated numbers of concurrent clients (default 1,2,4)")
    g.add_argument("--requests", type=int, default=3, help="requests per client, band and level (default 3)")
    g.add_argument("--bands", default=DEFAULT_BANDS, help=f"NAME:FRAMES,... audio lengths in 80 ms frames (default {DEFAULT_BANDS})")
    g.add_argument("--warmup", type=int, default=1, help="uncounted requests per band before measuring (default 1)")
    g.add_argument("--voice", default=None, help="speaker (default: the checkpoint's first)")
    g.add_argument("--seed", type=int, default=0)
    p = parser.add_argument_group("pipeline (as edge-infer serve)")
    p.add_argument("--dtype", default="auto", help="both stages: auto, bfloat16 or float32")
    p.add_argument("--quantization", default=None, choices=QUANTIZATION_CHOICES, help="the Talker's weights")
    p.add_argument("--num-threads", type=int, default=None, help="threads of each stage (default: the Talker every core, Code2Wav half)")
    p.add_argument("--max-num-seqs", type=int, default=None, help="requests batched per stage (default 4)")
    p.add_argument("--kv-cache-memory-bytes", type=int, default=None, help="the Talker's exact KV budget")
    p.add_argument("--stage-overrides", default=None, help="JSON per stage id, applied last")


@dataclass(frozen=True)
class Band:
    name: str
    frames: int

    @property
    def text(self) -> str:
        words = max(3, self.frames // 5)
        return " ".join(_WORDS[i % len(_WORDS)] for i in range(words)).capitalize() + "."


def parse_bands(spec: str) -> list[Band]:
    bands = []
    for item in spec.split(","):
        name, _, frames = item.strip().partition(":")
        if not name or not frames.isdigit() or int(frames) < 1:
            raise ValueError(f"--bands entry {item!r} must be NAME:FRAMES with FRAMES >= 1 (e.g. {DEFAULT_BANDS})")
        bands.append(Band(name, int(frames)))
    return bands


@dataclass
class Sample:
    ttfp_s: float
    rtf: float
    audio_s: float
    stage_s: dict[str, float] = field(default_factory=dict)


def pct(values: list[float], q: int) -> float:
    return statistics.quantiles(values, n=100, method="inclusive")[q - 1] if len(values) > 1 else values[0]


def level_metrics(prefix: str, samples: list[Sample], wall_s: float, stages: list[str]) -> dict[str, float]:
    ttfp = [s.ttfp_s * 1000 for s in samples]
    rtf = [s.rtf for s in samples]
    out = {
        f"{prefix}_ttfp_p50_ms": pct(ttfp, 50), f"{prefix}_ttfp_p95_ms": pct(ttfp, 95),
        f"{prefix}_rtf_p50": pct(rtf, 50), f"{prefix}_rtf_p95": pct(rtf, 95),
        f"{prefix}_audio_s_per_s": sum(s.audio_s for s in samples) / wall_s,
    }
    for stage in stages:
        out[f"{prefix}_{stage}_p50_ms"] = pct([s.stage_s[stage] * 1000 for s in samples], 50)
    return {k: round(v, 4) for k, v in out.items()}


async def measure(args: argparse.Namespace, pipeline, bands: list[Band], levels: list[int]) -> tuple[dict[str, float], list[str]]:
    import time

    from edge_infer.runtime.omni import AsyncOmni
    from edge_infer.tts.timing import SpeechTiming

    names = {s.stage_id: s.name or f"stage{s.stage_id}" for s in pipeline.config.stages}
    stages = [names[sid] for sid in sorted(names)]

    async def one(band: Band, index: int) -> Sample:
        params = {"voice": args.voice, "max_tokens": band.frames, "ignore_eos": True, "seed": args.seed + index}
        timing = SpeechTiming()
        last = None
        async for event in omni.generate(band.text, sampling_params_list=pipeline.params_list(params)):
            if event.kind == "output" and event.payload is not None:
                timing.audio(len(event.payload.data), int(event.payload.metadata["sample_rate"]))
            last = event
        if last is None or last.kind != "finished":
            raise RuntimeError(f"a {band.name} request ended with {last.kind if last else 'nothing'}: {last.error if last else ''}")
        return Sample(timing.ttfp_s, timing.rtf, timing.duration_s,
                      {names[sid]: m.time_in_stage_s for sid, m in last.metrics.items()})

    metrics: dict[str, float] = {}
    lines = []
    async with AsyncOmni(pipeline.config) as omni:
        for band in bands:
            for w in range(args.warmup):
                await one(band, -1 - w)
            for c in levels:
                start = time.perf_counter()
                per_client = await asyncio.gather(*(
                    _sequential(one, band, c * 1000 + k * args.requests, args.requests) for k in range(c)
                ))
                samples = [s for client in per_client for s in client]
                level = level_metrics(f"c{c}_{band.name}", samples, time.perf_counter() - start, stages)
                metrics |= level
                lines.append(_row(band, c, level, stages))
    return metrics, lines


async def _sequential(one, band: Band, first: int, count: int) -> list[Sample]:
    return [await one(band, first + r) for r in range(count)]


def _row(band: Band, c: int, m: dict[str, float], stages: list[str]) -> str:
    p = f"c{c}_{band.name}"
    per_stage = " ".join(f"{m[f'{p}_{s}_p50_ms']:>13.1f}" for s in stages)
    return (f"{band.name:<8} {band.frames:>6} {c:>3} {m[f'{p}_ttfp_p50_ms']:9.1f} {m[f'{p}_ttfp_p95_ms']:9.1f} "
            f"{m[f'{p}_rtf_p50']:7.3f} {m[f'{p}_rtf_p95']:7.3f} {m[f'{p}_audio_s_per_s']:8.2f}  {per_stage}")


def run(args: argparse.Namespace) -> int:
    from edge_infer.models.qwen3_tts.config import ConfigError, load_config
    from edge_infer.runtime.config import DeployConfigError
    from edge_infer.runtime.omni import DeployRefused
    from edge_infer.tts.deploy import EngineFlags, SpeechPipeline

    try:
        bands = parse_bands(args.bands)
        levels = [int(c) for c in args.concurrency.split(",") if c.strip()]
        if not levels or min(levels) < 1 or args.requests < 1 or args.warmup < 0:
            raise ValueError("--concurrency needs positive counts, --requests >= 1, --warmup >= 0")
        voices = sorted(load_config(args.model).talker.speakers)
        args.voice = args.voice or voices[0]
        flags = EngineFlags(dtype=args.dtype, max_num_seqs=args.max_num_seqs or max(4, max(levels)), num_threads=args.num_threads,
                            kv_cache_memory_bytes=args.kv_cache_memory_bytes, quantization=args.quantization,
                            max_model_len=max(2048, max(b.frames for b in bands) + 256))
        pipeline = SpeechPipeline.for_checkpoint(args.model, args.stage_overrides, flags)
        metrics, lines = asyncio.run(measure(args, pipeline, bands, levels))
    except (ConfigError, DeployConfigError, DeployRefused, ValueError, RuntimeError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    stages = " ".join(f"{(s.name or s.executor) + ' p50 ms':>13}" for s in pipeline.config.stages)
    print(f"{'band':<8} {'frames':>6} {'c':>3} {'TTFP p50':>9} {'p95 ms':>9} {'RTF p50':>7} {'p95':>7} {'audio/s':>8}  {stages}",
          file=sys.stderr)
    print("\n".join(lines), file=sys.stderr)
    print(json.dumps({**metrics, **ran_with(pipeline, args.voice)}))
    return 0


def ran_with(pipeline, voice: str) -> dict[str, object]:
    """The settings the stages resolved (dtype, quantization, KV bytes): what this arm measured."""
    from edge_infer.runtime.deploy_plan import plan_deploy
    from edge_infer.tts.planning import code2wav_settings, talker_engine_config

    talker = talker_engine_config(pipeline.config.stage(pipeline.talker_stage))
    plan = plan_deploy(pipeline.config)
    return {
        "talker_dtype": talker.dtype, "talker_quantization": talker.quant.name if talker.quant else "none",
        "talker_kv_bytes": plan.stage(pipeline.talker_stage).reservation.kv_bytes,
        "code2wav_dtype": code2wav_settings(pipeline.config.stage(pipeline.audio_stage)).dtype, "voice": voice,
    }
