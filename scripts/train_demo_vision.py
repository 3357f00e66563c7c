"""Give the demo model eyes: train the vision demo, the embedded default model (src/edge_infer/assets/demo-vl-model/).

    PYTHONPATH=src python scripts/train_demo_vision.py --threads 2 [--lm src/edge_infer/assets/demo-model]

The result is a Qwen2.5-VL checkpoint (``Qwen2_5_VLForConditionalGeneration``, transformers 5.24's layout):
the demo text model with multimodal RoPE and a tiny Qwen2.5 ViT (14-px patches, temporal patch 2, 2x2 merger
into the decoder's width), trained on pictures drawn with Pillow (scripts/demo_vision_data.py: coloured shapes,
digits, counts) to answer questions about them. Nothing is downloaded; it takes about 45 minutes on two CPU threads
(the shipped checkpoint: 874 s for the tower, 1,623 s for the whole model, on an AMD EPYC with AVX-512).

The text model alone cannot be steered into these answers through its input (a frozen decoder, or a frozen
embedding, learns next to nothing: the README says what was tried), so all of the model learns, and each step
also distils the text model on its own samples (KL to its next-token distributions), so that without a picture
the vision model keeps answering as the text model does. With text-only input M-RoPE equals 1-D RoPE.

The checkpoint is written with edge-infer's layout helpers (``models.synth`` / ``models.synth_thinker``:
config.json as transformers saves it, the tokenizer with the media tokens, a chat template that renders image
parts), then loaded in edge-infer's engine, which answers held-out pictures' questions (``LLM.chat``, greedy),
dense and with quantized towers (``--encoder-quantization``), and held-out text prompts beside the text model:
the figures go into the checkpoint's README.md.
"""
from __future__ import annotations

import argparse
import base64
import io
import json
import math
import os
import shutil
import sys
import time
from collections import Counter
from dataclasses import dataclass, field, replace
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))
import demo_vision_data as data  # noqa: E402  (lives next to this script)

REPO = Path(__file__).resolve().parent.parent
DEFAULT_LM = REPO / "src" / "edge_infer" / "assets" / "demo-model"
DEFAULT_OUT = REPO / "src" / "edge_infer" / "assets" / "demo-vl-model"

TRAIN_SEED = 1234
EVAL_SEED = 98765

# The tower: 4 blocks of width 128 (the last one attends over the whole picture; the others within 112-px
# windows, which at these sizes is most of it), merged 2x2 into the decoder's width.
TOWER = dict(depth=4, hidden_size=128, intermediate_size=256, num_heads=2, fullatt_block_indexes=[3])
# Pictures are resized to between 56x56 and 224x224 pixels' area: a square 224-px picture is 16x16 patches, 64 tokens.
PIXELS = dict(min_pixels=56 * 56, max_pixels=224 * 224)
# M-RoPE's frequency pairs per axis (time, height, width), in Qwen's 1:1.5:1.5 ratio for a head of 64.
MROPE_SECTION = [8, 12, 12]


@dataclass(frozen=True)
class Settings:
    steps: int
    batch_size: int  # pictures per step
    replay_rows: int  # rows of text per step (distillation: the text model's samples and its corpus, alternately)
    replay_len: int  # tokens per sampled row
    replay_pool: int  # rows made before training, cycled through
    lr_tower: float  # peak learning rates
    lr_decoder: float
    kl_weight: float  # of the distillation term, against the answers' cross-entropy
    warmup_steps: int
    eval_examples: int
    tower_steps: int  # of the tower's own pre-training (what is where in the picture), before the whole model
    tower_batch: int


FULL = Settings(steps=2000, batch_size=16, replay_rows=4, replay_len=320, replay_pool=512, lr_tower=1e-3,
                lr_decoder=1e-3, kl_weight=1.0, warmup_steps=20, eval_examples=400, tower_steps=2000, tower_batch=32)
QUICK = Settings(steps=6, batch_size=4, replay_rows=2, replay_len=64, replay_pool=8, lr_tower=1e-3,
                 lr_decoder=1e-3, kl_weight=1.0, warmup_steps=2, eval_examples=40, tower_steps=6, tower_batch=4)


# ------------------------------------------------------------------ checkpoint layout

