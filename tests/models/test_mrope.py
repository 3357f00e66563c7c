"""M-RoPE / TMRoPE positions equal transformers 5.24's get_rope_index on random prompts, and bad layouts are
refused with the reason."""
from __future__ import annotations

from types import SimpleNamespace

import numpy as np
import pytest
import torch

from mm_prompts import IMAGE, VIDEO, VISION_END, VISION_START, Prompt, mm_config, random_prompt
from edge_infer.models.mrope import MediaLayout, layout_problem, rope_index

SEEDS = range(60)


def omni_reference(prompt: Prompt, audio_in_video: bool) -> tuple[np.ndarray, int]:
    from transformers.models.qwen2_5_omni.modeling_qwen2_5_omni import (
        Qwen2_5OmniPreTrainedModelForConditionalGeneration as Omni,
    )

    mm = prompt.mm
    stub = SimpleNamespace(
        spatial_merge_size=mm.spatial_merge_size,
        config=SimpleNamespace(image_token_id=mm.image_token_id, video_token_id=mm.video_token_id,
                               audio_token_id=mm.audio_token_id, vision_start_token_id=mm.vision_start_token_id,
                               audio_start_token_id=mm.audio_start_token_id,
                               position_id_per_seconds=int(mm.position_id_per_seconds),
                               seconds_per_chunk=int(mm.seconds_per_chunk)),
    )
    stub.get_llm_pos_ids_for_vision = lambda *a: Omni.get_llm_pos_ids_for_vision(stub, *a)
    stub.get_chunked_index = lambda *a: Omni.get_chunked_index(stub, *a)
    images = [i for i in prompt.items if i.kind == "image"]
    videos = [i for i in prompt.items if i.kind == "video"]
    audios = [i for i in prompt.items if i.kind == "audio"]
    grids = lambda items: torch.tensor([i.grid_thw for i in items]) if items else None  # noqa: E731
    ids = torch.tensor([prompt.ids])
    pos, delta = Omni.get_rope_index(
        stub, ids, grids(images), grids(videos), torch.ones_like(ids), audio_in_video,
        torch.tensor([a.frames for a in audios]) if audios else None,
        torch.tensor([v.second_per_grid for v in videos], dtype=torch.float32) if videos else None,
    )
    return pos[:, 0].numpy(), int(delta)


def vl_reference(prompt: Prompt) -> tuple[np.ndarray, int]:
    from transformers.models.qwen2_5_vl.modeling_qwen2_5_vl import Qwen2_5_VLModel

    mm = prompt.mm
    stub = SimpleNamespace(config=SimpleNamespace(vision_config=SimpleNamespace(
        spatial_merge_size=mm.spatial_merge_size, tokens_per_second=int(mm.position_id_per_seconds))))
    stub.get_vision_position_ids = lambda *a, **k: Qwen2_5_VLModel.get_vision_position_ids(stub, *a, **k)
    ids = torch.tensor([prompt.ids])
    types = torch.zeros_like(ids)
    types[ids == IMAGE], types[ids == VIDEO] = 1, 2
    images = [i.grid_thw for i in prompt.items if i.kind == "image"]
    videos = [i for i in prompt.items if i.kind == "video"]
    pos, delta = Qwen2_5_VLModel.get_rope_index(
        stub, ids, types, torch.tensor(images) if images else None,
        torch.tensor([v.grid_thw for v in videos]) if videos else None,
        torch.tensor([v.second_per_grid for v in videos], dtype=torch.float32) if videos else None,
        torch.ones_like(ids))
    return pos[:, 0].numpy(), int(delta)


@pytest.mark.parametrize("audio_in_video", [False, True])
@pytest.mark.parametrize("seed", SEEDS)
def test_omni_positions_equal_transformers(seed, audio_in_video):
    prompt = random_prompt(np.random.default_rng(seed), mm_config("qwen2_5_omni"), audio_in_video)
    assert layout_problem(prompt.ids, prompt.layouts, prompt.mm) is None
    ours, delta = rope_index(len(prompt.ids), prompt.layouts, prompt.mm)
    ref, ref_delta = omni_reference(prompt, audio_in_video)
    np.testing.assert_array_equal(ours, ref)
    assert delta == ref_delta


