"""Toy stage executors: small, deterministic stand-ins for real stages in tests.

``ToyARExecutor`` (kind ``ar``) streams one token per step, computed from the
prompt and the tokens so far. ``ToyVocoderExecutor`` (kind ``generation``)
turns token ids or codec codes into PCM chunks through a tiny torch model, on
the product's ``ChunkedVocoder`` (as the ONNX vocoder is).
"""
from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import numpy as np
from pydantic import Field

from edge_infer.runtime.chunked_vocoder import ChunkedVocoder, VocoderOptions
from edge_infer.runtime.contracts import Payload
from edge_infer.runtime.executors import ExecutorOptions, ReservationPlan, StageExecutor, StageRequestError, StepOutput

if TYPE_CHECKING:  # pragma: no cover
    from edge_infer.runtime.config import StageConfig

MiB = 1 << 20


def toy_next_token(history: list[int], vocab_size: int, seed: int) -> int:
    """The toy AR model: a fixed function of the last tokens and the position."""
    return (31 * sum(history[-4:]) + 17 * len(history) + seed) % vocab_size


def toy_ar_tokens(prompt: list[int], max_tokens: int, vocab_size: int = 256, seed: int = 0) -> list[int]:
    history = list(prompt)
    for _ in range(max_tokens):
        history.append(toy_next_token(history, vocab_size, seed))
    return history[len(prompt):]


class ToyAROptions(ExecutorOptions):
    vocab_size: int = Field(default=256, ge=2)
    step_delay_s: float = Field(default=0.0, ge=0)
    # A prompt containing this token id fails with a request error (error-path tests).
    fail_on_token: int | None = None
    # A prompt containing this token id makes step() raise: the stage process dies (crash tests).
    crash_on_token: int | None = None


@dataclass
class _Sequence:
    max_tokens: int
    seed: int
    history: list[int] = field(default_factory=list)
    generated: int = 0
    ready: bool = False


class ToyARExecutor(StageExecutor):
    kinds = frozenset({"ar"})
    input_contracts = frozenset({"token_ids/1", "text/1"})
    output_contracts = frozenset({"token_ids/1"})
    Options = ToyAROptions
    DEFAULT_MAX_TOKENS = 16
    DEFAULT_MAX_MODEL_LEN = 4096
    # RssAnon of its stage process: ~30 MiB measured (Python 3.11, numpy, pydantic), with margin.
    # Checked by tests/runtime/test_external_backend.py. Spawn re-imports the parent's main module in
    # every stage process: a main module that imports torch adds ~120 MiB to each.
    RUNTIME_BYTES = 48 * MiB

    @classmethod
    def plan(cls, stage: StageConfig) -> ReservationPlan:
        max_len = stage.engine.max_model_len or cls.DEFAULT_MAX_MODEL_LEN
        # The "KV cache" of the toy is its token history: 8 bytes per position.
        return ReservationPlan(kv_bytes=stage.engine.max_num_seqs * max_len * 8, runtime_bytes=cls.RUNTIME_BYTES, max_payload_bytes=8)

    def start(self, stage: StageConfig) -> None:
        self.opts: ToyAROptions = self.options(stage)
        self.max_num_seqs = stage.engine.max_num_seqs
        self.max_model_len = stage.engine.max_model_len or self.DEFAULT_MAX_MODEL_LEN
        self.seqs: dict[str, _Sequence] = {}

    def submit(self, request_id: str, params: dict[str, Any]) -> None:
        max_tokens = params.get("max_tokens")
        self.seqs[request_id] = _Sequence(
            max_tokens=self.DEFAULT_MAX_TOKENS if max_tokens is None else int(max_tokens),
            seed=int(params.get("seed") or 0),
        )

    def feed(self, request_id: str, payload: Payload) -> None:
        if payload.contract == "text/1":
            ids = list(str(payload.data).encode("utf-8"))  # the toy "tokenizer": UTF-8 bytes
        else:
            ids = [int(t) for t in np.asarray(payload.data)]
        if self.opts.fail_on_token is not None and self.opts.fail_on_token in ids:
            raise StageRequestError(request_id, f"toy AR refuses token {self.opts.fail_on_token} (fail_on_token)")
        self.seqs[request_id].history.extend(i % self.opts.vocab_size for i in ids)

    def end_input(self, request_id: str) -> None:
        seq = self.seqs[request_id]
        if len(seq.history) + seq.max_tokens > self.max_model_len:
            raise StageRequestError(
                request_id,
                f"prompt of {len(seq.history)} tokens + max_tokens {seq.max_tokens} exceeds max_model_len {self.max_model_len}; "
                "lower max_tokens or raise engine.max_model_len",
            )
        seq.ready = True

    def has_work(self) -> bool:
        return any(s.ready for s in self.seqs.values())

    def step(self) -> list[StepOutput]:
        batch = [rid for rid, s in self.seqs.items() if s.ready][: self.max_num_seqs]
        crash = self.opts.crash_on_token
        if crash is not None and any(crash in self.seqs[rid].history for rid in batch):
            raise RuntimeError(f"toy AR crashes on token {crash} (crash_on_token)")
        if self.opts.step_delay_s:
            time.sleep(self.opts.step_delay_s)
        out = []
        for rid in batch:
            seq = self.seqs[rid]
            if seq.max_tokens == 0:
                out.append(StepOutput(rid, None, finished=True))
                del self.seqs[rid]
                continue
            token = toy_next_token(seq.history, self.opts.vocab_size, seq.seed)
            seq.history.append(token)
            seq.generated += 1
            done = seq.generated >= seq.max_tokens
            out.append(StepOutput(rid, Payload("token_ids/1", np.array([token], dtype=np.int64)), finished=done))
            if done:
                del self.seqs[rid]
        return out

    def abort(self, request_id: str) -> None:
        self.seqs.pop(request_id, None)


