"""Media through the engine core of a multimodal thinker: encoded once per request (not again on preemption and
recompute), placed across prefill chunks, batched, kept apart in the prefix cache by their digests, refused
with the reason when they do not fit the prompt, on their own thread count."""
from __future__ import annotations

import dataclasses

import numpy as np
import pytest
import torch

from mm_fakes import FakeTowers, media_inputs
from mm_prompts import Prompt, mm_config
from edge_infer.config import EngineConfig
from edge_infer.engine.core import EngineCore
from edge_infer.engine.protocol import EngineRequest, MediaEmbeddings, MediaInput
from edge_infer.engine.sampling_params import SamplingParams
from edge_infer.errors import InvalidRequestError

MM = mm_config("qwen2_5_omni")
GREEDY = SamplingParams(temperature=0, max_tokens=10, ignore_eos=True, logit_bias={t: -100 for t in range(289, 296)})


def config(path, **kw) -> EngineConfig:
    settings = dict(model=str(path), dtype="float32", max_model_len=320, max_num_seqs=4,
                    max_num_batched_tokens=16, kv_cache_memory_bytes=4 << 20)
    return EngineConfig(**{**settings, **kw})


def engine(path, towers: FakeTowers | None = None, **kw) -> EngineCore:
    core = EngineCore(config(path, **kw))
    core.model.encoders = (towers or FakeTowers(core.model.cfg.hidden_size)).encoders()
    return core


def run(core: EngineCore, requests: dict[str, tuple[list[int], list[MediaInput]]],
        params: SamplingParams = GREEDY) -> dict[str, list]:
    """Each request's deltas, run to their end."""
    for rid, (prompt, media) in requests.items():
        assert core.add_request(EngineRequest(rid, prompt, params, media=media)) is None
    out: dict[str, list] = {rid: [] for rid in requests}
    while core.has_work():
        for d in core.step():
            out[d.request_id].append(d)
    return out


def tokens(deltas) -> list[int]:
    assert all(d.error is None for d in deltas), [d.error for d in deltas]
    return [d.token_id for d in deltas if d.token_id is not None]


def requests() -> dict[str, tuple[list[int], list[MediaInput]]]:
    prompts = {
        "image": Prompt(MM).text([5, 6, 7]).image((1, 6, 8)).text([8, 9]),
        "audio+image": Prompt(MM).text([10]).audio(120).text([11, 12]).image((1, 4, 4)).text([13]),
        "video+audio": Prompt(MM).text([14, 15]).video_with_audio((4, 4, 4), 1.0, 420).text([16]),
        "text": Prompt(MM).text([17, 18, 19, 20, 21]),
    }
    return {rid: (p.ids, media_inputs(p, seed=i)) for i, (rid, p) in enumerate(prompts.items())}


@pytest.fixture(scope="module")
def omni(thinker_checkpoints):
    return thinker_checkpoints["qwen2_5_omni_thinker"]


def test_batched_requests_equal_each_alone_and_chunks_equal_one_pass(omni):
    reqs = requests()
    alone = {rid: tokens(run(engine(omni, max_num_batched_tokens=512), {rid: r})[rid]) for rid, r in reqs.items()}
    together = run(engine(omni), reqs)  # 16-token chunks: images and the interleaved video split across steps
    assert {rid: tokens(d) for rid, d in together.items()} == alone
    prompt, media = reqs["video+audio"]
    chunked = engine(omni, max_num_batched_tokens=7).score(prompt, media)
    whole = engine(omni, max_num_batched_tokens=512).score(prompt, media)
    assert (chunked - whole).abs().max().item() < 1e-5


