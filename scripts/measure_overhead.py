"""Measure the per-process runtime overhead the memory planner adds to every plan.

Writes src/edge_infer/memory/overhead.json: RssAnon of
  - a library frontend (edge_infer's LLM/LocalTextEngine imports, a tokenizer loaded),
  - a server frontend (the same plus FastAPI, uvicorn, prometheus),
  - an engine worker (interpreter + torch + engine modules, thread pool started, no weights),
the tokenizer's resident bytes per byte of tokenizer.json, the bytes a
server process holds per byte, JSON item and object of the bodies of its requests in flight, and the
activation calibration: the RssAnon a prefill step adds, measured at two
chunk sizes on the demo model and fitted as (factor x the shape-derived
bytes per token) x tokens + fixed bytes, after the mask and logits; and the
media encoders' (memory/encoder_sizing.py): the RssAnon one encode adds
(memory/encoder_probe.py), at two sizes of each tower at a small and at the
Qwen2.5-Omni-3B width, fitted per tower and dtype as factor x the shape-derived
tensors + fixed bytes + bytes per byte of the largest weight matrix. Each
figure is the median of several fresh processes. Run on the machine class
the plan is for; the file records where it was measured.

    python scripts/measure_overhead.py               # everything
    python scripts/measure_overhead.py --encoders    # the encoders' keys only
    python scripts/measure_overhead.py --encoders bfloat16   # one dtype's (this CPU's calibration class)
    python scripts/measure_overhead.py --bodies      # the server's bytes per byte of request bodies in flight
"""
from __future__ import annotations

import json
import platform
import statistics
import shutil
import subprocess
import sys
import tempfile
from datetime import datetime, timezone
from pathlib import Path
from typing import Callable

ROOT = Path(__file__).resolve().parents[1]
OUT = ROOT / "src" / "edge_infer" / "memory" / "overhead.json"
REPEATS = 5

PROBE = """
import sys
from edge_infer.memory.measure import rss_anon_bytes
kind, tok = sys.argv[1], sys.argv[2]
if kind == "worker":
    import torch
    from edge_infer.engine import core, worker  # noqa: F401
    torch.set_num_threads(len(__import__("os").sched_getaffinity(0)))
    torch.ones(64, 64) @ torch.ones(64, 64)  # start the intra-op thread pool
    print(rss_anon_bytes())
    raise SystemExit
from edge_infer.engine import llm, local, async_engine  # noqa: F401
import tokenizers, jinja2  # noqa: F401  (imported by every frontend; not part of the tokenizer's own bytes)
if kind == "server":
    import fastapi, uvicorn, prometheus_client  # noqa: F401
base = rss_anon_bytes()
if tok != "-":
    from edge_infer.models.tokenizer import Tokenizer
    t = Tokenizer(tok)
    t.encode("warm up the tokenizer " * 20)
print(base, rss_anon_bytes())
"""

# llguidance's view of a tokenizer (engine/grammar.py), built in the worker on the first constrained request.
GRAMMAR_PROBE = """
import sys
from pathlib import Path
from edge_infer.engine.grammar import load_ll_tokenizer
from edge_infer.memory.measure import rss_anon_bytes
import llguidance  # noqa: F401  (the library's own bytes are the worker's, not the tokenizer's)
base = rss_anon_bytes()
load_ll_tokenizer(Path(sys.argv[1]) / "tokenizer.json", int(sys.argv[2]), (0,))
print(base, rss_anon_bytes())
"""


def grammar_tokenizer_calibration(tokenizer_dirs: list[Path], vocab_sizes: list[int]) -> dict[str, float]:
    """Fixed bytes and bytes per tokenizer.json byte of llguidance's tokenizer: a line through two sizes."""
    points = []
    for directory, vocab in zip(tokenizer_dirs, vocab_sizes):
        runs = []
        for _ in range(REPEATS):
            out = subprocess.run([sys.executable, "-c", GRAMMAR_PROBE, str(directory), str(vocab)],
                                 capture_output=True, text=True, check=True)
            base, after = (int(x) for x in out.stdout.split())
            runs.append(after - base)
        points.append(((directory / "tokenizer.json").stat().st_size, statistics.median(runs)))
    (x0, y0), (x1, y1) = points
    slope = (y1 - y0) / (x1 - x0)
    return {"grammar_tokenizer_bytes_per_json_byte": round(slope, 3),
            "grammar_tokenizer_fixed_bytes": int(max(0, y0 - slope * x0))}


