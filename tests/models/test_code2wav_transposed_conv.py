"""Code2Wav's transposed conv, computed as one matrix product, equals ``conv_transpose1d``."""
from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from edge_infer.models.qwen3_tts.code2wav import CausalTransposedConv, DecodeState
from edge_infer.models.qwen3_tts.config import parse_code2wav_config
from edge_infer.models.qwen3_tts.presets import checkpoint_spec


def reference(layer: CausalTransposedConv, x: torch.Tensor) -> torch.Tensor:
    """PyTorch's transposed conv over the whole input, the tail past its end cut."""
    conv = layer.conv
    y = F.conv_transpose1d(x, conv.weight, conv.bias, stride=layer.stride)
    return y[..., : x.shape[-1] * layer.stride]


@pytest.mark.parametrize("cin, cout, stride, taps", [(7, 5, 3, 2), (6, 4, 4, 1), (5, 3, 2, 3)])
def test_whole_and_streamed_outputs_equal_conv_transpose(cin, cout, stride, taps):
    torch.manual_seed(0)
    layer = CausalTransposedConv(cin, cout, stride * taps, stride)
    x = torch.randn(1, cin, 11)
    expected = reference(layer, x)
    with torch.no_grad():
        torch.testing.assert_close(layer(x), expected, rtol=1e-5, atol=1e-5)
        state = DecodeState(parse_code2wav_config(checkpoint_spec("tiny").speech_tokenizer_config))
        chunks = [layer(x[..., a:b], state) for a, b in ((0, 1), (1, 5), (5, 11))]
    torch.testing.assert_close(torch.cat(chunks, dim=-1), expected, rtol=1e-5, atol=1e-5)


def test_a_kernel_that_is_not_a_multiple_of_the_stride_is_refused():
    with pytest.raises(ValueError, match="not a multiple of its stride"):
        CausalTransposedConv(4, 4, 5, 2)
