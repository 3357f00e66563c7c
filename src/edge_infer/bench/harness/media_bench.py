"""The media benchmark's method, shared by edge-infer's arm (`bench media`) and transformers' (`bench transformers media`).

An engine supplies one function, ``chat(request) -> Sample``: take one chat request with media as a user sends
it (a PNG, a WAV, a question), prepare it, run the prompt and greedily produce ``request.tg`` tokens
(end-of-sequence ignored), and say when each part happened. Everything else lives here, so both engines are
measured by the same code:

- The media are synthetic but realistic and deterministic: a drawn ``image_size`` x ``image_size`` PNG (a
  gradient, shapes, digits, sensor-like noise) and ``audio_seconds`` of 16 kHz mono 16-bit WAV (a chord with
  vibrato and an envelope over noise). 16 kHz is the audio tower's rate, so neither engine resamples.
- Requests: ``image`` (one image and the question), ``audio`` (one clip), ``both`` (the image, the clip, the
  question), in that order, after ``warmup`` uncounted ``both`` requests made of other media (another seed), so
  that first-call set-up does not land on one kind. Each request is measured once per run; the grid's passes
  give the spread.
- Per request: ``ttft_ms`` from submission (preprocessing, encoding and prefill inside), ``prepare_ms`` (decode,
  featurize, build the prompt), ``encode_ms`` (the towers), ``decode_tps = (tokens - 1) / (last - first token)``,
  and the process tree's peak RssAnon while it ran (sampled: a lower bound).
"""
from __future__ import annotations

import argparse
import base64
import io
from dataclasses import asdict, dataclass
from typing import Any, Callable

from edge_infer.memory.measure import PeakSampler

KINDS = ("image", "audio", "both")
AUDIO_RATE = 16000
QUESTIONS = {
    "image": "What is in this picture? Describe the shapes, colours and numbers.",
    "audio": "What do you hear in this recording?",
    "both": "Describe the picture and the sound, and say whether they belong together.",
}


@dataclass(frozen=True)
class MediaBenchSettings:
    kinds: tuple[str, ...] = KINDS
    image_size: int = 448
    audio_seconds: float = 10.0
    tg: int = 32
    warmup: int = 1
    seed: int = 0
    sample_interval: float = 0.02

    def validate(self) -> None:
        unknown = [k for k in self.kinds if k not in KINDS]
        if unknown or not self.kinds:
            raise ValueError(f"--media {','.join(self.kinds)}: choose among {', '.join(KINDS)}")
        if not 28 <= self.image_size <= 4096:
            raise ValueError(f"--image-size must be 28..4096 pixels, got {self.image_size}")
        if not 0.5 <= self.audio_seconds <= 30:
            raise ValueError(f"--audio-seconds must be 0.5..30 (the default per-clip limit), got {self.audio_seconds:g}")
        if self.tg < 2:
            raise ValueError(f"--tg must be at least 2 (a decode rate needs two tokens), got {self.tg}")
        if self.warmup < 0 or self.sample_interval <= 0:
            raise ValueError("--warmup must be >= 0 and --sample-interval positive")


def add_media_args(parser: argparse.ArgumentParser) -> None:
    g = parser.add_argument_group("media requests")
    g.add_argument("--media", default=",".join(KINDS), help=f"requests to measure, in order (default {','.join(KINDS)})")
    g.add_argument("--image-size", type=int, default=448, help="width and height of the drawn PNG (default 448)")
    g.add_argument("--audio-seconds", type=float, default=10.0, help="length of the WAV clip (default 10)")
    g.add_argument("--tg", type=int, default=32, help="tokens generated after each prompt (default 32)")
    g.add_argument("--warmup", type=int, default=1, help="uncounted image+audio requests first, other media (default 1)")
    g.add_argument("--seed", type=int, default=0, help="seed of the drawn media (default 0)")
    g.add_argument("--sample-interval", type=float, default=0.02, metavar="S", help="RssAnon polling interval (default 0.02)")


def settings_from(args: argparse.Namespace) -> MediaBenchSettings:
    s = MediaBenchSettings(kinds=tuple(k.strip() for k in args.media.split(",") if k.strip()), image_size=args.image_size,
                           audio_seconds=args.audio_seconds, tg=args.tg, warmup=args.warmup, seed=args.seed,
                           sample_interval=args.sample_interval)
    s.validate()
    return s


