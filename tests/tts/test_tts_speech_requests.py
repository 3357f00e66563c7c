"""The speech server's request checks, without starting the pipeline (fast)."""
from __future__ import annotations

import pytest

from edge_infer.server.errors import APIError
from edge_infer.server.speech_protocol import SpeechRequest
from edge_infer.server.speech_service import SpeechService
from edge_infer.server.service import ServeSettings
from edge_infer.tts.deploy import EngineFlags, SpeechPipeline
from tts_helpers import TINY


@pytest.fixture(scope="module")
def state() -> SpeechService:
    pipeline = SpeechPipeline.for_checkpoint(TINY, engine=EngineFlags(dtype="float32", max_model_len=64))
    return SpeechService(pipeline, ServeSettings(served_model_name="tiny"), max_input_chars=500)


def refused(state: SpeechService, **body) -> APIError:
    with pytest.raises(APIError) as info:
        state.prepare(SpeechRequest(**{"input": "Hello.", "voice": "ryan", **body}))
    assert info.value.status == 400
    return info.value


def test_a_good_request_becomes_talker_parameters(state) -> None:
    job = state.prepare(SpeechRequest(input="Hello.", voice="Vivian", language="english", seed=3, temperature=0,
                                      response_format="pcm", stream_format="sse"))
    assert job.params == {"voice": "vivian", "language": "english", "ignore_eos": False, "seed": 3, "temperature": 0}
    assert (job.response_format, job.stream_format, job.text) == ("pcm", "sse", "Hello.")
    assert state.pipeline.params_list(job.params)[state.pipeline.talker_stage] == job.params


def test_input_longer_than_the_talker_positions_is_refused_naming_max_model_len(state) -> None:
    error = refused(state, input="many words here " * 20)  # under 500 characters, over 64 positions
    assert error.param == "input" and "max_model_len is 64" in error.message


def test_voice_objects_are_accepted_like_names(state) -> None:
    assert state.prepare(SpeechRequest(input="Hi.", voice={"id": "ryan"})).params["voice"] == "ryan"


@pytest.mark.parametrize("body, param", [
    ({"speed": 0.5}, "speed"),
    ({"response_format": "aac"}, "response_format"),
    ({"input": ""}, "input"),
    ({"input": "x" * 501}, "input"),
    ({"voice": "nobody"}, "voice"),
    ({"language": "elvish"}, "language"),
    ({"instructions": "sing"}, "instructions"),
])
def test_each_bad_field_is_named(state, body, param) -> None:
    assert refused(state, **body).param == param


def test_the_voice_list_has_the_speakers_and_their_dialects(state) -> None:
    voices = state.voice_list()
    assert {v.id: v.dialect for v in voices.data}["eric"] == "sichuan_dialect"
    assert voices.languages[0] == "auto" and "beijing_dialect" not in voices.languages