def larger_tokenizer(out: Path, pieces: int = 32_000) -> Path:
    """A byte-level BPE of ``pieces`` trained on the Python standard library's sources (no model hub)."""
    import glob
    import os

    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    def texts():
        for path in sorted(glob.glob(f"{os.path.dirname(os.__file__)}/**/*.py", recursive=True)):
            try:
                yield Path(path).read_text(encoding="utf-8")
            except (UnicodeDecodeError, OSError):
                continue

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    tok.train_from_iterator(texts(), trainers.BpeTrainer(vocab_size=pieces, show_progress=False,
                                                         initial_alphabet=pre_tokenizers.ByteLevel.alphabet()))
    out.mkdir(parents=True, exist_ok=True)
    tok.save(str(out / "tokenizer.json"))
    return out


ACTIVATION_PROBE = """
import sys
from edge_infer.config import EngineConfig, QuantConfig
from edge_infer.engine.core import EngineCore
from edge_infer.engine.protocol import EngineRequest
from edge_infer.engine.sampling_params import SamplingParams
from edge_infer.memory.measure import PeakSampler, malloc_trim, rss_anon_bytes
model, tokens, ctx, quantization = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), sys.argv[4]
quant = QuantConfig.named(quantization) if quantization != "none" else None
core = EngineCore(EngineConfig(model=model, dtype="bfloat16", max_model_len=ctx, max_num_seqs=1,
                               max_num_batched_tokens=tokens, kv_cache_memory_bytes=64 << 20, quant=quant))
malloc_trim()
base = rss_anon_bytes()
sampler = PeakSampler(interval_s=0.002).start()
core.add_request(EngineRequest("probe", [5] * (ctx - 2), SamplingParams(max_tokens=1, temperature=0, ignore_eos=True)))
while core.has_work():
    core.step()
sampler.stop()
print(sampler.peak_bytes - base)
"""
ACTIVATION_POINTS = (128, 512)  # prefill chunk sizes at the short context
ACTIVATION_CONTEXTS = (1024, 2048)  # contexts for the largest chunk: what the attention mask really costs


def _probe_transient(model_dir: str, tokens: int, ctx: int, quantization: str | None) -> float:
    args = [model_dir, str(tokens), str(ctx), quantization or "none"]
    runs = [int(subprocess.run([sys.executable, "-c", ACTIVATION_PROBE, *args], capture_output=True, text=True,
                               check=True).stdout.split()[-1]) for _ in range(REPEATS)]
    return statistics.median(runs)


def _step_transients(model_dir: str, quantization: str | None) -> tuple[float, float, float, int]:
    """(bytes per token, fixed bytes, bytes per mask element, shape bytes per token) of one model's prefill steps.

    The mask of a chunk against the context ([group x chunk, ctx] booleans)
    costs more than its own bytes: attention turns it into a float bias.
    Its real cost per element comes from the same chunk at two contexts;
    the rest from two chunk sizes at the shorter context."""
    from edge_infer.config import QuantConfig
    from edge_infer.hardware.cpu import detect
    from edge_infer.memory import plan
    from edge_infer.models.config import ModelConfig
    from edge_infer.models.weights import weight_specs
    from edge_infer.quant.sizes import int4_prompt_bytes, int4_prompt_widths

    cfg = ModelConfig.from_dir(model_dir)
    group = cfg.num_attention_heads // cfg.num_key_value_heads
    lo, hi = ACTIVATION_POINTS
    short, long = ACTIVATION_CONTEXTS
    at_short = {tokens: _probe_transient(model_dir, tokens, short, quantization) for tokens in ACTIVATION_POINTS}
    at_long = _probe_transient(model_dir, hi, long, quantization)
    per_mask_element = max(1.0, (at_long - at_short[hi]) / (hi * (long - short) * group))
    logits = 4 * cfg.vocab_size * 5
    # cpu_int4's dequantized prompt blocks are an item of their own (quant/sizes.int4_prompt_bytes)
    width = int4_prompt_widths(weight_specs(cfg), QuantConfig.named(quantization), None)[0] if quantization else 0
    blocks = {t: int4_prompt_bytes(t, width, 2, detect().native_bf16) for t in at_short}  # the probe's bf16, g128
    measured = {t: m - per_mask_element * t * short * group - logits - blocks[t] for t, m in at_short.items()}
    per_token = (measured[hi] - measured[lo]) / (hi - lo)
    return per_token, measured[lo] - per_token * lo, per_mask_element, plan.activation_tensor_bytes(cfg, 2)


