"""Toy stages for tests: ``toy_ar`` and ``toy_vocoder``, and the deploy configs built on them.

They are not shipped: ``register()`` (called by tests/conftest.py) adds them to
the executor registry. A stage process imports its executor by
``module:Class``; it starts with the parent's ``sys.path`` (engine/child.py),
where pytest put ``tests/``, so ``runtime.toys.executors`` imports there too.
"""
from __future__ import annotations

from pathlib import Path

CONFIGS = Path(__file__).parent / "configs"
TOY_TEXT = CONFIGS / "toy_text.yaml"  # one toy_ar stage
TOY_SPEECH = CONFIGS / "toy_speech.yaml"  # toy_ar -> toy_vocoder, both final outputs


def register() -> None:
    from edge_infer.runtime.executors import register_executor

    from .executors import ToyARExecutor, ToyVocoderExecutor

    register_executor("toy_ar", ToyARExecutor)
    register_executor("toy_vocoder", ToyVocoderExecutor)