def vl_chat_template(text_template: str) -> str:
    """The text model's template (tools and all) with every message content written by synth's ``render`` macro,
    so that user messages may hold image parts; text-only conversations render exactly as before."""
    from edge_infer.models.synth_thinker import MARKERS, render_macro

    template = text_template
    for old, new in (('+ system_message }}', '+ render(system_message) }}'),
                     ('(message.content or "")', 'render(message.content)')):
        if template.count(old) != 1:
            raise SystemExit(f"the text model's chat template has changed: {old!r} occurs {template.count(old)} "
                             "times, not once; update vl_chat_template")
        template = template.replace(old, new)
    return render_macro({"image": MARKERS["qwen2_5_vl"]["image"]}) + template


def write_layout(lm: Path, out: Path) -> dict:
    """config.json, tokenizer, chat template, preprocessor and generation config of the vision model in ``out``."""
    from edge_infer.models.synth import FamilyStyle, write_tokenizer
    from edge_infer.models.synth_thinker import ARCHITECTURES, CHATML, MARKERS, PREPROCESSORS, thinker_config

    lm_config = json.loads((lm / "config.json").read_text())
    if lm_config.get("architectures") != ["Qwen2ForCausalLM"]:
        raise SystemExit(f"{lm}: expected the demo text model (Qwen2ForCausalLM), found {lm_config.get('architectures')}")
    out.mkdir(parents=True, exist_ok=True)
    text_template = json.loads((lm / "tokenizer_config.json").read_text())["chat_template"]
    markers = tuple(dict.fromkeys(t for marks in MARKERS["qwen2_5_vl"].values() for t in marks))
    style = FamilyStyle(ARCHITECTURES["qwen2_5_vl"], "qwen2_5_vl", None, "<|im_end|>", CHATML + markers,
                        vl_chat_template(text_template))
    ids = write_tokenizer(out, style, lm_config["max_position_embeddings"], base=lm)
    if max(ids.values()) >= lm_config["vocab_size"]:
        raise SystemExit(f"{lm}: its embedding has {lm_config['vocab_size']} rows, no room for the media tokens")
    text = {k: lm_config[k] for k in ("hidden_size", "intermediate_size", "num_hidden_layers", "num_attention_heads",
                                      "num_key_value_heads", "max_window_layers", "max_position_embeddings",
                                      "rope_theta")}
    shape = dict(text=dict(text, mrope_section=MROPE_SECTION), vision=TOWER,
                 tie_word_embeddings=lm_config["tie_word_embeddings"])
    config = thinker_config("qwen2_5_vl", shape, lm_config["vocab_size"], ids, "bfloat16")
    (out / "config.json").write_text(json.dumps(config, indent=2) + "\n")
    (out / "preprocessor_config.json").write_text(json.dumps({**PREPROCESSORS["qwen2_5_vl"], **PIXELS}, indent=2) + "\n")
    shutil.copy(lm / "generation_config.json", out / "generation_config.json")
    return config


def build_model(lm: Path, out: Path, seed: int):
    """transformers' Qwen2_5_VLForConditionalGeneration: the text model's weights, a fresh tower."""
    import torch
    from safetensors.torch import load_file
    from transformers import Qwen2_5_VLConfig, Qwen2_5_VLForConditionalGeneration

    torch.manual_seed(seed)
    model = Qwen2_5_VLForConditionalGeneration(Qwen2_5_VLConfig.from_pretrained(out)).float()
    weights = load_file(str(lm / "model.safetensors"))
    decoder = {k.removeprefix("model."): v.float() for k, v in weights.items() if k.startswith("model.")}
    model.model.language_model.load_state_dict(decoder, strict=True)
    if "lm_head.weight" in weights:
        model.lm_head.weight.data.copy_(weights["lm_head.weight"].float())
    model.tie_weights()
    return model


def save_weights(model, lm: Path, out: Path) -> None:
    """model.safetensors in the hub layout, bf16."""
    import torch
    from safetensors.torch import load_file, save_file

    tensors = {}
    for prefix, module in (("visual.", model.model.visual), ("model.", model.model.language_model)):
        for name, value in module.state_dict().items():
            tensors[prefix + name] = value.detach().to(torch.bfloat16).contiguous()
    if "lm_head.weight" in load_file(str(lm / "model.safetensors")):  # an untied head is stored, as the text model's
        tensors["lm_head.weight"] = model.lm_head.weight.detach().to(torch.bfloat16).contiguous()
    save_file(tensors, str(out / "model.safetensors"), metadata={"format": "pt"})


# ------------------------------------------------------------------ examples into tensors