def activation_calibration(model_dirs: list[str], quantization: str | None = None) -> dict[str, float]:
    """The largest measured/shape ratio over the probe models: a plan errs on the side of refusing.

    Keyed as edge_infer.memory.plan.activation_calibration reads it: the
    quantized kernel's figures carry its name as a prefix."""
    fits = [_step_transients(d, quantization) for d in model_dirs]
    prefix = f"{quantization}_" if quantization else ""
    return {
        prefix + "activation_per_token_factor": round(max(per_token / shape for per_token, _, _, shape in fits), 3),
        prefix + "activation_fixed_bytes": int(max(0, max(fixed for _, fixed, _, _ in fits))),
        "activation_mask_bytes_per_element": round(max(mask for _, _, mask, _ in fits), 3),
    }


def shared_mask_cost(*calibrations: dict[str, float]) -> dict[str, float]:
    """Every kernel's calibration, merged: the attention mask is the same kernel's, so its cost is the largest seen."""
    merged = {k: v for c in calibrations for k, v in c.items()}
    merged["activation_mask_bytes_per_element"] = max(c["activation_mask_bytes_per_element"] for c in calibrations)
    return merged


# Towers random-weighted in memory (encoder_probe --config): a small width and the Qwen2.5-Omni-3B width (two
# blocks; the activations do not depend on depth), each measured at two sizes.
ENCODER_SHAPES = {
    "small": {"vision_config": {"depth": 2, "hidden_size": 128, "num_heads": 4, "intermediate_size": 256,
                                "out_hidden_size": 96, "fullatt_block_indexes": [1]},
              "audio_config": {"num_mel_bins": 128, "d_model": 128, "encoder_layers": 2, "encoder_attention_heads": 4,
                               "encoder_ffn_dim": 256, "output_dim": 96}},
    "omni-3b": {"vision_config": {"depth": 2, "hidden_size": 1280, "num_heads": 16, "intermediate_size": 3420,
                                  "out_hidden_size": 2048, "fullatt_block_indexes": [1]},
                "audio_config": {"num_mel_bins": 128, "d_model": 1280, "encoder_layers": 2,
                                 "encoder_attention_heads": 20, "encoder_ffn_dim": 5120, "output_dim": 2048}},
}
ENCODER_SIZES = {  # (vision grid side in patches, audio mel frames), two points per shape
    "small": ((64, 3000), (128, 12000)),
    "omni-3b": ((32, 1000), (64, 3000)),
}


def _encoder_peak(config: Path, dtype: str, args: list[str]) -> float:
    runs = []
    for _ in range(REPEATS):
        out = subprocess.run([sys.executable, "-m", "edge_infer.memory.encoder_probe", "--config", str(config),
                              "--dtype", dtype, *args], capture_output=True, text=True, check=True)
        runs.append(json.loads(out.stdout)["peak_bytes"])
    return statistics.median(runs)


