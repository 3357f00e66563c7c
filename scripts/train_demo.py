"""Train the demo model that ships in src/edge_infer/assets/demo-model/.

    PYTHONPATH=src python scripts/train_demo.py

Generates a templated chat corpus (scripts/demo_corpus.py), trains a
byte-level BPE tokenizer on it, trains a small Qwen2-architecture decoder
with transformers, writes a bf16 Hugging Face checkpoint, then reloads that
checkpoint and measures greedy exact-match accuracy on held-out generated
prompts. Deterministic: fixed seeds, two threads. Takes a few minutes on two
CPU cores.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import re
import sys
import time
from collections import Counter
from dataclasses import dataclass
from pathlib import Path

import torch
from safetensors.torch import save_file
from tokenizers import AddedToken, Regex, Tokenizer, decoders, models, normalizers, pre_tokenizers, trainers

sys.path.insert(0, str(Path(__file__).parent))
import demo_corpus  # noqa: E402  (lives next to this script)

REPO = Path(__file__).resolve().parent.parent
DEFAULT_OUT = REPO / "src" / "edge_infer" / "assets" / "demo-model"

TRAIN_SEED = 1234
EVAL_SEED = 98765  # held-out prompts come from a different stream
MAX_VOCAB = 4096  # BPE stops earlier: the templated corpus has few distinct words
VOCAB_MULTIPLE = 128  # the embedding is padded to a multiple of this
MAX_MODEL_LEN = 2048

MODEL_SHAPE = {
    "hidden_size": 256,
    "intermediate_size": 768,
    "num_hidden_layers": 6,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
}

# Loss weight of tokens outside assistant answers: the model still learns to
# model prompts (useful for plain completions and fidelity metrics), but the
# answers carry most of the gradient.
PROMPT_LOSS_WEIGHT = 0.1


@dataclass(frozen=True)
class TrainSettings:
    dialogues: int
    steps: int
    batch_size: int  # rows of seq_len tokens
    seq_len: int
    lr: float  # peak
    warmup_steps: int
    eval_prompts: int


FULL = TrainSettings(dialogues=17500, steps=460, batch_size=8, seq_len=512, lr=3e-3, warmup_steps=30, eval_prompts=200)
QUICK = TrainSettings(dialogues=2000, steps=30, batch_size=8, seq_len=512, lr=3e-3, warmup_steps=5, eval_prompts=40)


# ---------------------------------------------------------------- tokenizer

# The pre-tokenizer and normalizer of Qwen2 tokenizers: transformers rebuilds
# any `qwen2` checkpoint's tokenizer with exactly these (ignoring the ones in
# tokenizer.json), so tokenizer.json must match them for every loader to
# produce the same token ids. Digits become single tokens.
PRE_TOKEN_PATTERN = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+"
    r"|\s+(?!\S)|\s+"
)

def train_tokenizer(texts: list[str]) -> Tokenizer:
    markup = demo_corpus.SPECIAL_TOKENS + demo_corpus.TOOL_TOKENS
    tokenizer = Tokenizer(models.BPE())
    tokenizer.normalizer = normalizers.NFC()
    tokenizer.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Split(Regex(PRE_TOKEN_PATTERN), behavior="isolated"),
        pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
    ])
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=MAX_VOCAB,
        special_tokens=list(markup),  # ids 0..6, reserved before any merge
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    # Markup is cut out of the training text so no merge learns pieces of it.
    pattern = re.compile("|".join(re.escape(token) for token in markup))
    tokenizer.train_from_iterator((pattern.sub("\n", text) for text in texts), trainer=trainer)
    tokenizer.add_special_tokens([AddedToken(t, special=True, normalized=False) for t in demo_corpus.SPECIAL_TOKENS])
    tokenizer.add_tokens([AddedToken(t, special=False, normalized=False) for t in demo_corpus.TOOL_TOKENS])
    return tokenizer


def token_id(tokenizer: Tokenizer, token: str) -> int:
    found = tokenizer.token_to_id(token)
    assert found is not None, f"{token} missing from the vocabulary"
    return found


# ------------------------------------------------------------------ packing

@dataclass(frozen=True)
class PackedRows:
    """Whole dialogues packed into fixed-length rows.

    Positions restart at 0 for each dialogue; with no attention mask,
    transformers reads those resets as packed sequences and keeps dialogues
    from attending to each other, so each one is seen as at inference.
    """

    input_ids: torch.Tensor  # [rows, seq_len]
    position_ids: torch.Tensor  # [rows, seq_len]
    weights: torch.Tensor  # [rows, seq_len] loss weight of predicting this token



def _token_weights(text: str, offsets: list[tuple[int, int]]) -> list[float]:
    answers = [(m.start(1), m.end()) for m in re.finditer(r"<\|im_start\|>assistant\n(.*?)<\|im_end\|>", text, re.S)]
    weights = [1.0 if any(a <= start < b for a, b in answers) else PROMPT_LOSS_WEIGHT for start, _ in offsets]
    weights[0] = 0.0  # a dialogue's first token has no context to be predicted from
    return weights


def pack(texts: list[str], tokenizer: Tokenizer, seq_len: int, pad_id: int) -> PackedRows:
    rows: list[tuple[list[int], list[int], list[float]]] = []
    open_rows: list[int] = []  # indices of recent rows that may still have room
    for text, encoding in zip(texts, tokenizer.encode_batch(texts)):
        ids = encoding.ids[:seq_len]
        weights = _token_weights(text, encoding.offsets)[:seq_len]
        target = next((r for r in open_rows if len(rows[r][0]) + len(ids) <= seq_len), None)
        if target is None:
            rows.append(([], [], []))
            target = len(rows) - 1
            open_rows = (open_rows + [target])[-16:]
        row_ids, row_positions, row_weights = rows[target]
        row_ids += ids
        row_positions += range(len(ids))
        row_weights += weights
    for row_ids, row_positions, row_weights in rows:
        pad = seq_len - len(row_ids)
        row_ids += [pad_id] * pad
        row_positions += range(pad)
        row_weights += [0.0] * pad
    return PackedRows(
        torch.tensor([r[0] for r in rows]), torch.tensor([r[1] for r in rows]), torch.tensor([r[2] for r in rows]),
    )


# ----------------------------------------------------------------- training

def model_config(vocab_size: int, special: dict[str, int]) -> dict:
    """config.json in the shape Qwen2.5 checkpoints use."""
    return {
        "architectures": ["Qwen2ForCausalLM"],
        "model_type": "qwen2",
        **MODEL_SHAPE,
        "hidden_act": "silu",
        "vocab_size": vocab_size,
        "max_position_embeddings": MAX_MODEL_LEN,
        "rope_theta": 10000.0,
        "rope_scaling": None,
        "rms_norm_eps": 1e-6,
        "tie_word_embeddings": True,
        "attention_dropout": 0.0,
        "initializer_range": 0.02,
        "use_cache": True,
        "use_sliding_window": False,
        "sliding_window": None,
        "max_window_layers": MODEL_SHAPE["num_hidden_layers"],
        "bos_token_id": special["<|endoftext|>"],
        "eos_token_id": special["<|im_end|>"],
        "torch_dtype": "bfloat16",
    }


def build_model(config: dict):
    from transformers import Qwen2Config, Qwen2ForCausalLM

    settings = {k: v for k, v in config.items() if k not in ("architectures", "model_type", "torch_dtype")}
    return Qwen2ForCausalLM(Qwen2Config(**settings))


def learning_rate(step: int, settings: TrainSettings) -> float:
    if step < settings.warmup_steps:
        return settings.lr * (step + 1) / settings.warmup_steps
    progress = (step - settings.warmup_steps) / max(1, settings.steps - settings.warmup_steps)
    return settings.lr * (0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * progress)))


LOG_EVERY = 25  # steps; logged losses are means over this window


@dataclass(frozen=True)
class TrainResult:
    seconds: float
    load_before: float  # 1-minute load average: the time depends on what else ran
    load_after: float
    final_loss: float  # weighted loss, mean of the last 10% of steps
    final_answer_loss: float  # loss on answer tokens only, same steps
    curve: list[tuple[int, float]]  # (steps done, mean weighted loss of the last LOG_EVERY steps)


def batch_order(rows: int, settings: TrainSettings) -> torch.Tensor:
    """Row indices of every step: shuffled epochs, as many as needed."""
    generator = torch.Generator().manual_seed(TRAIN_SEED)
    needed = settings.steps * settings.batch_size
    return torch.cat([torch.randperm(rows, generator=generator) for _ in range(math.ceil(needed / rows))])[:needed]


def train(model, rows: PackedRows, order: torch.Tensor, settings: TrainSettings) -> TrainResult:
    decay = [p for p in model.parameters() if p.dim() >= 2]
    no_decay = [p for p in model.parameters() if p.dim() < 2]
    optimizer = torch.optim.AdamW(
        [{"params": decay, "weight_decay": 0.1}, {"params": no_decay, "weight_decay": 0.0}],
        lr=settings.lr, betas=(0.9, 0.95),
    )
    losses, answer_losses, curve = [], [], []
    model.train()
    load_before = os.getloadavg()[0]
    start = time.perf_counter()
    for step in range(settings.steps):
        batch = order[step * settings.batch_size:(step + 1) * settings.batch_size]
        ids, positions, weights = rows.input_ids[batch], rows.position_ids[batch], rows.weights[batch]
        for group in optimizer.param_groups:
            group["lr"] = learning_rate(step, settings)
        with torch.autocast("cpu", dtype=torch.bfloat16):
            # No cache: with one, transformers would not isolate the packed dialogues.
            logits = model(input_ids=ids, position_ids=positions, use_cache=False).logits
        token_loss = torch.nn.functional.cross_entropy(
            logits[:, :-1].float().flatten(0, 1), ids[:, 1:].flatten(), reduction="none",
        )
        target_weights = weights[:, 1:].flatten()
        loss = (token_loss * target_weights).sum() / target_weights.sum()
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
        losses.append(loss.item())
        answer_losses.append(token_loss[target_weights == 1.0].mean().item())
        if (step + 1) % LOG_EVERY == 0 or step == settings.steps - 1:
            recent = losses[-LOG_EVERY:]
            curve.append((step + 1, round(sum(recent) / len(recent), 4)))
            print(f"step {step + 1:4d}  loss {curve[-1][1]:.4f}  "
                  f"answer loss {sum(answer_losses[-LOG_EVERY:]) / len(recent):.4f}  "
                  f"lr {learning_rate(step, settings):.2e}  {time.perf_counter() - start:.0f}s", flush=True)
    tail = max(1, settings.steps // 10)
    return TrainResult(
        seconds=time.perf_counter() - start,
        load_before=load_before,
        load_after=os.getloadavg()[0],
        final_loss=sum(losses[-tail:]) / tail,
        final_answer_loss=sum(answer_losses[-tail:]) / tail,
        curve=curve,
    )


# ------------------------------------------------------------------- saving

def save_checkpoint(out: Path, model, config: dict, tokenizer: Tokenizer, special: dict[str, int]) -> None:
    out.mkdir(parents=True, exist_ok=True)
    # The output head is tied to the embedding, so only the embedding is stored.
    state = {k: v.to(torch.bfloat16).contiguous() for k, v in model.state_dict().items() if k != "lm_head.weight"}
    save_file(state, str(out / "model.safetensors"), metadata={"format": "pt"})
    _write_json(out / "config.json", config)
    tokenizer.save(str(out / "tokenizer.json"))
    added = {
        str(special[t]): {
            "content": t, "lstrip": False, "normalized": False, "rstrip": False, "single_word": False,
            "special": t in demo_corpus.SPECIAL_TOKENS,
        }
        for t in demo_corpus.SPECIAL_TOKENS + demo_corpus.TOOL_TOKENS
    }
    _write_json(out / "tokenizer_config.json", {
        "tokenizer_class": "PreTrainedTokenizerFast",
        "added_tokens_decoder": added,
        "bos_token": None,
        "eos_token": "<|im_end|>",
        "pad_token": "<|endoftext|>",
        "unk_token": None,
        "model_max_length": MAX_MODEL_LEN,
        "clean_up_tokenization_spaces": False,
        "chat_template": demo_corpus.CHAT_TEMPLATE,
    })
    _write_json(out / "generation_config.json", {
        "bos_token_id": special["<|endoftext|>"],
        "eos_token_id": [special["<|im_end|>"], special["<|endoftext|>"]],
        "pad_token_id": special["<|endoftext|>"],
        "do_sample": True,
        "temperature": 0.7,
        "top_p": 0.9,
        "repetition_penalty": 1.0,
    })


def _write_json(path: Path, value: dict) -> None:
    path.write_text(json.dumps(value, indent=2, ensure_ascii=False) + "\n")


# --------------------------------------------------------------- evaluation

@dataclass(frozen=True)
class EvalResult:
    correct: dict[str, int]  # per category
    total: dict[str, int]
    unseen_correct: int  # prompts that never occur in the training corpus
    unseen_total: int

    @property
    def accuracy(self) -> float:
        return sum(self.correct.values()) / sum(self.total.values())


def evaluate(checkpoint: Path, dialogues: list[demo_corpus.Dialogue], seen_prompts: set[str]) -> EvalResult:
    """Greedy exact match of the saved (bf16) checkpoint, loaded by transformers."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(checkpoint, padding_side="left")
    model = AutoModelForCausalLM.from_pretrained(checkpoint, dtype=torch.bfloat16).eval()
    im_end = tokenizer.convert_tokens_to_ids("<|im_end|>")
    prompts = [d.prompt() for d in dialogues]
    # The model only works on the token ids it was trained on.
    shipped = Tokenizer.from_file(str(checkpoint / "tokenizer.json"))
    for prompt in prompts:
        if tokenizer(prompt)["input_ids"] != shipped.encode(prompt).ids:
            raise SystemExit(f"transformers tokenizes differently from tokenizer.json: {prompt!r}")
    by_length = sorted(range(len(dialogues)), key=lambda i: len(prompts[i]))
    correct, total, unseen_correct, unseen_total = Counter(), Counter(), 0, 0
    for first in range(0, len(by_length), 32):
        batch = by_length[first:first + 32]
        inputs = tokenizer([prompts[i] for i in batch], return_tensors="pt", padding=True)
        with torch.no_grad():
            out = model.generate(**inputs, do_sample=False, max_new_tokens=64)
        for i, generated in zip(batch, out[:, inputs["input_ids"].shape[1]:].tolist()):
            ok = im_end in generated and tokenizer.decode(generated[:generated.index(im_end)]) == dialogues[i].answer()
            category = dialogues[i].category
            total[category] += 1
            correct[category] += ok
            if prompts[i] not in seen_prompts:
                unseen_total += 1
                unseen_correct += ok
    return EvalResult(dict(correct), dict(total), unseen_correct, unseen_total)


