"""Code2Wav's planned bytes against what it holds: activations at the released shapes, weights as loaded."""
from __future__ import annotations

import weakref
from pathlib import Path

import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode

from edge_infer.hardware.cpu import detect
from edge_infer.models.qwen3_tts.code2wav import Code2Wav, load_code2wav
from edge_infer.models.qwen3_tts.code2wav_shapes import decode_activation_bytes
from edge_infer.models.qwen3_tts.config import load_code2wav_config, parse_code2wav_config
from edge_infer.models.qwen3_tts.presets import checkpoint_spec
from edge_infer.tts.planning import code2wav_weight_bytes

pytestmark = pytest.mark.slow
TINY = Path(__file__).resolve().parents[1] / "fixtures" / "qwen3_tts" / "tiny"
# The dtype Code2Wav runs in here (dtype auto): bf16 where the CPU has it natively; where bf16 is emulated
# a decode at the released shapes takes minutes, and auto picks fp32 anyway.
DTYPE = torch.bfloat16 if detect().native_bf16 else torch.float32


class LiveTensorPeak(TorchDispatchMode):
    """The peak of the bytes held by tensors the operators create (storages counted once, until freed)."""

    def __init__(self, ignore: list[torch.Tensor]) -> None:
        super().__init__()
        self.live = self.peak = 0
        # (oneDNN-packed weights have no storage to name; they are weights, not activations, either way.)
        self.seen = {t.untyped_storage().data_ptr() for t in ignore if not t.is_mkldnn}

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        for t in out if isinstance(out, (tuple, list)) else [out]:
            if not isinstance(t, torch.Tensor):
                continue
            storage = t.untyped_storage()
            key, size = storage.data_ptr(), storage.nbytes()
            if size and key not in self.seen:
                self.seen.add(key)
                self.live += size
                self.peak = max(self.peak, self.live)
                weakref.finalize(storage, self._freed, key, size)
        return out

    def _freed(self, key: int, size: int) -> None:
        self.live -= size
        self.seen.discard(key)


@pytest.fixture(scope="module")
def released() -> tuple[Code2Wav, object]:
    config = parse_code2wav_config(checkpoint_spec("qwen3-tts-0.6b").speech_tokenizer_config)
    torch.manual_seed(0)
    return Code2Wav(config).to(DTYPE).eval().pack(), config


@pytest.mark.parametrize("frames", [8, 33])  # the default chunk, and a chunk after 25 frames of left context
def test_a_carried_state_decode_stays_within_the_planned_activation_bytes(released, frames):
    model, config = released
    codes = torch.randint(0, config.codebook_size, (frames, config.num_quantizers), generator=torch.Generator().manual_seed(1))
    state = model.new_state()
    model(codes, state)  # the state's carried columns exist before the measured chunk
    tracker = LiveTensorPeak(list(model.parameters()) + list(state.tails.values()))
    with tracker:
        pcm = model(codes, state)
    assert pcm.shape == (frames * config.samples_per_frame,)
    bound = decode_activation_bytes(config, frames, DTYPE.itemsize)
    assert 0.5 * bound < tracker.peak <= bound, (tracker.peak, bound)


def test_planned_weight_bytes_equal_the_loaded_weights():
    model = load_code2wav(TINY, load_code2wav_config(TINY), torch.bfloat16)
    loaded = sum(p.numel() * p.element_size() for p in model.parameters())
    assert code2wav_weight_bytes(TINY, 2) == loaded
