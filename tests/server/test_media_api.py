"""Images, audio and video through the real server with the official `openai` client (and langchain-openai, the `llm` CLI): answers
equal `LLM.chat`'s for the same messages (greedy), streamed or not, alone or batched; bad media, sources the operator
did not allow and requests over a limit are 400s naming the problem, and the server keeps serving; preparing media
does not hold up other requests; a client that leaves while its image is encoded frees everything. The limits a request
is held to are the ones the server's memory plan sized (its --max-images ... flags, the rest fitted to the context)."""
from __future__ import annotations

import asyncio
import base64
import contextlib
import io
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import threading
from concurrent.futures import ThreadPoolExecutor

import httpx
import openai
import pytest

from media_files import audio_file, data_url, frames_of, png, recording, sine, video_file
from edge_infer import LLM, SamplingParams
from edge_infer.media.sources import MediaPolicy

from .serverutil import ServerProcess, free_port, scrape, wait_until

pytestmark = pytest.mark.slow

MODEL = "qwen2_5_omni"  # the served name: the checkpoint directory's
MAX_TOKENS = 8
QUESTION = {"type": "text", "text": "What is in this?"}
# The media limits the server is started with (a request at all of them fits its 2048-token context; unset, the plan
# would fit them itself and turn videos off at this context): one image of up to 448x448 pixels, a video of 8 frames
# with its sound, clips of up to 3 s (its --max-audios: one per request).
LIMITS = {"max_images": 1, "max_image_pixels": 448 * 448, "max_video_frames": 8, "max_audio_seconds": 3}
LIMIT_FLAGS = [arg for name, value in LIMITS.items() for arg in ("--" + name.replace("_", "-"), str(value))]


def image(seed: int = 0, **size) -> dict:
    return {"type": "image_url", "image_url": {"url": data_url(png(seed, **size), "image/png")}}


def wav(seconds: float = 1.0, hz: float = 440.0) -> dict:
    data = base64.b64encode(audio_file(sine(seconds, 16000, hz), 16000, "WAV")).decode()
    return {"type": "input_audio", "input_audio": {"data": data, "format": "wav"}}


# 8 frames at 4 fps with 2 s of sound (PyAV): with Qwen2.5-Omni its sound goes into the prompt, interleaved
VIDEO = {"type": "video_url", "video_url": {"url": data_url(video_file(frames_of(8), 4, audio=sine(2.0, 48000)[:, 0]),
                                                            "video/mp4")}}


def user(*parts) -> list[dict]:
    return [{"role": "user", "content": list(parts)}]


@pytest.fixture(scope="module")
def media_dir(tmp_path_factory):
    root = tmp_path_factory.mktemp("media")
    (root / "allowed").mkdir()
    (root / "allowed" / "picture.png").write_bytes(png(5))
    (root / "outside.png").write_bytes(png(5))
    return root


@pytest.fixture(scope="module")
def omni(synth_thinkers):
    return synth_thinkers["qwen2_5_omni"]


@pytest.fixture(scope="module")
def omni_server(omni, media_dir):
    with ServerProcess(omni, "--max-model-len", "2048", "--max-num-seqs", "4", *LIMIT_FLAGS,
                       "--allowed-media-dir", str(media_dir / "allowed")) as proc:
        yield proc


@pytest.fixture(scope="module")
def reference(omni, media_dir):
    """The same checkpoint and settings in this process: what LLM.chat answers."""
    with LLM(omni, dtype="float32", max_model_len=2048, max_num_seqs=4, num_threads=1, worker="thread",
             media_limits=LIMITS, media_policy=MediaPolicy(allowed_dir=media_dir / "allowed")) as llm:
        yield llm


def expected(llm: LLM, messages: list[dict], **kw) -> str:
    params = SamplingParams(temperature=0, max_tokens=MAX_TOKENS, ignore_eos=True)
    out = llm.chat(messages, params, **kw)[0]
    assert out.error is None, out.error
    return out.outputs[0].text


