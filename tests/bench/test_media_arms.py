"""`bench media` (edge-infer) and `bench transformers media` on a tiny `edge-infer synth` Omni thinker: each prints its
metrics and what it ran, edge-infer's encode time comes from the engine and sits inside the TTFT, both engines run
the same prompts; the shared workload (harness/media_bench.py) and the published spec."""
from __future__ import annotations

import io
import json
import shlex
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest

from edge_infer.bench.harness import media_bench
from edge_infer.bench.harness.runner import numeric_metrics
from edge_infer.bench.harness.spec import load_spec
from edge_infer.bench.harness.stats import direction_of
from edge_infer.cli import build_parser, main

from .engine_models import last_json, run_cli

# A small workload: a 112 x 112 image (16 tokens), a 2 s clip (50 tokens), 4 tokens out, no warm-up.
SMALL = ["--image-size", "112", "--audio-seconds", "2", "--tg", "4", "--warmup", "0"]
PER_REQUEST = ("ttft_ms", "prepare_ms", "encode_ms", "decode_tps", "peak_rss_anon_mb")
SHARED = {f"{kind}_{name}" for kind in media_bench.KINDS for name in PER_REQUEST} | {
    "init_s", "ready_s", "peak_rss_anon_mb", "rss_anon_after_load_mb", "rss_file_mb"}
SPEC = Path(__file__).resolve().parents[2] / "benchmarks/specs/media-qwen2.5-omni-3b.json"


@pytest.fixture(scope="module")
def omni(synth_thinkers) -> Path:
    return synth_thinkers["qwen2_5_omni"]


@pytest.fixture(scope="module")
def edge_infer_arm(omni) -> dict:
    done = run_cli("bench", "media", str(omni), "--dtype", "float32", "--max-model-len", "1024", *SMALL, "--tag", "ei")
    assert done.returncode == 0, done.stderr
    return last_json(done.stdout)


def _sane(r: dict) -> None:
    """Every top-level number is a metric with a direction, and each request's figures hold together."""
    assert [k for k in numeric_metrics(r) if direction_of(k) is None] == []
    assert SHARED <= set(numeric_metrics(r))
    for kind in media_bench.KINDS:
        assert 0 < r[f"{kind}_encode_ms"] < r[f"{kind}_ttft_ms"], kind
        assert 0 < r[f"{kind}_prepare_ms"] < r[f"{kind}_ttft_ms"], kind
        assert r[f"{kind}_decode_tps"] > 0 and r["peak_rss_anon_mb"] >= r[f"{kind}_peak_rss_anon_mb"] > 0
        request = r["requests"][kind]
        assert request["generated_tokens"] == 4 and len(request["prompt_sha256"]) == 16
    # placeholders expanded: 16 image rows (112 px: 8 x 8 patches merged 2 x 2) and 50 audio rows (2 s)
    assert r["requests"]["both"]["prompt_tokens"] > 16 + 50
    assert r["settings"]["media"]["image_size"] == 112 and r["provenance"]["packages"]["torch"]


@pytest.mark.slow
def test_the_edge_infer_arm_prints_its_metrics_what_ran_and_the_engines_encode_time(edge_infer_arm):
    r = edge_infer_arm
    _sane(r)
    assert r["engine"] == "edge-infer" and r["tag"] == "ei" and r["model_fingerprint"]["sha256"]
    loaded = r["loaded"]
    assert loaded["dtype"] == "float32" and loaded["quantization"] is None and loaded["encoder_quantization"] == "none"
    assert loaded["linear_kernels"]["encoder linears"] == "dense" and set(loaded["encoder_weight_bytes"]) == {"vision", "audio"}
    assert loaded["num_threads"] == loaded["encoder_threads"] >= 1 and r["settings_mismatches"] == []
    assert r["settings"]["prefix_caching"] is False and r["settings"]["max_num_seqs"] == 1
    assert r["plan_peak_mb"] > 0 and {row["measured"] for row in r["plan_vs_measured"]} == {
        "peak_rss_anon_mb", "image_peak_rss_anon_mb", "audio_peak_rss_anon_mb", "both_peak_rss_anon_mb"}


