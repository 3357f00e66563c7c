"""The engine core: model, KV cache, scheduler, runner and sampler in one loop.

``EngineCore.step()`` schedules one batch, runs one forward pass, samples and
reports a ``TokenDelta`` per request that progressed or ended. It knows token
ids only, and media as encoder features: a multimodal thinker's media item is
encoded (on ``encoder_threads``) when the first step that computes one of its
placeholder tokens is scheduled (an item that comes with its embeddings,
``MediaEmbeddings``, is placed as it is); its embeddings then replace its
features and stay with the sequence until it ends. It runs inside a worker
process by default (``engine.worker``).
"""
from __future__ import annotations

import logging
import os
import time
import traceback
from concurrent.futures import Future
from contextlib import contextmanager
from dataclasses import replace
from pathlib import Path
from typing import Callable, Iterator, Sequence as Seq

import numpy as np
import torch

from edge_infer.config import EngineConfig
from edge_infer.models.layers.kv_cache import KVCache, KVLayout
from edge_infer.engine.grammar import GrammarMatchers, met_limit
from edge_infer.engine.protocol import (
    GRAMMAR_DEAD_END, GRAMMAR_LIMIT, CoreStats, EngineRequest, MediaInput, ReadyInfo, TokenDelta, media_problem,
    mrope_positions, request_problem,
)
from edge_infer.engine.runner import ModelRunner
from edge_infer.engine.sampler import SampledToken, sample_row
from edge_infer.engine.scheduler import ScheduledSeq, Scheduler
from edge_infer.engine.sampling_params import SamplingParams
from edge_infer.engine.sequence import Sequence
from edge_infer.errors import CheckpointError
from edge_infer.memory.measure import malloc_trim
from edge_infer.models.config import ModelConfig
from edge_infer.models.layers.linear import make_kernel, onednn_bf16_available
from edge_infer.models.llama import DecoderLM
from edge_infer.models.multimodal import MultimodalLM
from edge_infer.models.checkpoint import check_checkpoint
from edge_infer.models.encoder_weights import is_tower_target
from edge_infer.models.loader import TORCH_DTYPES, LinearInstaller, install_dense, load_weights
from edge_infer.quant.native import enable_native_ops

log = logging.getLogger(__name__)



def configure_threads(requested: int | None) -> int:
    """Use the cores this process may run on (its affinity), not every core of the host."""
    n = requested or len(os.sched_getaffinity(0))
    torch.set_num_threads(n)
    return n


@contextmanager
def threads(n: int) -> Iterator[None]:
    """Run the block on ``n`` threads, then go back to the ones set before."""
    before = torch.get_num_threads()
    if n != before:
        torch.set_num_threads(n)
    try:
        yield
    finally:
        if n != before:
            torch.set_num_threads(before)


def weight_backend(config: EngineConfig) -> str:
    if config.weight_backend != "auto":
        return config.weight_backend
    return "onednn" if config.dtype == "bfloat16" and onednn_bf16_available() else "dense"


def linear_installer(config: EngineConfig) -> LinearInstaller:
    if config.quant is not None:
        from edge_infer.quant.install import quantized_installer

        return quantized_installer(config.quant, fallback=install_dense(weight_backend(config)))
    if config.weight_backend == "w16":
        from edge_infer.quant.widened import install_widened

        return install_widened
    return install_dense(weight_backend(config))


def tower_installer(config: EngineConfig) -> LinearInstaller:
    """A thinker's towers: dense in the engine's dtype, or the kernel --encoder-quantization names."""
    dense = install_dense(weight_backend(config))
    quant = config.encoder_quant()
    if quant is None:
        return dense
    from edge_infer.quant.install import quantized_installer

    return quantized_installer(quant, fallback=dense)


def thinker_installer(decoder: LinearInstaller, towers: LinearInstaller) -> LinearInstaller:
    """One load of a thinker: each linear by its target, the towers' (visual., audio_tower.) apart."""
    def install(linear, target, sources, reader, dtype) -> None:
        (towers if is_tower_target(target) else decoder)(linear, target, sources, reader, dtype)

    return install