def ask(client: openai.OpenAI, messages: list[dict], stream: bool = False, **extra) -> str:
    kw = dict(model=MODEL, messages=messages, max_tokens=MAX_TOKENS, temperature=0,
              extra_body={"ignore_eos": True, **extra})
    if not stream:
        return client.chat.completions.create(**kw).choices[0].message.content
    return "".join(c.choices[0].delta.content or "" for c in client.chat.completions.create(stream=True, **kw)
                   if c.choices)


CASES = {
    "image": (user(image(), QUESTION), {}),
    "audio": (user(wav(), QUESTION), {}),
    "image and audio": (user(QUESTION, image(1), wav(0.5, 300.0)), {}),
    "a browser's WebM recording": (user({"type": "input_audio", "input_audio": {"data": base64.b64encode(recording(
        sine(1.0, 48000), 48000, "webm", "libopus")).decode(), "format": "webm"}}, QUESTION), {}),
    "video with its sound": (user(VIDEO, QUESTION), {}),
    "video without its sound": (user(VIDEO, QUESTION), {"mm_processor_kwargs": {"use_audio_in_video": False}}),
}


@pytest.mark.parametrize("case", CASES)
def test_answers_equal_llm_chat_streamed_and_not(omni_server, reference, case):
    messages, extra = CASES[case]
    want = expected(reference, messages, **extra)
    client = omni_server.client()
    assert ask(client, messages, **extra) == want
    assert ask(client, messages, stream=True, **extra) == want


def test_a_url_given_as_a_bare_string_is_read_as_llm_chat_reads_it(omni_server, reference):
    """vLLM's short form, {"image_url": "data:..."}: LLM.chat took it and the server once refused it."""
    short = {"type": "image_url", "image_url": image()["image_url"]["url"]}
    assert ask(omni_server.client(), user(short, QUESTION)) == expected(reference, user(image(), QUESTION))


def test_the_media_change_the_answer(omni_server):
    """So that the equalities above are not vacuous: another image, another answer; the video's sound matters."""
    client = omni_server.client()
    assert ask(client, user(image(0), QUESTION)) != ask(client, user(image(1), QUESTION))
    assert ask(client, user(VIDEO, QUESTION)) != ask(client, user(VIDEO, QUESTION),
                                                     mm_processor_kwargs={"use_audio_in_video": False})


def test_a_file_url_is_read_only_under_the_allowed_directory(omni_server, reference, media_dir):
    inside = user({"type": "image_url", "image_url": {"url": (media_dir / "allowed" / "picture.png").as_uri()}})
    assert ask(omni_server.client(), inside) == expected(reference, inside) == expected(reference, user(image(5)))
    sneaky = (media_dir / "allowed").as_uri() + "/../outside.png"
    for url in ((media_dir / "outside.png").as_uri(), sneaky):
        refused(omni_server, user({"type": "image_url", "image_url": {"url": url}}),
                "is outside the allowed media directory")


def refused(server, messages: list[dict], problem: str, code: str | None = "invalid_media") -> None:
    """A 400 OpenAI error naming ``problem``; then the server still answers a media request."""
    client = server.client()
    with pytest.raises(openai.BadRequestError) as err:
        ask(client, messages)
    assert err.value.status_code == 400
    body = err.value.body
    assert body["type"] == "invalid_request_error" and problem in body["message"], body
    assert body["code"] == code
    assert ask(client, user(image(), QUESTION))


def huge_png() -> bytes:
    from PIL import Image

    buf = io.BytesIO()
    Image.new("RGB", (3600, 3600), (200, 30, 30)).save(buf, format="PNG")  # 12.96 MP, a few KiB
    return buf.getvalue()