def encoder_calibration(dtype: str) -> dict[str, float]:
    """Per tower: factor, fixed bytes and bytes per largest-weight byte of one encode, for ``dtype``.

    The factor is the larger slope of measured over shape-derived bytes (of the tower's two widths); each
    width's fixed part the larger remainder; the fixed parts of the two widths give the line through the
    largest weight matrix's bytes (the BLAS's packing buffers grow with it). A plan errs on the side of
    refusing."""
    from edge_infer.memory import encoder_sizing as sizing
    from edge_infer.models.encoder_config import AudioConfig, VisionConfig

    d = 2 if dtype == "bfloat16" else 4
    result = {}
    with tempfile.TemporaryDirectory() as tmp:
        for tower in ("vision", "audio"):
            points, largest = {}, {}  # width -> [(tensors, measured)], its largest linear's bytes
            for shape, config in ENCODER_SHAPES.items():
                path = Path(tmp) / f"{shape}.json"
                path.write_text(json.dumps(config))
                cfg = (VisionConfig.from_dict(config["vision_config"], split_qkv=True) if tower == "vision"
                       else AudioConfig.from_dict(config["audio_config"]))
                largest[shape] = sizing.largest_linear_bytes(cfg, d)
                measured = []
                for side, frames in ENCODER_SIZES[shape]:
                    if tower == "vision":
                        args, tensors = ["--image-grid", "1", str(side), str(side)], sizing.vision_tensor_bytes(
                            cfg, side * side, d, sizing.native_elementwise(d), sizing.products_bytes(d),
                            sizing.linear_accumulator_bytes(d))
                    else:
                        args, tensors = ["--audio-frames", str(frames)], sizing.audio_tensor_bytes(
                            cfg, frames, d, sizing.products_bytes(d), sizing.linear_accumulator_bytes(d))
                    measured.append((tensors, _encoder_peak(path, dtype, args)))
                points[shape] = measured
            factor = max((m1 - m0) / (t1 - t0) for (t0, m0), (t1, m1) in points.values())
            fixed = {shape: max(m - factor * t for t, m in pts) for shape, pts in points.items()}
            (l0, f0), (l1, f1) = ((largest[s], fixed[s]) for s in ENCODER_SHAPES)
            per_weight_byte = max(0.0, (f1 - f0) / (l1 - l0))
            prefix = sizing.calibration_prefix(tower, d)
            result.update({
                prefix + "activation_factor": round(factor, 3),
                prefix + "activation_fixed_bytes": int(max(0, max(f - per_weight_byte * largest[s] for s, f in fixed.items()))),
                prefix + "scratch_per_weight_byte": round(per_weight_byte, 3)})
    return result


def encoder_dtypes() -> tuple[str, ...]:
    """Both dtypes where oneDNN runs bf16 (natively or emulated); fp32 only elsewhere (the bf16 keys are kept).
    ``--encoders DTYPE`` measures that one alone (a CPU of a new bf16 class leaves the fp32 keys as they are)."""
    from edge_infer.models.layers.linear import onednn_bf16_available

    if "--encoders" in sys.argv[1:-1] and (only := sys.argv[sys.argv.index("--encoders") + 1]) in ("float32", "bfloat16"):
        return (only,)
    return ("float32", "bfloat16") if onednn_bf16_available() else ("float32",)


def encoder_calibrations() -> dict[str, float]:
    return {k: v for dtype in encoder_dtypes() for k, v in encoder_calibration(dtype).items()}


def measured_here() -> str:
    """When and on what a figure was measured, for its provenance line."""
    from edge_infer.hardware.cpu import detect

    cpu = detect()
    return (f"measured {datetime.now(timezone.utc).isoformat(timespec='seconds')} on {platform.node()} "
            f"({cpu.model}: {cpu.isa_summary})")


def encoder_provenance(previous: dict[str, str] | None = None) -> dict[str, str]:
    """Per calibration class (encoder_sizing.calibration_class): how and where its keys were measured; the classes
    this CPU cannot measure (the bf16 classes of other CPUs) keep their ``previous`` entry."""
    import os

    from edge_infer.memory.encoder_sizing import calibration_class

    how = (f"memory/encoder_probe.py (glibc mmap threshold pinned), {REPEATS} fresh processes each, "
           f"{len(os.sched_getaffinity(0))} threads: random towers of a small width and the Qwen2.5-Omni-3B width, "
           f"each at two sizes {ENCODER_SIZES}; {measured_here()}")
    return {**(previous or {}), **{calibration_class(2 if d == "bfloat16" else 4): how for d in encoder_dtypes()}}


# Request bodies a server holds while their requests wait for room behind a long one (the embedded demo,
# --max-num-seqs 1): image requests (4 pictures of 294 x 294 random pixels, 1.4 MB bodies) for the bytes; then
# bodies of many small JSON items for what each item parses to beyond its bytes: strings of two letters in an
# unknown field (server/http.py's "items") and one-word text parts (its "objects").
BODY_REQUESTS = 20
BODY_ITEMS = 100_000
BODY_PARTS = 600
BODY_PROBE = (f"the demo server's process (--max-num-seqs 1) with {BODY_REQUESTS} requests waiting for room behind a "
              f"long one: RssAnon gained per body byte (image requests of 1.4 MB), per item beyond that ({BODY_ITEMS:,} "
              f"two-letter strings each), per object beyond both ({BODY_PARTS} text parts each); median of 3 servers")