@pytest.mark.parametrize("seed", SEEDS)
def test_vl_positions_equal_transformers(seed):
    """Equal, except text after a video that lasts longer than its frame is wide: transformers 5.24 restarts
    it inside the video's temporal range; it continues after the video's largest position (module docstring)."""
    mm = mm_config("qwen2_5_vl")
    prompt = random_prompt(np.random.default_rng(1000 + seed), mm)
    assert layout_problem(prompt.ids, prompt.layouts, mm) is None
    ours, delta = rope_index(len(prompt.ids), prompt.layouts, mm)
    ref, ref_delta = vl_reference(prompt)
    first_gap = next((v for v in prompt.items if v.kind == "video"
                      and ours[0, v.positions].max() - ours[0, v.positions[0]] >= max(v.grid_thw[1:]) // 2), None)
    if first_gap is None:
        np.testing.assert_array_equal(ours, ref)
        assert delta == ref_delta
        return
    end = int(first_gap.positions[-1]) + 1
    np.testing.assert_array_equal(ours[:, :end], ref[:, :end])
    assert (ours[:, end] == ours[:, first_gap.positions].max() + 1).all()  # <vision_end> after the whole video


def test_vl_text_after_a_long_video_continues_after_it():
    mm = mm_config("qwen2_5_vl")
    prompt = Prompt(mm).text([7, 8]).video((4, 2, 2), 2.0).text([9])
    pos, delta = rope_index(len(prompt.ids), prompt.layouts, mm)
    # video at 3 (after 2 text tokens and <vision_start>), frames 4 positions apart (2 s x 2 per second)
    assert pos[0, 3:7].tolist() == [3, 7, 11, 15]
    assert pos[:, 7].tolist() == [16, 16, 16] and pos[:, 8].tolist() == [17, 17, 17]
    assert delta == 18 - 9
    # transformers 5.24 puts <vision_end> at the video's start plus its frame's side (1 merged patch): inside the
    # video's temporal positions. If this changes, transformers has gone back to Qwen's rule: follow it exactly.
    ref, _ = vl_reference(prompt)
    assert ref[:, 7].tolist() == [4, 4, 4]


def test_text_only_is_one_dimensional():
    mm = mm_config("qwen2_5_omni")
    pos, delta = rope_index(5, [], mm)
    assert pos.tolist() == [list(range(5))] * 3 and delta == 0


def test_positions_of_an_image_grid():
    mm = mm_config("qwen2_5_vl")
    prompt = Prompt(mm).text([1]).image((1, 4, 6)).text([2])
    pos, delta = rope_index(len(prompt.ids), prompt.layouts, mm)
    img = prompt.items[0].positions
    assert pos[0, img].tolist() == [2] * 6
    assert pos[1, img].tolist() == [2, 2, 2, 3, 3, 3] and pos[2, img].tolist() == [2, 3, 4, 2, 3, 4]
    assert pos[:, -2].tolist() == [5, 5, 5]  # <vision_end>: after the image's largest position
    assert delta == 7 - len(prompt.ids)


def _moved(layout: MediaLayout, **changes) -> MediaLayout:
    return MediaLayout(**{**layout.__dict__, **changes})


@pytest.mark.parametrize("case, message", [
    ("kind", "takes image, video, not audio"),
    ("count", "gives 4 tokens, but 3 positions"),
    ("outside", "outside the prompt"),
    ("order", "must increase"),
    ("placeholder", "not the image placeholder"),
    ("loose", "no image fills"),
    ("grid", "multiples of the merge size"),
    ("markers", "must be preceded by token(s)"),
    ("split", "not one run of placeholders"),
    ("seconds", "positive number of seconds"),
])
def test_bad_layouts_are_refused_with_the_reason(case, message):
    mm = mm_config("qwen2_5_vl")
    prompt = Prompt(mm).text([3, 4]).image((1, 4, 4)).text([5]).video((2, 2, 2), 1.0).text([6])
    ids, (image, video) = list(prompt.ids), prompt.layouts
    media = [image, video]
    if case == "kind":
        media.append(MediaLayout("audio", np.array([0])))
    elif case == "count":
        media[0] = _moved(image, positions=image.positions[:3])
    elif case == "outside":
        media[1] = _moved(video, positions=video.positions + 100)
    elif case == "order":
        media[0] = _moved(image, positions=image.positions[::-1].copy())
    elif case == "placeholder":
        ids[int(image.positions[1])] = 7
    elif case == "loose":
        media = [video]
    elif case == "grid":
        media[0] = _moved(image, grid_thw=(1, 3, 4))
    elif case == "markers":
        ids[int(image.positions[0]) - 1] = 9
    elif case == "split":
        ids = ids[:4] + [11] + ids[4:]  # a text token inside the image's run
        media = [_moved(image, positions=np.array([3, 5, 6, 7])), _moved(video, positions=video.positions + 1)]
    elif case == "seconds":
        media[1] = _moved(video, second_per_grid=0.0)
    problem = layout_problem(ids, media, mm)
    assert problem is not None and message in problem, problem


def test_an_audio_track_must_interleave_with_its_video_in_chunks():
    mm = mm_config("qwen2_5_omni")
    prompt = Prompt(mm).text([3]).video_with_audio((6, 2, 2), 1.0, 600).text([4])
    video, audio = prompt.layouts
    assert layout_problem(prompt.ids, prompt.layouts, mm) is None
    # the same tokens, the video's and the audio's indices swapped inside the block
    block = np.sort(np.concatenate([video.positions, audio.positions]))
    swapped = [_moved(video, positions=block[: len(video.positions)]), _moved(audio, positions=block[len(video.positions):])]
    ids = list(prompt.ids)
    for p in swapped[0].positions:
        ids[int(p)] = mm.video_token_id
    for p in swapped[1].positions:
        ids[int(p)] = mm.audio_token_id
    problem = layout_problem(ids, swapped, mm)
    assert problem is not None and "interleave them in chunks of 2 s" in problem
    assert VISION_START in prompt.ids and VISION_END in prompt.ids


def test_rotary_table_rotates_each_frequency_band_by_its_axis_as_transformers():
    """cos/sin for [3, T] positions equal transformers' Qwen2.5 M-RoPE bit for bit; three equal rows (a text token,
    a decode step) give exactly the 1-D table's rows, positions past the context included."""
    from transformers import Qwen2_5_VLTextConfig
    from transformers.models.qwen2_5_vl.modeling_qwen2_5_vl import Qwen2_5_VLRotaryEmbedding

    from edge_infer.models.layers.rope import RotaryTable

    section = (2, 5, 5)
    config = Qwen2_5_VLTextConfig(hidden_size=120, num_attention_heads=5,
                                  rope_parameters={"rope_type": "default", "mrope_section": list(section), "rope_theta": 1e6})
    positions = torch.randint(0, 20000, (3, 1, 57))
    hf_cos, hf_sin = Qwen2_5_VLRotaryEmbedding(config)(torch.zeros(1), positions)
    table = RotaryTable(24, 1e6, 64, mrope_section=section)
    cos, signed_sin = table.lookup(positions[:, 0], torch.float32)
    assert torch.equal(cos[:, 0], hf_cos[0]) and table.nbytes == 0
    assert torch.equal(signed_sin[:, 0, 12:], hf_sin[0][:, 12:]) and torch.equal(signed_sin[:, 0, :12], -hf_sin[0][:, :12])
    flat = RotaryTable(24, 1e6, 20000)
    same = torch.randint(0, 20000, (57,))
    for got, want in zip(table.lookup(same.expand(3, -1), torch.float32), flat.lookup(same, torch.float32)):
        assert torch.equal(got, want)