BAD = {
    "undecodable image": (user({"type": "image_url", "image_url": {"url": data_url(b"not a picture", "image/png")}}),
                          "content[0] (image_url): is not an image edge-infer decodes"),
    "0-byte audio": (user({"type": "input_audio", "input_audio": {"data": "", "format": "wav"}}),
                     "content[0] (input_audio): is empty (0 bytes)"),
    "oversized image": (user({"type": "image_url", "image_url": {"url": data_url(huge_png(), "image/png")}}),
                        "content[0] (image_url): 3600x3600 pixels is above the limit of 200,704 pixels per image "
                        "(--max-image-pixels)"),
    "too many images": (user(image(0), image(1)),
                        "the request: 2 images is above the limit of 1 image per request (--max-images); send fewer "
                        "images or raise --max-images"),
    "too many clips": (user(wav(0.5), wav(0.5, 300.0)),
                       "the request: 2 audio clips is above the limit of 1 audio clip per request (--max-audios)"),
    "too long a clip": (user(wav(4.0)), "content[0] (input_audio): 4.0 s is above the limit of 3 seconds of audio per "
                                        "clip (--max-audio-seconds)"),
    "remote URL": (user({"type": "image_url", "image_url": {"url": "http://127.0.0.1:9/picture.png"}}),
                   "remote media URLs are off; send the file as a data: URL, or start the server with "
                   "--allow-remote-media"),
    "not base64": (user({"type": "input_audio", "input_audio": {"data": "%%%", "format": "wav"}}),
                   "content[0] (input_audio): the data is not valid base64"),
    "undecodable video": (user({"type": "video_url", "video_url": {"url": data_url(b"\0" * 64, "video/mp4")}}),
                          "content[0] (video_url): is not a video container edge-infer reads"),
}


@pytest.mark.parametrize("case", BAD)
def test_bad_media_are_400s_naming_the_problem_and_the_server_keeps_serving(omni_server, case):
    refused(omni_server, *BAD[case])


def test_a_format_and_a_message_role_that_cannot_carry_media_are_400s(omni_server):
    refused(omni_server, user({"type": "input_audio", "input_audio": {"data": "AAAA", "format": "aac"}}),
            "input_audio.format: Input should be 'wav', 'mp3', 'flac', 'ogg', 'm4a' or 'webm'",
            code="invalid_parameter")
    refused(omni_server, [{"role": "system", "content": [image()]}, {"role": "user", "content": "Hi"}],
            "messages.0.system.content.0: only user messages carry image_url parts; move it into a user message",
            code="invalid_parameter")
    with pytest.raises(openai.BadRequestError, match="'fps' is not an option of edge-infer's preprocessing"):
        ask(omni_server.client(), user(VIDEO), mm_processor_kwargs={"fps": 1})


def test_a_text_model_answers_that_it_takes_text_only(server):
    client = server.client()  # the text model every server test shares (conftest.py)
    with pytest.raises(openai.BadRequestError, match=r"messages\[0\]\.content\[1\] \(image_url\): this model "
                                                     r"\(tiny-qwen2\) takes text only"):
        client.chat.completions.create(model="tiny-qwen2", messages=user(QUESTION, image()), max_tokens=2)
    assert client.chat.completions.create(model="tiny-qwen2", messages=user(QUESTION), max_tokens=2).choices


def test_concurrent_multimodal_requests_equal_single_ones(omni_server):
    conversations = [user(image(2), QUESTION), user(wav(0.7, 500.0)), user(QUESTION, VIDEO), user(image(3), wav())]
    single = [ask(omni_server.client(), messages) for messages in conversations]

    async def together() -> list[str]:
        client = omni_server.async_client()

        async def one(messages, stream):
            kw = dict(model=MODEL, messages=messages, max_tokens=MAX_TOKENS, temperature=0,
                      extra_body={"ignore_eos": True})
            if not stream:
                return (await client.chat.completions.create(**kw)).choices[0].message.content
            return "".join([c.choices[0].delta.content or "" async for c in
                            await client.chat.completions.create(stream=True, **kw) if c.choices])

        return list(await asyncio.gather(*(one(m, i % 2 == 1) for i, m in enumerate(conversations))))

    assert asyncio.run(together()) == single


