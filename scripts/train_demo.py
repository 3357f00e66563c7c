"""Train the demo model that ships in src/edge_infer/assets/demo-model/.

    PYTHONPATH=src python scripts/train_demo.py

Generates a templated chat corpus (scripts/demo_corpus.py) and phone-agent
turns played by the scripted expert on the simulated phone
(scripts/demo_agent_corpus.py), trains a byte-level BPE tokenizer on both,
trains a small Qwen2-architecture decoder with transformers on rows packed
by scripts/demo_packing.py, writes a bf16 Hugging Face checkpoint, then
reloads that checkpoint and measures greedy exact-match accuracy on held-out
generated prompts and runs the agent suite against it with `edge-infer agent
suite --serve` (the real server). Deterministic for a given thread count:
fixed seeds. Takes over an hour (the shipped model: 4221 s with --threads 1 on a shared machine).

    PYTHONPATH=src python scripts/train_demo.py --continue-from src/edge_infer/assets/demo-model

trains such a checkpoint further on freshly drawn data, mostly agent turns,
keeping its tokenizer; the shipped model is a from-scratch run continued
once (its README gives both runs).
"""

from __future__ import annotations

import argparse
import json
import math
import os
import random
import re
import subprocess
import sys
import tempfile
import time
from collections import Counter
from dataclasses import dataclass
from pathlib import Path

import torch
from safetensors.torch import save_file
from tokenizers import AddedToken, Regex, Tokenizer, decoders, models, normalizers, pre_tokenizers, trainers

sys.path.insert(0, str(Path(__file__).parent))
import demo_agent_corpus  # noqa: E402  (these live next to this script)
import demo_corpus  # noqa: E402
from demo_packing import (  # noqa: E402
    DECISION_WEIGHT, PROMPT_LOSS_WEIGHT, BranchRows, PackedRows, branch_mask, pack, pack_branches, shared_prefix_forward,
)

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


@dataclass(frozen=True)
class TrainSettings:
    dialogues: int  # templated chat dialogues
    agent_turns: int  # agent turns (one dialogue each)
    steps: int
    batch_size: int  # rows of chat dialogues per step
    agent_batch_size: int  # rows of agent turns (after their shared prefix) per step
    seq_len: int
    lr: float  # peak
    warmup_steps: int
    eval_prompts: int
    eval_agent_turns: int
    section_page_share: float | None = None  # of agent turns; None: as episodes bring them


FULL = TrainSettings(dialogues=17500, agent_turns=20000, steps=1200, batch_size=4, agent_batch_size=8, seq_len=512,
                     lr=3e-3, warmup_steps=40, eval_prompts=200, eval_agent_turns=200)
# Further training of a FULL checkpoint (--continue-from): fresh episodes and dialogues, mostly agent rows, half
# of their turns on a Settings section's page (FULL's model answers there with the average answer, tap or done,
# whatever the switch's state), a lower peak; the tokenizer and every weight carry over.
CONTINUED = TrainSettings(dialogues=17500, agent_turns=20000, steps=500, batch_size=2, agent_batch_size=12, seq_len=512,
                          lr=1e-3, warmup_steps=20, eval_prompts=200, eval_agent_turns=200, section_page_share=0.5)
CONTINUE_SEED = 4321  # fresh data: neither the first run's seed nor the held-out one
QUICK = TrainSettings(dialogues=2000, agent_turns=600, steps=30, batch_size=4, agent_batch_size=4, seq_len=512,
                      lr=3e-3, warmup_steps=5, eval_prompts=40, eval_agent_turns=20)


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


def load_model(checkpoint: Path, config: dict):
    """A saved checkpoint as float32 master weights, to train further."""
    from safetensors.torch import load_file

    model = build_model(config)
    missing, unexpected = model.load_state_dict(
        {k: v.float() for k, v in load_file(str(checkpoint / "model.safetensors")).items()}, strict=False)
    if unexpected or set(missing) - {"lm_head.weight"}:
        raise SystemExit(f"{checkpoint} does not match the demo model's shape: missing {missing}, unexpected {unexpected}")
    model.tie_weights()
    return model


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
    final_answer_loss: float  # loss on chat answer tokens only, same steps
    final_agent_answer_loss: float  # loss on agent answer tokens (the tool calls) only, same steps
    curve: list[tuple[int, float]]  # (steps done, mean weighted loss of the last LOG_EVERY steps)


