"""The loader's staging buffer: weights oneDNN reorders are read into one reused buffer, and no linear keeps it."""
from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from edge_infer.hardware.cpu import detect
from edge_infer.hardware.kernels import KERNELS
from edge_infer.models import loader
from edge_infer.models.config import ModelConfig
from edge_infer.models.layers.linear import Linear
from edge_infer.models.llama import DecoderLM
from edge_infer.models.loader import (CheckpointReader, fill_concatenated, install_dense, load_weights,
                                      release_staging, staged_rows)
from edge_infer.models.multimodal import MultimodalLM

_onednn_missing = KERNELS["onednn-bf16"].missing(detect())
needs_onednn_bf16 = pytest.mark.skipif(_onednn_missing is not None, reason=str(_onednn_missing))


def test_one_buffer_serves_successive_weights_and_is_freed_on_request():
    with loader._staging_scope():
        first = staged_rows((4, 8), torch.bfloat16)
        second = staged_rows((2, 8), torch.bfloat16)
        assert second.data_ptr() == first.data_ptr()  # memory already touched, not fresh
        grown = staged_rows((64, 64), torch.float32)
        assert grown.shape == (64, 64) and grown.dtype == torch.float32
        release_staging()  # before a quantized linear: its own working set, not this buffer's on top
        assert loader._staging().buffer is None
    outside = staged_rows((4, 8), torch.bfloat16)
    assert loader._staging() is None and outside.untyped_storage().nbytes() == 4 * 8 * 2


def _model(path) -> DecoderLM:
    cfg = ModelConfig.from_dir(path)
    return MultimodalLM(cfg, 64) if cfg.multimodal is not None else DecoderLM(cfg, 64)


@needs_onednn_bf16
@pytest.mark.parametrize("kind", ["llama", "qwen2_5_omni"])
def test_every_reordered_linear_computes_with_its_own_checkpoint_weight(kind, hf_checkpoints, synth_thinkers):
    """All of a model's oneDNN linears were staged in one buffer, each overwriting the one before: every one must
    still multiply by the weight the checkpoint holds for it (fused q/k/v and gate/up included)."""
    path = synth_thinkers[kind] if kind in synth_thinkers else hf_checkpoints[kind]
    model = _model(path)
    load_weights(model, path, torch.bfloat16, install_dense("onednn"))
    gen = torch.Generator().manual_seed(0)
    checked = 0
    with CheckpointReader(path) as reader:
        for spec in model.weight_specs():
            linear = getattr(*model.resolve(spec.target))
            if not isinstance(linear, Linear):
                continue
            assert linear.kernel.name == "onednn-bf16"
            weight = torch.empty(linear.out_features, linear.in_features, dtype=torch.bfloat16)
            fill_concatenated(reader, spec.sources, weight)
            x = torch.randn(3, linear.in_features, generator=gen).bfloat16()
            expected = F.linear(x, weight).float()
            error = (linear.kernel(x).float() - expected).norm() / expected.norm()
            assert error < 1e-2, f"{spec.target}: relative error {error:.3g}"
            checked += 1
    assert checked >= 8


@needs_onednn_bf16
def test_quantized_towers_load_without_the_decoders_staged_rows_held(synth_thinkers, monkeypatch):
    """A bf16 decoder on oneDNN (its rows staged) and cpu_int4 towers in one load: every quantized linear is filled
    with the staging buffer freed, so the load holds one working set at a time, as the plan counts it."""
    from edge_infer.config import QuantConfig
    from edge_infer.engine.core import thinker_installer
    from edge_infer.quant import install
    from edge_infer.quant.install import quantized_installer

    held = []
    fill = install.fill_kernel
    monkeypatch.setattr(install, "fill_kernel", lambda *a, **kw: (held.append(loader._staging().buffer), fill(*a, **kw)))
    path = synth_thinkers["qwen2_5_omni"]
    model = _model(path)
    dense = install_dense("onednn")
    load_weights(model, path, torch.bfloat16, thinker_installer(dense, quantized_installer(QuantConfig(group_size=32), dense)))
    assert model.layers[0].gate_up.kernel.name == "onednn-bf16"
    assert held and all(buffer is None for buffer in held)