class Encoder:
    """Examples into token ids, labels and the processor's patches, as edge-infer's frontend prepares them."""

    def __init__(self, out: Path):
        from tokenizers import Tokenizer as HfTokenizer

        from edge_infer.media.config import MediaProcessing
        from edge_infer.models.tokenizer import Tokenizer

        self.chat = Tokenizer(out)
        self.bpe = HfTokenizer.from_file(str(out / "tokenizer.json"))
        self.vision = MediaProcessing.from_dir(out).vision
        self.image_pad = self.bpe.token_to_id("<|image_pad|>")

    def prompt(self, question: str) -> str:
        return self.chat.apply_chat_template(messages(question), add_generation_prompt=True)

    def encode(self, example: data.Example):
        from edge_infer.media.image import image_features

        features = image_features(data.draw(example.scene), self.vision)
        prompt = self.bpe.encode(self.prompt(example.question), add_special_tokens=False).ids
        at = prompt.index(self.image_pad)
        prompt = prompt[:at] + [self.image_pad] * features.num_tokens + prompt[at + 1:]
        answer = self.bpe.encode(example.answer + "<|im_end|>", add_special_tokens=False).ids
        return prompt + answer, [-100] * len(prompt) + answer, features


def messages(question: str, image_url: str | None = None) -> list[dict]:
    """One user turn: the picture, then the question (as Qwen2.5-VL's examples put them)."""
    image = {"type": "image_url", "image_url": {"url": image_url}} if image_url else {"type": "image"}
    return [{"role": "user", "content": [image, {"type": "text", "text": question}]}]


def batch(encoder: Encoder, examples: list[data.Example]) -> dict:
    import numpy as np
    import torch

    rows = [encoder.encode(e) for e in examples]
    width = max(len(ids) for ids, _, _ in rows)
    input_ids = torch.zeros(len(rows), width, dtype=torch.long)
    labels = torch.full((len(rows), width), -100, dtype=torch.long)
    mask = torch.zeros(len(rows), width, dtype=torch.long)
    for i, (ids, target, _) in enumerate(rows):
        input_ids[i, :len(ids)] = torch.tensor(ids)
        labels[i, :len(ids)] = torch.tensor(target)
        mask[i, :len(ids)] = 1
    # Marks the image tokens for transformers' M-RoPE: without it transformers falls back to 1-D positions, and the
    # decoder would learn positions other than the 3-D ones edge-infer's engine (and transformers' processor) give.
    types = (input_ids == encoder.image_pad).int()
    return dict(input_ids=input_ids, labels=labels, attention_mask=mask, mm_token_type_ids=types,
                pixel_values=torch.from_numpy(np.concatenate([f.pixel_values for _, _, f in rows])),
                image_grid_thw=torch.tensor([f.grid_thw for _, _, f in rows]))


# ------------------------------------------------------------------ training

# The tower's pre-training labels each image token with what covers most of its 28x28 pixels.
COLOR_CLASSES = ("none",) + tuple(data.COLORS)
SHAPE_CLASSES = ("none",) + data.SHAPES + ("digit",)
DIGIT_CLASSES = ("none",) + tuple(str(d) for d in range(10))
MIN_COVER = 0.1  # of a token's pixels, for it to be labelled with an item


