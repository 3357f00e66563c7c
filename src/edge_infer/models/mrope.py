"""Multimodal RoPE positions of a prompt (Qwen2.5-VL M-RoPE, Qwen2.5-Omni TMRoPE), torch-free.

Each prompt token gets three positions: time, height and width. Text
tokens get one running position on all three axes. An image or a video
frame's merged patches share the temporal position of their frame and take
their row and column (offset by the block's start) as height and width; a
video's frames advance the temporal position by ``position_id_per_seconds``
per second. An audio clip's tokens advance all three axes by one each,
like text. After a block, text continues from its largest position plus
one, so a prompt with media has fewer positions than tokens: a generated
token ``i`` (0-based over the whole sequence) is at ``i + delta`` on all
three axes.

Qwen2.5-Omni can interleave a video with its own audio track
(``use_audio_in_video``): the two are cut into chunks of
``seconds_per_chunk`` seconds of positions, and the prompt holds video chunk
0, audio chunk 0, video chunk 1, ... between ``<vision_bos><audio_bos>`` and
``<audio_eos><vision_eos>``; each pair of markers shares one position.

The values equal transformers 5.24's ``get_rope_index`` of
Qwen2_5OmniThinkerForConditionalGeneration and
Qwen2_5_VLForConditionalGeneration, float32 rounding of the temporal
positions included, with one exception: after a Qwen2.5-VL video, text
continues from the video's largest position plus one (as Qwen's own code,
transformers up to 5.2 and vLLM do), where transformers 5.24 continues from
the start plus the frame's larger side, overlapping the video's temporal
positions when the video lasts longer than the frame is wide.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

import numpy as np

from edge_infer.models.config import MultimodalConfig


@dataclass(frozen=True)
class MediaLayout:
    """Where one media item sits in a prompt and the shape of its tokens."""

    kind: str  # image | video | audio
    positions: np.ndarray  # int64 prompt indices its tokens fill, increasing
    grid_thw: tuple[int, int, int] | None = None  # image / video: the patch grid before merging
    second_per_grid: float | None = None  # video: seconds per temporal grid step (temporal patch / fps); None = 1


@dataclass(frozen=True)
class _Block:
    """One media item, or a video and the audio interleaved with it, at prompt indices ``start..end``."""

    items: tuple[int, ...]  # indices into the media list: (item,) or (video, audio)
    start: int
    end: int

    @property
    def paired(self) -> bool:
        return len(self.items) == 2


def temporal_positions(item: MediaLayout, mm: MultimodalConfig) -> np.ndarray:
    """Temporal position of each frame of an image or video, relative to its block (transformers' float32 products,
    truncated)."""
    grid_t = item.grid_thw[0]
    steps = np.arange(grid_t, dtype=np.float32)
    pps = np.float32(mm.position_id_per_seconds)
    seconds = np.float32(1.0 if item.kind == "image" or item.second_per_grid is None else item.second_per_grid)
    if mm.family == "qwen2_5_omni":  # (frame x seconds per frame) x positions per second; an image's frames 1 s apart
        return (steps * seconds * pps).astype(np.int64)
    if item.kind == "image":  # Qwen2.5-VL numbers an image's frames 0, 1, ...
        return np.arange(grid_t, dtype=np.int64)
    return (steps * (pps * seconds)).astype(np.int64)


def vision_positions(item: MediaLayout, mm: MultimodalConfig) -> np.ndarray:
    """``[3, tokens]`` positions of an image or video's merged patches relative to its block, frame by frame,
    row by row."""
    _, h, w = item.grid_thw
    rows, cols = h // mm.spatial_merge_size, w // mm.spatial_merge_size
    t = temporal_positions(item, mm)
    grid = np.stack(np.meshgrid(t, np.arange(rows), np.arange(cols), indexing="ij"))
    return grid.reshape(3, -1).astype(np.int64)


def chunk_bounds(values: np.ndarray, per_chunk: int) -> list[tuple[int, int]]:
    """Split increasing temporal ``values`` where they reach the next multiple of ``per_chunk``: ``(start, end)``
    index ranges. As transformers does it, a value that skips several chunks starts only one new chunk."""
    out, start, chunk = [], 0, 1
    for i, v in enumerate(values.tolist()):
        if v >= chunk * per_chunk:
            out.append((start, i))
            start, chunk = i, chunk + 1
    out.append((start, len(values)))
    return out


def audio_in_video_pieces(video: MediaLayout, audio_tokens: int, mm: MultimodalConfig) -> list[tuple[str, int, int]]:
    """The token order of a video interleaved with its audio: ``(kind, first, end)`` ranges of each item's
    tokens, video chunk 0, audio chunk 0, video chunk 1, ... (chunks of ``seconds_per_chunk`` seconds)."""
    per_chunk = int(mm.position_id_per_seconds * mm.seconds_per_chunk)
    video_chunks = chunk_bounds(vision_positions(video, mm)[0], per_chunk)
    audio_chunks = chunk_bounds(np.arange(audio_tokens), per_chunk)
    pieces = []
    for j in range(max(len(video_chunks), len(audio_chunks))):
        for kind, chunks in (("video", video_chunks), ("audio", audio_chunks)):
            if j < len(chunks) and chunks[j][1] > chunks[j][0]:
                pieces.append((kind, *chunks[j]))
    return pieces


def _blocks(media: Sequence[MediaLayout], mm: MultimodalConfig) -> list[_Block]:
    """The media in prompt order; an Omni video and an audio that starts within it or right after its last token
    (no markers between: its own track) as one block."""
    spans = [(int(m.positions[0]), int(m.positions[-1]) + 1) for m in media]
    paired: dict[int, int] = {}
    if mm.family == "qwen2_5_omni":
        for a, m in enumerate(media):
            if m.kind != "audio":
                continue
            for v, other in enumerate(media):
                if other.kind == "video" and spans[v][0] < spans[a][0] <= spans[v][1]:
                    paired[v] = a
    blocks = []
    for i in range(len(media)):
        if i in paired.values():
            continue
        items = (i, paired[i]) if i in paired else (i,)
        blocks.append(_Block(items, min(spans[j][0] for j in items), max(spans[j][1] for j in items)))
    return sorted(blocks, key=lambda b: b.start)


def rope_index(num_tokens: int, media: Sequence[MediaLayout], mm: MultimodalConfig) -> tuple[np.ndarray, int]:
    """Positions ``int64 [3, num_tokens]`` of a prompt with ``media`` (checked by ``layout_problem``), and the
    delta a generated token adds to its index."""
    pos = np.empty((3, num_tokens), dtype=np.int64)
    cursor = nxt = 0  # next prompt index, next free position

    def text(end: int) -> None:
        nonlocal cursor, nxt
        pos[:, cursor:end] = np.arange(nxt, nxt + end - cursor)
        nxt += end - cursor
        cursor = end

    for block in _blocks(media, mm):
        if block.paired:  # <vision_bos><audio_bos> share one position, as do <audio_eos><vision_eos>
            text(block.start - 2)
            pos[:, cursor:block.start] = nxt
            nxt, cursor = nxt + 1, block.start
        else:
            text(block.start)
        nxt = _place(block, media, mm, pos, base=nxt)
        cursor = block.end
        if block.paired:
            pos[:, cursor:cursor + 2] = nxt
            nxt, cursor = nxt + 1, cursor + 2
    text(num_tokens)
    return pos, int(pos.max()) + 1 - num_tokens


def _place(block: _Block, media: Sequence[MediaLayout], mm: MultimodalConfig, pos: np.ndarray, base: int) -> int:
    """Write a block's positions from ``base``; returns where text continues: after the last piece's largest
    position (for an interleaved block, the last chunk's, as transformers takes it)."""
    if not block.paired:
        item = media[block.items[0]]
        rel = np.tile(np.arange(len(item.positions)), (3, 1)) if item.kind == "audio" else vision_positions(item, mm)
        pos[:, item.positions] = rel + base
        return int(rel.max()) + base + 1
    video, audio = (media[i] for i in block.items)
    rel = vision_positions(video, mm)
    pos[:, video.positions] = rel + base
    pos[:, audio.positions] = np.arange(len(audio.positions)) + base
    kind, first, end = audio_in_video_pieces(video, len(audio.positions), mm)[-1]
    last = rel[:, first:end].max() if kind == "video" else end - 1
    return int(last) + base + 1


def layout_problem(prompt_ids: Sequence[int], media: Sequence[MediaLayout], mm: MultimodalConfig) -> str | None:
    """Why ``media`` cannot sit in this prompt as the model expects, as the user should read it, or None.

    Every placeholder token is covered by exactly one item of its kind, each item's tokens are contiguous
    between its start and end markers (an Omni video's audio is interleaved with it in chunks, between
    ``<vision_bos><audio_bos>`` and ``<audio_eos><vision_eos>``), and an image or video has one token per
    merged patch of its grid."""
    n = len(prompt_ids)
    ids = np.asarray(prompt_ids, dtype=np.int64)
    covered = np.zeros(n, dtype=bool)
    for k, m in enumerate(media):
        what = f"media item {k} ({m.kind})"
        if m.kind not in mm.kinds:
            return f"{what}: this model takes {', '.join(mm.kinds)}, not {m.kind}"
        p = m.positions
        if p.ndim != 1 or len(p) == 0 or not np.issubdtype(p.dtype, np.integer):
            return f"{what}: positions must be a non-empty 1-D array of prompt indices"
        if np.any(np.diff(p) <= 0):
            return f"{what}: positions must increase"
        if p[0] < 0 or p[-1] >= n:
            return f"{what}: positions {int(p[0])}..{int(p[-1])} fall outside the prompt's {n} tokens"
        if m.kind != "audio":
            problem = _grid_problem(m, mm)
            if problem is not None:
                return f"{what}: {problem}"
        wrong = np.flatnonzero(ids[p] != mm.placeholder_id(m.kind))
        if len(wrong):
            return (f"{what}: prompt token {int(p[wrong[0]])} is {int(ids[p[wrong[0]]])}, not the {m.kind} "
                    f"placeholder {mm.placeholder_id(m.kind)}")
        if covered[p].any():
            return f"{what}: shares prompt index {int(p[covered[p]][0])} with another item"
        covered[p] = True
    for kind in mm.kinds:
        loose = np.flatnonzero((ids == mm.placeholder_id(kind)) & ~covered)
        if len(loose):
            return (f"the prompt has {len(loose)} {kind} placeholder token(s) (id {mm.placeholder_id(kind)}, first "
                    f"at index {int(loose[0])}) that no {kind} fills; give one {kind} per placeholder run")
    for block in _blocks(media, mm):
        problem = _block_problem(block, media, ids, mm)
        if problem is not None:
            return problem
    return None


def _grid_problem(m: MediaLayout, mm: MultimodalConfig) -> str | None:
    grid = m.grid_thw
    if grid is None or len(grid) != 3 or any(int(g) < 1 for g in grid):
        return f"grid_thw={grid!r} must be three positive integers"
    merge = mm.spatial_merge_size
    if grid[1] % merge or grid[2] % merge:
        return f"grid {tuple(grid)}: height and width must be multiples of the merge size {merge}"
    tokens = grid[0] * grid[1] * grid[2] // merge**2
    if len(m.positions) != tokens:
        return f"a grid of {tuple(grid)} patches gives {tokens} tokens, but {len(m.positions)} positions are given"
    if m.second_per_grid is not None and not (np.isfinite(m.second_per_grid) and m.second_per_grid > 0):
        return f"second_per_grid={m.second_per_grid!r} must be a positive number of seconds"
    return None


def _block_problem(block: _Block, media: Sequence[MediaLayout], ids: np.ndarray, mm: MultimodalConfig) -> str | None:
    first = media[block.items[0]]
    if block.paired:
        video, audio = (media[i] for i in block.items)
        expected = {"video": [], "audio": []}
        index = block.start
        for kind, a, b in audio_in_video_pieces(video, len(audio.positions), mm):
            expected[kind].append(np.arange(index, index + b - a))
            index += b - a
        if not (np.array_equal(np.concatenate(expected["video"]), video.positions)
                and np.array_equal(np.concatenate(expected["audio"]), audio.positions)):
            return (f"a video with its audio at prompt indices {block.start}..{block.end - 1} must interleave them in "
                    f"chunks of {mm.seconds_per_chunk:g} s (video chunk 0, audio chunk 0, video chunk 1, ...)")
        before = (mm.vision_start_token_id, mm.audio_start_token_id)
        after = (mm.audio_end_token_id, mm.vision_end_token_id)
        name = "a video with its audio"
    else:
        if first.positions[-1] - first.positions[0] + 1 != len(first.positions):
            return f"the {first.kind} at prompt indices {block.start}..{block.end - 1} is not one run of placeholders"
        audio = first.kind == "audio"
        before = (mm.audio_start_token_id,) if audio else (mm.vision_start_token_id,)
        after = (mm.audio_end_token_id,) if audio else (mm.vision_end_token_id,)
        name = f"the {first.kind}"
    lead, tail = ids[max(0, block.start - len(before)):block.start], ids[block.end:block.end + len(after)]
    if tuple(lead.tolist()) != before or tuple(tail.tolist()) != after:
        return (f"{name} at prompt indices {block.start}..{block.end - 1} must be preceded by token(s) {list(before)} "
                f"and followed by {list(after)}")
    return None