# ------------------------------------------------------------------- README

def write_readme(out: Path, settings: TrainSettings, result: TrainResult, evaluation: EvalResult,
                 vocab: int, config: dict, params: int, command: str) -> None:
    size = sum(p.stat().st_size for p in out.iterdir() if p.name != "README.md")
    categories = "\n".join(
        f"| {c} | {evaluation.correct.get(c, 0)}/{n} | {evaluation.correct.get(c, 0) / n:.0%} |"
        for c, n in sorted(evaluation.total.items())
    )
    curve = ", ".join(f"{loss} (step {step})" for step, loss in result.curve[1::2])
    unseen = evaluation.unseen_correct / max(1, evaluation.unseen_total)
    (out / "README.md").write_text(f"""# edge-infer demo model (a toy)

A tiny chat model shipped with edge-infer, so that `edge-infer serve` works on
a fresh machine with no checkpoint at hand, and so that quantization fidelity
can be measured against a trained reference model.

It is **a toy**. It only knows the templated dialogues it was trained on:
greetings, adding and subtracting numbers up to 10, counting, repeating text,
capitals of a few real and made-up countries, colors, opposites, the languages
of a small made-up world, and calling the tools `get_weather`, `get_time`,
`set_alarm`, `add` and `send_message` (with `tools` given, it answers with a
`<tool_call>` block; given the tool's result, it answers in words). Anything
else gets fluent-looking nonsense. Even in distribution it is often wrong,
most of all where the answer must copy something from the prompt (a sum,
repeated text, the values in a tool's result): see the accuracy table.

## Architecture

- Qwen2 (`Qwen2ForCausalLM`), {params:,} parameters, stored in bfloat16.
- hidden 256, intermediate 768, 6 layers, 4 attention heads and 2 KV heads
  (head_dim 64), q/k/v bias, tied embeddings, RoPE theta 10000, RMSNorm eps
  1e-6, max_position_embeddings {MAX_MODEL_LEN}; trained on dialogues of at
  most {settings.seq_len} tokens.
- Byte-level BPE tokenizer with {vocab:,} tokens, embedding padded to
  {config["vocab_size"]:,}. Normalizer and pre-tokenizer are Qwen2's, so
  transformers' Qwen2 tokenizer and `tokenizer.json` give the same ids.
  `<|endoftext|>`, `<|im_start|>`, `<|im_end|>` are special tokens;
  `<tool_call>`, `</tool_call>`, `<tool_response>`, `</tool_response>` are
  single, non-special added tokens.
- ChatML chat template with tools (`<tool_call>` JSON in Hermes/Qwen style,
  tool results as `<tool_response>` in a user turn). Generation stops on
  `<|im_end|>`.

## How it was trained

    {command}

All data comes from the templates in `scripts/demo_corpus.py` (seed
{TRAIN_SEED}); nothing is downloaded. {settings.dialogues:,} dialogues packed
into rows of {settings.seq_len} tokens, each dialogue attending only to
itself; {settings.steps} AdamW steps of {settings.batch_size} rows, peak
learning rate {settings.lr}, cosine schedule, bf16 autocast, two CPU threads.
Answer tokens have loss weight 1, prompt tokens {PROMPT_LOSS_WEIGHT}.

- training time: {result.seconds:.0f} s wall clock (1-minute load average
  {result.load_before:.1f} before, {result.load_after:.1f} after, on a
  machine shared with other work)
- final loss (weighted, mean of the last 10% of steps): {result.final_loss:.4f}
- final loss on answer tokens only: {result.final_answer_loss:.4f}
- loss, mean of the {LOG_EVERY} steps up to: {curve}

## Accuracy

Greedy decoding of this bf16 checkpoint, loaded with `transformers`, on
{sum(evaluation.total.values())} held-out dialogues drawn with another seed
({EVAL_SEED}); an answer counts when it matches exactly and ends with
`<|im_end|>`. Overall: **{evaluation.accuracy:.1%}**. The templates are
small, so many held-out prompts also occur in the training corpus; on the
{evaluation.unseen_total} that do not, accuracy is {unseen:.1%}.

| category | correct | accuracy |
|---|---|---|
{categories}

Size of the checkpoint files: {size / 1e6:.1f} MB.
""")