def batch_order(rows: int, steps: int, batch_size: int, seed: int) -> torch.Tensor:
    """Row indices of every step: shuffled epochs, as many as needed."""
    generator = torch.Generator().manual_seed(seed)
    needed = steps * batch_size
    return torch.cat([torch.randperm(rows, generator=generator) for _ in range(math.ceil(needed / rows))])[:needed]


def _token_losses(logits: torch.Tensor, ids: torch.Tensor, weights: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Per-token loss of predicting each next token, and its weight (flattened)."""
    losses = torch.nn.functional.cross_entropy(logits[..., :-1, :].float().flatten(0, -2), ids[..., 1:].flatten(),
                                               reduction="none")
    return losses, weights[..., 1:].flatten()


def train(model, chat: PackedRows, agent: BranchRows, settings: TrainSettings) -> TrainResult:
    """Each step: a batch of chat rows and a batch of agent rows behind their shared prefix, one AdamW update."""
    decay = [p for p in model.parameters() if p.dim() >= 2]
    no_decay = [p for p in model.parameters() if p.dim() < 2]
    optimizer = torch.optim.AdamW(
        [{"params": decay, "weight_decay": 0.1}, {"params": no_decay, "weight_decay": 0.0}],
        lr=settings.lr, betas=(0.9, 0.95),
    )
    chat_order = batch_order(len(chat.input_ids), settings.steps, settings.batch_size, TRAIN_SEED)
    agent_order = batch_order(len(agent.rows.input_ids), settings.steps, settings.agent_batch_size, TRAIN_SEED + 1)
    prefix_len = len(agent.prefix_ids)
    losses, answer_losses, agent_answer_losses, curve = [], [], [], []
    model.train()
    load_before = os.getloadavg()[0]
    start = time.perf_counter()
    for step in range(settings.steps):
        batch = chat_order[step * settings.batch_size:(step + 1) * settings.batch_size]
        agent_batch = agent_order[step * settings.agent_batch_size:(step + 1) * settings.agent_batch_size]
        rows = agent.rows
        for group in optimizer.param_groups:
            group["lr"] = learning_rate(step, settings)
        with torch.autocast("cpu", dtype=torch.bfloat16):
            # No cache: with one, transformers would not isolate the packed dialogues.
            chat_logits = model(input_ids=chat.input_ids[batch], position_ids=chat.position_ids[batch], use_cache=False).logits
            prefix_logits, cache = shared_prefix_forward(model, agent.prefix_ids, len(agent_batch))
            agent_logits = model(
                input_ids=rows.input_ids[agent_batch], position_ids=rows.position_ids[agent_batch], cache=cache,
                attention_mask=branch_mask(rows.segments[agent_batch], prefix_len), use_cache=True,
            ).logits
        chat_loss, chat_weights = _token_losses(chat_logits, chat.input_ids[batch], chat.weights[batch])
        prefix_loss, prefix_weights = _token_losses(prefix_logits, agent.prefix_ids, agent.prefix_weights)
        agent_loss, agent_weights = _token_losses(agent_logits, rows.input_ids[agent_batch], rows.weights[agent_batch])
        total = (chat_loss * chat_weights).sum() + (agent_loss * agent_weights).sum() + (prefix_loss * prefix_weights).sum()
        loss = total / (chat_weights.sum() + agent_weights.sum() + prefix_weights.sum())
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
        losses.append(loss.item())
        answer_losses.append(chat_loss[chat_weights >= 1.0].mean().item())
        agent_answer_losses.append(agent_loss[agent_weights >= 1.0].mean().item())
        if (step + 1) % LOG_EVERY == 0 or step == settings.steps - 1:
            window = len(losses[-LOG_EVERY:])
            curve.append((step + 1, round(sum(losses[-LOG_EVERY:]) / window, 4)))
            print(f"step {step + 1:4d}  loss {curve[-1][1]:.4f}  "
                  f"answer loss {sum(answer_losses[-LOG_EVERY:]) / window:.4f}  "
                  f"agent answer loss {sum(agent_answer_losses[-LOG_EVERY:]) / window:.4f}  "
                  f"lr {learning_rate(step, settings):.2e}  {time.perf_counter() - start:.0f}s", flush=True)
    tail = max(1, settings.steps // 10)
    return TrainResult(
        seconds=time.perf_counter() - start,
        load_before=load_before,
        load_after=os.getloadavg()[0],
        final_loss=sum(losses[-tail:]) / tail,
        final_answer_loss=sum(answer_losses[-tail:]) / tail,
        final_agent_answer_loss=sum(agent_answer_losses[-tail:]) / tail,
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

def _accuracy_rows(evaluation: EvalResult) -> str:
    return "\n".join(
        f"| {c} | {evaluation.correct.get(c, 0)}/{n} | {evaluation.correct.get(c, 0) / n:.0%} |"
        for c, n in sorted(evaluation.total.items())
    )


def _suite_rows(suite: dict) -> str:
    rows = []
    for e in suite["episodes"]:
        damage = "; ".join(e["collateral"]) or "none"
        rows.append(f"| {e['task']} | {'**pass**' if e['success'] else 'fail'} | {'yes' if e['false_claim'] else 'no'} | "
                    f"{damage} | {e['steps']} | {e['stop_reason']} |")
    return "\n".join(rows)


def _training_text(settings: TrainSettings, result: TrainResult, command: str, threads: int) -> str:
    """What a from-scratch run did (the README's "How it was trained")."""
    curve = ", ".join(f"{loss} (step {step})" for step, loss in result.curve[3::4])
    return f"""    {command}

All data is generated (seed {TRAIN_SEED}); nothing is downloaded.

- {settings.dialogues:,} chat dialogues from the templates in
  `scripts/demo_corpus.py`, packed into rows of {settings.seq_len} tokens,
  each dialogue attending only to itself.
- {settings.agent_turns:,} agent turns from `scripts/demo_agent_corpus.py`:
  the scripted expert (`edge_infer.agent.expert`) plays random tasks on
  randomised demo phones through the real agent loop, so each turn is the
  exact request the loop sends (system prompt, tools, screen, last actions,
  task), rendered by this chat template as the server renders it. Tasks:
  any switch on or off (half of them already in the wanted state),
  any app, any alarm time, two tasks chained; phones: other switches and
  alarms, labels renamed with other phones' words, shuffled lists, decoy
  switches beside Wi-Fi, start screens other than home, and now and then
  a random step (played, not learnt) that the expert recovers from. Only
  episodes the task oracle passes are kept. On the page of a switch the
  task names, the answer first copies the switch's line and adds the
  state the task wants ('[2] Switch "Wi-Fi" on; task: on.'), then calls
  the tool.
- Every agent turn begins with the same system prompt and tools; that
  prefix is run once per batch and its keys and values are shared by all
  agent rows, each holding several turns that attend to it and to
  themselves (`scripts/demo_packing.py`): the same computation as on whole
  turns, for about a quarter of the tokens.
- {settings.steps} AdamW steps, each of {settings.batch_size} chat rows and {settings.agent_batch_size} agent rows, peak
  learning rate {settings.lr}, cosine schedule, bf16 autocast, {threads} CPU thread{"s" if threads > 1 else ""}.
  Answer tokens have loss weight 1, prompt tokens {PROMPT_LOSS_WEIGHT}; in a switch's reading the
  state copied and the call's first token (tap or task_complete) {DECISION_WEIGHT:g}.

- training time: {result.seconds:.0f} s wall clock (1-minute load average
  {result.load_before:.1f} before, {result.load_after:.1f} after, on a
  machine shared with other work)
- final loss (weighted, mean of the last 10% of steps): {result.final_loss:.4f}
- final loss on chat answer tokens only: {result.final_answer_loss:.4f};
  on agent answer tokens (the tool calls) only: {result.final_agent_answer_loss:.4f}
- loss, mean of the {LOG_EVERY} steps up to: {curve}"""


def _continued_text(settings: TrainSettings, result: TrainResult, command: str, threads: int, seed: int) -> str:
    """What a --continue-from run added to its checkpoint's training."""
    curve = ", ".join(f"{loss} (step {step})" for step, loss in result.curve[1::2])
    share = "" if settings.section_page_share is None else (
        f", {settings.section_page_share:.0%} of the turns\n  on a Settings section's page (tap the switch the task "
        "names, call it done when the switch\n  already holds, or leave a wrong section)")
    return f"""Then trained further from that checkpoint, keeping its tokenizer:

    {command}

- fresh data (seed {seed}): {settings.dialogues:,} chat dialogues and {settings.agent_turns:,} agent turns
  drawn as above{share}; on a switch's page the answer first copies the switch's line and adds the
  state the task wants ('[2] Switch "Wi-Fi" on; task: on.'), then calls the tool; the state copied and the
  call's first token (tap or task_complete) have loss weight {DECISION_WEIGHT:g}.
- {settings.steps} AdamW steps (a new optimizer state), each of {settings.batch_size} chat rows and {settings.agent_batch_size} agent rows,
  peak learning rate {settings.lr} after {settings.warmup_steps} warm-up steps, cosine schedule, bf16 autocast,
  {threads} CPU thread{"s" if threads > 1 else ""}.
- training time: {result.seconds:.0f} s wall clock (1-minute load average {result.load_before:.1f} before,
  {result.load_after:.1f} after)
- final loss (weighted, mean of the last 10% of steps): {result.final_loss:.4f}; on chat answer tokens
  {result.final_answer_loss:.4f}, on agent answer tokens {result.final_agent_answer_loss:.4f}
- loss, mean of the {LOG_EVERY} steps up to: {curve}
"""


def _training_section(readme: Path) -> str:
    """The "How it was trained" text of a checkpoint this script wrote."""
    text = readme.read_text()
    start, end = text.find("## How it was trained\n\n"), text.find("\n## Accuracy")
    if start < 0 or end < 0:
        raise SystemExit(f"{readme} is not a README this script wrote: it has no 'How it was trained' section")
    return text[start + len("## How it was trained\n\n"):end].rstrip("\n") + "\n"


def write_readme(out: Path, settings: TrainSettings, result: TrainResult, evaluation: EvalResult,
                 agent_evaluation: EvalResult, suite: dict, vocab: int, config: dict, params: int,
                 training: str) -> None:
    size = sum(p.stat().st_size for p in out.iterdir() if p.name != "README.md")
    unseen = evaluation.unseen_correct / max(1, evaluation.unseen_total)
    agent_unseen = agent_evaluation.unseen_correct / max(1, agent_evaluation.unseen_total)
    passed = sum(e["success"] for e in suite["episodes"])
    (out / "README.md").write_text(f"""# edge-infer demo model (a toy)

A tiny chat model shipped with edge-infer, so that `edge-infer serve` works on
a fresh machine with no checkpoint at hand, so that quantization fidelity
can be measured against a trained reference model, and so that `edge-infer
agent suite --serve` has a model that operates the simulated phone.

It is **a toy**. It only knows the templated dialogues it was trained on:
greetings, adding and subtracting numbers up to 10, counting, repeating text,
capitals of a few real and made-up countries, colors, opposites, the languages
of a small made-up world, calling the tools `get_weather`, `get_time`,
`set_alarm`, `add` and `send_message` (with `tools` given, it answers with a
`<tool_call>` block; given the tool's result, it answers in words), and the
turns of the phone agent (`edge_infer.agent`) on the demo phone: with the
agent's system prompt and tools, it reads the screen, its last actions and
the task and answers with one tool call. Anything else gets fluent-looking
nonsense. Even in distribution it is often wrong, most of all where the
answer must copy something from the prompt (a sum, repeated text, the values
in a tool's result): see the accuracy tables.

## Architecture

- Qwen2 (`Qwen2ForCausalLM`), {params:,} parameters, stored in bfloat16.
- hidden {MODEL_SHAPE["hidden_size"]}, intermediate {MODEL_SHAPE["intermediate_size"]}, \
{MODEL_SHAPE["num_hidden_layers"]} layers, {MODEL_SHAPE["num_attention_heads"]} attention heads and \
{MODEL_SHAPE["num_key_value_heads"]} KV heads
  (head_dim {MODEL_SHAPE["hidden_size"] // MODEL_SHAPE["num_attention_heads"]}), q/k/v bias, tied embeddings, \
RoPE theta 10000, RMSNorm eps
  1e-6, max_position_embeddings {MAX_MODEL_LEN}; trained on dialogues of at
  most {settings.seq_len} tokens (agent turns: up to {settings.seq_len} after their shared prefix).
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

{training}
## Accuracy

Greedy decoding of this bf16 checkpoint, loaded with `transformers`, on
{sum(evaluation.total.values())} held-out dialogues drawn with another seed
({EVAL_SEED}); an answer counts when it matches exactly and ends with
`<|im_end|>`. Overall: **{evaluation.accuracy:.1%}**. The templates are
small, so many held-out prompts also occur in the training corpus; on the
{evaluation.unseen_total} that do not, accuracy is {unseen:.1%}.

| category | correct | accuracy |
|---|---|---|
{_accuracy_rows(evaluation)}

The same on {sum(agent_evaluation.total.values())} held-out agent turns (seed {EVAL_SEED}), by the tool the
expert called; the answer is the whole reply (any reading, then the `<tool_call>` block). Overall:
**{agent_evaluation.accuracy:.1%}**; on the {agent_evaluation.unseen_total} turns whose prompt is not in the
training corpus, {agent_unseen:.1%}.

| expert's call | correct | accuracy |
|---|---|---|
{_accuracy_rows(agent_evaluation)}

## The agent suite

`edge-infer agent suite --serve src/edge_infer/assets/demo-model`: the real
server, greedy decoding, every task and variant once (docs/agent.md).
Passed **{passed}/{len(suite["episodes"])}**.

| task | result | false claim | collateral damage | steps | stopped by |
|---|---|---|---|---|---|
{_suite_rows(suite)}

How far this is from what it was trained on: the suite's tasks, wordings
and start states are among the training episodes' (the base tasks exactly);
the rename variant's words (Connections, WLAN, Flight mode) are among the
synonyms the training phones use; the reorder variant's order and the decoy
layout are drawn at random in training like any other. It is a 5M-parameter
model that learnt these screens, not a phone agent.

Size of the checkpoint files: {size / 1e6:.1f} MB.
""")


# --------------------------------------------------------------------- main

def agent_prefix() -> str:
    """What every agent turn starts with: the loop's system prompt and tools, up to the user's message."""
    from edge_infer.agent.actions import SYSTEM_PROMPT, TOOLS

    return demo_corpus.render([{"role": "system", "content": SYSTEM_PROMPT}], TOOLS) + "<|im_start|>user\n"


def corpus(settings: TrainSettings, seed: int) -> tuple[list[demo_corpus.Dialogue], list[demo_corpus.Dialogue]]:
    """Chat dialogues and agent turns; the turns of one episode are spread apart so no row holds a whole episode."""
    agent = demo_agent_corpus.generate_agent_dialogues(settings.agent_turns, seed, settings.section_page_share)
    random.Random(seed).shuffle(agent)
    return demo_corpus.generate_dialogues(settings.dialogues, seed), agent


def run_agent_suite(checkpoint: Path) -> dict:
    """`edge-infer agent suite --serve` on the checkpoint: every task and variant once, greedy, on the real server."""
    with tempfile.TemporaryDirectory() as tmp:
        report = Path(tmp) / "suite.json"
        subprocess.run([sys.executable, "-m", "edge_infer.cli", "agent", "suite", "--serve", str(checkpoint),
                        "--out", str(report)], check=True)
        return json.loads(report.read_text())


def source_commit() -> str:
    """The commit this script runs from, marked when the tree differs from it, so a README names its recipe."""
    def git(*argv: str) -> str:
        return subprocess.run(["git", *argv], cwd=Path(__file__).parent, capture_output=True, text=True).stdout.strip()

    commit = git("rev-parse", "--short=12", "HEAD") or "unknown"
    return commit + (" with uncommitted changes" if git("status", "--porcelain", "--", "src", "scripts") else "")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=DEFAULT_OUT, help="checkpoint directory to write")
    parser.add_argument("--quick", action="store_true", help="tiny settings to check the pipeline, not to ship")
    parser.add_argument("--threads", type=int, default=2, help="torch threads (results are reproducible per thread count)")
    parser.add_argument("--continue-from", type=Path, metavar="CHECKPOINT",
                        help="train this checkpoint (one this script wrote) further on fresh data, keeping its tokenizer")
    parser.add_argument("--seed", type=int,
                        help=f"with --continue-from: the data's seed (default {CONTINUE_SEED}; another for each further run)")
    args = parser.parse_args()
    if args.continue_from and args.quick:
        parser.error("--quick trains from scratch; it does not combine with --continue-from")
    if args.seed is not None and not args.continue_from:
        parser.error("--seed picks a further run's data; a run from scratch always uses the recorded seed")
    settings = CONTINUED if args.continue_from else QUICK if args.quick else FULL
    seed = (CONTINUE_SEED if args.seed is None else args.seed) if args.continue_from else TRAIN_SEED
    torch.manual_seed(seed)
    torch.set_num_threads(args.threads)

    chat, agent = corpus(settings, seed)
    chat_texts, agent_texts = [d.render() for d in chat], [d.render() for d in agent]
    seen_prompts = {d.prompt() for d in chat + agent}
    if args.continue_from:
        tokenizer = Tokenizer.from_file(str(args.continue_from / "tokenizer.json"))
        config = json.loads((args.continue_from / "config.json").read_text())
        earlier_training = _training_section(args.continue_from / "README.md")
        # What it saw before: the first run's data, and the first continuation's when this is a later one.
        earlier = [(FULL, TRAIN_SEED)] + ([(CONTINUED, CONTINUE_SEED)] if seed != CONTINUE_SEED else [])
        seen_prompts |= {d.prompt() for run in earlier for part in corpus(*run) for d in part}
    else:
        tokenizer = train_tokenizer(chat_texts + agent_texts)
    special = {t: token_id(tokenizer, t) for t in demo_corpus.SPECIAL_TOKENS + demo_corpus.TOOL_TOKENS}
    chat_rows = pack(chat_texts, tokenizer, settings.seq_len, pad_id=special["<|endoftext|>"])
    agent_rows = pack_branches(agent_texts, agent_prefix(), tokenizer, settings.seq_len, pad_id=special["<|endoftext|>"])
    print(f"{len(chat_texts)} dialogues in {len(chat_rows.input_ids)} rows, {len(agent_texts)} agent turns in "
          f"{len(agent_rows.rows.input_ids)} rows behind a {len(agent_rows.prefix_ids)}-token prefix; vocabulary "
          f"{tokenizer.get_vocab_size()}; {settings.steps * settings.batch_size / len(chat_rows.input_ids):.2f} and "
          f"{settings.steps * settings.agent_batch_size / len(agent_rows.rows.input_ids):.2f} epochs", flush=True)

    if args.continue_from:
        model = load_model(args.continue_from, config)
    else:
        config = model_config(-(-tokenizer.get_vocab_size() // VOCAB_MULTIPLE) * VOCAB_MULTIPLE, special)
        model = build_model(config)
    result = train(model, chat_rows, agent_rows, settings)
    save_checkpoint(args.out, model, config, tokenizer, special)

    evaluation = evaluate(args.out, demo_corpus.generate_dialogues(settings.eval_prompts, EVAL_SEED), seen_prompts)
    agent_evaluation = evaluate(
        args.out, demo_agent_corpus.generate_agent_dialogues(settings.eval_agent_turns, EVAL_SEED), seen_prompts,
    )
    suite = run_agent_suite(args.out)
    command = "PYTHONPATH=src python scripts/train_demo.py" + (" --quick" if args.quick else "")
    at = f"  # scripts at commit {source_commit()}"
    if args.threads != 2:
        command += f" --threads {args.threads}"
    if args.continue_from:
        command += f" --continue-from {args.continue_from}" + (f" --seed {seed}" if seed != CONTINUE_SEED else "")
        training = earlier_training + "\n" + _continued_text(settings, result, command + at, args.threads, seed)
    else:
        training = _training_text(settings, result, command + at, args.threads)
    params = sum(p.numel() for p in model.parameters())
    write_readme(args.out, settings, result, evaluation, agent_evaluation, suite, tokenizer.get_vocab_size(), config,
                 params, training)
    print(f"trained in {result.seconds:.0f}s, final loss {result.final_loss:.4f} "
          f"(answers {result.final_answer_loss:.4f}, agent answers {result.final_agent_answer_loss:.4f}), "
          f"held-out accuracy {evaluation.accuracy:.1%} (unseen prompts {evaluation.unseen_correct}/"
          f"{evaluation.unseen_total}), agent turns {agent_evaluation.accuracy:.1%}, "
          f"suite pass rate {suite['pass_rate']:.0%}", flush=True)
    for result_set in (evaluation, agent_evaluation):
        for category, n in sorted(result_set.total.items()):
            print(f"  {category:20s} {result_set.correct.get(category, 0)}/{n}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
