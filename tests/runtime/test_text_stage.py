"""The real text engine as an `ar` stage: same tokens as the text API, text chunks, errors, plan."""
from __future__ import annotations

import json
from types import SimpleNamespace

import pytest

from edge_infer import LLM, SamplingParams
from edge_infer.runtime.config import load_deploy_config
from edge_infer.runtime.deploy_plan import plan_deploy
from edge_infer.runtime.omni import Omni
from edge_infer.memory.plan import plan_text_session
from omni_helpers import write_config

pytestmark = pytest.mark.slow

PIPELINE = """
base_config: text
stages:
  - {{stage_id: 0, model: "{model}", engine: {{max_model_len: 256, max_num_seqs: 2}}}}
  - {{stage_id: 1, kind: generation, executor: toy_vocoder, executor_options: {{vocab_size: 8192}}}}
routes:
  - {{from: 0, to: 1, contract: token_ids/1}}
final_outputs: [0, 1]
"""


@pytest.fixture(scope="module")
def config_path(tiny_model, tmp_path_factory):
    return write_config(tmp_path_factory.mktemp("text-stage"), PIPELINE.format(model=tiny_model))


def test_text_stage_generates_what_the_text_api_generates(config_path, tiny_model):
    params = dict(max_tokens=12, temperature=0.0, ignore_eos=True)
    with LLM(tiny_model, max_model_len=256, worker="thread") as llm:
        expected = llm.generate("Hello there", SamplingParams(**params))[0].outputs[0]
    with Omni(config_path) as omni:
        (out,) = omni.generate("Hello there", sampling_params_list=[params, {}])
        assert out.status == "finished", out.error
        tokens = [int(t) for p in out.payloads(0) if p.contract == "token_ids/1" for t in p.data]
        text = "".join(p.data for p in out.payloads(0) if p.contract == "text/1")
        assert tokens == expected.token_ids
        assert text == expected.text
        assert len(out.payloads(1)) > 0  # the downstream stage received the tokens and produced audio
        assert out.metrics[0].tokens_out == 12

        (bad,) = omni.generate([5] * 300, sampling_params_list=[{"max_tokens": 4}, {}])
        assert bad.status == "error" and "max_model_len is 256" in bad.error
        (many,) = omni.generate("Hello there", sampling_params_list=[{**params, "n": 3}, {}])
        assert many.status == "error" and "one sample per request, not n=3" in many.error
        # a misspelt key in a dict is named (it was dropped: max_token=3 generated to max_tokens' default)
        (misspelt,) = omni.generate("Hello there", sampling_params_list=[{"max_token": 3}, {}])
        assert misspelt.status == "error" and "unknown sampling parameter(s) max_token for a text stage" in misspelt.error
        # a parameter object, ours or another engine's, is cut to what the stage takes
        foreign = SimpleNamespace(max_tokens=3, temperature=0.0, ignore_eos=True, best_of=None, detokenize=True)
        (cut,) = omni.generate("Hello there", sampling_params_list=[foreign, {}])
        assert cut.status == "finished" and cut.metrics[0].tokens_out == 3
        # an object's fields at their class defaults leave the deploy config's (text.yaml: temperature 0, greedy)
        (again,) = omni.generate("Hello there", sampling_params_list=[SamplingParams(max_tokens=8, ignore_eos=True), {}])
        assert again.status == "finished"
        assert [int(t) for p in again.payloads(0) if p.contract == "token_ids/1" for t in p.data] == expected.token_ids[:8]


def test_text_stage_reservation_is_the_text_plan(config_path, tiny_model):
    plan = plan_deploy(load_deploy_config(config_path))
    assert plan.admitted
    text_plan = plan_text_session(tiny_model, max_model_len=256, max_num_seqs=2)
    stage = plan.stage(0).reservation
    assert stage.weights_bytes == text_plan.item("weights")
    assert stage.kv_bytes == text_plan.item("kv cache")


