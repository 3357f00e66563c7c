"""``LLM``: the offline, synchronous API (vLLM-compatible names).

    llm = LLM("path/to/checkpoint", max_model_len=2048)
    out = llm.generate(["Hello"], SamplingParams(max_tokens=32))
    print(out[0].outputs[0].text)

A multimodal thinker (Qwen2.5-VL, Qwen2.5-Omni) takes OpenAI content parts in ``chat``:

    llm.chat([{"role": "user", "content": [{"type": "image_url", "image_url": {"url": "data:image/png;base64,..."}},
                                           {"type": "text", "text": "What is in this picture?"}]}])

The engine core runs in a worker process by default (``worker="thread"``
keeps it in this process, for tests and debugging).
"""
from __future__ import annotations

import numbers
import threading
import time
from collections import deque
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Callable, Iterable, Iterator, Sequence

from edge_infer.engine.frontend import Frontend, PreparedPrompt, PromptInput, RenderedChat
from edge_infer.engine.media_gate import check_media_sequences
from edge_infer.engine.request_fold import RequestFold
from edge_infer.engine.outputs import CompletionOutput, Logprob, RequestMetrics, RequestOutput
from edge_infer.engine.protocol import AbortRequests, AddRequest, CoreStats, Deltas, EngineRequest
from edge_infer.engine.sampling_params import SamplingParams
from edge_infer.engine.worker import CoreClient
from edge_infer.errors import InvalidRequestError, StaleSessionError
from edge_infer.media.sources import MediaPolicy