def test_a_client_that_leaves_while_its_big_image_is_encoded_frees_everything(omni_server):
    """An image at the limit (448x448, 256 tokens) keeps the encoder busy; the client goes once the request holds KV
    blocks. Asked for 1,500 tokens, it holds them for seconds: with 80 the tiny model could finish between two polls
    of the metrics, and the client never see it admitted."""
    body = {"model": MODEL, "messages": user(image(7, width=448, height=448)), "max_tokens": 1500, "ignore_eos": True,
            "stream": True}
    with httpx.stream("POST", omni_server.base_url + "/v1/chat/completions", json=body, timeout=60):
        wait_until(lambda: omni_server.metrics()["edge_infer_kv_blocks_used"] > 0, "the request to be admitted")
    wait_until(lambda: settled(omni_server.base_url), "no running sequence and every KV block free")
    assert ask(omni_server.client(), user(image(), QUESTION))


def settled(base_url: str) -> bool:
    m = scrape(base_url)
    return (m["edge_infer_kv_blocks_used"] == 0 and m["edge_infer_sequences_running"] == 0
            and m["edge_infer_sequences_in_flight"] == 0)


def test_langchain_chat_openai_sends_an_image(omni_server, reference):
    from langchain_core.messages import HumanMessage
    from langchain_openai import ChatOpenAI

    chat = ChatOpenAI(base_url=omni_server.base_url + "/v1", api_key="unused", model=MODEL, temperature=0,
                      max_tokens=MAX_TOKENS, max_retries=0, extra_body={"ignore_eos": True})
    messages = user(QUESTION, image(4))
    assert chat.invoke([HumanMessage(content=messages[0]["content"])]).content == expected(reference, messages)


def test_the_llm_cli_sends_a_picture(omni_server, reference, tmp_path):
    # `llm` (Simon Willison's CLI) with the server as an OpenAI-compatible model, vision on: `-a` sends the file as a
    # data URL after the prompt's text; greedy, it stops at EOS where the server's model does
    (tmp_path / "extra-openai-models.yaml").write_text(
        f'- model_id: edge\n  model_name: {MODEL}\n  api_base: "{omni_server.base_url}/v1"\n  vision: true\n')
    picture = tmp_path / "picture.png"
    picture.write_bytes(png(4))
    cli = shutil.which("llm", path=os.path.dirname(sys.executable))
    run = subprocess.run([cli, "-m", "edge", "-a", str(picture), "-o", "temperature", "0", "-o", "max_tokens",
                          str(MAX_TOKENS), "--no-log", QUESTION["text"]],
                         env={**os.environ, "LLM_USER_PATH": str(tmp_path), "OPENAI_API_KEY": "unused"},
                         capture_output=True, text=True, timeout=120)
    assert run.returncode == 0, run.stderr
    out = reference.chat(user(QUESTION, image(4)), SamplingParams(temperature=0, max_tokens=MAX_TOKENS))[0]
    assert run.stdout == out.outputs[0].text + "\n"


def test_a_stopped_worker_does_not_stop_the_server_while_images_wait_for_it(omni):
    """A 448x448 image's features are megabytes, more than the worker's command pipe holds: with the worker
    stopped (or busy in a long step) the server queues them and keeps answering: /health says the engine is
    unresponsive, the waiting requests end saying why, and it serves again once the worker continues."""
    body = {"model": MODEL, "messages": user(image(7, width=448, height=448)), "max_tokens": 4}
    with ServerProcess(omni, "--max-model-len", "2048", *LIMIT_FLAGS, "--heartbeat-timeout-s", "1.5") as server:
        (worker,) = server.worker_pids()
        os.kill(worker, signal.SIGSTOP)
        try:
            with ThreadPoolExecutor(2) as pool:
                asks = [pool.submit(httpx.post, server.base_url + "/v1/chat/completions", json=body, timeout=60)
                        for _ in range(2)]
                wait_until(lambda: httpx.get(server.base_url + "/health", timeout=2).status_code == 503,
                           "/health to answer 503 while the worker is stopped", 20)
                answers = [ask.result() for ask in asks]
            assert all(a.status_code >= 500 and "stopped responding" in a.text for a in answers), answers
        finally:
            os.kill(worker, signal.SIGCONT)
        wait_until(lambda: httpx.get(server.base_url + "/health", timeout=2).status_code == 200,
                   "/health to answer 200 again", 20)
        assert server.worker_pids() == [worker]
        assert httpx.post(server.base_url + "/v1/chat/completions", json=body, timeout=60).status_code == 200


