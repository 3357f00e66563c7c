"""The load transient the plan books for blocked repacking holds on a real shape."""
from __future__ import annotations


def test_blocked_repack_bounds_the_planned_load_transient_on_a_real_shape():
    from edge_infer.config import QuantConfig
    from edge_infer.models.config import ModelConfig
    from edge_infer.models.synth import model_config
    from edge_infer.models.weights import weight_specs
    from edge_infer.quant.sizes import repack_transient_bytes

    cfg = ModelConfig.from_dict(model_config("qwen2", "qwen2.5-0.5b", "bfloat16"))
    blocked = repack_transient_bytes(weight_specs(cfg), QuantConfig(), cfg.tie_word_embeddings, 2)
    assert blocked <= 20 << 20  # one block of about a million weights, not gate/up (9728 x 896) whole
