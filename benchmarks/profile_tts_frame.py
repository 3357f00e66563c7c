"""Where one frame of speech goes: the Talker's step and Code2Wav's decode, per 80 ms frame.

    python benchmarks/profile_tts_frame.py benchmarks/models/qwen3-tts-0.6b [--quantization cpu_int4|cpu_w4a8] \
        [--threads N] --out benchmarks/results/tts-frames/NAME.json
    python benchmarks/profile_tts_frame.py --table benchmarks/results/tts-frames

Runs both models in this process on ``--threads`` threads, one request
(batch 1, ``ignore_eos``), and reports per frame: the Talker's wall time
(its 28-layer decoder step plus the code predictor's 15 passes), the self
time of the weight products inside it (torch.profiler), the weights those
products read, and Code2Wav's wall time per frame at chunks of 1, 4 and 8
frames. Real time is 80 ms per frame for both together; the table says how
far each part is from it. Run it on quiet cores (`taskset -c 0-1`).
"""
from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

from step_profile import time_and_profile

WARMUP_FRAMES = 8
FRAMES = 24
CODE2WAV_CHUNKS = (1, 4, 8)
CODE2WAV_FRAMES = 48
FRAME_MS = 80.0
# The operators that multiply by weights: oneDNN's bf16 linear, the int4 kernel, a plain matmul.
WEIGHT_OPS = ("mkldnn::_linear_pointwise", "aten::_weight_int4pack_mm_for_cpu", "edge_infer::w4a8_linear", "aten::mm", "aten::addmm")
# A whole decoder layer in one call (cpu_w4a8 decode steps): its products and everything around them.
FUSED_OPS = ("edge_infer::decode_layer",)


def layer_weight_bytes(decoder) -> int:
    """Resident bytes of a decoder's layer weights (every linear under ``layers.``)."""
    return sum(lin.resident_bytes for name, lin in decoder.linears() if name.startswith("layers."))