@pytest.mark.slow
def test_the_transformers_arm_runs_the_same_prompts_and_prints_the_same_keys(omni, edge_infer_arm):
    done = run_cli("bench", "transformers", "media", str(omni), "--dtype", "float32", *SMALL, "--tag", "hf")
    assert done.returncode == 0, done.stderr
    r = last_json(done.stdout)
    _sane(r)
    assert r["engine"] == "transformers" and r["tag"] == "hf"
    loaded = r["loaded"]
    assert loaded["dtype"] == "float32" and loaded["attn_implementation"] in ("eager", "sdpa")
    assert loaded["image_processor"] == "Qwen2VLImageProcessorPil" and loaded["feature_extractor"] == "WhisperFeatureExtractor"
    # like with like: the same token ids (chat template, placeholders expanded) went into both engines
    for kind in media_bench.KINDS:
        assert r["requests"][kind]["prompt_sha256"] == edge_infer_arm["requests"][kind]["prompt_sha256"], kind
    assert set(numeric_metrics(r)) == set(numeric_metrics(edge_infer_arm)) - {"plan_steady_mb", "plan_peak_mb"}


def test_the_media_are_a_drawn_png_and_a_16_khz_wav_the_same_for_the_same_seed():
    import soundfile
    from PIL import Image

    png = media_bench.picture(448, 0)
    assert png == media_bench.picture(448, 0) != media_bench.picture(448, 1)
    image = Image.open(io.BytesIO(png))
    assert image.format == "PNG" and image.size == (448, 448) and image.mode == "RGB"
    assert len(np.unique(np.asarray(image).reshape(-1, 3), axis=0)) > 1000  # drawn and noisy, not flat
    wav = media_bench.clip(10, 0)
    assert wav == media_bench.clip(10, 0)
    samples, rate = soundfile.read(io.BytesIO(wav))
    assert rate == 16000 and samples.shape == (160000,) and 0.05 < np.abs(samples).max() < 1
    request = media_bench.request("both", media_bench.MediaBenchSettings(), 0)
    parts = request.messages()[0]["content"]
    assert [p["type"] for p in parts] == ["image_url", "input_audio", "text"]
    assert parts[0]["image_url"]["url"].startswith("data:image/png;base64,") and parts[1]["input_audio"]["format"] == "wav"
    assert [p["type"] for p in request.template_messages()[0]["content"]] == ["image", "audio", "text"]
    assert media_bench.request("image", media_bench.MediaBenchSettings(), 0).audio is None


def test_the_measure_folds_samples_into_metrics_and_refuses_an_impossible_one():
    s = media_bench.MediaBenchSettings(kinds=("image", "audio"), image_size=56, audio_seconds=1, tg=5, warmup=1)
    seen = []

    def chat(req: media_bench.MediaRequest) -> media_bench.Sample:
        seen.append(req.kind)
        return media_bench.Sample(prepare_s=0.01, encode_s=0.1, ttft_s=0.5, last_token_s=1.5, tokens=5,
                                  prompt_token_ids=[1, 2, 3])

    metrics, details = media_bench.measure(chat, s)
    assert seen == ["both", "image", "audio"]  # the warm-up first
    assert metrics["image_ttft_ms"] == 500 and metrics["image_encode_ms"] == 100 and metrics["audio_decode_tps"] == 4
    assert details["audio"]["prompt_tokens"] == 3 and details["audio"]["prompt_sha256"] == media_bench.prompt_digest([1, 2, 3])
    with pytest.raises(RuntimeError, match="not within its time to first token"):
        media_bench.measure(lambda req: media_bench.Sample(0, 0.6, 0.5, 1.5, 5, [1]), s)
    with pytest.raises(RuntimeError, match="generated 3 tokens, not 5"):
        media_bench.measure(lambda req: media_bench.Sample(0, 0.1, 0.5, 1.5, 3, [1]), s)


def test_a_kernel_or_dtype_the_engine_did_not_load_fails_the_arm():
    from edge_infer.bench.measures.media import verify_loaded

    choice = SimpleNamespace(kind="encoder linears", label="cpu-w4a8 [avx2]")
    plan = SimpleNamespace(settings={"dtype": "bfloat16"}, kernels=SimpleNamespace(choices=[choice]))
    ready = SimpleNamespace(dtype="bfloat16", linear_kernels={"encoder linears": "cpu-w4a8 [avx2]"})
    assert verify_loaded(plan, ready) == []
    ready = SimpleNamespace(dtype="float32", linear_kernels={"encoder linears": "onednn-bf16"})
    assert verify_loaded(plan, ready) == ["dtype: plan bfloat16, engine loaded float32",
                                          "encoder linears: plan cpu-w4a8 [avx2], engine loaded onednn-bf16"]