def load_model(config: EngineConfig, progress: Callable[[int, int], None] | None = None) -> DecoderLM:
    cfg = ModelConfig.from_dir(config.model)
    # A thinker is its text decoder plus its media towers (models/multimodal.py): one weight list, one load, the
    # towers' linears on their own installer; without them (load_encoders false) the decoder alone.
    if cfg.multimodal is not None:
        model: DecoderLM = MultimodalLM(cfg, config.max_model_len, towers=config.load_encoders)
    else:
        model = DecoderLM(cfg, config.max_model_len)
    check_checkpoint(cfg, config.model, model.weight_specs())
    quantized_head = config.quant is not None and config.quant.quantize_head
    widened = config.weight_backend == "w16"  # 16-bit weights kept as stored, the table too (quant/widened.py)
    install = linear_installer(config)
    if cfg.multimodal is not None and config.load_encoders:
        install = thinker_installer(install, tower_installer(config))
    load_weights(
        model, config.model, TORCH_DTYPES[config.dtype], install, progress,
        head_from_embedding=(quantized_head or widened) and cfg.tie_word_embeddings,
        release=malloc_trim,
        table_dtype_as_stored=widened,
    )
    if config.packed_head and cfg.tie_word_embeddings and not quantized_head:
        if weight_backend(config) != "onednn":
            raise CheckpointError("packed_head needs the oneDNN bf16 kernel (dtype bfloat16 on a CPU with bf16 support)")
        model.lm_head.kernel = make_kernel(model.embed, "onednn")
    if config.quant is not None:
        from edge_infer.quant.fused_decode import offer

        offer(model, config.quant)
    enable_native_ops(TORCH_DTYPES[config.dtype])
    return model