def test_media_are_encoded_once_though_preemption_recomputes_them(omni):
    reqs = requests()
    towers = FakeTowers(96)
    reference = {rid: tokens(d) for rid, d in run(engine(omni, towers, max_num_batched_tokens=512), reqs).items()}
    towers.calls = 0
    # 12 blocks of 16 tokens: the four requests cannot all hold their sequences; the newest are preempted
    small = engine(omni, towers, kv_cache_memory_bytes=12 * 16 * 2 * 3 * 2 * 16 * 4)
    out = run(small, reqs, dataclasses.replace(GREEDY, max_tokens=24))
    assert small.current_stats().num_preemptions > 0
    assert sum(d.num_preemptions for ds in out.values() for d in ds if d.finished) > 0
    assert towers.calls == small.current_stats().media_encoded == sum(len(m) for _, m in reqs.values())
    assert {rid: tokens(d)[:10] for rid, d in out.items()} == reference


def test_an_encoded_item_keeps_its_embeddings_and_drops_its_features(omni):
    """Each item is held as its features until it is encoded, then as its embeddings only (the plan's "sequence
    media" item sizes one or the other)."""
    prompt, media = requests()["audio+image"]  # the clip in the first 16-token chunk, the image in a later one
    core = engine(omni)
    assert core.add_request(EngineRequest("r", prompt, GREEDY, media=media)) is None
    seq = core.sequences["r"]
    seen = set()
    while seq.num_computed < len(prompt):
        core.step()
        held = tuple((m.features is None, e is not None) for m, e in zip(seq.media, seq.media_embeds))
        assert all(dropped == encoded for dropped, encoded in held), held
        seen.add(held)
    assert ((True, True), (False, False)) in seen  # the clip encoded, the image not yet
    assert all(m.features is None for m in seq.media) and all(e is not None for e in seq.media_embeds)
    assert all(m.features is not None for m in media)  # the caller's own items are left as they were


def test_different_images_behind_equal_tokens_do_not_share_cached_blocks(omni):
    prompt = Prompt(MM).text(list(range(20, 40))).image((1, 8, 8)).text(list(range(40, 60)))
    first, other = media_inputs(prompt, seed=1), media_inputs(prompt, seed=2)
    cold = {name: tokens(run(engine(omni, prefix_caching=False), {name: (prompt.ids, m)})[name])
            for name, m in (("first", first), ("other", other))}
    assert cold["first"] != cold["other"]  # the images matter
    core = engine(omni, prefix_caching=True)
    image_start = int(prompt.items[0].positions[0])
    run(core, {"a": (prompt.ids, first)})
    b = run(core, {"b": (prompt.ids, other)})["b"]
    assert tokens(b) == cold["other"]
    assert b[-1].num_cached_tokens == image_start // 16 * 16  # the text before the image's block only
    encoded = core.current_stats().media_encoded
    c = run(core, {"c": (prompt.ids, first)})["c"]  # the first image again: its blocks are found
    assert tokens(c) == cold["first"]
    assert c[-1].num_cached_tokens == (len(prompt.ids) - 1) // 16 * 16
    assert core.current_stats().media_encoded == encoded  # every block holding it was cached: not encoded again


def test_text_only_requests_share_blocks_with_the_text_before_media(omni):
    core = engine(omni, prefix_caching=True)
    system = list(range(100, 140))
    prompt = Prompt(MM).text(system).image((1, 4, 4)).text([7])
    run(core, {"text": (system + [1, 2, 3], [])})
    deltas = run(core, {"image": (prompt.ids, media_inputs(prompt))})["image"]
    assert deltas[-1].num_cached_tokens == 32


def test_encoders_run_on_their_own_thread_count(omni):
    seen = []
    towers = FakeTowers(96)
    core = engine(omni, towers, num_threads=2, encoder_threads=1)
    encoders = towers.encoders()
    core.model.encoders = {k: (lambda f, e=e: seen.append(torch.get_num_threads()) or e(f)) for k, e in encoders.items()}
    prompt, media = requests()["image"]
    tokens(run(core, {"r": (prompt, media)})["r"])
    assert seen == [1] and torch.get_num_threads() == 2


