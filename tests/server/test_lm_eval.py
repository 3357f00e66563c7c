"""lm-evaluation-harness's `local-completions` model against `edge-infer serve`: a local multiple-choice
task (tests/fixtures/lm_eval), scored through echo + logprobs, equal to transformers' loglikelihoods."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow
pytest.importorskip("lm_eval", reason="lm-evaluation-harness is not installed: pip install -e '.[test]'")

FIXTURES = Path(__file__).parents[1] / "fixtures" / "lm_eval"


def test_local_completions_scores_a_local_task_with_the_models_loglikelihoods(server, served_model, tmp_path):
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tasks = tmp_path / "tasks"
    tasks.mkdir()
    spec = (FIXTURES / "weather_mc.yaml").read_text().replace("DATA_FILE", str(FIXTURES / "weather_mc.jsonl"))
    (tasks / "weather_mc.yaml").write_text(spec)
    name = server.client().models.list().data[0].id
    model_args = (f"model={name},base_url={server.base_url}/v1/completions,tokenizer_backend=huggingface,"
                  f"tokenizer={served_model},tokenized_requests=True,num_concurrent=1,max_retries=1")
    done = subprocess.run(
        [sys.executable, "-m", "lm_eval", "--model", "local-completions", "--model_args", model_args,
         "--tasks", "edge_infer_weather_mc", "--include_path", str(tasks), "--output_path", str(tmp_path / "out"),
         "--log_samples"],
        capture_output=True, text=True, timeout=600, env={**os.environ, "HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1"},
    )
    assert done.returncode == 0, done.stderr[-3000:]
    samples_file = next((tmp_path / "out").rglob("samples_edge_infer_weather_mc_*.jsonl"))
    samples = [json.loads(line) for line in samples_file.read_text().splitlines()]
    assert len(samples) == 6

    tok = AutoTokenizer.from_pretrained(served_model)
    model = AutoModelForCausalLM.from_pretrained(served_model, dtype=torch.float32).eval()
    for sample in samples:
        doc = sample["doc"]
        context = tok(doc["question"])["input_ids"]
        for choice, resp in zip(doc["choices"], sample["resps"]):
            ids = tok(doc["question"] + " " + choice)["input_ids"]  # as lm-eval splits a pair: the whole, then the context
            with torch.no_grad():
                logprobs = torch.log_softmax(model(torch.tensor([ids])).logits[0], dim=-1)
            expected = sum(logprobs[i - 1, ids[i]].item() for i in range(len(context), len(ids)))
            assert float(resp[0][0]) == pytest.approx(expected, abs=1e-3)