class LLM:
    def __init__(
        self,
        model: str | Path | None = None,
        *,
        dtype: str = "auto",
        max_model_len: int | None = None,
        max_num_seqs: int | None = None,
        max_num_batched_tokens: int | None = None,
        kv_cache_memory_bytes: int | None = None,
        quantization: str | None = None,
        priority: str | None = None,
        seed: int = 0,
        worker: str = "process",
        num_threads: int | None = None,
        weight_backend: str = "auto",
        skip_tokenizer_init: bool = False,
        load_progress: Callable[[int, int], None] | None = None,
        media_policy: MediaPolicy | None = None,
        **plan_options: Any,
    ):
        """``load_progress(done, total)`` is called as the worker loads tensors (done == total: weights loaded).
        ``quantization="auto"`` (or a ``priority`` alone) picks the weight path by ``priority``: speed, fidelity
        or memory (memory/weight_path.py); ``self.plan.notes[0]`` says which and why. ``media_policy``: where
        chat media parts may be read from (default: data: URLs only; ``MediaPolicy(allowed_dir=...)`` for file://)."""
        self.frontend = Frontend.create(
            model,
            skip_tokenizer_init=skip_tokenizer_init,
            dtype=dtype,
            max_model_len=max_model_len,
            max_num_seqs=max_num_seqs,
            max_num_batched_tokens=max_num_batched_tokens,
            kv_cache_memory_bytes=kv_cache_memory_bytes,
            quantization=quantization,
            priority=priority,
            seed=seed,
            num_threads=num_threads,
            weight_backend=weight_backend,
            **plan_options,
        )
        self.plan = self.frontend.plan
        if media_policy is not None:
            self.frontend.media_policy = media_policy
        self._client = CoreClient(self.frontend.engine_config, mode=worker)
        self._calls = threading.Lock()  # held by a call (_run): two at once each dropped the other's tokens
        self.ready = self._client.start(load_progress)
        self.core_stats = CoreStats()  # the worker's counters, as last reported
        self._counter = 0

    # -- public API -------------------------------------------------------------

    def get_tokenizer(self):
        return self.frontend.tokenizer

    def get_default_sampling_params(self) -> SamplingParams:
        return self.frontend.default_params()

    def generate(
        self,
        prompts: PromptInput | Sequence[PromptInput],
        sampling_params: SamplingParams | Sequence[SamplingParams] | None = None,
        use_tqdm: bool = False,
    ) -> list[RequestOutput]:
        prompt_list = self._as_list(prompts)
        prepared = []
        for i, p in enumerate(prompt_list):
            with _naming("prompt", i, len(prompt_list)):
                prepared.append(self.frontend.prepare(p))
        return self._run(prepared, sampling_params, use_tqdm, "prompt")

    def chat(
        self,
        messages: list[dict[str, Any]] | list[list[dict[str, Any]]],
        sampling_params: SamplingParams | Sequence[SamplingParams] | None = None,
        tools: list[dict[str, Any]] | None = None,
        add_generation_prompt: bool = True,
        chat_template_kwargs: dict[str, Any] | None = None,
        use_tqdm: bool = False,
        mm_processor_kwargs: dict[str, Any] | None = None,
    ) -> list[RequestOutput]:
        """Conversations rendered by the chat template; user messages may hold image_url, input_audio, audio_url
        and video_url parts (a multimodal model). ``mm_processor_kwargs={"use_audio_in_video": False}`` leaves a
        video's sound track out (Omni; it goes in by default). Every conversation is rendered and checked before
        any runs; their media are read and decoded as the worker has room for them (a batch of a thousand
        pictures never holds a thousand decoded pictures), so media that cannot be read raise when their turn
        comes, and the conversations still running are aborted."""
        conversations = _conversations(messages)
        kwargs = dict(chat_template_kwargs or {}, tools=tools, add_generation_prompt=add_generation_prompt)
        # Rendered (and checked) now; their media are loaded as the worker has room for them (_run).
        rendered = []
        for i, conv in enumerate(conversations):
            with _naming("conversation", i, len(conversations)):
                rendered.append(self.frontend.render_chat(conv, mm_processor_kwargs, **kwargs))
        return self._run(rendered, sampling_params, use_tqdm, "conversation")

    def close(self) -> None:
        if self._client is not None:
            self._client.close()
            self._client = None

    def __enter__(self) -> "LLM":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    def __del__(self) -> None:
        try:
            self.close()
        except Exception:
            pass

    # -- internals ------------------------------------------------------------

    @staticmethod
    def _as_list(prompts: PromptInput | Sequence[PromptInput]) -> list[PromptInput]:
        if isinstance(prompts, (str, dict)):
            return [prompts]
        if hasattr(prompts, "tolist"):  # an array or tensor: 1-D, one prompt's token ids; 2-D, one per row
            prompts = prompts.tolist()
        if isinstance(prompts, (list, tuple)) and prompts and isinstance(prompts[0], numbers.Integral):
            return [prompts]  # one prompt given as token ids
        if not isinstance(prompts, Iterable):
            raise InvalidRequestError(f"prompts must be a string, a list of token ids, a prompt dict or a list of "
                                      f"those, not {type(prompts).__name__}")
        return list(prompts)

    def _params_for(self, sampling_params, count: int) -> list[SamplingParams]:
        if sampling_params is None:
            return [self.frontend.default_params()] * count
        if isinstance(sampling_params, SamplingParams):
            return [sampling_params] * count
        if len(sampling_params) != count:
            raise ValueError(f"got {len(sampling_params)} SamplingParams for {count} prompts")
        return list(sampling_params)

    def _run(self, prompts: Sequence[PreparedPrompt | RenderedChat], sampling_params, use_tqdm: bool,
             kind: str) -> list[RequestOutput]:
        """One call at a time reads the worker's pipe; a call from another thread waits its turn."""
        if self._client is None:
            raise StaleSessionError("this LLM is closed; create a new one")
        with self._calls:
            return self._run_window(prompts, sampling_params, use_tqdm, kind)

    def _run_window(self, prompts: Sequence[PreparedPrompt | RenderedChat], sampling_params,
                    use_tqdm: bool, kind: str) -> list[RequestOutput]:
        """Every prompt's samples, run in the worker. All prompts are checked first (a bad one raises before any
        runs), then go to the worker in order as it has room: at most 2 x max_num_seqs samples there at once (what
        runs and as much again queued, so the scheduler never starves; a prompt of more samples goes alone), and of
        those at most max_num_seqs holding media (engine/media_gate.py says why), each prompt's media loaded only
        when it goes. Without the window a list of 4,000 long prompts sat whole in the worker's queue, outside every
        plan item. A prompt whose media fail to load or check raises when its turn comes; the samples still running
        are aborted. An error about one of several prompts names it (``kind`` and its index)."""
        from tqdm import tqdm

        params = self._params_for(sampling_params, len(prompts))
        prompts = [self.frontend.load_media(p) if isinstance(p, RenderedChat) and not p.parts else p for p in prompts]
        window = self.frontend.engine_config.max_num_seqs
        batch_id = self._counter
        self._counter += 1
        layout = [[f"{batch_id}-{i}-{k}" for k in range(p.n)] for i, p in enumerate(params)]
        media = [_has_media(prompt) for prompt in prompts]
        checked = {}
        for i, prompt in enumerate(prompts):
            with _naming(kind, i, len(prompts)):
                if media[i]:
                    check_media_sequences(params[i].n, window)
                else:
                    checked[i] = self._requests(prompt, params[i], layout[i])
        queue = deque(range(len(prompts)))
        sent: list[PreparedPrompt | None] = [None] * len(prompts)  # each prompt's text and ids, for its output
        samples: dict[str, RequestFold] = {}
        pending: set[str] = set()
        holding: set[str] = set()  # the unfinished samples holding media in the worker
        arrival = time.time()
        bar = tqdm(total=sum(map(len, layout)), desc="generating", unit="sample", disable=not use_tqdm)
        try:
            while queue or pending:
                while queue and _has_room(params[queue[0]].n, len(pending), len(holding), window, media[queue[0]]):
                    i = queue.popleft()
                    pending.update(layout[i])  # before any is sent: an interrupt meanwhile still aborts them
                    with _naming(kind, i, len(prompts)):
                        sent[i] = self._start(prompts[i], params[i], layout[i], checked.pop(i, None), samples)
                    prompts[i] = sent[i]  # no reference to its media left here
                    if media[i]:
                        holding.update(layout[i])
                self._receive(samples, pending, holding, bar)
        except BaseException:
            if pending:
                self._client.send(AbortRequests(sorted(pending)))
            raise
        finally:
            bar.close()
        return [self._output(sent[i], ids, samples, arrival) for i, ids in enumerate(layout)]

    def _start(self, prompt: PreparedPrompt | RenderedChat, params: SamplingParams, ids: list[str],
               requests: list[EngineRequest] | None, samples: dict[str, RequestFold]) -> PreparedPrompt:
        """Send one prompt's samples (``requests``, or built now with its media loaded); returns its text and
        token ids without the media, which only the worker keeps."""
        if requests is None:
            if isinstance(prompt, RenderedChat):
                prompt = self.frontend.load_media(prompt)
            requests = self._requests(prompt, params, ids)
        samples.update((r.request_id, RequestFold.start(self.frontend.tokenizer, r.params)) for r in requests)
        self._send_all(requests)
        return PreparedPrompt(prompt.prompt, list(prompt.token_ids))

    def _requests(self, prompt: PreparedPrompt, params: SamplingParams, ids: list[str]) -> list[EngineRequest]:
        """The engine requests of one prompt's n samples: distinct seeds when seeded, independent draws otherwise."""
        return [self.frontend.request(rid, prompt, params.for_sample(k)) for k, rid in enumerate(ids)]

    def _receive(self, samples: dict[str, RequestFold], pending: set[str], holding: set[str], bar) -> None:
        """Apply the worker's deltas for a while (up to 1 s); finished samples leave ``pending`` and ``holding``."""
        for report in self._client.receive(timeout_s=1.0):
            if not isinstance(report, Deltas):
                continue
            self.core_stats = report.stats
            for delta in report.deltas:
                if delta.request_id not in pending:
                    continue
                step = samples[delta.request_id].apply(delta)
                if step.abort_in_core:
                    self._client.send(AbortRequests([delta.request_id]))
                if step.finished:
                    pending.discard(delta.request_id)
                    holding.discard(delta.request_id)
                    bar.update(1)

    def _send_all(self, requests: list[EngineRequest]) -> None:
        """Hand the requests to the worker and keep no reference to them (nor to their media's features)."""
        for req in requests:
            self._client.send(AddRequest(req))
        requests.clear()

    def _output(self, prompt: PreparedPrompt, ids: list[str], samples: dict[str, RequestFold], arrival: float) -> RequestOutput:
        outs = [
            CompletionOutput(
                index=index, text=s.text.text, token_ids=list(s.token_ids), cumulative_logprob=s.cumulative_logprob,
                logprobs=None if s.logprobs is None else [_logprob_entry(tid, lp) for tid, lp in zip(s.token_ids, s.logprobs)],
                finish_reason=s.finish_reason, stop_reason=s.text.stop_reason,
            )
            for index, s in ((i, samples[rid]) for i, rid in enumerate(ids))
        ]
        first = samples[ids[0]]
        errors = [samples[r].error for r in ids if samples[r].error]
        return RequestOutput(
            request_id=ids[0].rsplit("-", 1)[0],
            prompt=prompt.prompt,
            prompt_token_ids=prompt.token_ids,
            outputs=outs,
            finished=True,
            metrics=RequestMetrics(arrival, first.first_token_at, time.time(), first.num_preemptions, first.encode_s),
            error=errors[0] if errors else None,
            num_cached_tokens=first.num_cached_tokens,
            prompt_logprobs=None if first.prompt_logprobs is None else [
                None, *(_logprob_entry(tid, lp) for tid, lp in zip(prompt.token_ids[1:], first.prompt_logprobs))],
        )