# -- a server in this process, where preparation and encoding can be held at a gate ------------------------------


@contextlib.contextmanager
def in_process_server(model, **settings):
    import uvicorn

    from edge_infer.engine.frontend import Frontend
    from edge_infer.server.app import build_app
    from edge_infer.server.service import ServeSettings
    from edge_infer.server.text_service import TextService

    frontend = Frontend.create(model, dtype="float32", max_model_len=2048, max_num_seqs=4, num_threads=1)
    service = TextService(frontend, ServeSettings(served_model_name=MODEL, **settings), worker="thread")
    port = free_port()
    server = uvicorn.Server(uvicorn.Config(build_app([service]), port=port, log_level="critical"))
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    base_url = f"http://127.0.0.1:{port}"
    try:
        wait_until(lambda: _healthy(base_url), "the in-process server", timeout_s=120)
        yield service, base_url
    finally:
        server.should_exit = True
        thread.join(60)


def _healthy(base_url: str) -> bool:
    try:
        return httpx.get(base_url + "/health", timeout=2).status_code == 200
    except httpx.HTTPError:
        return False


class Gate:
    """Wraps a function so that each call waits until ``open()``; ``entered`` is set by the first call."""

    def __init__(self, fn):
        self.fn, self.entered, self.opened = fn, threading.Event(), threading.Event()

    def __call__(self, *args, **kwargs):
        self.entered.set()
        assert self.opened.wait(120), "the gate was never opened"
        return self.fn(*args, **kwargs)

    def open(self) -> None:
        self.opened.set()


@pytest.fixture(scope="module")
def local_server(omni):
    with in_process_server(omni) as running:
        yield running


def test_text_requests_stream_to_their_end_while_media_are_prepared(local_server, monkeypatch):
    """The image's preparation is held at a gate on the media threads: a text request still streams every token
    (it could not if the preparation held the event loop or the tokenizing thread), then the image is answered."""
    from edge_infer.engine import media_prompt

    service, base_url = local_server
    gate = Gate(media_prompt.load_part)
    monkeypatch.setattr(media_prompt, "load_part", gate)
    kw = dict(model=MODEL, max_tokens=MAX_TOKENS, temperature=0, extra_body={"ignore_eos": True})

    async def scenario() -> tuple[str | None, str]:
        client = openai.AsyncOpenAI(base_url=base_url + "/v1", api_key="unused", max_retries=0, timeout=120)
        held = asyncio.ensure_future(client.chat.completions.create(messages=user(image(), QUESTION), **kw))
        assert await asyncio.to_thread(gate.entered.wait, 60)
        stream = await client.chat.completions.create(messages=user(QUESTION), stream=True, **kw)
        finish = await asyncio.wait_for(_finish_reason(stream), 60)  # a deadlock fails here, not by hanging
        assert not held.done()  # the image is still being prepared
        gate.open()
        return finish, (await held).choices[0].finish_reason

    assert asyncio.run(scenario()) == ("length", "length")  # the text request got all its tokens first


async def _finish_reason(stream) -> str | None:
    reason = None
    async for chunk in stream:
        if chunk.choices and chunk.choices[0].finish_reason:
            reason = chunk.choices[0].finish_reason
    return reason