def test_a_thinker_stage_takes_chat_messages_with_media(synth_thinkers, tmp_path):
    """A chat/1 prompt (a conversation with an image and a file:// audio under the stage's allowed directory) is
    prepared as every frontend prepares one: the stage's tokens equal LLM.chat's; a source the stage does not allow
    fails that request, naming the part."""
    from media_files import audio_file, data_url, png, sine
    from edge_infer.media.sources import MediaPolicy

    model = synth_thinkers["qwen2_5_omni"]
    (tmp_path / "clip.flac").write_bytes(audio_file(sine(0.8, 16000), 16000, "FLAC"))
    messages = [{"role": "user", "content": [
        {"type": "image_url", "image_url": {"url": data_url(png(), "image/png")}},
        {"type": "audio_url", "audio_url": {"url": (tmp_path / "clip.flac").as_uri()}},
        {"type": "text", "text": "What is this?"}]}]
    params = dict(max_tokens=8, temperature=0.0, ignore_eos=True)
    with LLM(model, dtype="float32", max_model_len=512, worker="thread",
             media_policy=MediaPolicy(allowed_dir=tmp_path)) as llm:
        expected = llm.chat(messages, SamplingParams(**params))[0].outputs[0]
    stage = {"model": str(model), "engine": {"dtype": "float32", "max_model_len": 512},
             "executor_options": {"allowed_media_dir": str(tmp_path)}}
    with Omni("text", stage_overrides={"0": stage}) as omni:
        (out,) = omni.generate(messages, sampling_params_list=[params])
        assert out.status == "finished", out.error
        assert [int(t) for p in out.payloads(0) if p.contract == "token_ids/1" for t in p.data] == expected.token_ids
        outside = [{"role": "user", "content": [{"type": "image_url", "image_url": {"url": "file:///etc/hostname"}}]}]
        (bad,) = omni.generate({"messages": outside}, sampling_params_list=[params])
        assert bad.status == "error" and "content[0] (image_url): file:///etc/hostname is outside" in bad.error


def test_a_thinker_stage_reserves_and_holds_requests_to_what_its_plan_sized(synth_thinkers, tmp_path):
    """The stage's engine settings reach its plan (the towers' kernel, the media limits): the reservation counts both
    towers and the media items, and a request over a limit the plan sized fails, naming the flag."""
    from media_files import data_url, png

    model = synth_thinkers["qwen2_5_omni"]
    engine = {"dtype": "float32", "max_model_len": 512, "encoder_quantization": "cpu_int4",
              "media_limits": {"max_images": 1, "max_audio_seconds": 2}}
    config = write_config(tmp_path, f"base_config: text\nstages:\n  - {{stage_id: 0, model: \"{model}\", "
                                    f"engine: {json.dumps(engine)}}}\n")
    text_plan = plan_text_session(model, dtype="float32", max_model_len=512, max_num_seqs=4,
                                  encoder_quantization="cpu_int4", media_limits={"max_images": 1, "max_audio_seconds": 2})
    assert text_plan.admitted and text_plan.media_limits.max_images == 1
    stage = plan_deploy(load_deploy_config(config)).stage(0).reservation
    assert stage.weights_bytes == text_plan.weight_bytes > text_plan.item("weights")  # the towers too
    assert stage.weights_bytes + stage.kv_bytes + stage.buffers_bytes + stage.runtime_bytes == text_plan.steady_bytes
    params = dict(max_tokens=4, temperature=0.0, ignore_eos=True)
    two = [{"role": "user", "content": [{"type": "image_url", "image_url": {"url": data_url(png(i), "image/png")}}
                                        for i in range(2)]}]
    with Omni(config) as omni:
        (bad,) = omni.generate(two, sampling_params_list=[params])
        assert bad.status == "error" and "2 images is above the limit of 1 image per request (--max-images)" in bad.error
        (one,) = omni.generate([{"role": "user", "content": two[0]["content"][:1]}], sampling_params_list=[params])
        assert one.status == "finished", one.error


def test_a_stages_media_limits_are_checked_by_name(tmp_path, tiny_model):
    from edge_infer.runtime.config import DeployConfigError

    config = write_config(tmp_path, f"base_config: text\nstages:\n  - {{stage_id: 0, model: \"{tiny_model}\", "
                                    "engine: {media_limits: {max_pictures: 2}}}\n")
    with pytest.raises(DeployConfigError, match="unknown media limit 'max_pictures'; known: max_images"):
        load_deploy_config(config)
