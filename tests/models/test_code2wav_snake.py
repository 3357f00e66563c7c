"""Code2Wav's SnakeBeta in the native kernel (one vectorized pass, its own sine) equals the PyTorch formula
to float rounding, special values included, and an fp32 decoder uses it wherever the kernels run."""
from __future__ import annotations

import pytest
import torch

from edge_infer.models.qwen3_tts.code2wav import SnakeBeta
from edge_infer.quant.native import missing_requirement, vector_variant

pytestmark = pytest.mark.skipif(missing_requirement() is not None, reason=str(missing_requirement()))


def both_ways(layer: SnakeBeta, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    layer.kernel_variant = None
    formula = layer(x)
    layer.kernel_variant = vector_variant()
    return layer(x), formula


@pytest.mark.parametrize("scale", [0.1, 1.0, 30.0, 3000.0])
def test_the_kernel_equals_the_formula_to_float_rounding(scale):
    torch.manual_seed(0)
    layer = SnakeBeta(24)
    with torch.no_grad():
        layer.alpha.normal_(0, 0.5)
        layer.beta.normal_(0, 0.5)
    x = torch.randn(1, 24, 301) * scale  # an odd length: the vector loop's remainder too
    kernel, formula = both_ways(layer, x)
    # Both round x + (a value under 1 / beta) to float, so they differ by about one unit in the last place of x.
    bound = x.abs() * 2.0**-22 + 4e-6
    assert bool(((kernel - formula).abs() <= bound).all()), float((kernel - formula).abs().max())


def test_nan_infinity_and_arguments_past_the_reduction_take_the_library_sine():
    layer = SnakeBeta(4)
    x = torch.zeros(1, 4, 40)
    x[0, 0, 3], x[0, 1, 5], x[0, 2, 7], x[0, 3, 39] = float("nan"), float("inf"), -1e9, 5e6
    kernel, formula = both_ways(layer, x)
    assert torch.equal(kernel.isnan(), formula.isnan()) and int(kernel.isnan().sum()) == 2
    assert torch.equal(kernel.nan_to_num(), formula.nan_to_num())


def test_an_fp32_decoder_given_the_variant_runs_its_snakes_in_the_kernel_and_a_bf16_one_in_pytorch(tmp_path):
    from edge_infer.models.qwen3_tts.code2wav import load_code2wav
    from edge_infer.models.qwen3_tts.config import load_code2wav_config
    from edge_infer.models.qwen3_tts.synth import write_random_checkpoint

    model = write_random_checkpoint(tmp_path / "tts", "tiny")
    config = load_code2wav_config(model)
    for dtype, expected in ((torch.float32, vector_variant()), (torch.bfloat16, None)):
        decoder = load_code2wav(model, config, dtype, snake_variant=vector_variant())
        snakes = [m for m in decoder.modules() if isinstance(m, SnakeBeta)]
        assert snakes and all(m.kernel_variant == expected for m in snakes)