def _image_body(seed: int, max_tokens: int = 8) -> bytes:
    import base64

    from edge_infer.bench.harness.media_bench import noise_png

    parts = []
    for i in range(4):
        picture = noise_png(seed * 4 + i, 294, 294)
        parts.append({"type": "image_url", "image_url": {"url": "data:image/png;base64," + base64.b64encode(picture).decode()}})
    messages = [{"role": "user", "content": [*parts, {"type": "text", "text": "What is in these pictures?"}]}]
    return json.dumps({"messages": messages, "max_tokens": max_tokens, "ignore_eos": True}).encode()


def _items_body(seed: int) -> bytes:
    letters = [f"{chr(97 + (seed + i) % 26)}{chr(97 + i % 26)}" for i in range(BODY_ITEMS)]
    return json.dumps({"messages": [{"role": "user", "content": "Hi"}], "max_tokens": 8, "extra": letters}).encode()


def _parts_body(seed: int) -> bytes:
    parts = [{"type": "text", "text": f"w{(seed + i) % 10}"} for i in range(BODY_PARTS)]
    return json.dumps({"messages": [{"role": "user", "content": parts}], "max_tokens": 8}).encode()


def _body_probe(body: Callable[[int], bytes], waiting_metric: str) -> tuple[float, list[bytes]]:
    """RssAnon the server process gains with BODY_REQUESTS requests of ``body`` waiting (``waiting_metric`` shows
    them all), and those bodies."""
    import contextlib
    import os
    import socket
    import threading
    import time

    import httpx

    from edge_infer.memory.measure import rss_anon_bytes

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    url = f"http://127.0.0.1:{port}"
    server = subprocess.Popen([sys.executable, "-m", "edge_infer.cli", "serve", "--port", str(port), "--max-num-seqs", "1",
                               "--max-body-bytes-in-flight", str(1 << 30)],
                              env={**os.environ, "PYTHONPATH": str(ROOT / "src")}, stdout=subprocess.DEVNULL,
                              stderr=subprocess.DEVNULL)

    def post(data: bytes) -> None:
        with contextlib.suppress(httpx.HTTPError):  # the requests still waiting when the server is stopped
            httpx.post(url + "/v1/chat/completions", content=data, headers={"Content-Type": "application/json"},
                       timeout=600)

    def waiting() -> float:
        line = next(l for l in httpx.get(url + "/metrics", timeout=10).text.splitlines()
                    if l.startswith(waiting_metric + " "))
        return float(line.split()[-1])

    try:
        for _ in range(600):
            if server.poll() is not None:
                raise RuntimeError(f"the server exited with {server.returncode}")
            try:
                if httpx.get(url + "/health", timeout=2).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            time.sleep(0.1)
        post(body(0))  # warm
        threading.Thread(target=post, args=(_image_body(1, max_tokens=1500),), daemon=True).start()
        time.sleep(1.0)
        before = rss_anon_bytes(server.pid)
        bodies = [body(2 + i) for i in range(BODY_REQUESTS)]
        for data in bodies:
            threading.Thread(target=post, args=(data,), daemon=True).start()
        while waiting() < BODY_REQUESTS:
            time.sleep(0.1)
        time.sleep(0.5)
        return rss_anon_bytes(server.pid) - before, bodies
    finally:
        server.kill()
        server.wait()


def _body_costs() -> tuple[float, float, float]:
    """Bytes held per body byte, per item beyond it and per object beyond both (server/http.py's BodyCost)."""
    from edge_infer.server.http import BodyCost

    count = BodyCost(0, 0).of
    gained, bodies = _body_probe(_image_body, "edge_infer_media_waiting")
    per_byte = gained / sum(map(len, bodies))
    gained, bodies = _body_probe(_items_body, "edge_infer_queue_depth")
    items = sum(count(b)[0] for b in bodies)
    per_item = (gained - per_byte * sum(map(len, bodies))) / items
    gained, bodies = _body_probe(_parts_body, "edge_infer_queue_depth")
    objects = sum(b.count(b"{") for b in bodies)
    others = sum(count(b)[0] for b in bodies) - objects
    per_object = (gained - per_byte * sum(map(len, bodies)) - per_item * others) / objects
    return per_byte, per_item, per_object


def body_calibration() -> dict[str, float]:
    runs = [_body_costs() for _ in range(3)]
    per_byte, per_item, per_object = (statistics.median(column) for column in zip(*runs))
    return {"server_bytes_per_body_byte": round(per_byte, 3), "server_bytes_per_body_item": round(per_item, 1),
            "server_bytes_per_body_object": round(per_object, 1)}