class ToyVocoderOptions(VocoderOptions):
    vocab_size: int = Field(default=256, ge=2)
    channels: int = Field(default=8, ge=1)
    seed: int = 0
    step_delay_s: float = Field(default=0.0, ge=0)  # a slow consumer (back-pressure tests)


class ToyVocoderExecutor(ChunkedVocoder):
    kinds = frozenset({"generation"})
    Options = ToyVocoderOptions
    # RssAnon of its stage process (torch imported, one thread): ~150 MiB measured, with margin.
    RUNTIME_BYTES = 192 * MiB

    @classmethod
    def plan(cls, stage: StageConfig) -> ReservationPlan:
        opts = cls.options(stage)
        c = opts.channels
        # float32 parameters of ToyVocoderModel: embedding, conv (k=3) + bias, transposed conv + bias.
        weights = (opts.vocab_size * c + c * c * 3 + c + c * opts.samples_per_token + 1) * 4
        # Activations of one chunk: embeddings, conv output, PCM (float32).
        activations = (2 * opts.chunk_tokens * opts.channels * 4) + cls.chunk_bytes(opts)
        return ReservationPlan(weights_bytes=weights, buffers_bytes=activations * stage.engine.max_num_seqs, runtime_bytes=cls.RUNTIME_BYTES, max_payload_bytes=cls.chunk_bytes(opts))

    def start(self, stage: StageConfig) -> None:
        super().start(stage)
        import torch

        from .vocoder_model import build_toy_vocoder

        torch.set_num_threads(1)  # one stage, one core: stages run side by side
        self.torch = torch
        self.vocab_size = self.opts.vocab_size
        self.model = build_toy_vocoder(self.opts.vocab_size, self.opts.channels, self.opts.samples_per_token, self.opts.seed)

    def step(self) -> list[StepOutput]:
        if self.opts.step_delay_s:
            time.sleep(self.opts.step_delay_s)
        return super().step()

    def synthesize(self, codes: np.ndarray) -> np.ndarray:
        with self.torch.inference_mode():
            return self.model(self.torch.from_numpy(codes)).numpy()
