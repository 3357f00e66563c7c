"""Plugging an executor in: registration, load-time checks, and running it in a stage process."""
import pytest

from edge_infer.runtime import executors
from edge_infer.runtime.config import DeployConfigError, load_deploy_config
from edge_infer.runtime.contracts import Payload
from edge_infer.runtime.executors import (
    ExecutorOptions,
    ReservationPlan,
    StageExecutor,
    StepOutput,
    register_executor,
    registered_executors,
)
from omni_helpers import write_config
from runtime import toys
from runtime.toys.executors import ToyVocoderExecutor


class ShoutOptions(ExecutorOptions):
    suffix: str = "!"


class ShoutExecutor(StageExecutor):
    """Upper-cases its text input, one chunk per input chunk."""

    kinds = frozenset({"generation"})
    input_contracts = frozenset({"text/1"})
    output_contracts = frozenset({"text/1"})
    Options = ShoutOptions

    @classmethod
    def plan(cls, stage):
        return ReservationPlan(runtime_bytes=64 << 20, max_payload_bytes=4096)

    def start(self, stage):
        self.suffix = self.options(stage).suffix
        self.pending, self.ended = {}, set()

    def submit(self, request_id, params):
        self.pending[request_id] = []

    def feed(self, request_id, payload):
        self.pending[request_id].append(str(payload.data).upper())

    def end_input(self, request_id):
        self.ended.add(request_id)

    def has_work(self):
        return any(self.pending[r] or r in self.ended for r in self.pending)

    def step(self):
        out = []
        for rid in list(self.pending):
            chunks = self.pending[rid]
            if chunks:
                out.append(StepOutput(rid, Payload("text/1", chunks.pop(0) + self.suffix), finished=rid in self.ended and not chunks))
            elif rid in self.ended:
                out.append(StepOutput(rid, None, finished=True))
            if out and out[-1].finished:
                del self.pending[rid]
                self.ended.discard(rid)
        return out

    def abort(self, request_id):
        self.pending.pop(request_id, None)
        self.ended.discard(request_id)


@pytest.fixture(autouse=True)
def own_registry(monkeypatch):
    monkeypatch.setattr(executors, "_registry", dict(executors._registry))


CONFIG = """
stages:
  - {stage_id: 0, kind: generation, executor: shout, executor_options: {suffix: "?!"}}
final_outputs: [0]
"""


@pytest.mark.slow
def test_a_registered_executor_runs_in_its_own_stage_process(tmp_path):
    from edge_infer.runtime.omni import Omni

    register_executor("shout", ShoutExecutor)
    assert "shout" in registered_executors()
    with Omni(write_config(tmp_path, CONFIG)) as omni:
        (result,) = omni.generate("hello edge")
        assert result.status == "finished" and result.joined(0) == "HELLO EDGE?!"
        assert omni.plan.stage(0).reservation.runtime_bytes == 64 << 20


def test_executor_options_and_contracts_are_checked_against_the_registered_class(tmp_path):
    register_executor("shout", ShoutExecutor)
    with pytest.raises(DeployConfigError) as exc:
        load_deploy_config(write_config(tmp_path, CONFIG.replace("suffix", "sufix")))
    assert exc.value.problems[0].key_path == "stages[id=0].executor_options.sufix"
    bad_route = """
    stages:
      - {stage_id: 0, kind: generation, executor: shout}
      - {stage_id: 1, kind: generation, executor: toy_vocoder}
    routes: [{from: 0, to: 1, contract: text/1}]
    final_outputs: [1]
    """
    with pytest.raises(DeployConfigError, match="stage 1 \\(executor toy_vocoder\\) accepts codec_codes/1, token_ids/1"):
        load_deploy_config(write_config(tmp_path, bad_route))


def test_registration_errors_say_what_to_do(tmp_path):
    class Local(ShoutExecutor):
        pass

    with pytest.raises(ValueError, match="define it at module level"):
        register_executor("local", Local)
    with pytest.raises(ValueError, match="package.module:ClassName"):
        register_executor("bad", "no_colon_here")
    register_executor("missing", "edge_infer.no_such_module:Nothing")
    path = write_config(tmp_path, "stages: [{stage_id: 0, kind: ar, executor: missing}]\nfinal_outputs: [0]\n")
    with pytest.raises(DeployConfigError, match="executor 'missing' cannot be imported"):
        load_deploy_config(path)


def test_vocoder_plan_scales_with_its_options():
    config = load_deploy_config(toys.TOY_SPEECH, stage_overrides={"1": {"executor_options": {"chunk_tokens": 8}}})
    plan = ToyVocoderExecutor.plan(config.stage(1))
    assert plan.max_payload_bytes == 8 * 240 * 4  # float32 samples of one chunk
    assert plan.weights_bytes == (256 * 8 + 8 * 8 * 3 + 8 + 8 * 240 + 1) * 4