def test_a_picture_above_the_size_the_plan_fitted_is_scaled_down_to_it(local_server):
    """Started without limit flags: the plan fitted the tokens a picture is encoded at to the 2048-token context. A
    larger picture (a photo) is scaled down to that, as the processor's own max_pixels scales it, not refused."""
    from edge_infer.media.config import MediaProcessing
    from edge_infer.media.image import smart_resize

    service, base_url = local_server
    limits = service.frontend.plan.media_limits
    assert 4 < limits.max_image_tokens < 12845056 // 28 ** 2  # not the checkpoint's max_pixels
    vision = MediaProcessing.from_dir(service.frontend.plan.model).vision

    def prompt_tokens(width: int, height: int) -> int:
        body = {"model": MODEL, "messages": user(image(9, width=width, height=height), QUESTION), "max_tokens": 1}
        response = httpx.post(base_url + "/v1/chat/completions", json=body, timeout=120)
        assert response.status_code == 200, response.text
        return response.json()["usage"]["prompt_tokens"]

    def tokens(width: int, height: int) -> int:  # at the checkpoint's own max_pixels
        h, w = smart_resize(height, width, vision.factor, vision.min_pixels, vision.max_pixels)
        return h * w // vision.factor ** 2

    assert tokens(1000, 750) > limits.max_image_tokens and tokens(56, 56) == 4
    scaled = prompt_tokens(1000, 750) - prompt_tokens(56, 56) + 4
    h, w = smart_resize(750, 1000, vision.factor, vision.min_pixels, limits.max_image_tokens * vision.factor ** 2)
    assert scaled == h * w // vision.factor ** 2 <= limits.max_image_tokens


def test_a_client_that_leaves_during_preparation_is_not_served(local_server, monkeypatch):
    from edge_infer.engine import media_prompt

    service, base_url = local_server
    gate = Gate(media_prompt.load_part)
    monkeypatch.setattr(media_prompt, "load_part", gate)
    body = json.dumps({"model": MODEL, "messages": user(image()), "max_tokens": 4}).encode()
    url = httpx.URL(base_url)
    with socket.create_connection((url.host, url.port), timeout=60) as sock:
        sock.sendall(b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                     b"Content-Length: %d\r\n\r\n" % len(body) + body)
        assert gate.entered.wait(60)  # the client leaves (closes its connection) while the gate holds
    wait_until(lambda: service.in_flight == 0, "the admission to be released when the client left")
    gate.open()
    assert settled(base_url)


def test_a_client_that_leaves_while_its_image_is_encoded_frees_everything(local_server, monkeypatch):
    """The vision tower is held at a gate inside the engine step that encodes the image; the client leaves, the
    step ends, and the engine holds nothing for the request."""
    from edge_infer.models.multimodal import MultimodalLM

    service, base_url = local_server
    gate = Gate(MultimodalLM.encode)
    monkeypatch.setattr(MultimodalLM, "encode", lambda self, *a: gate(self, *a))
    body = {"model": MODEL, "messages": user(image(8)), "max_tokens": 16, "stream": True}
    with httpx.stream("POST", base_url + "/v1/chat/completions", json=body, timeout=60):
        assert gate.entered.wait(60)  # the engine step that encodes the image holds the request's KV blocks
    wait_until(lambda: service.in_flight == 0, "the server to see the client leave")
    gate.open()
    wait_until(lambda: settled(base_url), "no running sequence and every KV block free")
    assert scrape(base_url)['edge_infer_request_finish_total{reason=abort}'] >= 1


