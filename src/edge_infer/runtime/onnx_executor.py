"""An external stage backend: a vocoder exported to ONNX, run by ONNX Runtime.

The stage runs in its own process like any other, but its compute is another
engine's. It speaks the same contracts (codes in, ``pcm_audio/1`` out) and its
reservation goes into the same shared-RAM ledger. The device selects the ONNX
Runtime execution providers; when none of them is installed the stage refuses
to start rather than falling back to the CPU silently.

Needs the optional extra ``external`` (``pip install 'edge-infer[external]'``).
"""
from __future__ import annotations

import os
from typing import TYPE_CHECKING

import numpy as np
from pydantic import Field

from edge_infer.runtime.chunked_vocoder import ChunkedVocoder, VocoderOptions
from edge_infer.runtime.executors import ReservationPlan

if TYPE_CHECKING:  # pragma: no cover
    from edge_infer.runtime.config import StageConfig

MiB = 1 << 20

# Providers tried per device, in order of preference.
PROVIDERS = {
    "cpu": ("CPUExecutionProvider",),
    "igpu": ("DmlExecutionProvider", "OpenVINOExecutionProvider", "ROCMExecutionProvider"),
    "npu": ("VitisAIExecutionProvider", "OpenVINOExecutionProvider", "QNNExecutionProvider"),
}


class OnnxVocoderOptions(VocoderOptions):
    intra_op_threads: int = Field(default=1, ge=1)


class OnnxVocoderExecutor(ChunkedVocoder):
    kinds = frozenset({"external"})
    devices = frozenset(PROVIDERS)
    Options = OnnxVocoderOptions
    requires_model = True
    # RssAnon of its stage process with an ONNX Runtime CPU session of a tiny model (the
    # test suite's toy vocoder): ~38 MiB measured, with margin (a real model's arena grows with it: set runtime_bytes).
    RUNTIME_BYTES = 64 * MiB

    @classmethod
    def plan(cls, stage: StageConfig) -> ReservationPlan:
        opts = cls.options(stage)
        if not stage.model or not os.path.isfile(stage.model):
            raise FileNotFoundError(f"{stage.label}: ONNX model {stage.model!r} not found; set model: to an .onnx file (relative to the deploy config)")
        # Initializers are copied into the session: the file size bounds the weights.
        weights = os.path.getsize(stage.model)
        return ReservationPlan(weights_bytes=weights, buffers_bytes=4 * cls.chunk_bytes(opts), runtime_bytes=cls.RUNTIME_BYTES, max_payload_bytes=cls.chunk_bytes(opts))

    def start(self, stage: StageConfig) -> None:
        super().start(stage)
        try:
            import onnxruntime as ort
        except ImportError:
            raise RuntimeError(f"{stage.label} needs onnxruntime: pip install 'edge-infer[external]'") from None
        if not stage.model or not os.path.isfile(stage.model):
            raise FileNotFoundError(f"{stage.label}: ONNX model {stage.model!r} not found")
        available = ort.get_available_providers()
        chosen = [p for p in PROVIDERS[stage.device] if p in available]
        if not chosen:
            raise RuntimeError(
                f"{stage.label} on {stage.device} needs one of the ONNX Runtime providers "
                f"{', '.join(PROVIDERS[stage.device])}; this onnxruntime has {', '.join(available)}. "
                f"Install an onnxruntime build for the device or set device: cpu"
            )
        so = ort.SessionOptions()
        so.intra_op_num_threads = self.opts.intra_op_threads
        so.inter_op_num_threads = 1
        self.session = ort.InferenceSession(stage.model, sess_options=so, providers=chosen)
        meta = self.session.get_modelmeta().custom_metadata_map
        if int(meta.get("samples_per_token", self.opts.samples_per_token)) != self.opts.samples_per_token:
            raise ValueError(
                f"{stage.label}: the model makes {meta['samples_per_token']} samples per token but "
                f"executor_options.samples_per_token is {self.opts.samples_per_token}; make them agree"
            )
        self.vocab_size = int(meta.get("vocab_size", np.iinfo(np.int64).max))
        self.input_name = self.session.get_inputs()[0].name

    def synthesize(self, codes: np.ndarray) -> np.ndarray:
        return self.session.run(None, {self.input_name: codes})[0]
