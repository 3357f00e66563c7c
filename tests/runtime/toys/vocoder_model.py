"""A tiny torch vocoder (codes -> PCM) for tests, and its ONNX export.

It stands in for a real Code2Wav stage: an embedding of the codes, a 1-D
convolution and a transposed convolution that upsamples each frame to
``samples_per_token`` samples. Weights come from a seeded generator, so the
same settings always build the same model (in any process).
"""
from __future__ import annotations

import warnings
from pathlib import Path

import torch
from torch import nn

ONNX_INPUT = "codes"
ONNX_OUTPUT = "pcm"


class ToyVocoderModel(nn.Module):
    def __init__(self, vocab_size: int, channels: int, samples_per_token: int):
        super().__init__()
        self.embed = nn.Embedding(vocab_size, channels)
        self.conv = nn.Conv1d(channels, channels, kernel_size=3, padding=1)
        self.up = nn.ConvTranspose1d(channels, 1, kernel_size=samples_per_token, stride=samples_per_token)

    def forward(self, codes: torch.Tensor) -> torch.Tensor:
        """codes [frames, codebooks] int64 -> PCM [frames * samples_per_token] in [-1, 1]."""
        x = self.embed(codes).sum(dim=1)  # codebooks add up, as in residual codecs
        x = torch.tanh(self.conv(x.t().unsqueeze(0)))
        return torch.tanh(self.up(x)).reshape(-1)


def build_toy_vocoder(vocab_size: int, channels: int, samples_per_token: int, seed: int) -> ToyVocoderModel:
    model = ToyVocoderModel(vocab_size, channels, samples_per_token)
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for param in model.parameters():
            fan_in = param.shape[1] * (param.shape[2] if param.ndim == 3 else 1) if param.ndim > 1 else 1
            param.copy_(torch.randn(param.shape, generator=gen) / fan_in**0.5)
    return model.eval()


def export_toy_vocoder_onnx(path: str | Path, *, vocab_size: int = 256, channels: int = 8, samples_per_token: int = 240, seed: int = 0) -> Path:
    """Write the toy vocoder as an ONNX model (needs the ``onnx`` package)."""
    import onnx

    path = Path(path)
    model = build_toy_vocoder(vocab_size, channels, samples_per_token, seed)
    example = torch.zeros(4, 1, dtype=torch.long)
    with warnings.catch_warnings():
        # The TorchScript exporter is the one that needs no extra package (onnxscript);
        # its deprecation notice is not actionable here.
        warnings.simplefilter("ignore", DeprecationWarning)
        torch.onnx.export(
            model, (example,), str(path), dynamo=False, opset_version=17,
            input_names=[ONNX_INPUT], output_names=[ONNX_OUTPUT],
            dynamic_axes={ONNX_INPUT: {0: "frames", 1: "codebooks"}, ONNX_OUTPUT: {0: "samples"}},
        )
    proto = onnx.load(str(path))
    for key, value in (("vocab_size", vocab_size), ("samples_per_token", samples_per_token)):
        entry = proto.metadata_props.add()
        entry.key, entry.value = key, str(value)
    onnx.save(proto, str(path))
    return path
