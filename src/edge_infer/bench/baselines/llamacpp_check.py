"""Does the exported GGUF compute what the checkpoint computes? Greedy tokens, side by side.

The same token ids go to both engines (our tokenizer and chat template
make them; llama.cpp's text tokenization is not involved), each produces
greedy tokens, and the report gives per prompt both sequences, their
decoded text, whether the first tokens agree and how many leading tokens
match. A wrong tensor mapping, RoPE layout or hyperparameter shows up as
disagreement on the first token; with a bf16 model small numeric
differences may let later tokens drift apart, which is why the first
token is the gate.
"""
from __future__ import annotations

from pathlib import Path
from typing import Any

DEFAULT_PROMPTS = (
    "What is the capital of France?",
    "Write one sentence about the sea.",
    "What does a lighthouse do?",
    "Count from one to five.",
)


def prompt_token_ids(model_dir: Path, prompts: list[str] | None) -> tuple[list[list[int]], Any]:
    """Token ids of each prompt (chat-formatted when the checkpoint has a template), and the tokenizer."""
    if not (model_dir / "tokenizer.json").is_file():
        if prompts:
            raise ValueError(f"{model_dir} has no tokenizer.json; text prompts cannot be encoded (omit --prompt)")
        from edge_infer.bench.harness.llama_bench import prompt_ids
        from edge_infer.models.config import ModelConfig

        vocab = ModelConfig.from_dir(model_dir).vocab_size
        return [prompt_ids(12, vocab, 0, i, "check") for i in range(len(DEFAULT_PROMPTS))], None
    from edge_infer.models.tokenizer import Tokenizer

    tok = Tokenizer(model_dir)
    out = []
    for text in prompts or DEFAULT_PROMPTS:
        if tok.chat_template:
            rendered = tok.apply_chat_template([{"role": "user", "content": text}], add_generation_prompt=True)
            out.append(tok.encode(rendered, add_special_tokens=False))
        else:
            out.append(tok.encode(text))
    return out, tok


def _leading_match(a: list[int], b: list[int]) -> int:
    n = 0
    for x, y in zip(a, b):
        if x != y:
            break
        n += 1
    return n


def run_check(model_dir: Path, gguf: Path, prompts: list[str] | None, n_tokens: int, dtype: str) -> dict[str, Any]:
    from edge_infer.bench.baselines.llamacpp_engine import LlamaCppModel, LlamaCppSettings
    from edge_infer.engine.llm import LLM
    from edge_infer.engine.sampling_params import SamplingParams

    ids, tok = prompt_token_ids(model_dir, prompts)
    context = max(map(len, ids)) + n_tokens + 1
    with LLM(model_dir, dtype=dtype, max_model_len=context, max_num_seqs=len(ids),
             max_num_batched_tokens=max(512, context), skip_tokenizer_init=True) as llm:
        params = SamplingParams(max_tokens=n_tokens, temperature=0.0, ignore_eos=True)
        ours = [o.outputs[0].token_ids for o in llm.generate([{"prompt_token_ids": p} for p in ids], params)]
        loaded_dtype = llm.ready.dtype
    # An f32 KV cache when edge-infer runs in fp32, so that llama.cpp does too (its default is f16).
    kv_type = "f32" if loaded_dtype == "float32" else "f16"
    model = LlamaCppModel(gguf, LlamaCppSettings(n_ctx=context, n_batch=context, n_threads=1, kv_type=kv_type))
    try:
        theirs = [model.greedy(p, n_tokens) for p in ids]
        loaded = model.loaded()
    finally:
        model.close()

    def text(t: list[int]) -> str | None:
        return None if tok is None else tok.decode(t, skip_special_tokens=False)

    rows = []
    for p, a, b in zip(ids, ours, theirs):
        rows.append({
            "prompt_tokens": len(p), "edge_infer": a, "llama_cpp": b,
            "edge_infer_text": text(a), "llama_cpp_text": text(b),
            "first_token_agree": a[:1] == b[:1], "leading_tokens_match": _leading_match(a, b),
        })
    n = len(rows)
    return {
        "model": str(model_dir), "gguf": str(gguf), "edge_infer_dtype": loaded_dtype, "llama_cpp": loaded,
        "tokens_per_prompt": n_tokens,
        "first_token_agreement": sum(r["first_token_agree"] for r in rows) / n,
        "exact_match": sum(r["leading_tokens_match"] == n_tokens for r in rows) / n,
        "mean_prefix_kept": sum(r["leading_tokens_match"] for r in rows) / n / n_tokens,
        "prompts": rows,
    }
