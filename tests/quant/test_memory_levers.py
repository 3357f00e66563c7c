"""Each memory lever's alternative is reachable by a flag, reaches the engine, and the plan sizes it."""
from __future__ import annotations

import argparse

import torch

from edge_infer.engine.cli_args import add_engine_args, engine_settings
from edge_infer.engine.core import EngineCore
from edge_infer.memory.plan import plan_text_session
from edge_infer.quant.kernel import Int4Kernel

COMMON = ["--dtype", "bfloat16", "--max-model-len", "128", "--kv-cache-memory-bytes", str(1 << 20),
          "--quantization", "cpu_int4", "--group-size", "32"]
ALTERNATIVES = ["--rope-model-positions", "--no-trim", "--int4-keep-dense-copy", "--int4-repack", "whole"]


def load(model, flags: list[str]):
    parser = argparse.ArgumentParser()
    add_engine_args(parser)
    plan = plan_text_session(model, **engine_settings(parser.parse_args([str(model), *COMMON, *flags])))
    return plan, EngineCore(plan.engine_config)


def test_lever_alternatives_reach_the_engine_and_the_plan(tied_model):
    lever_plan, lever = load(tied_model, [])
    alt_plan, alt = load(tied_model, ALTERNATIVES)
    cfg = lever.model.cfg
    # RoPE: max_model_len positions, or the model's maximum.
    assert lever.ready_info.rope_bytes == lever_plan.item("rope tables") == 2 * 128 * cfg.head_dim * 4
    assert alt.ready_info.rope_bytes == alt_plan.item("rope tables") == 2 * cfg.max_position_embeddings * cfg.head_dim * 4
    # One packed copy, or a dense copy kept beside it: both planned exactly.
    assert lever.ready_info.weight_bytes == lever_plan.item("weights")
    assert alt.ready_info.weight_bytes == alt_plan.item("weights") > lever_plan.item("weights")
    int4 = [lin.kernel for _, lin in alt.model.linears() if isinstance(lin.kernel, Int4Kernel)]
    assert int4 and all(k.dense_copy is not None for k in int4)
    # Whole-tensor repacking: no smaller a planned load transient (equal here: one block holds
    # a whole linear of this tiny model), the same packed weights.
    assert alt_plan.item("load transient") >= lever_plan.item("load transient")
    assert alt_plan.engine_config.quant.repack == "whole"
    assert all(torch.equal(a, b) for a, b in zip(packed(alt), packed(lever)))
    # No malloc_trim: nothing released, and said so.
    assert alt.ready_info.trimmed_bytes == 0
    assert not alt_plan.engine_config.trim_after_load and lever_plan.engine_config.trim_after_load


def packed(core):
    return [lin.kernel.packed for _, lin in core.model.linears() if isinstance(lin.kernel, Int4Kernel)]



def test_blocked_repack_bounds_the_planned_load_transient_on_a_real_shape():
    from edge_infer.config import QuantConfig
    from edge_infer.models.config import ModelConfig
    from edge_infer.models.synth import model_config
    from edge_infer.models.weights import weight_specs
    from edge_infer.quant.sizes import repack_transient_bytes

    cfg = ModelConfig.from_dict(model_config("qwen2", "qwen2.5-0.5b", "bfloat16"))
    specs = weight_specs(cfg)
    blocked = repack_transient_bytes(specs, QuantConfig(), cfg.tie_word_embeddings, 2)
    whole = repack_transient_bytes(specs, QuantConfig(repack="whole"), cfg.tie_word_embeddings, 2)
    assert blocked <= 20 << 20  # one block of about a million weights
    assert whole == 9728 * 896 * 16  # gate/up, the largest linear, at 16 bytes per bf16 weight