# --------------------------------------------------------------------- main

def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=DEFAULT_OUT, help="checkpoint directory to write")
    parser.add_argument("--quick", action="store_true", help="tiny settings to check the pipeline, not to ship")
    args = parser.parse_args()
    settings = QUICK if args.quick else FULL
    torch.manual_seed(TRAIN_SEED)
    torch.set_num_threads(2)

    dialogues = demo_corpus.generate_dialogues(settings.dialogues, TRAIN_SEED)
    texts = [d.render() for d in dialogues]
    tokenizer = train_tokenizer(texts)
    special = {t: token_id(tokenizer, t) for t in demo_corpus.SPECIAL_TOKENS + demo_corpus.TOOL_TOKENS}
    rows = pack(texts, tokenizer, settings.seq_len, pad_id=special["<|endoftext|>"])
    order = batch_order(len(rows.input_ids), settings)
    print(f"{len(texts)} dialogues, vocabulary {tokenizer.get_vocab_size()}, {len(rows.input_ids)} rows "
          f"({rows.weights.gt(0).float().mean():.0%} of tokens carry loss), "
          f"{len(order) / len(rows.input_ids):.2f} epochs", flush=True)

    config = model_config(-(-tokenizer.get_vocab_size() // VOCAB_MULTIPLE) * VOCAB_MULTIPLE, special)
    model = build_model(config)
    result = train(model, rows, order, settings)
    save_checkpoint(args.out, model, config, tokenizer, special)

    seen_prompts = {d.prompt() for d in dialogues}
    evaluation = evaluate(args.out, demo_corpus.generate_dialogues(settings.eval_prompts, EVAL_SEED), seen_prompts)
    command = "PYTHONPATH=src python scripts/train_demo.py" + (" --quick" if args.quick else "")
    params = sum(p.numel() for p in model.parameters())
    write_readme(args.out, settings, result, evaluation, tokenizer.get_vocab_size(), config, params, command)
    print(f"trained in {result.seconds:.0f}s, final loss {result.final_loss:.4f} "
          f"(answers {result.final_answer_loss:.4f}), held-out accuracy {evaluation.accuracy:.1%} "
          f"(unseen prompts {evaluation.unseen_correct}/{evaluation.unseen_total})", flush=True)
    for category, n in sorted(evaluation.total.items()):
        print(f"  {category:14s} {evaluation.correct.get(category, 0)}/{n}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