def noise_png(seed: int = 0, width: int = 64, height: int = 48) -> bytes:
    """A PNG of random pixels: it does not compress, so its bytes are the largest a picture of its size sends."""
    import numpy as np
    from PIL import Image

    pixels = np.random.default_rng(seed).integers(0, 256, size=(height, width, 3), dtype=np.uint8)
    buf = io.BytesIO()
    Image.fromarray(pixels).save(buf, format="PNG")
    return buf.getvalue()


def picture(size: int, seed: int) -> bytes:
    """A drawn PNG: a two-colour gradient, filled shapes, digits and a little noise, the same for the same seed."""
    import numpy as np
    from PIL import Image, ImageDraw

    rng = np.random.default_rng(seed)
    y, x = np.mgrid[0:size, 0:size] / max(1, size - 1)
    a, b = rng.integers(0, 256, size=(2, 3))
    base = a * (1 - (x + y)[..., None] / 2) + b * ((x + y)[..., None] / 2)
    base += rng.normal(0, 6, size=base.shape)  # sensor-like noise: a photo's PNG does not compress to nothing
    image = Image.fromarray(np.clip(base, 0, 255).astype(np.uint8))
    draw = ImageDraw.Draw(image)
    for k in range(6):
        x0, y0 = (int(v) for v in rng.integers(0, size * 3 // 4, size=2))
        w, h = (int(v) for v in rng.integers(size // 10, size // 3, size=2))
        colour = tuple(int(c) for c in rng.integers(0, 256, size=3))
        (draw.ellipse if k % 2 else draw.rectangle)((x0, y0, x0 + w, y0 + h), fill=colour, outline=(0, 0, 0))
    for _ in range(4):
        x0, y0 = (int(v) for v in rng.integers(0, size * 7 // 8, size=2))
        draw.text((x0, y0), str(int(rng.integers(0, 100))), fill=(255, 255, 255))
    buf = io.BytesIO()
    image.save(buf, format="PNG")
    return buf.getvalue()


def clip(seconds: float, seed: int) -> bytes:
    """A 16 kHz mono 16-bit WAV: three tones with vibrato under a slow envelope, over noise."""
    import numpy as np
    import soundfile

    rng = np.random.default_rng(seed)
    t = np.arange(round(seconds * AUDIO_RATE)) / AUDIO_RATE
    envelope = 0.6 + 0.4 * np.sin(2 * np.pi * 0.3 * t)
    tones = sum(np.sin(2 * np.pi * f * t + 3 * np.sin(2 * np.pi * 5 * t)) / (i + 1)
                for i, f in enumerate(rng.uniform(180, 900, size=3)))
    samples = 0.25 * envelope * tones / 1.9 + 0.02 * rng.standard_normal(len(t))
    buf = io.BytesIO()
    soundfile.write(buf, np.clip(samples, -1, 1).astype(np.float32), AUDIO_RATE, format="WAV", subtype="PCM_16")
    return buf.getvalue()


@dataclass(frozen=True)
class MediaRequest:
    """One chat request: the media files and the question, as a user sends them."""

    kind: str
    image: bytes | None
    audio: bytes | None
    question: str
    tg: int

    def messages(self) -> list[dict[str, Any]]:
        """OpenAI chat content parts (a data: URL image, base64 WAV input_audio), as LLM.chat and the server take them."""
        parts: list[dict[str, Any]] = []
        if self.image is not None:
            url = "data:image/png;base64," + base64.b64encode(self.image).decode()
            parts.append({"type": "image_url", "image_url": {"url": url}})
        if self.audio is not None:
            parts.append({"type": "input_audio", "input_audio": {"data": base64.b64encode(self.audio).decode(),
                                                                 "format": "wav"}})
        return [{"role": "user", "content": [*parts, {"type": "text", "text": self.question}]}]

    def template_messages(self) -> list[dict[str, Any]]:
        """The same conversation as Qwen's processors hand it to the chat template: media as typed parts."""
        parts = [{"type": kind} for kind, data in (("image", self.image), ("audio", self.audio)) if data is not None]
        return [{"role": "user", "content": [*parts, {"type": "text", "text": self.question}]}]


def request(kind: str, s: MediaBenchSettings, seed: int) -> MediaRequest:
    return MediaRequest(kind, picture(s.image_size, seed) if kind in ("image", "both") else None,
                        clip(s.audio_seconds, seed) if kind in ("audio", "both") else None, QUESTIONS[kind], s.tg)


@dataclass(frozen=True)
class Sample:
    """One request as an engine ran it; times in seconds from its submission."""

    prepare_s: float  # media decoded, featurized, prompt built (ready to run)
    encode_s: float  # in the towers
    ttft_s: float  # the first generated token
    last_token_s: float
    tokens: int  # generated
    prompt_token_ids: list[int]  # the prompt as the engine ran it, placeholders expanded


def prompt_digest(ids: list[int]) -> str:
    """A short hash of a prompt's token ids: equal digests, the same prompt in both engines."""
    import hashlib

    return hashlib.sha256(b"".join(i.to_bytes(4, "little") for i in ids)).hexdigest()[:16]


ChatFn = Callable[[MediaRequest], Sample]


def measure(chat: ChatFn, s: MediaBenchSettings) -> tuple[dict[str, float], dict[str, Any]]:
    """Warm up, then one request per kind: (metrics, details). Metrics are ``<kind>_<name>``, named for the grid."""
    for w in range(s.warmup):
        chat(request("both" if "audio" in s.kinds or "both" in s.kinds else "image", s, s.seed + 1 + w))
    metrics: dict[str, float] = {}
    details: dict[str, Any] = {}
    for kind in s.kinds:
        sampler = PeakSampler(interval_s=s.sample_interval).start()
        try:
            sample = chat(request(kind, s, s.seed))
        finally:
            sampler.stop()
        if sample.tokens != s.tg:
            raise RuntimeError(f"the {kind} request generated {sample.tokens} tokens, not {s.tg}")
        if sample.last_token_s <= sample.ttft_s:
            raise RuntimeError(f"the {kind} request's last token came no later than its first: no decode rate")
        if not 0 <= sample.encode_s < sample.ttft_s:
            raise RuntimeError(f"the {kind} request's encode time {sample.encode_s:.3f} s is not within its "
                               f"time to first token {sample.ttft_s:.3f} s")
        metrics |= {
            f"{kind}_ttft_ms": round(sample.ttft_s * 1000, 2),
            f"{kind}_prepare_ms": round(sample.prepare_s * 1000, 2),
            f"{kind}_encode_ms": round(sample.encode_s * 1000, 2),
            f"{kind}_decode_tps": round((sample.tokens - 1) / (sample.last_token_s - sample.ttft_s), 3),
            f"{kind}_peak_rss_anon_mb": round(sampler.peak_bytes / (1 << 20), 3),
        }
        details[kind] = {
            **{k: round(v, 4) for k, v in asdict(sample).items() if k.endswith("_s")}, "generated_tokens": sample.tokens,
            "prompt_tokens": len(sample.prompt_token_ids), "prompt_sha256": prompt_digest(sample.prompt_token_ids),
            "peak_rss_anon_bytes": sampler.peak_bytes,
        }
    return metrics, details


def run_figures(metrics: dict[str, float], details: dict[str, Any], sampler: PeakSampler, init_s: float, ready_s: float,
                file_backed: int) -> dict[str, float]:
    """The requests' metrics and the run's own, as every engine's arm prints them: load times, the run's sampled
    peak (the run's sampler or a request's, whichever caught more: both poll), RssAnon after loading (the
    sampler's first mark) and the file-backed bytes."""
    from edge_infer.bench.harness.arm_output import mib

    peak = max([sampler.peak_bytes, *(d["peak_rss_anon_bytes"] for d in details.values())])
    return {**metrics, "init_s": round(init_s, 3), "ready_s": round(ready_s, 3), "peak_rss_anon_mb": mib(peak),
            "rss_anon_after_load_mb": mib(sampler.marks[0].rss_anon_bytes), "rss_file_mb": mib(file_backed)}


def describe(s: MediaBenchSettings) -> dict[str, Any]:
    """The workload, for the result's settings."""
    return {**asdict(s), "kinds": list(s.kinds), "audio_rate": AUDIO_RATE, "questions": {k: QUESTIONS[k] for k in s.kinds},
            "image_format": "PNG", "audio_format": "WAV PCM_16 mono"}