@contextmanager
def _naming(kind: str, index: int, count: int) -> Iterator[None]:
    """An InvalidRequestError about one of ``count`` > 1 prompts or conversations names which (``conversation 2:
    messages[0]...``): the same message for every conversation of a batch left the caller searching."""
    try:
        yield
    except InvalidRequestError as exc:
        if count > 1:
            exc.args = (f"{kind} {index}: {exc}", *exc.args[1:])
        raise


def _conversations(messages: Any) -> list[list[dict[str, Any]]]:
    """One conversation (a list of message dicts) or a list of them, as a list of conversations."""
    if isinstance(messages, (str, bytes, dict)) or not isinstance(messages, Sequence):
        raise InvalidRequestError(f"messages must be a list of message dicts ({{'role': ..., 'content': ...}}) or a "
                                  f"list of such lists, not {type(messages).__name__}")
    return messages if messages and isinstance(messages[0], list) else [messages]


def _has_media(prompt: PreparedPrompt | RenderedChat) -> bool:
    return bool(prompt.parts if isinstance(prompt, RenderedChat) else prompt.media)


def _has_room(n: int, pending: int, holding: int, window: int, media: bool) -> bool:
    """Whether a prompt of ``n`` samples may go to the worker now (LLM._run_window); one alone always may."""
    if media and holding + n > window:
        return False
    return pending == 0 or pending + n <= 2 * window


def _logprob_entry(token_id: int, logprobs: tuple[float, list[tuple[int, float]]]) -> dict[int, Logprob]:
    """The chosen token's logprob and its ranked alternatives (vLLM's shape). The chosen token comes first, with
    its rank when it is among the alternatives (a greedy pick is rank 1); outside them its rank is not computed."""
    chosen, top = logprobs
    ranks = {tid: rank for rank, (tid, _) in enumerate(top, start=1)}
    entry = {token_id: Logprob(chosen, ranks.get(token_id))}
    for rank, (tid, lp) in enumerate(top, start=1):
        entry.setdefault(tid, Logprob(lp, rank))
    return entry