def probe(kind: str, tokenizer_dir: str = "-") -> list[int]:
    out = subprocess.run([sys.executable, "-c", PROBE, kind, tokenizer_dir], capture_output=True, text=True, check=True)
    return [int(x) for x in out.stdout.split()]


def median(kind: str, tokenizer_dir: str = "-") -> list[int]:
    runs = [probe(kind, tokenizer_dir) for _ in range(REPEATS)]
    return [int(statistics.median(col)) for col in zip(*runs)]


def main() -> None:
    sys.path.insert(0, str(ROOT / "src"))
    if "--bodies" in sys.argv[1:]:
        result = json.loads(OUT.read_text())
        provenance = result.pop("provenance")
        result.update(body_calibration())
        provenance["body_probe"] = f"{BODY_PROBE}; {measured_here()}"
        OUT.write_text(json.dumps({**result, "provenance": provenance}, indent=2) + "\n")
        print(json.dumps(result, indent=2))
        return
    if "--encoders" in sys.argv[1:]:
        result = json.loads(OUT.read_text())
        provenance = result.pop("provenance")
        result.update(encoder_calibrations())
        provenance["encoder_probe"] = encoder_provenance(provenance.get("encoder_probe"))
        OUT.write_text(json.dumps({**result, "provenance": provenance}, indent=2) + "\n")
        print(json.dumps(result, indent=2))
        return
    from edge_infer.engine.frontend import demo_model_dir

    from edge_infer.models.synth import write_checkpoint

    tok_dir = str(demo_model_dir())
    real_shape = str(write_checkpoint(Path(tempfile.mkdtemp()) / "qwen2.5-0.5b", "qwen2", "qwen2.5-0.5b"))
    json_bytes = (demo_model_dir() / "tokenizer.json").stat().st_size
    big_tok = larger_tokenizer(Path(real_shape).parent / "bpe-32k")
    worker = median("worker")[0]
    lib_base, lib_tok = median("library", tok_dir)
    server_base, server_tok = median("server", tok_dir)
    previous = json.loads(OUT.read_text())
    result = {
        "frontend_bytes": lib_base,
        "server_frontend_bytes": server_base,
        **body_calibration(),
        "worker_bytes": worker,
        "tokenizer_bytes_per_json_byte": round(max(0, lib_tok - lib_base) / json_bytes, 3),
        **grammar_tokenizer_calibration([demo_model_dir(), big_tok], [1408, 32_000]),
        **shared_mask_cost(
            activation_calibration([str(demo_model_dir()), real_shape]),
            activation_calibration([str(demo_model_dir()), real_shape], "cpu_int4"),
        ),
        # each encoder calibration class is measured only on a CPU of its class (bf16 on AVX512-BF16, bf16_amx on
        # AMX, bf16_emulated on AVX-512 without bf16); the other classes' previous figures are kept
        **{k: v for k, v in previous.items() if k.startswith("encoder_")},
        **encoder_calibrations(),
        "provenance": {
            "measured_at": datetime.now(timezone.utc).isoformat(timespec="seconds"),
            "host": platform.node(),
            "python": platform.python_version(),
            "machine": platform.machine(),
            "method": f"median RssAnon of {REPEATS} fresh processes per kind (scripts/measure_overhead.py)",
            "tokenizer_probe": f"demo model tokenizer.json, {json_bytes} bytes",
            "grammar_tokenizer_probe": "llguidance's tokenizer from the demo model's and a 32k-piece BPE's tokenizer.json",
            "activation_probe": (
                f"demo model and a synthetic qwen2.5-0.5b shape, bf16 and cpu_int4 (g128), prefill chunks of {ACTIVATION_POINTS} tokens "
                f"at a {ACTIVATION_CONTEXTS[0]}-token context and {ACTIVATION_POINTS[1]} at {ACTIVATION_CONTEXTS[1]}; "
                f"the larger per-token factor, fixed part and mask cost"
            ),
            "encoder_probe": encoder_provenance(previous["provenance"].get("encoder_probe")),
            "body_probe": f"{BODY_PROBE}; {measured_here()}",
        },
    }
    shutil.rmtree(Path(real_shape).parent)
    OUT.write_text(json.dumps(result, indent=2) + "\n")
    print(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
