"""Fidelity metrics: exact for identical models, ranking quantizers on the trained demo model."""
from __future__ import annotations

import json

import pytest
import torch

from edge_infer.cli import main
from edge_infer.config import QuantConfig
from edge_infer.models.checkpoint import demo_model_dir
from edge_infer.quant.export import quantize_checkpoint
from edge_infer.quant.sizes import TENSOR_GROUP
from edge_infer.bench.measures.fidelity_metrics import measure_fidelity

PROMPTS = [[5, 17, 99, 3, 250, 41, 7], [300, 2, 2, 64, 18], [11, 12, 13]]


def test_a_model_against_itself_is_perfect(tied_model, make_core):
    report = measure_fidelity(make_core(tied_model), make_core(tied_model), PROMPTS, max_new_tokens=6)
    assert report.top1_agreement == 1.0
    assert report.mean_kl == pytest.approx(0.0, abs=1e-9)
    assert report.greedy_kept_fraction == 1.0
    assert report.greedy_exact_matches == len(PROMPTS)
    assert report.positions == sum(len(p) + 6 - 1 for p in PROMPTS)


def test_int4_differs_measurably_from_its_reference(tied_model, make_core):
    report = measure_fidelity(make_core(tied_model), make_core(tied_model, QuantConfig(group_size=32)), PROMPTS, 6)
    assert report.mean_kl > 1e-3
    assert report.top1_agreement < 1.0
    d = report.to_dict()
    assert d["num_prompts"] == 3 and len(d["per_prompt"]) == 3


def test_a_simulated_quantizer_computes_what_the_kernel_computes(tmp_path, untied_model, make_core):
    """--simulate writes the weights the int4 kernel would use, so simulated quantizers are comparable."""
    quant = QuantConfig(group_size=32, symmetric=False, quantize_head=True)
    simulated = quantize_checkpoint(untied_model, tmp_path / "sim", quant, simulate=True).out_dir
    expected = make_core(untied_model, quant, dtype="float32").score(PROMPTS[0])
    assert torch.allclose(make_core(simulated, dtype="float32").score(PROMPTS[0]), expected, atol=1e-3, rtol=1e-3)


def test_bench_fidelity_command_prints_json(chat_model, tmp_path, capsys):
    prompts = tmp_path / "prompts.txt"
    prompts.write_text("# two prompts\nWhat is the capital of France?\n\nCount from one to ten.\n")
    out = tmp_path / "fidelity.json"
    argv = ["bench", "fidelity", "--reference", str(chat_model), "--candidate-quantization", "cpu_int4", "--group-size", "32",
            "--prompts", str(prompts), "--max-new-tokens", "4", "--json", "--out", str(out)]
    assert main(argv) == 0
    line = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert line["num_prompts"] == 2
    assert 0.0 <= line["top1_agreement"] <= 1.0 and line["mean_kl"] >= 0.0
    assert "cpu_int4 g32 sym" in line["candidate"]
    assert len(json.loads(out.read_text())["per_prompt"]) == 2


def test_bench_fidelity_compares_an_int8_kv_cache_with_the_16_bit_one(demo_model, capsys):
    argv = ["bench", "fidelity", "--reference", str(demo_model), "--candidate-kv-cache-dtype", "int8", "--max-new-tokens", "8",
            "--json"]
    assert main(argv) == 0
    line = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert line["candidate"].endswith("int8 kv]") and not line["reference"].endswith("int8 kv]")
    # int8 K/V change the distributions measurably, but not the trained model's greedy choices much
    assert 0.0 < line["mean_kl"] < 0.01 and line["greedy_kept_fraction"] > 0.8


def test_bench_fidelity_refuses_a_candidate_that_is_the_reference(chat_model, capsys):
    assert main(["bench", "fidelity", "--reference", str(chat_model)]) == 2
    assert "--candidate" in capsys.readouterr().err


@pytest.mark.slow
def test_fidelity_ranks_w4a16_g128_above_a_deliberately_bad_quantizer(tmp_path, make_core):
    """The metric must rank: on the trained demo model, W4A16 g128 is closer to bf16 than
    4-bit codes with one scale per whole matrix (simulated: the kernel cannot run it)."""
    from edge_infer.models.generation_config import GenerationDefaults
    from edge_infer.models.tokenizer import Tokenizer
    from edge_infer.bench.measures.fidelity_metrics import DEFAULT_PROMPTS

    demo = demo_model_dir()
    tok = Tokenizer(demo)
    prompts = [tok.encode_chat([{"role": "user", "content": t}])[1] for t in DEFAULT_PROMPTS]
    bad = quantize_checkpoint(demo, tmp_path / "bad", QuantConfig(group_size=TENSOR_GROUP), simulate=True).out_dir
    # As `edge-infer bench fidelity` runs: the reference's continuations end at its end-of-turn token.
    eos = GenerationDefaults.from_dir(demo, tok.eos_token_id).eos_token_ids
    settings = dict(max_model_len=256, max_num_batched_tokens=256, eos_token_ids=eos)
    reference = make_core(demo, **settings)
    g128 = measure_fidelity(reference, make_core(demo, QuantConfig(group_size=128), **settings), prompts)
    per_tensor = measure_fidelity(reference, make_core(bad, **settings), prompts)
    for name, report in (("W4A16 g128", g128), ("one scale per matrix", per_tensor)):
        print(f"\n{name}: " + json.dumps({k: v for k, v in report.to_dict().items() if k != "per_prompt"}))
    # The distribution metrics (hundreds of positions) must rank the two. Greedy divergence over
    # 24 short continuations is reported but does not resolve a gap this small (both keep ~95%).
    assert g128.mean_kl < per_tensor.mean_kl
    assert g128.top1_agreement > per_tensor.top1_agreement
    assert 0.0 < g128.greedy_kept_fraction <= 1.0


@pytest.mark.slow
def test_w8a8_is_closer_to_bf16_than_w4a8(make_core):
    """On the trained demo model, 8-bit weights (cpu_w8a8) keep more of bf16's distribution than 4-bit weights
    with the same int8 activations and groups (cpu_w4a8): the near-lossless choice is measurably that."""
    from edge_infer.models.generation_config import GenerationDefaults
    from edge_infer.models.tokenizer import Tokenizer
    from edge_infer.bench.measures.fidelity_metrics import DEFAULT_PROMPTS
    from edge_infer.quant.native import missing_requirement

    if missing_requirement("cpu-w8a8") is not None:
        pytest.skip(missing_requirement("cpu-w8a8"))
    demo = demo_model_dir()
    tok = Tokenizer(demo)
    prompts = [tok.encode_chat([{"role": "user", "content": t}])[1] for t in DEFAULT_PROMPTS[::3]]
    eos = GenerationDefaults.from_dir(demo, tok.eos_token_id).eos_token_ids
    settings = dict(max_model_len=256, max_num_batched_tokens=256, eos_token_ids=eos)
    reference = make_core(demo, **settings)
    reports = {name: measure_fidelity(reference, make_core(demo, QuantConfig.named(name, group_size=128), **settings), prompts)
               for name in ("cpu_w4a8", "cpu_w8a8")}
    for name, report in reports.items():
        print(f"\n{name} g128: " + json.dumps({k: v for k, v in report.to_dict().items() if k != "per_prompt"}))
    assert reports["cpu_w8a8"].mean_kl < reports["cpu_w4a8"].mean_kl / 2
    assert reports["cpu_w8a8"].top1_agreement >= reports["cpu_w4a8"].top1_agreement
