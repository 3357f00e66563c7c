"""An external backend (ONNX Runtime) behind the same contract, fanned out beside the torch stage."""
import os

import numpy as np
import pytest

from edge_infer.runtime.omni import Omni
from omni_helpers import write_config
from runtime.toys.executors import toy_ar_tokens
from testutil import live_children, wait_until

pytest.importorskip("onnxruntime", reason="the external backend needs the 'external' extra (onnxruntime, onnx)")
pytest.importorskip("onnx", reason="exporting the toy model needs the 'external' extra (onnx)")
pytestmark = pytest.mark.slow

PIPELINE = """
base_config: toy_speech.yaml
stages:
  - stage_id: 2
    name: onnx-vocoder
    kind: external
    executor: onnx_vocoder
    model: vocoder.onnx
routes:
  - {from: 0, to: 1, contract: token_ids/1}
  - {from: 0, to: 2, contract: token_ids/1}
final_outputs: [0, 1, 2]
"""


def rss_anon(pid):
    with open(f"/proc/{pid}/status") as f:
        return next(int(line.split()[1]) * 1024 for line in f if line.startswith("RssAnon:"))


def test_onnx_stage_matches_the_torch_stage_and_is_in_the_ledger(tmp_path):
    from runtime.toys.vocoder_model import export_toy_vocoder_onnx

    model = export_toy_vocoder_onnx(tmp_path / "vocoder.onnx")  # the toy vocoder's defaults, seed 0
    with Omni(write_config(tmp_path, PIPELINE)) as omni:
        plan = omni.plan.stage(2)
        assert plan.reservation.weights_bytes == os.path.getsize(model)
        assert omni.plan.pools[0].stage_ids == (0, 1, 2)
        results = omni.generate([[3, 1, 4, 1, 5], "onnx"], sampling_params_list=[{"max_tokens": 10}, None, None])
        for result, prompt in zip(results, [[3, 1, 4, 1, 5], list(b"onnx")]):
            assert result.status == "finished", result.error
            assert list(result.joined(0)) == toy_ar_tokens(prompt, 10)
            torch_pcm, onnx_pcm = result.joined(1), result.joined(2)
            assert torch_pcm.shape == onnx_pcm.shape == (10 * 240,)
            np.testing.assert_allclose(onnx_pcm, torch_pcm, atol=1e-5)
            assert all(p.metadata == {"sample_rate": 24000, "channels": 1} for p in result.payloads(2))
        # The plan's per-stage bytes cover what each stage process actually holds.
        for sid, pid in omni.worker_pids().items():
            assert rss_anon(pid) <= omni.plan.stage(sid).reservation.total_bytes, sid


def test_onnx_stage_on_a_device_without_its_provider_refuses_to_start(tmp_path):
    from edge_infer.memory.device import load_profile
    from edge_infer.runtime.orchestrator import StageStartError
    from runtime.toys.vocoder_model import export_toy_vocoder_onnx

    export_toy_vocoder_onnx(tmp_path / "vocoder.onnx")
    path = write_config(tmp_path, """
        stages:
          - {stage_id: 0, kind: external, executor: onnx_vocoder, model: vocoder.onnx, device: npu}
        final_outputs: [0]
    """)
    before = {p.pid for p in live_children()}
    # The laptop profile has an NPU, so the plan admits it; this onnxruntime has no NPU provider.
    with pytest.raises(StageStartError, match="needs one of the ONNX Runtime providers .* set device: cpu"):
        Omni(path, profile=load_profile("laptop"))
    assert wait_until(lambda: {p.pid for p in live_children()} <= before)