def token_labels(example: data.Example, grid_thw: tuple[int, int, int], merge: int, patch: int):
    """(colour, shape, digit) class per image token, in the merger's output order (row-major over merged cells)."""
    import numpy as np

    _, gh, gw = grid_thw
    cell = merge * patch
    items = np.asarray(data.label_map(example.scene).resize((gw * patch, gh * patch), resample=0))  # nearest
    cells = items.reshape(gh // merge, cell, gw // merge, cell).transpose(0, 2, 1, 3).reshape(-1, cell * cell)
    labels = []
    for pixels in cells:
        counts = np.bincount(pixels, minlength=len(example.scene.items) + 1)[1:]
        if counts.size == 0 or counts.max() < MIN_COVER * cell * cell:
            labels.append((0, 0, 0))
            continue
        item = example.scene.items[int(counts.argmax())]
        digit = 0 if item.digit is None else 1 + item.digit
        labels.append((COLOR_CLASSES.index(item.color), SHAPE_CLASSES.index(item.shape), digit))
    return labels


def pretrain_tower(model, encoder: Encoder, settings: Settings, seed: int) -> list[float]:
    """Teach the tower alone what is where: linear heads on each output token predict the colour, the shape and the
    digit covering it. Cheap (no decoder), and it gives the whole model's training a tower whose tokens already say
    something, which the decoder then learns to read."""
    import numpy as np
    import torch
    import torch.nn.functional as F

    from edge_infer.media.image import image_features

    torch.manual_seed(seed)
    tower = model.model.visual
    heads = torch.nn.Linear(tower.config.out_hidden_size, len(COLOR_CLASSES) + len(SHAPE_CLASSES) + len(DIGIT_CLASSES))
    params = list(tower.parameters()) + list(heads.parameters())
    optimizer = torch.optim.AdamW(params, lr=settings.lr_tower, weight_decay=0.0, betas=(0.9, 0.98))
    stream = data.examples(settings.tower_steps * settings.tower_batch, seed + 1)
    sizes = (len(COLOR_CLASSES), len(SHAPE_CLASSES), len(DIGIT_CLASSES))
    losses: list[float] = []
    for step in range(settings.tower_steps):
        for group in optimizer.param_groups:
            group["lr"] = settings.lr_tower * learning_rate(step, replace(settings, steps=settings.tower_steps))
        examples = stream[step * settings.tower_batch:(step + 1) * settings.tower_batch]
        features = [image_features(data.draw(e.scene), encoder.vision) for e in examples]
        labels = torch.tensor([label for e, f in zip(examples, features)
                               for label in token_labels(e, f.grid_thw, f.merge_size, encoder.vision.patch_size)])
        with torch.autocast("cpu", dtype=torch.bfloat16):
            tokens = tower(torch.from_numpy(np.concatenate([f.pixel_values for f in features])),
                           grid_thw=torch.tensor([f.grid_thw for f in features])).pooler_output
            logits = heads(tokens).float().split(sizes, dim=-1)
        loss = sum(F.cross_entropy(part, labels[:, i]) for i, part in enumerate(logits))
        loss.backward()
        torch.nn.utils.clip_grad_norm_(params, 1.0)
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        losses.append(loss.item())
        if step % 100 == 0 or step == settings.tower_steps - 1:
            print(f"tower step {step:4d}  loss {sum(losses[-100:]) / len(losses[-100:]):.4f}", flush=True)
    return losses


def replay_rows(lm: Path, settings: Settings, seed: int):
    """``replay_pool`` rows of text for the distillation, alternately of two kinds: the text model's own samples
    (temperature 1, from a bare system turn: the text it was trained on, in its proportions) and dialogues of
    its corpus (scripts/demo_corpus.py, packed end to end), which its samples under-cover (an echo or a greeting
    from a bare system turn is rare) — to keep its answers while the decoder learns to read pictures."""
    import demo_corpus
    import torch
    from transformers import AutoModelForCausalLM
    from tokenizers import Tokenizer as HfTokenizer

    teacher = AutoModelForCausalLM.from_pretrained(str(lm), dtype=torch.float32).eval()
    tokenizer = HfTokenizer.from_file(str(lm / "tokenizer.json"))
    start = tokenizer.encode("<|im_start|>system\n", add_special_tokens=False).ids
    torch.manual_seed(seed)
    half = settings.replay_pool // 2
    rows, chunk = [], 64
    with torch.no_grad():
        for _ in range(-(-half // chunk)):
            prompt = torch.tensor([start] * chunk)
            rows.append(teacher.generate(prompt, attention_mask=torch.ones_like(prompt), do_sample=True, temperature=1.0,
                                         top_p=1.0, top_k=0, max_new_tokens=settings.replay_len - len(start),
                                         min_new_tokens=settings.replay_len - len(start), pad_token_id=0))
    sampled = torch.cat(rows)[:half]
    stream: list[int] = []
    for dialogue in demo_corpus.generate_dialogues(half * settings.replay_len // 16, seed):
        stream += tokenizer.encode(dialogue.render(), add_special_tokens=False).ids
        if len(stream) >= half * settings.replay_len:
            break
    corpus = torch.tensor(stream[:half * settings.replay_len]).view(half, settings.replay_len)
    return teacher, torch.stack((sampled, corpus), 1).flatten(0, 1)  # the two kinds alternate


def learning_rate(step: int, settings: Settings) -> float:
    """The fraction of the peak learning rate at ``step``: linear warm-up, cosine decay to 5%."""
    if step < settings.warmup_steps:
        return (step + 1) / settings.warmup_steps
    progress = (step - settings.warmup_steps) / max(1, settings.steps - settings.warmup_steps)
    return 0.05 + 0.95 * 0.5 * (1 + math.cos(math.pi * progress))


@dataclass
class TrainResult:
    losses: list[float]  # answer cross-entropy per step
    kl: list[float]  # distillation KL (text model || this model) per step, nats per token
    seconds: float
    tower_losses: list[float] = field(default_factory=list)  # the tower's pre-training
    tower_seconds: float = 0.0


def train(model, teacher, replay, encoder: Encoder, settings: Settings, seed: int) -> TrainResult:
    """AdamW; each step a fresh batch of pictures with questions (cross-entropy on the answers) and rows of the
    text model's samples (KL to its next-token distributions at every position)."""
    import torch
    import torch.nn.functional as F

    tower = list(model.model.visual.parameters())
    decoder = [p for n, p in model.named_parameters() if not n.startswith("model.visual.")]
    optimizer = torch.optim.AdamW([{"params": tower, "lr": settings.lr_tower, "peak": settings.lr_tower},
                                   {"params": decoder, "lr": settings.lr_decoder, "peak": settings.lr_decoder}],
                                  weight_decay=0.0, betas=(0.9, 0.98))
    stream = data.examples(settings.steps * settings.batch_size, seed)
    result = TrainResult([], [], 0.0)
    model.train()
    start = time.perf_counter()
    for step in range(settings.steps):
        for group in optimizer.param_groups:
            group["lr"] = group["peak"] * learning_rate(step, settings)
        inputs = batch(encoder, stream[step * settings.batch_size:(step + 1) * settings.batch_size])
        text = replay[torch.arange(step * settings.replay_rows, (step + 1) * settings.replay_rows) % len(replay)]
        with torch.no_grad():
            target = F.log_softmax(teacher(input_ids=text).logits.float(), -1)
        with torch.autocast("cpu", dtype=torch.bfloat16):
            loss = model(**inputs).loss
            logits = model(input_ids=text).logits.float()
        kl = F.kl_div(F.log_softmax(logits, -1), target, log_target=True, reduction="sum") / text.numel()
        (loss + settings.kl_weight * kl).backward()
        torch.nn.utils.clip_grad_norm_(tower + decoder, 1.0)
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        result.losses.append(loss.item())
        result.kl.append(kl.item())
        if step % 10 == 0 or step == settings.steps - 1:
            recent = slice(max(0, step - 9), step + 1)
            print(f"step {step:4d}  answer loss {sum(result.losses[recent]) / len(result.losses[recent]):.4f}  "
                  f"kl {sum(result.kl[recent]) / len(result.kl[recent]):.4f}  {time.perf_counter() - start:.0f}s",
                  flush=True)
    result.seconds = time.perf_counter() - start
    return result


# ------------------------------------------------------------------ evaluation through edge-infer

def png_url(example: data.Example) -> str:
    buf = io.BytesIO()
    data.draw(example.scene).save(buf, format="PNG")
    return "data:image/png;base64," + base64.b64encode(buf.getvalue()).decode()


def evaluate(out: Path, examples: list[data.Example], threads: int, encoder_quantization: str | None = None,
             ) -> dict[str, tuple[int, int]]:
    """Greedy answers of edge-infer's engine to ``examples``: kind -> (exact matches, count)."""
    from edge_infer import LLM, SamplingParams

    conversations = [messages(e.question, png_url(e)) for e in examples]
    greedy = SamplingParams(temperature=0.0, max_tokens=32)
    with LLM(str(out), num_threads=threads, max_model_len=512, encoder_quantization=encoder_quantization) as llm:
        answers = [r.outputs[0] for r in llm.chat(conversations, greedy)]
    right, total = Counter(), Counter()
    for example, answer in zip(examples, answers):
        total[example.kind] += 1
        right[example.kind] += answer.text == example.answer and answer.finish_reason == "stop"
    return {kind: (right[kind], total[kind]) for kind in data.KINDS if total[kind]}


@dataclass
class TextAgreement:
    same: Counter  # category -> prompts whose greedy answer is the text model's, token for token
    right: Counter  # category -> answers that are the expected one (this model)
    right_text: Counter  # the same for the text model
    total: Counter


def text_agreement(out: Path, lm: Path, threads: int, count: int) -> TextAgreement:
    """Greedy answers of this model and of the text model (edge-infer's engine) to held-out text prompts of the
    text model's corpus (scripts/demo_corpus.py): how often they agree, and how often each is right."""
    import demo_corpus

    from edge_infer import LLM, SamplingParams

    dialogues = demo_corpus.generate_dialogues(count, EVAL_SEED)
    greedy = SamplingParams(temperature=0.0, max_tokens=64)
    answers = []
    for model in (out, lm):
        with LLM(str(model), num_threads=threads, max_model_len=1024) as llm:
            answers.append([r.outputs[0] for r in llm.generate([d.prompt() for d in dialogues], greedy)])
    result = TextAgreement(Counter(), Counter(), Counter(), Counter())
    for dialogue, mine, theirs in zip(dialogues, *answers):
        kind = dialogue.category
        result.total[kind] += 1
        result.same[kind] += mine.token_ids == theirs.token_ids
        result.right[kind] += mine.text == dialogue.answer() and mine.finish_reason == "stop"
        result.right_text[kind] += theirs.text == dialogue.answer() and theirs.finish_reason == "stop"
    return result


def percent(right: int, total: int) -> str:
    return f"{100 * right / total:.1f}%"


def overall(scores: dict[str, tuple[int, int]]) -> tuple[int, int]:
    return sum(r for r, _ in scores.values()), sum(t for _, t in scores.values())


# ------------------------------------------------------------------ README

def write_readme(out: Path, lm: Path, settings: Settings, result: TrainResult,
                 scores: dict[str | None, dict[str, tuple[int, int]]], agreement: TextAgreement, threads: int) -> None:
    from safetensors import safe_open

    from edge_infer.hardware.cpu import detect

    config = json.loads((out / "config.json").read_text())
    vision = config["vision_config"]
    with safe_open(str(out / "model.safetensors"), framework="numpy") as f:
        tower_params = sum(math.prod(f.get_slice(k).get_shape()) for k in f.keys() if k.startswith("visual."))
        total_params = sum(math.prod(f.get_slice(k).get_shape()) for k in f.keys())
    cpu = detect()
    base = scores[None]
    rows = "\n".join(f"| {kind} | {r}/{t} | {percent(r, t)} |" for kind, (r, t) in base.items())
    quant = "\n".join(
        f"| {method or 'none (bf16)'} | " + " | ".join(percent(*s[kind]) for kind in base) + f" | {percent(*overall(s))} |"
        for method, s in scores.items())
    text_rows = "\n".join(
        f"| {kind} | {agreement.same[kind]}/{n} | {percent(agreement.right[kind], n)} | {percent(agreement.right_text[kind], n)} |"
        for kind, n in sorted(agreement.total.items()))
    n_text = sum(agreement.total.values())
    tenth = max(1, len(result.losses) // 10)
    tower_tenth = max(1, len(result.tower_losses) // 10)

    def mean(values: list[float]) -> float:
        return sum(values) / len(values)

    size_mb = sum(p.stat().st_size for p in out.iterdir() if p.is_file()) / 1e6
    text = f"""# edge-infer vision demo model (a toy that can see)

The embedded default of `edge-infer serve` (and `make run`): the demo text
model (`src/edge_infer/assets/demo-model`, README there) with a tiny vision tower, so that a chat
request with a picture gets an answer about it. It only knows pictures like
those it was trained on: one to three shapes (circle, square, triangle, star)
in six colours (red, green, blue, yellow, purple, black) on a white
background, or one digit; and four kinds of questions about them:

- "What is in this picture?" -> "A red circle and two blue squares." / "The number 7, in green."
- "How many triangles are there?" -> "There are 2 triangles."
- "What color is the circle?" -> "The circle is red."
- "What number is written?" -> "The number is 7."

Without a picture it answers as the text demo model, mostly token for token
(below: it was fine-tuned with the text model as a teacher, not frozen).

## Architecture

- `Qwen2_5_VLForConditionalGeneration` in transformers 5.24's layout,
  {total_params:,} parameters, bf16. Decoder: the text demo's shape and
  vocabulary (hidden 256, 6 layers, head_dim 64, RoPE theta
  {config['text_config']['rope_parameters']['rope_theta']:g}) with multimodal RoPE, `mrope_section` {MROPE_SECTION}.
- Vision tower ({tower_params:,} parameters): Qwen2.5 ViT, 14-px patches,
  temporal patch 2, {vision['depth']} blocks of width {vision['hidden_size']} ({vision['num_heads']} heads,
  MLP {vision['intermediate_size']}), full attention in block(s) {vision['fullatt_block_indexes']} and
  {vision['window_size']}-px windows elsewhere, a 2x2 patch merger into width {vision['out_hidden_size']}.
- `preprocessor_config.json`: pictures are resized to between {PIXELS['min_pixels']:,} and
  {PIXELS['max_pixels']:,} pixels of area (sides multiples of 28): a square 224-px picture is
  16x16 patches, 64 image tokens. Larger pictures are shrunk (the server
  decodes up to a 4K screenshot's 8.3 megapixels, `--max-image-pixels`, and a
  larger JPEG photo at a reduced scale).
- Tokenizer: the text demo's, with `<|vision_start|>` `<|image_pad|>` `<|video_pad|>`
  `<|vision_end|>` added as special tokens (ids {config['vision_start_token_id']}-{config['vision_end_token_id']}, rows of the
  padded embedding). Chat template: the text demo's (tools included), with
  message contents that may be lists of text and image parts. It renders no
  video part (the tower never saw one), so the plan sizes no video and a
  video is refused as a kind this model does not take.

## How it was trained

    PYTHONPATH=src python scripts/train_demo_vision.py --threads {threads}

All pictures are drawn with Pillow (`scripts/demo_vision_data.py`, seed
{TRAIN_SEED}); nothing is downloaded. transformers'
`Qwen2_5_VLForConditionalGeneration`, built from the text model's weights and
a fresh tower, in two stages.

1. The tower alone, {settings.tower_steps} AdamW steps of {settings.tower_batch} pictures: linear heads on each of
   its output tokens predict the colour, the shape and the digit that cover
   most of the token's 28x28 pixels (labels from the drawing itself). Cheap (no
   decoder), and the second stage starts from tokens that already say what is
   where. {result.tower_seconds:.0f} s; loss (mean of the first and last 10% of steps)
   {mean(result.tower_losses[:tower_tenth]):.3f} -> {mean(result.tower_losses[-tower_tenth:]):.3f}.
2. All of it (tower, decoder, the embedding tied to the head), {settings.steps} AdamW
   steps, each of:

   - {settings.batch_size} fresh examples (one picture, one question): cross-entropy on the answer;
   - {settings.replay_rows} rows of {settings.replay_len} tokens of text, alternately sampled from the text
     model (temperature 1, from a bare system turn: chat, tool calls and agent turns in the proportions it
     learnt them) and dialogues of its corpus packed end to end (`scripts/demo_corpus.py`, seed {TRAIN_SEED}:
     the samples rarely hold an echo or a greeting); {settings.replay_pool} rows made once, cycled: KL divergence to
     the text model's next-token distribution at every position (weight
     {settings.kl_weight:g}), so that the model keeps its text answers while it learns to read
     pictures.

Peak learning rates {settings.lr_tower:g} (tower) and {settings.lr_decoder:g} (the rest), warm-up {settings.warmup_steps} steps,
cosine decay to 5%, bf16 autocast, {threads} CPU thread(s).

Why the text model is not kept frozen: with it frozen, neither the tower nor
free per-answer soft prompts (16 or 64 learnt input vectors per digit) made it
say "The number is 7." (answer loss stuck near 1.7 nats per token); with its
blocks learning but its embedding (tied to the head) frozen, 400 steps reached
an answer loss of 2.0 and 10% right answers. A 5M-parameter model trained on
templates is not steerable through its input alone, and the words of these
answers were never its outputs. With everything learning but no first stage,
400 steps learnt the answers' wording and not the pictures (17% right: the
colour, shape or digit guessed).

- training time: {result.tower_seconds + result.seconds:.0f} s wall clock ({result.tower_seconds:.0f} s the first stage), sampling the
  text model's rows not counted, on {cpu.model} (a machine shared with other work)
- answer loss, mean of the first and last 10% of steps: {mean(result.losses[:tenth]):.4f} -> {mean(result.losses[-tenth:]):.4f}
- KL to the text model on its samples (nats per token), same steps: {mean(result.kl[:tenth]):.4f} -> {mean(result.kl[-tenth:]):.4f}

## Accuracy on pictures

Greedy answers of edge-infer's own engine (`LLM.chat` with the picture as a PNG
data URL, dtype auto: bf16 here, {threads} thread(s)) to {sum(t for _, t in base.values())} held-out examples
(seed {EVAL_SEED}); an answer counts when it is exactly the expected sentence.
Overall: **{percent(*overall(base))}**. Measured on {cpu.model} ({', '.join(cpu_features(cpu))}).

| question kind | correct | accuracy |
|---|---|---|
{rows}

The same examples with the tower's linears quantized (`--encoder-quantization`;
the decoder as above):

| encoder quantization | {' | '.join(base)} | overall |
|---|{'---|' * (len(base) + 1)}
{quant}

## Text without a picture

Greedy answers (edge-infer, 64 tokens at most) of this model and of the text
model to {n_text} held-out prompts of the text model's corpus
(`scripts/demo_corpus.py`, seed {EVAL_SEED}): the same tokens for
**{percent(sum(agreement.same.values()), n_text)}** of them; right (the expected answer exactly):
{percent(sum(agreement.right.values()), n_text)} here, {percent(sum(agreement.right_text.values()), n_text)} for the text model.

| category | same tokens as the text model | right | right (text model) |
|---|---|---|---|
{text_rows}

Size of the checkpoint files: {size_mb:.1f} MB.
"""
    (out / "README.md").write_text(text)


def cpu_features(cpu) -> list[str]:
    """The ISA features that decide which kernels ran (the README says where its figures came from)."""
    return [f for f in ("avx2", "avx512f", "avx512_vnni", "avx512_bf16", "amx_bf16", "amx_int8", "neon")
            if f in cpu.features] or ["baseline"]


def measure(out: Path, lm: Path, examples: int, threads: int):
    """Accuracy on held-out pictures (dense tower and quantized ones) and agreement with the text model on text."""
    held_out = data.examples(examples, EVAL_SEED)
    scores: dict[str | None, dict[str, tuple[int, int]]] = {None: evaluate(out, held_out, threads)}
    for method in ("cpu_w8a8", "cpu_int4"):
        scores[method] = evaluate(out, held_out, threads, method)
    for method, s in scores.items():
        print(f"pictures, encoder quantization {method or 'none'}:", {k: percent(*v) for k, v in s.items()},
              "overall", percent(*overall(s)))
    agreement = text_agreement(out, lm, threads, examples // 2)
    n = sum(agreement.total.values())
    print(f"text prompts answered as the text model: {percent(sum(agreement.same.values()), n)}; right: "
          f"{percent(sum(agreement.right.values()), n)} (text model: {percent(sum(agreement.right_text.values()), n)})")
    return scores, agreement


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--lm", type=Path, default=DEFAULT_LM, help="the demo text model's checkpoint directory")
    parser.add_argument("--out", type=Path, default=DEFAULT_OUT)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--quick", action="store_true", help="a few steps, to check the pipeline")
    parser.add_argument("--steps", type=int, help="override the number of training steps")
    parser.add_argument("--lr-decoder", type=float, help="override the decoder's peak learning rate")
    parser.add_argument("--lr-tower", type=float, help="override the tower's peak learning rate")
    parser.add_argument("--kl-weight", type=float, help="override the distillation term's weight")
    parser.add_argument("--evaluate-only", action="store_true",
                        help="measure the checkpoint in --out (pictures, dense and quantized towers; text) and print")
    parser.add_argument("--encoder-quantization", help="with --evaluate-only: only the pictures, with this tower path "
                        "(none, cpu_w8a8, cpu_int4, ...), as one JSON line (an arm of benchmarks/specs/demo-vision.json)")
    args = parser.parse_args()

    import torch

    torch.set_num_threads(args.threads)
    os.environ.setdefault("OMP_NUM_THREADS", str(args.threads))
    settings = QUICK if args.quick else FULL
    overrides = {"steps": args.steps, "lr_decoder": args.lr_decoder, "lr_tower": args.lr_tower,
                 "kl_weight": args.kl_weight}
    settings = replace(settings, **{k: v for k, v in overrides.items() if v is not None})
    lm, out = args.lm.resolve(), args.out.resolve()
    if args.evaluate_only and args.encoder_quantization:
        method = None if args.encoder_quantization == "none" else args.encoder_quantization
        scores = evaluate(out, data.examples(settings.eval_examples, EVAL_SEED), args.threads, method)
        right, total = overall(scores)
        print(json.dumps({"accuracy": right / total, **{kind: r / t for kind, (r, t) in scores.items()},
                          "examples": total, "encoder_quantization": args.encoder_quantization}))
        return 0
    if args.evaluate_only:
        measure(out, lm, settings.eval_examples, args.threads)
        return 0
    if out.exists():
        shutil.rmtree(out)
    write_layout(lm, out)
    model = build_model(lm, out, TRAIN_SEED)
    encoder = Encoder(out)
    started = time.perf_counter()
    tower_losses = pretrain_tower(model, encoder, settings, TRAIN_SEED)
    tower_seconds = time.perf_counter() - started
    teacher, replay = replay_rows(lm, settings, TRAIN_SEED)
    result = train(model, teacher, replay, encoder, settings, TRAIN_SEED)
    result.tower_losses, result.tower_seconds = tower_losses, tower_seconds
    save_weights(model, lm, out)
    scores, agreement = measure(out, lm, settings.eval_examples, args.threads)
    write_readme(out, lm, settings, result, scores, agreement, args.threads)
    print(f"wrote {out} ({result.seconds:.0f} s of training)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
