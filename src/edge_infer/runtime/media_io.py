"""Media between stages: where a stage may read media from, and encoded media items as payloads.

Stages that read the media parts of ``chat/1`` prompts (the text stage, the
encoder stage) share ``MediaSourceOptions``: the server's ``--allowed-media-dir``,
``--allow-remote-media``, ``--max-media-bytes`` and ``--media-timeout-s``.

An encoder stage (runtime/encoder_executor.py) sends a thinker stage each
media item's embeddings as one ``hidden_states/1`` payload, ``[tokens,
hidden]`` float32, whose metadata place it (extra keys, which the contract
passes along; docs/contracts.md):

    kind             "image" | "video" | "audio"
    positions        the prompt indices its rows fill, as runs [[start, count], ...] (an Omni video's sound is
                     interleaved with it, so an item may be several runs)
    digest           hex of the item's digest (engine/media_prompt.digest): the prefix cache keys on it
    grid_thw         images and videos: [t, h, w], the patch grid before merging (M-RoPE follows it)
    second_per_grid  videos: seconds one temporal patch spans

``media_payload`` writes one, ``media_from_payload`` reads one back into a
``MediaInput`` carrying ``MediaEmbeddings``, refusing metadata that does not
describe an item.
"""
from __future__ import annotations

import numbers
from pathlib import Path
from typing import Any

import numpy as np
from pydantic import Field

from edge_infer.engine.protocol import MediaEmbeddings, MediaInput
from edge_infer.errors import InvalidRequestError
from edge_infer.media.features import VisionFeatures
from edge_infer.media.sources import MediaPolicy
from edge_infer.runtime.contracts import Payload
from edge_infer.runtime.executors import ExecutorOptions

MEDIA_KINDS = ("image", "video", "audio")


class MediaSourceOptions(ExecutorOptions):
    """Where the media parts of chat/1 prompts may come from (data: URLs only unless the operator allows more)."""

    allowed_media_dir: str | None = None
    allow_remote_media: bool = False
    max_media_bytes: int = Field(20 << 20, gt=0)
    media_timeout_s: float = Field(10.0, gt=0)

    def media_policy(self) -> MediaPolicy:
        allowed = Path(self.allowed_media_dir).resolve() if self.allowed_media_dir else None
        return MediaPolicy(allowed_dir=allowed, allow_remote=self.allow_remote_media, max_bytes=self.max_media_bytes,
                           timeout_s=self.media_timeout_s)


def media_payload(item: MediaInput, rows: np.ndarray) -> Payload:
    """One media item's embeddings ``rows`` (float32 ``[tokens, hidden]``) as a ``hidden_states/1`` payload."""
    meta: dict[str, Any] = {"hidden_size": int(rows.shape[1]), "kind": item.kind,
                            "positions": _runs(np.asarray(item.positions)), "digest": item.digest.hex()}
    f = item.features
    if isinstance(f, (VisionFeatures, MediaEmbeddings)) and f.grid_thw is not None:
        meta["grid_thw"] = [int(g) for g in f.grid_thw]
        if f.second_per_grid is not None:
            meta["second_per_grid"] = float(f.second_per_grid)
    return Payload("hidden_states/1", rows, meta)


def media_from_payload(payload: Payload) -> MediaInput:
    """The ``MediaInput`` a ``hidden_states/1`` payload of ``media_payload`` describes; InvalidRequestError names
    the metadata key that is missing or wrong."""
    meta = payload.metadata
    kind = meta.get("kind")
    if kind not in MEDIA_KINDS:
        raise InvalidRequestError(f"a media item's hidden_states/1 needs metadata kind: one of {', '.join(MEDIA_KINDS)}, "
                                  f"got {kind!r}")
    runs = meta.get("positions")
    if not (isinstance(runs, list) and runs and all(_is_run(r) for r in runs)):
        raise InvalidRequestError(f"the {kind}'s hidden_states/1 needs metadata positions: a non-empty list of "
                                  f"[start, count] runs of prompt indices, got {runs!r}")
    try:
        digest = bytes.fromhex(meta.get("digest"))
    except (TypeError, ValueError):
        digest = b""
    if not digest:
        raise InvalidRequestError(f"the {kind}'s hidden_states/1 needs metadata digest: the hex digest of the item, "
                                  f"got {meta.get('digest')!r}")
    grid = meta.get("grid_thw")
    if grid is not None and not (isinstance(grid, list) and len(grid) == 3 and all(_is_int(g) for g in grid)):
        raise InvalidRequestError(f"the {kind}'s metadata grid_thw must be [t, h, w] integers, got {grid!r}")
    seconds = meta.get("second_per_grid")
    if seconds is not None and not (isinstance(seconds, numbers.Real) and not isinstance(seconds, bool)):
        raise InvalidRequestError(f"the {kind}'s metadata second_per_grid must be a number, got {seconds!r}")
    positions = np.concatenate([np.arange(start, start + count, dtype=np.int64) for start, count in runs])
    embeddings = MediaEmbeddings(np.asarray(payload.data), None if grid is None else tuple(grid),
                                 None if seconds is None else float(seconds))
    return MediaInput(kind, embeddings, positions, digest)


def _runs(positions: np.ndarray) -> list[list[int]]:
    """Increasing indices as [start, count] runs of consecutive ones."""
    breaks = np.flatnonzero(np.diff(positions) != 1) + 1
    return [[int(run[0]), len(run)] for run in np.split(positions, breaks) if len(run)]


def _is_int(value: Any) -> bool:
    return isinstance(value, numbers.Integral) and not isinstance(value, bool)


def _is_run(run: Any) -> bool:
    return isinstance(run, list) and len(run) == 2 and all(_is_int(v) for v in run) and run[0] >= 0 and run[1] >= 1