class EngineCore:
    def __init__(self, config: EngineConfig, progress: Callable[[int, int], None] | None = None):
        t0 = time.perf_counter()
        self.config = config
        self.num_threads = configure_threads(config.num_threads)
        self.encoder_threads = config.encoder_threads or self.num_threads
        self.model = load_model(config, progress)
        cfg = self.model.cfg
        dtype = TORCH_DTYPES[config.dtype]
        self.layout = KVLayout.for_model(cfg, dtype.itemsize, config.block_size, int8=config.kv_cache_dtype == "int8")
        if self.layout.int8:  # the fused decode layer reads a 16-bit cache; with int8 codes decode runs the layers
            self.model.fused_factory = None
        trimmed = malloc_trim()
        self.cache = KVCache(self.layout, self.layout.blocks_for_budget(config.kv_cache_memory_bytes), dtype)
        self.scheduler = Scheduler(self.layout, self.cache.num_blocks, config.max_num_seqs, config.max_num_batched_tokens,
                                   config.prefix_caching)
        self.runner = ModelRunner(self.model, self.cache, config.max_num_seqs)
        self.generator = torch.Generator().manual_seed(config.seed)
        self.grammars = GrammarMatchers(Path(config.model) / "tokenizer.json", self.model.cfg.vocab_size,
                                        config.eos_token_ids)
        self.scheduler_params = SamplingParams(max_tokens=None)
        self.sequences: dict[str, Sequence] = {}
        self.stats = CoreStats(kv_blocks_total=self.cache.num_blocks)
        kernels: dict[str, int] = {}
        for _, lin in self.model.linears():
            if lin.kernel is not None:
                kernels[lin.kernel.name] = kernels.get(lin.kernel.name, 0) + 1
        self.ready_info = ReadyInfo(
            pid=os.getpid(),
            dtype=config.dtype,
            weight_bytes=self.model.resident_bytes(),
            decode_read_bytes=self.model.decode_read_bytes(),
            kv_cache_bytes=self.cache.nbytes,
            kv_blocks=self.cache.num_blocks,
            rope_bytes=self.model.rope.nbytes,
            weight_kernels=kernels,
            linear_kernels=self.model.kernels_by_kind(),
            encoder_weight_bytes=self.model.tower_bytes() if isinstance(self.model, MultimodalLM) else {},
            num_threads=self.num_threads,
            load_s=time.perf_counter() - t0,
            trimmed_bytes=trimmed,
        )

    # -- requests -------------------------------------------------------------

    def add_request(self, req: EngineRequest) -> TokenDelta | None:
        """Queue a request; returns an error delta instead of raising for bad input."""
        p = req.params
        n_prompt = len(req.prompt_token_ids)
        if req.request_id in self.sequences:
            problem = f"request id {req.request_id!r} is already in use"
        else:
            problem = (request_problem(req.prompt_token_ids, p.max_tokens or 1, self.config.max_model_len,
                                       self.model.cfg.vocab_size, p.logit_bias or ())
                       or self._media_problem(req.prompt_token_ids, req.media, req.mrope_positions))
        if problem is not None:
            return TokenDelta(req.request_id, finished=True, finish_reason="error", error=problem, num_prompt_tokens=n_prompt)
        stop_ids = set(p.stop_token_ids or ())
        if not p.ignore_eos:
            stop_ids |= set(self.config.eos_token_ids)
        try:  # SamplingParams checked the seed; one changed after that must not take the worker down
            generator = torch.Generator().manual_seed(p.seed) if p.seed is not None else None
        except (RuntimeError, TypeError, ValueError) as exc:
            return TokenDelta(req.request_id, finished=True, finish_reason="error", num_prompt_tokens=n_prompt,
                              error=f"seed {p.seed!r} cannot seed a generator ({exc}); use one in [-2**63, 2**64 - 1]")
        seq = Sequence(
            request_id=req.request_id,
            prompt_token_ids=list(req.prompt_token_ids),
            params=p,
            stop_ids=frozenset(stop_ids),
            credits=req.credits,
            arrival_time=req.arrival_time,
            generator=generator,
            prompt_logprobs=[] if p.prompt_logprobs is not None else None,
            grammar=None if req.grammar is None else self.grammars.start(req.grammar),
        )
        self._attach_media(seq, req.media, req.mrope_positions, req.mrope_delta)
        self.sequences[req.request_id] = seq
        self.scheduler.add(seq)
        self.stats.num_waiting_peak = max(self.stats.num_waiting_peak, len(self.scheduler.waiting))
        if seq.media:
            self.stats.media_sequences += 1
            self.stats.media_sequences_peak = max(self.stats.media_sequences_peak, self.stats.media_sequences)
        return None

    def _media_problem(self, prompt_ids: list[int], media: Seq[MediaInput], positions) -> str | None:
        cfg = self.model.cfg
        problem = media_problem(prompt_ids, media, cfg.multimodal, cfg.architecture)
        if problem is None:
            missing = sorted({m.kind for m in media if not m.encoded and not self.model.can_encode(m.kind)})
            if missing:
                problem = f"this engine has no {' or '.join(missing)} encoder for {cfg.architecture}"
                if not self.config.load_encoders:
                    problem += " (it runs without its towers, load_encoders false: send the media's embeddings)"
        if problem is None and positions is not None and np.shape(positions) != (3, len(prompt_ids)):
            problem = f"mrope_positions has shape {np.shape(positions)}; the prompt needs (3, {len(prompt_ids)})"
        return problem

    def _attach_media(self, seq: Sequence, media: Seq[MediaInput], positions, delta: int) -> None:
        """Media and M-RoPE positions of a checked request; positions are computed here when not given."""
        if not media:
            return
        if positions is None:
            positions, delta = mrope_positions(seq.prompt_token_ids, media, self.model.cfg.multimodal)
        seq.media = [m if isinstance(m.positions, np.ndarray) else replace(m, positions=np.asarray(m.positions))
                     for m in media]
        seq.mrope_positions, seq.mrope_delta = np.asarray(positions, dtype=np.int64), int(delta)
        seq.media_embeds = [None] * len(media)

    def _encode_media(self, item: ScheduledSeq) -> None:
        """Encode the media items with a placeholder among the tokens this step computes for ``item`` that are
        not encoded yet (on the encoder threads)."""
        seq = item.seq
        start, end = seq.num_computed, seq.num_computed + item.num_new
        encoded = seq.encode_s
        for k, m in enumerate(seq.media):
            if seq.media_embeds[k] is None and np.searchsorted(m.positions, start) < np.searchsorted(m.positions, end):
                if m.encoded:  # embeddings computed elsewhere (an encoder stage): placed as they are
                    seq.media_embeds[k] = torch.from_numpy(m.features.rows).to(self.model.dtype)
                else:
                    began = time.perf_counter()
                    with threads(self.encoder_threads):
                        seq.media_embeds[k] = self.model.encode(m.kind, m.features)
                    seq.encode_s += time.perf_counter() - began
                    self.stats.media_encoded += 1
                seq.media[k] = replace(m, features=None)  # the embeddings replace the input (memory/media_plan.py)
        if seq.encode_s != encoded:
            malloc_trim()  # an encode's freed blocks go back now, not when the engine idles

    def abort(self, request_ids: list[str]) -> list[TokenDelta]:
        out = []
        for rid in request_ids:
            seq = self.sequences.get(rid)
            if seq is not None:
                out.append(self._finish(seq, "abort"))
        return out

    def grant(self, request_id: str, credits: int) -> None:
        seq = self.sequences.get(request_id)
        if seq is not None and seq.credits is not None:
            seq.credits += credits

    def score(self, token_ids: list[int], media: Seq[MediaInput] = ()) -> torch.Tensor:
        """fp32 logits ``[len(token_ids), vocab]``: the next-token distribution after each prefix.

        Teacher forcing for fidelity metrics and tests. Runs alone (call it
        when no request is in flight), in chunks of max_num_batched_tokens.
        ``media`` sit in ``token_ids`` as in a request's prompt.
        """
        if self.scheduler.num_unfinished:
            raise RuntimeError("score() needs an idle engine")
        if not 0 < len(token_ids) <= self.config.max_model_len:
            raise ValueError(f"score() takes 1..{self.config.max_model_len} tokens, got {len(token_ids)}")
        problem = self._media_problem(list(token_ids), media, None)
        if problem is not None:
            raise ValueError(problem)
        seq = Sequence(request_id="score", prompt_token_ids=list(token_ids), params=self.scheduler_params)
        self._attach_media(seq, media, None, 0)
        rows = []
        try:
            while seq.num_computed < seq.num_tokens:
                n = min(seq.remaining, self.config.max_num_batched_tokens)
                if not self.scheduler.reserve(seq, seq.num_computed + n):
                    raise RuntimeError("the KV cache cannot hold the tokens to score")
                self._encode_media(ScheduledSeq(seq, n))
                rows.append(self.runner.forward_all_logits(ScheduledSeq(seq, n)))
                seq.num_computed += n
        finally:
            self.scheduler.release(seq)
        return torch.cat(rows)

    def has_work(self) -> bool:
        return self.scheduler.has_schedulable()

    # -- the loop ------------------------------------------------------------

    def step(self) -> list[TokenDelta]:
        batch = self.scheduler.schedule()
        if not batch:
            return []
        out: list[TokenDelta] = []
        if self.model.cfg.multimodal is not None:
            batch = self._encode_batch(batch, out)
            if not batch:
                return out
        try:
            logits, sampling = self.runner.forward(batch)
        except Exception as exc:  # keep serving: fail this batch's requests, not the engine
            log.error("forward pass failed:\n%s", traceback.format_exc())
            return out + [self._fail(item.seq, f"forward pass failed: {exc}") for item in batch]
        self.stats.steps += 1
        for item in batch:
            item.seq.num_computed += item.num_new
            self.scheduler.cache_computed_blocks(item.seq)
            if len(item.seq.output_token_ids) == 0:
                self.stats.prompt_tokens_computed += item.num_new
        rows: list[tuple[int, Sequence]] = []
        for row, item in enumerate(sampling):
            if item.seq.params.max_tokens == 0:  # the prompt alone was asked for (scoring): done once it is computed
                out.append(self._finish(item.seq, "length"))
            else:
                rows.append((row, item.seq))
        allowed = self._grammar_masks([seq for _, seq in rows], out)
        for row, seq in rows:
            if seq.finish_reason is not None:  # its grammar could not be built, or allows no token
                continue
            try:
                tok = sample_row(logits[row], seq, self.generator, allowed.get(seq.request_id))
            except Exception as exc:  # e.g. parameters that turn the distribution into NaN: fail this request only
                log.error("sampling failed for %s:\n%s", seq.request_id, traceback.format_exc())
                out.append(self._fail(seq, f"sampling failed: {exc}"))
                continue
            seq.output_token_ids.append(tok.token_id)
            self.stats.generated_tokens += 1
            if seq.credits is not None:
                seq.credits -= 1
            reason = self._finish_reason(seq, tok.token_id)
            if reason == "stop":
                seq.stop_reason = tok.token_id
            out.append(self._delta(seq, tok, finished=False) if reason is None else self._finish(seq, reason, tok))
        return out

    def _encode_batch(self, batch: list[ScheduledSeq], out: list[TokenDelta]) -> list[ScheduledSeq]:
        """The batch with the media its step needs encoded; a request whose media fail to encode ends with the
        error (``out``), the others run."""
        kept = []
        for item in batch:
            try:
                self._encode_media(item)
            except Exception as exc:
                log.error("encoding media failed for %s:\n%s", item.seq.request_id, traceback.format_exc())
                out.append(self._fail(item.seq, f"encoding its media failed: {exc}"))
                continue
            kept.append(item)
        return kept

    def _grammar_masks(self, seqs: list[Sequence], out: list[TokenDelta]) -> dict[str, torch.Tensor]:
        """The allowed tokens of each constrained sequence, by request id; a grammar that could not be built,
        or that allows no token, ends its request here."""
        ready = []
        for seq in seqs:
            if isinstance(seq.grammar, Future):
                try:
                    seq.grammar = seq.grammar.result()
                except Exception as exc:
                    out.append(self._fail(seq, str(exc)))
                    continue
            if seq.grammar is not None:
                ready.append(seq)
        if not ready:
            return {}
        live = {}
        for seq, mask in zip(ready, self.grammars.allowed([seq.grammar for seq in ready])):
            if seq.grammar.is_error() or not bool(mask.any()):
                # llguidance then allows only EOS; ending here keeps that EOS out of the output
                log.warning("%s: the grammar allows no token after %d generated (%s)", seq.request_id,
                            len(seq.output_token_ids), seq.grammar.get_error() or "empty mask")
                out.append(self._finish(seq, GRAMMAR_LIMIT if met_limit(seq.grammar) else GRAMMAR_DEAD_END))
            else:
                live[seq.request_id] = mask
        return live

    def _finish_reason(self, seq: Sequence, token: int) -> str | None:
        if seq.grammar is not None and not seq.grammar.consume_token(token):
            # only a token the mask allowed is sampled: the matcher itself failed (a parser limit, as a rule)
            log.warning("%s: the grammar took no token after %d generated (%s)", seq.request_id,
                        len(seq.output_token_ids), seq.grammar.get_error())
            return GRAMMAR_LIMIT if met_limit(seq.grammar) else GRAMMAR_DEAD_END
        if token in seq.stop_ids:  # the sampler masks them until min_tokens is reached
            return "stop"
        if seq.grammar is not None and seq.grammar.is_stopped():  # complete, and nothing may follow
            return "stop"
        if seq.params.max_tokens is not None and len(seq.output_token_ids) >= seq.params.max_tokens:
            return "length"
        if seq.num_tokens >= self.config.max_model_len:
            return "length"
        return None

    def _finish(self, seq: Sequence, reason: str, tok: SampledToken | None = None) -> TokenDelta:
        """End ``seq`` (its blocks are released) and the delta that says so."""
        self.scheduler.finish(seq, reason)
        if self.sequences.pop(seq.request_id, None) is not None and seq.media:
            self.stats.media_sequences -= 1
        return self._delta(seq, tok, finished=True)

    def _fail(self, seq: Sequence, message: str) -> TokenDelta:
        delta = self._finish(seq, "error")
        delta.error = message
        return delta

    def _delta(self, seq: Sequence, tok, finished: bool) -> TokenDelta:
        prompt_logprobs = None  # sent once, when every prompt token is scored (not for an unfinished prefill)
        scored = seq.prompt_logprobs is not None and len(seq.prompt_logprobs) == len(seq.prompt_token_ids) - 1
        if scored and not seq.prompt_logprobs_sent:
            prompt_logprobs, seq.prompt_logprobs, seq.prompt_logprobs_sent = seq.prompt_logprobs, [], True
        return TokenDelta(
            request_id=seq.request_id,
            token_id=None if tok is None else tok.token_id,
            logprob=None if tok is None else tok.logprob,
            top_logprobs=None if tok is None else tok.top_logprobs,
            prompt_logprobs=prompt_logprobs,
            finished=finished,
            finish_reason=seq.finish_reason if finished else None,
            stop_reason=seq.stop_reason,
            num_prompt_tokens=len(seq.prompt_token_ids),
            num_cached_tokens=seq.num_cached_tokens,
            num_preemptions=seq.num_preemptions,
            encode_s=seq.encode_s,
        )

    def current_stats(self) -> CoreStats:
        s = self.stats
        s.num_waiting = len(self.scheduler.waiting)
        s.num_running = len(self.scheduler.running)
        s.kv_blocks_used = self.scheduler.allocator.num_used
        s.num_preemptions = self.scheduler.num_preemptions
        s.prefix_cache_query_tokens = self.scheduler.prefix_query_tokens
        s.prefix_cache_hit_tokens = self.scheduler.prefix_hit_tokens
        s.prefix_cache_evictions = self.scheduler.allocator.num_evictions
        s.kv_blocks_cached = self.scheduler.allocator.num_cached
        return s