def test_a_failing_encoder_ends_its_request_only(omni):
    core = engine(omni)
    good = core.model.encoders["audio"]
    core.model.encoders["image"] = lambda f: (_ for _ in ()).throw(ValueError("the tower broke"))
    reqs = requests()
    out = run(core, {"image": reqs["image"], "text": reqs["text"]})
    assert out["image"][-1].finish_reason == "error" and "the tower broke" in out["image"][-1].error
    assert len(tokens(out["text"])) == 10 and good is core.model.encoders["audio"]
    assert core.scheduler.allocator.num_used == 0


def _moved(media: MediaInput, **changes) -> MediaInput:
    return dataclasses.replace(media, **changes)


@pytest.mark.parametrize("case, message", [
    ("outside", "outside the prompt's"),
    ("count", "its features give 6 embeddings, but 5 positions"),
    ("loose", "that no image fills"),
    ("digest", "digest must be non-empty bytes"),
    ("kind", "features must be AudioFeatures"),
    ("merge", "features merged 1x1 patches"),
    ("positions", "mrope_positions has shape (3, 4)"),
])
def test_media_that_do_not_fit_the_prompt_are_refused_with_the_reason(omni, case, message):
    core = engine(omni)
    prompt = Prompt(MM).text([3, 4]).image((1, 4, 6)).text([5])
    ids, (image,) = list(prompt.ids), media_inputs(prompt)
    media, kw = [image], {}
    if case == "outside":
        media = [_moved(image, positions=image.positions + 50)]
    elif case == "count":
        media = [_moved(image, positions=image.positions[:-1])]
    elif case == "loose":
        media = []
    elif case == "digest":
        media = [_moved(image, digest=b"")]
    elif case == "kind":
        media = [_moved(image, kind="audio")]
    elif case == "merge":
        media = [_moved(image, features=dataclasses.replace(image.features, merge_size=1))]
    elif case == "positions":
        kw = dict(mrope_positions=np.zeros((3, 4), dtype=np.int64))
    delta = core.add_request(EngineRequest("r", ids, GREEDY, media=media, **kw))
    assert delta is not None and delta.finish_reason == "error" and message in delta.error, delta.error


def test_a_text_model_refuses_media_and_a_thinker_without_the_encoder_says_so(hf_checkpoints, omni):
    prompt = Prompt(MM).text([3]).image((1, 2, 2)).text([4])
    media = media_inputs(prompt)
    text = EngineCore(EngineConfig(model=str(hf_checkpoints["qwen2"]), dtype="float32", max_model_len=64,
                                   max_num_seqs=2, max_num_batched_tokens=16, kv_cache_memory_bytes=1 << 20))
    delta = text.add_request(EngineRequest("r", prompt.ids, GREEDY, media=media))
    assert "Qwen2ForCausalLM takes text only; it cannot take image input" in delta.error
    core = engine(omni)
    core.model.encoders = {}
    delta = core.add_request(EngineRequest("r", prompt.ids, GREEDY, media=media))
    assert "this engine has no image encoder for Qwen2_5OmniThinkerForConditionalGeneration" in delta.error


def test_a_thinker_without_towers_places_embeddings_computed_elsewhere(omni):
    """load_encoders false: the decoder alone; items that come with their embeddings (an encoder stage's) give the
    tokens of the towers in the process, unencoded; features are refused naming the setting."""
    towers = FakeTowers(96)
    reqs = requests()
    whole = engine(omni, towers)
    expected = {rid: tokens(d) for rid, d in run(whole, reqs).items()}
    bare = EngineCore(config(omni, load_encoders=False))
    assert bare.model.towers() == {} and bare.model.encoders == {}
    assert bare.ready_info.weight_bytes == whole.ready_info.weight_bytes - sum(whole.ready_info.encoder_weight_bytes.values())

    def embedded(m: MediaInput) -> MediaInput:
        rows = towers.encoders()[m.kind](m.features).numpy()
        return dataclasses.replace(m, features=MediaEmbeddings(rows, getattr(m.features, "grid_thw", None),
                                                               getattr(m.features, "second_per_grid", None)))

    encoded = {rid: (ids, [embedded(m) for m in media]) for rid, (ids, media) in reqs.items()}
    assert {rid: tokens(d) for rid, d in run(bare, encoded).items()} == expected
    assert bare.current_stats().media_encoded == 0
    ids, media = reqs["image"]
    delta = bare.add_request(EngineRequest("raw", ids, GREEDY, media=media))
    assert "no image encoder" in delta.error and "load_encoders false" in delta.error