def test_bad_settings_and_a_checkpoint_that_does_not_fit_are_refused_with_the_reason(omni, tmp_path, capsys, monkeypatch):
    from edge_infer.bench.baselines import transformers_media

    assert main(["bench", "media", str(omni), "--max-num-seqs", "2"]) == 2
    assert "drop --max-num-seqs" in capsys.readouterr().err
    assert main(["bench", "media", str(omni), "--media", "image,video"]) == 2
    assert "--media image,video: choose among image, audio, both" in capsys.readouterr().err
    (tmp_path / "config.json").write_text(json.dumps({"architectures": ["Qwen2ForCausalLM"]}))
    assert main(["bench", "transformers", "media", str(tmp_path)]) == 1
    assert "is a Qwen2ForCausalLM; bench transformers media runs Qwen2_5OmniThinkerForConditionalGeneration" in capsys.readouterr().err
    monkeypatch.setattr("edge_infer.hardware.memory.available_memory_bytes", lambda: 1 << 20)
    with pytest.raises(RuntimeError, match="refused before loading"):
        transformers_media.weights_fit(omni, 4)


@pytest.mark.parametrize("spec_path", [SPEC, SPEC.with_name("media-qwen2.5-omni-3b-amx.json")], ids=["plain", "amx"])
def test_the_published_spec_runs_every_arm_on_two_cores_and_each_command_parses(spec_path):
    spec = load_spec(spec_path)
    assert spec.cores == "0-1" and spec.metric == "image_ttft_ms"
    tags = [arm.tag for arm in spec.arms]
    assert {"edge-infer-bf16", "edge-infer-w4a8", "edge-infer-w4a16", "transformers-bf16"} <= set(tags)
    for arm in spec.arms:
        words = shlex.split(arm.command.replace("${EDGE_INFER:-edge-infer}", "edge-infer"))[1:]
        args = build_parser(words[0]).parse_args(words)
        assert args.tag == arm.tag and args.media == "image,audio,both" and args.image_size == 448
        assert args.audio_seconds == 10 and (args.num_threads if args.bench_command == "media" else args.threads) == 2


def test_the_llamacpp_arm_hands_libmtmd_one_marker_per_media_item_of_the_chat_template(omni):
    """libmtmd adds its own start and end markers and the embedding rows: each item's span in the rendered
    template (start marker, placeholder, end marker) becomes its one media marker, the text around it kept."""
    from transformers import AutoTokenizer

    from edge_infer.bench.baselines.llamacpp_media import with_media_markers

    s = media_bench.MediaBenchSettings(image_size=112, audio_seconds=2)
    text = AutoTokenizer.from_pretrained(omni).apply_chat_template(
        media_bench.request("both", s, 0).template_messages(), tokenize=False, add_generation_prompt=True)
    marked = with_media_markers(text, "<__media__>")
    assert marked.count("<__media__>") == 2
    assert not any(token in marked for token in ("<|IMAGE|>", "<|AUDIO|>", "<|vision_bos|>", "<|audio_eos|>"))
    assert marked.replace("<__media__>", "") == "".join(text.split("<|vision_bos|><|IMAGE|><|vision_eos|>")).replace(
        "<|audio_bos|><|AUDIO|><|audio_eos|>", "")
    assert media_bench.QUESTIONS["both"] in marked


def test_the_llamacpp_arm_without_libmtmd_fails_naming_the_build_flag(omni):
    llama_cpp = pytest.importorskip("llama_cpp", reason="llama-cpp-python (the baseline extra) is not installed")
    try:
        import llama_cpp.mtmd_cpp  # noqa: F401
    except (ImportError, OSError):
        pass
    else:
        pytest.skip(f"this llama-cpp-python ({llama_cpp.__file__}) has libmtmd")
    gguf = Path(omni) / "none.gguf"
    done = run_cli("bench", "llamacpp", "media", str(gguf), "--mmproj", str(gguf), "--tokenizer", str(omni), *SMALL)
    assert done.returncode == 1 and "built without libmtmd" in done.stderr and "-DLLAVA_BUILD=ON" in done.stderr, done.stderr
