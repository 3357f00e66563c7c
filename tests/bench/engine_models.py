"""Tiny checkpoints for the engine benchmarks' tests (bench commands that load a model)."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import edge_infer

CHATML = (
    "{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)
# The metrics both engines' pp-tg arms print (so one grid compares them key by key).
PP_TG_METRICS = {"pp_tps", "tg_tps", "pp_median_tps", "tg_median_tps", "init_s", "rss_anon_mb", "rss_file_mb",
                 "tg_read_gb_per_s", "mem_read_gb_per_s"}
SPECIALS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
CORPUS = [
    "The lighthouse keeper climbed the stairs every evening to light the lamp.",
    "Edge machines share one pool of memory between the CPU and the accelerator.",
    "A small model answers short questions about the weather, the sea and the stars.",
    "Numbers without provenance cannot be checked; numbers with it can be retracted.",
] * 8


def add_byte_level_tokenizer(model_dir: Path, vocab_size: int = 320) -> dict[str, int]:
    """Train a small byte-level BPE (the kind our checkpoints ship) into `model_dir`; returns special ids."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size, special_tokens=SPECIALS, initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
    )
    tok.train_from_iterator(CORPUS, trainer)
    tok.save(str(model_dir / "tokenizer.json"))
    (model_dir / "tokenizer_config.json").write_text(json.dumps({
        "tokenizer_class": "PreTrainedTokenizerFast", "bos_token": None, "eos_token": "<|im_end|>",
        "pad_token": "<|endoftext|>", "chat_template": CHATML,
    }))
    ids = {t: tok.token_to_id(t) for t in SPECIALS}
    (model_dir / "generation_config.json").write_text(json.dumps({"eos_token_id": [ids["<|im_end|>"]]}))
    return ids


_made: dict[str, Path] = {}


def tiny_text_checkpoint(root: Path, family: str = "qwen2") -> Path:
    """A tiny random checkpoint (`edge-infer synth`, the demo model's tokenizer), made once per test session."""
    if family in _made:
        return _made[family]
    out = root / f"tiny-{family}"
    from edge_infer.models.synth import write_checkpoint

    write_checkpoint(out, family, "tiny", dtype="float32")
    _made[family] = out
    return out


def run_cli(*args: str, timeout: float = 300) -> subprocess.CompletedProcess:
    """`edge-infer ARGS` in a new interpreter (so process-creation timings mean something)."""
    src = str(Path(edge_infer.__file__).resolve().parents[1])
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [src, os.environ.get("PYTHONPATH")]))}
    return subprocess.run([sys.executable, "-m", "edge_infer.cli", *args], capture_output=True, text=True, env=env, timeout=timeout)


def last_json(stdout: str) -> dict:
    return json.loads([line for line in stdout.splitlines() if line.startswith("{")][-1])
