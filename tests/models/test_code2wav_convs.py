"""Code2Wav's convs, computed as matrix products or rearranged convs, equal PyTorch's ``conv1d`` and
``conv_transpose1d`` over a whole input and streamed in chunks with a carried state."""
from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from edge_infer.models.qwen3_tts.code2wav import CausalConv, CausalTransposedConv, DecodeState
from edge_infer.models.qwen3_tts.config import parse_code2wav_config
from edge_infer.models.qwen3_tts.presets import checkpoint_spec


def new_state() -> DecodeState:
    return DecodeState(parse_code2wav_config(checkpoint_spec("tiny").speech_tokenizer_config))


def whole_and_streamed(layer, x: torch.Tensor, cuts: list[int]) -> tuple[torch.Tensor, torch.Tensor]:
    state = new_state()
    with torch.no_grad():
        whole = layer(x)
        chunks = [layer(x[..., a:b], state) for a, b in zip(cuts, cuts[1:])]
    return whole, torch.cat(chunks, dim=-1)


@pytest.mark.parametrize("cin, cout, stride, taps", [(7, 5, 3, 2), (6, 4, 4, 1), (5, 3, 2, 3), (40, 6, 5, 2)])
@pytest.mark.parametrize("polyphase", [False, True])
def test_transposed_conv_equals_conv_transpose_in_both_layouts(cin, cout, stride, taps, polyphase):
    torch.manual_seed(0)
    layer = CausalTransposedConv(cin, cout, stride * taps, stride, polyphase)
    x = torch.randn(1, cin, 11)
    with torch.no_grad():
        expected = F.conv_transpose1d(x, layer.conv.weight, layer.conv.bias, stride=stride)[..., : 11 * stride]
    layer.pack()
    assert (layer.phases is not None) == polyphase
    whole, streamed = whole_and_streamed(layer, x, [0, 1, 5, 11])
    torch.testing.assert_close(whole, expected, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(streamed, expected, rtol=1e-5, atol=1e-5)


def test_a_kernel_that_is_not_a_multiple_of_the_stride_is_refused():
    with pytest.raises(ValueError, match="not a multiple of its stride"):
        CausalTransposedConv(4, 4, 5, 2)


@pytest.mark.parametrize("cin, cout, kernel, dilation", [(64, 16, 7, 1), (64, 8, 7, 3), (64, 16, 1, 1), (9, 5, 3, 2)])
@pytest.mark.parametrize("columns", [1, 5, 40])  # few columns for 64 channels (the product) and many (conv1d)
def test_causal_conv_equals_conv1d_whole_and_streamed(cin, cout, kernel, dilation, columns):
    torch.manual_seed(0)
    layer = CausalConv(cin, cout, kernel, dilation)
    x = torch.randn(1, cin, columns)
    expected = F.conv1d(F.pad(x, ((kernel - 1) * dilation, 0)), layer.conv.weight, layer.conv.bias, dilation=dilation)
    whole, streamed = whole_and_streamed(layer, x, sorted({0, 1, columns // 2, columns}))
    torch.testing.assert_close(whole, expected, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(streamed, expected, rtol=1e-5, atol=1e-5)