def test_requests_beyond_max_num_seqs_wait_before_their_media_are_decoded(local_server, monkeypatch):
    """Six image requests at once on a server that runs four sequences: while the first image's encode is held,
    four requests have had their image decoded and two wait with theirs undecoded (edge_infer_media_waiting); then
    all six are answered, and the engine never held media for more than four sequences at once: the memory plan's
    "sequence media" item holds max_num_seqs of them, whatever the queue."""
    from edge_infer.engine import media_prompt
    from edge_infer.models.multimodal import MultimodalLM

    service, base_url = local_server
    decoded = []
    load = media_prompt.load_part
    monkeypatch.setattr(media_prompt, "load_part", lambda *a: decoded.append(a[0].where) or load(*a))
    gate = Gate(MultimodalLM.encode)
    monkeypatch.setattr(MultimodalLM, "encode", lambda self, *a: gate(self, *a))
    kw = dict(model=MODEL, max_tokens=MAX_TOKENS, temperature=0, extra_body={"ignore_eos": True})

    async def scenario() -> list[str]:
        client = openai.AsyncOpenAI(base_url=base_url + "/v1", api_key="unused", max_retries=0, timeout=120)
        asks = [asyncio.ensure_future(client.chat.completions.create(messages=user(image(10 + i), QUESTION), **kw))
                for i in range(6)]
        assert await asyncio.to_thread(gate.entered.wait, 60)
        await asyncio.to_thread(wait_until, lambda: scrape(base_url)["edge_infer_media_waiting"] == 2
                                and len(decoded) >= 4, "two requests waiting for room, four decoding")
        assert len(decoded) == 4 and service.engine.media_gate.in_use == 4
        gate.open()
        return [r.choices[0].finish_reason for r in await asyncio.gather(*asks)]

    assert asyncio.run(scenario()) == ["length"] * 6
    assert len(decoded) == 6
    m = scrape(base_url)
    assert 2 <= m["edge_infer_media_sequences_peak"] <= 4
    assert m["edge_infer_media_sequences"] == 0 and m["edge_infer_media_waiting"] == 0
    assert service.engine.media_gate.in_use == 0
    body = {"model": MODEL, "messages": user(image(), QUESTION), "max_tokens": 2, "n": 5}  # could never all run
    response = httpx.post(base_url + "/v1/chat/completions", json=body, timeout=60)
    assert response.status_code == 400 and "at most max_num_seqs=4 sequences hold media" in response.text


def test_bodies_in_flight_past_the_budget_get_429_until_there_is_room(omni, monkeypatch):
    """--max-body-bytes-in-flight: while one image request is held at the encoder, a second whose body would take
    the bodies in flight past the budget gets 429 naming the flag (before its body is read); once the first is
    answered there is room, and it is served."""
    import json

    from edge_infer.models.multimodal import MultimodalLM

    body = {"model": MODEL, "messages": user(image(3)), "max_tokens": 2}
    size = len(json.dumps(body).encode())
    with in_process_server(omni, max_body_bytes_in_flight=size * 3 // 2) as (service, base_url):
        gate = Gate(MultimodalLM.encode)
        monkeypatch.setattr(MultimodalLM, "encode", lambda self, *a: gate(self, *a))
        with ThreadPoolExecutor(1) as pool:
            first = pool.submit(httpx.post, base_url + "/v1/chat/completions", json=body, timeout=120)
            assert gate.entered.wait(60)
            refused = httpx.post(base_url + "/v1/chat/completions", json=body, timeout=60)
            gate.open()
            assert first.result().status_code == 200
        assert refused.status_code == 429 and refused.headers["Retry-After"]
        assert "--max-body-bytes-in-flight" in refused.json()["error"]["message"]
        assert httpx.post(base_url + "/v1/chat/completions", json=body, timeout=60).status_code == 200


def test_a_client_that_announces_a_body_and_stalls_holds_none_of_the_budget(omni):
    """Body bytes are counted as they arrive: two connections that announce bodies filling the budget and send
    nothing do not turn other requests away."""
    import socket

    with in_process_server(omni, max_body_bytes=1 << 20, max_body_bytes_in_flight=2 << 20) as (service, base_url):
        port = int(base_url.rsplit(":", 1)[1])
        stalled = [socket.create_connection(("127.0.0.1", port)) for _ in range(2)]
        try:
            for conn in stalled:
                conn.sendall(b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                             b"Content-Length: 1048000\r\n\r\n")
            body = {"model": MODEL, "messages": user(image(5), QUESTION), "max_tokens": 2}
            assert httpx.post(base_url + "/v1/chat/completions", json=body, timeout=60).status_code == 200
        finally:
            for conn in stalled:
                conn.close()
