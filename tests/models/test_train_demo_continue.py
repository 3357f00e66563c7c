"""`scripts/train_demo.py --continue-from`: a shipped checkpoint is trained further from exactly what it holds.

The shipped demo model is the product of two runs (from scratch, then
continued); the second must start from the first's weights bit for bit and
carry its README's account of the first run forward.
"""
from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

SCRIPTS = Path(__file__).resolve().parents[2] / "scripts"
if str(SCRIPTS) not in sys.path:
    sys.path.insert(0, str(SCRIPTS))  # scripts/ is not a package; its modules import each other by name

import train_demo  # noqa: E402


def test_continuing_starts_from_the_checkpoints_weights(demo_model):
    config = json.loads((demo_model / "config.json").read_text())
    model = train_demo.load_model(demo_model, config)
    stored = load_file(str(demo_model / "model.safetensors"))
    state = model.state_dict()
    assert set(state) - set(stored) == {"lm_head.weight"}
    for name, tensor in stored.items():
        assert state[name].dtype == torch.float32
        assert torch.equal(state[name], tensor.float()), name
    # The head stays tied: one tensor, so training updates both.
    assert model.lm_head.weight.data_ptr() == model.model.embed_tokens.weight.data_ptr()


def test_a_checkpoint_of_another_shape_is_refused(demo_model, tmp_path):
    config = json.loads((demo_model / "config.json").read_text())
    with pytest.raises(SystemExit, match="does not match the demo model's shape"):
        train_demo.load_model(demo_model, {**config, "num_hidden_layers": config["num_hidden_layers"] + 1})


def test_the_first_runs_account_is_carried_forward(demo_model, tmp_path):
    section = train_demo._training_section(demo_model / "README.md")
    assert section.lstrip().startswith("PYTHONPATH=src python scripts/train_demo.py")
    assert "## " not in section  # the section only, not the headings around it
    other = tmp_path / "README.md"
    other.write_text("# some model\n\nno training notes\n")
    with pytest.raises(SystemExit, match="no 'How it was trained' section"):
        train_demo._training_section(other)