def test_llm_generate_takes_prompts_with_media(omni, monkeypatch):
    """The frontend checks media, computes their positions and sends them with the request (a worker thread here:
    the stand-in towers live in this process)."""
    from edge_infer import LLM
    from edge_infer.engine import core as core_module

    load = core_module.load_model

    def with_towers(config, progress=None):
        model = load(config, progress)
        model.encoders = FakeTowers(model.cfg.hidden_size).encoders()
        return model

    monkeypatch.setattr(core_module, "load_model", with_towers)
    reqs = requests()
    expected = {rid: tokens(d) for rid, d in run(engine(omni), reqs).items()}
    with LLM(str(omni), dtype="float32", max_model_len=320, max_num_batched_tokens=16, worker="thread",
             skip_tokenizer_init=True, kv_cache_memory_bytes=4 << 20) as llm:
        outs = llm.generate([{"prompt_token_ids": ids, "media": media} for ids, media in reqs.values()], GREEDY)
        assert {rid: o.outputs[0].token_ids for rid, o in zip(reqs, outs)} == expected
        ids, (image,) = reqs["image"]
        with pytest.raises(InvalidRequestError, match="shares prompt index"):
            llm.generate({"prompt_token_ids": ids, "media": [image, image]}, GREEDY)


@pytest.mark.parametrize("method", ["cpu_w4a8", "cpu_w8a8"])
def test_the_fused_decode_layer_takes_mrope_positions_past_the_context(omni, method):
    """A thinker's decode positions are index + delta, possibly past max_model_len (no table holds them): with one
    key per sequence attention is exact, so the fused int8 layer equals the PyTorch layers bit for bit."""
    from edge_infer.config import QuantConfig
    from edge_infer.models.layers.attention import AttentionMetadata, build_seq_attention
    from edge_infer.models.layers.kv_cache import KVCache

    core = engine(omni, dtype="bfloat16", max_model_len=64, quant=QuantConfig.named(method, group_size=32))
    model = core.model
    group = model.cfg.num_attention_heads // model.cfg.num_key_value_heads
    positions = torch.tensor([[700, 65, 3]] * 3)  # three sequences' next tokens, two beyond the 64-token context
    results = []
    for fused in (False, True):
        cache = KVCache(core.layout, 4, torch.bfloat16)
        meta = AttentionMetadata(torch.tensor([0, 16, 48]), [build_seq_attention(i, 1, 1, [b], 16, group, None)
                                                              for i, b in enumerate((0, 1, 3))])
        model.fused_decode = None if fused else False
        out = model.run_layers(model.embed_tokens(torch.tensor([5, 77, 250])), positions, meta, cache)
        assert model.fused_decode is fused
        results.append((out, cache.storage.clone()))
    assert torch.equal(results[0][0], results[1][0]) and torch.equal(results[0][1], results[1][1])


def test_an_image_partly_in_cached_blocks_is_encoded_and_placed_from_where_the_cache_ends(omni):
    prompt = Prompt(MM).text(list(range(20, 40))).image((1, 8, 8)).text([41, 42, 43])  # image at 21..36 of 41 tokens
    media = media_inputs(prompt, seed=3)
    cold = tokens(run(engine(omni, prefix_caching=False), {"r": (prompt.ids, media)})["r"])
    core = engine(omni, prefix_caching=True)
    run(core, {"a": (prompt.ids, media)})
    again = run(core, {"b": (prompt.ids, media)})["b"]
    assert again[-1].num_cached_tokens == 32  # the last 4 of the image's 16 rows are computed again
    assert tokens(again) == cold and core.current_stats().media_encoded == 2
