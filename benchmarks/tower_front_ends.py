"""The towers' front ends in fp32 against bf16 where bf16 is emulated, one process, alternated (docs/multimodal.md).

    python benchmarks/tower_front_ends.py --out benchmarks/results/tower-front-ends-qwen2.5-omni-3b-zen3.json \
        [--model benchmarks/models/qwen2.5-omni-3b] [--pairs 4]

On a CPU without bf16 arithmetic the ViT's patch embedding and the audio tower's convolutions multiply in fp32
(``models.layers.linear.products_dtype``). This loads the thinker once (W4A8 decoder and towers, bf16, the core
on a thread of this process) and sends the media benchmark's 448x448 image and 10 s clip
(``bench/harness/media_bench.py``) through ``LLM.chat``, swapping the towers' front ends between fp32 and
bf16 products before each pair of requests, in alternating order. Reported: each request's encode time (the
engine's own timing) per front end, and their per-pair ratios. A grid cannot do this comparison on a noisy
host: its arms are separate processes minutes apart.
"""
from __future__ import annotations

import argparse
import statistics
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--out", type=Path, required=True)
    p.add_argument("--model", default=str(REPO / "benchmarks/models/qwen2.5-omni-3b"))
    p.add_argument("--pairs", type=int, default=4)
    p.add_argument("--threads", type=int, default=2)
    args = p.parse_args()
    sys.path.insert(0, str(REPO / "src"))
    import edge_infer.models.audio_encoder as audio_encoder
    import edge_infer.models.vision as vision
    from edge_infer.bench.harness import media_bench
    from edge_infer.bench.harness.arm_output import stamp, write_json_atomic
    from edge_infer.bench.harness.provenance import now_utc
    from edge_infer.engine.llm import LLM
    from edge_infer.engine.sampling_params import SamplingParams
    from edge_infer.hardware.cpu import detect

    if detect().native_bf16:
        print("this CPU has bf16 arithmetic: the front ends run in bf16 either way", file=sys.stderr)
        return 2
    started = now_utc()
    front_ends = {"fp32": audio_encoder.products_dtype, "bf16": lambda dtype: dtype}
    settings = media_bench.MediaBenchSettings()
    params = SamplingParams(max_tokens=2, temperature=0.0, ignore_eos=True)
    llm = LLM(args.model, worker="thread", quantization="cpu_w4a8", encoder_quantization="same", num_threads=args.threads,
              max_num_seqs=1, prefix_caching=False)
    try:
        llm.chat(media_bench.request("both", settings, settings.seed + 1).messages(), params)  # warm-up, other media
        encode_s: dict[str, dict[str, list[float]]] = {name: {"audio": [], "image": []} for name in front_ends}
        for pair in range(args.pairs):
            for name in (("fp32", "bf16") if pair % 2 == 0 else ("bf16", "fp32")):
                audio_encoder.products_dtype = vision.products_dtype = front_ends[name]
                for kind in ("audio", "image"):
                    out = llm.chat(media_bench.request(kind, settings, settings.seed).messages(), params)[0]
                    encode_s[name][kind].append(out.metrics.encode_time)
            print(pair, {name: {k: round(v[-1], 3) for k, v in kinds.items()} for name, kinds in encode_s.items()},
                  flush=True)
    finally:
        llm.close()
    rows = {}
    for kind in ("audio", "image"):
        ratios = [a / b for a, b in zip(encode_s["fp32"][kind], encode_s["bf16"][kind])]
        rows[kind] = {"fp32_encode_s": encode_s["fp32"][kind], "bf16_encode_s": encode_s["bf16"][kind],
                      "fp32_median_s": statistics.median(encode_s["fp32"][kind]),
                      "bf16_median_s": statistics.median(encode_s["bf16"][kind]),
                      "pair_ratios": [round(r, 4) for r in ratios], "median_ratio": round(statistics.median(ratios), 4)}
        print(kind, rows[kind], flush=True)
    write_json_atomic(args.out, {
        "kind": "edge-infer.tower-front-ends", "model": args.model, "threads": args.threads, "pairs": args.pairs,
        "settings": {"quantization": "cpu_w4a8", "encoder_quantization": "same", "dtype": "bfloat16 (auto)",
                     "media": media_bench.describe(settings)},
        "encodes": rows, "provenance": stamp(started)})
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