def profile(args: argparse.Namespace) -> dict:
    import os

    import torch

    from edge_infer.bench.harness import provenance
    from edge_infer.models.loader import TORCH_DTYPES
    from edge_infer.models.qwen3_tts.code2wav import load_code2wav
    from edge_infer.models.qwen3_tts.config import load_code2wav_config
    from edge_infer.models.qwen3_tts.prompt import VoiceRequest
    from edge_infer.models.qwen3_tts.tokenizer import TextTokenizer
    from edge_infer.quant.native import vector_variant
    from edge_infer.runtime.config import load_deploy_config
    from edge_infer.tts.planning import code2wav_settings, talker_engine_config
    from edge_infer.models.qwen3_tts.config import SamplingParams
    from edge_infer.tts.talker_engine import load_talker_engine

    stamp = provenance.collect(sorted(os.sched_getaffinity(0)))
    torch.set_num_threads(args.threads)
    model = str(Path(args.model).resolve())
    stage = {"model": model, "engine": {"dtype": args.dtype, "quantization": args.quantization, "max_num_seqs": 1}}
    # Both stages resolve --dtype as the pipeline does (auto: fp32 Code2Wav where bf16 is not native).
    config = load_deploy_config("qwen3_tts", {"0": stage, "1": {"model": model, "engine": {"dtype": args.dtype}}})
    engine = load_talker_engine(talker_engine_config(config.stage(0)))
    voice = VoiceRequest(TextTokenizer.from_dir(model).assistant_ids("Where does the time of one frame go?"),
                         speaker=sorted(engine.config.talker.speakers)[0])
    total = 1 + WARMUP_FRAMES + 2 * args.frames + 1
    engine.add("profile", voice, SamplingParams(max_frames=total, ignore_eos=True), torch.Generator().manual_seed(0))
    for _ in range(1 + WARMUP_FRAMES):  # the prompt, then warm-up frames
        engine.step()
    talker_ms, per_frame = time_and_profile(engine.step, args.frames)
    ops = {key: ms for key, ms, _ in per_frame}
    weight_ms = sum(ms for key, ms in ops.items() if key in WEIGHT_OPS)
    fused_ms = sum(ms for key, ms in ops.items() if key in FUSED_OPS)
    in_ops_ms = sum(ops.values())
    talker, predictor = engine.talker.decoder, engine.talker.predictor
    talker_dtype = str(talker.dtype).removeprefix("torch.")
    residual = predictor.num_residual
    # Per frame: the decoder's layers and codec head once, the predictor's layers once per residual code,
    # and each of its heads once.
    weight_bytes = (layer_weight_bytes(talker) + talker.lm_head.resident_bytes
                    + residual * layer_weight_bytes(predictor) + sum(h.resident_bytes for h in predictor.heads))
    del engine

    code2wav_config = load_code2wav_config(model)
    code2wav_dtype = code2wav_settings(config.stage(1)).dtype
    code2wav = load_code2wav(model, code2wav_config, TORCH_DTYPES[code2wav_dtype], vector_variant())
    code2wav_ms = {}
    for chunk in CODE2WAV_CHUNKS:
        state = code2wav.new_state()
        codes = torch.randint(0, code2wav_config.codebook_size, (chunk, code2wav_config.num_quantizers),
                              generator=torch.Generator().manual_seed(chunk))
        code2wav(codes, state=state)  # warm-up
        start = time.perf_counter()
        for _ in range(CODE2WAV_FRAMES // chunk):
            code2wav(codes, state=state)
        code2wav_ms[str(chunk)] = round((time.perf_counter() - start) * 1e3 / (CODE2WAV_FRAMES // chunk * chunk), 2)

    result = {
        "kind": "edge-infer.profile.tts-frame",
        "model": args.model,
        "settings": {"dtype": args.dtype, "talker_dtype": talker_dtype, "code2wav_dtype": code2wav_dtype,
                     "quantization": args.quantization, "threads": torch.get_num_threads(),
                     "frames": args.frames, "warmup_frames": WARMUP_FRAMES, "batch": 1},
        "talker_ms_per_frame": round(talker_ms, 2),
        "weight_products_ms_per_frame": round(weight_ms, 2),
        "fused_layers_ms_per_frame": round(fused_ms, 2),
        "other_operators_ms_per_frame": round(in_ops_ms - weight_ms - fused_ms, 2),
        "outside_operators_ms_per_frame": round(talker_ms - in_ops_ms, 2),
        "weight_bytes_per_frame": weight_bytes,
        # With fused layers, a lower bound on the products' rate (the calls also hold the rest of a layer).
        "weight_gb_per_s": round(weight_bytes / (weight_ms + fused_ms) / 1e6, 2),
        "code2wav_ms_per_frame_by_chunk": code2wav_ms,
        "frame_ms": FRAME_MS,
    }
    stamp.finished_at = provenance.now_utc()
    result["provenance"] = stamp.model_dump()
    return result


def table(directory: Path) -> int:
    paths = sorted(directory.glob("*.json"))
    if not paths:
        print(f"no frame profiles in {directory}", file=sys.stderr)
        return 1
    print("| profile | threads | Talker ms/frame | weight products (ms) | fused layers (ms) | other ops (ms) "
          "| outside ops (ms) | weights read/frame | weight rate | Code2Wav ms/frame (chunk 1 / 4 / 8) |")
    print("|---|---|---|---|---|---|---|---|---|---|")
    for path in paths:
        p = json.loads(path.read_text())
        c = p["code2wav_ms_per_frame_by_chunk"]
        print(f"| {path.stem} | {p['settings']['threads']} | {p['talker_ms_per_frame']:.1f} "
              f"| {p['weight_products_ms_per_frame']:.1f} | {p.get('fused_layers_ms_per_frame', 0.0):.1f} "
              f"| {p['other_operators_ms_per_frame']:.1f} "
              f"| {p['outside_operators_ms_per_frame']:.1f} | {p['weight_bytes_per_frame'] / 1e6:.0f} MB "
              f"| {p['weight_gb_per_s']:.1f} GB/s | {c['1']:.0f} / {c['4']:.0f} / {c['8']:.0f} |")
    return 0


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("model", nargs="?")
    parser.add_argument("--dtype", default="auto", choices=["auto", "bfloat16", "float32"],
                        help="both stages' dtype, resolved as the pipeline does (default auto: what users get)")
    parser.add_argument("--quantization", choices=["cpu_int4", "cpu_w4a8"], default=None)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--frames", type=int, default=FRAMES,
                        help="frames timed and profiled (the profiler's parse of a tiny model's many operators is slow)")
    parser.add_argument("--out", type=Path)
    parser.add_argument("--table", type=Path, help="print the markdown table of a directory of profiles instead")
    args = parser.parse_args()
    if args.table is not None:
        return table(args.table)
    if args.model is None or args.out is None:
        parser.error("a model directory and --out are required (or --table DIR)")
    result = profile(args)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=1) + "\n")
    print(json.dumps({k: v for k, v in result.items() if k != "provenance"}, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
