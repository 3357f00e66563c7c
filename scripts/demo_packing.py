"""Training rows for the demo model: dialogues packed into fixed-length rows, and the loss weight of each token.

Two kinds of rows:

- ``pack``: whole dialogues side by side. Positions restart at 0 for each
  dialogue; with no attention mask, transformers reads those resets as
  packed sequences and keeps dialogues from attending to each other, so each
  one is seen as at inference.
- ``pack_branches``: dialogues that all begin with the same long prefix (the
  agent's turns: system prompt and tools are ~390 of their ~500 tokens). The
  prefix is run once per batch and its keys and values are shared by every
  row; a row holds only what follows it, several turns side by side, each
  attending to the prefix and to itself (``branch_mask``), at the positions
  it has in the full dialogue. The model computes exactly what it would on
  each whole turn, for about a quarter of the tokens.
"""
from __future__ import annotations

import re
from dataclasses import dataclass

import torch
from tokenizers import Tokenizer

# Loss weight of tokens outside assistant answers: the model still learns to
# model prompts (useful for plain completions and fidelity metrics), but the
# answers carry most of the gradient.
PROMPT_LOSS_WEIGHT = 0.1
# Loss weight of the two decisions in an agent answer that reads a switch ('[2] Switch "Wi-Fi" on; task: on.',
# then tap or task_complete): the state copied from the switch's line, and the call's first token, which
# compares that state with the task's. Every other token of the answer is a copy the model learns at weight 1;
# at weight 1 these two were answered with the data's share (the state from the other switches' lines, the
# call whatever the state).
DECISION_WEIGHT = 20.0
DECISIONS = (re.compile(r'\] Switch "[^"\n]*"()\s(?:on|off); task: (?:on|off)\.'),
             re.compile(r'; task: (?:on|off)\.\n<tool_call>\n\{"name": "()'))
OPEN_ROWS = 16  # recent rows a dialogue may still be packed into


@dataclass(frozen=True)
class PackedRows:
    input_ids: torch.Tensor  # [rows, seq_len]
    position_ids: torch.Tensor  # [rows, seq_len]
    weights: torch.Tensor  # [rows, seq_len] loss weight of predicting this token
    segments: torch.Tensor  # [rows, seq_len] which dialogue of the row a token belongs to (-1: padding)


@dataclass(frozen=True)
class BranchRows:
    """Rows of what follows a shared prefix; ``rows.position_ids`` count from the prefix's end."""

    prefix_ids: torch.Tensor  # [prefix_len]
    prefix_weights: torch.Tensor  # [prefix_len]
    rows: PackedRows


def token_weights(text: str, offsets: list[tuple[int, int]]) -> list[float]:
    answers = [(m.start(1), m.end()) for m in re.finditer(r"<\|im_start\|>assistant\n(.*?)<\|im_end\|>", text, re.S)]
    weights = [1.0 if any(a <= start < b for a, b in answers) else PROMPT_LOSS_WEIGHT for start, _ in offsets]
    decisions = {m.start(1) for pattern in DECISIONS for m in pattern.finditer(text)}
    weights = [DECISION_WEIGHT if start in decisions else w for (start, _), w in zip(offsets, weights)]
    weights[0] = 0.0  # a dialogue's first token has no context to be predicted from
    return weights


def pack(texts: list[str], tokenizer: Tokenizer, seq_len: int, pad_id: int) -> PackedRows:
    pieces = []
    for text, encoding in zip(texts, tokenizer.encode_batch(texts)):
        if len(encoding.ids) > seq_len:
            raise ValueError(f"a dialogue of {len(encoding.ids)} tokens does not fit rows of {seq_len}: {text[:80]!r}")
        pieces.append((encoding.ids, token_weights(text, encoding.offsets)))
    return _rows(pieces, seq_len, pad_id, first_position=0)


def pack_branches(texts: list[str], prefix: str, tokenizer: Tokenizer, seq_len: int, pad_id: int) -> BranchRows:
    """``texts`` all start with ``prefix``; each row holds the rest of several of them."""
    prefix_ids = tokenizer.encode(prefix).ids
    cut = len(prefix_ids)
    pieces = []
    for text, encoding in zip(texts, tokenizer.encode_batch(texts)):
        if encoding.ids[:cut] != prefix_ids or encoding.offsets[cut - 1][1] != len(prefix):
            raise ValueError(f"a dialogue does not start with the shared prefix's tokens: {text[len(prefix) - 40:][:120]!r}")
        if len(encoding.ids) - cut > seq_len:
            raise ValueError(f"a dialogue's {len(encoding.ids) - cut} tokens after the prefix do not fit rows of {seq_len}")
        weights = token_weights(text, encoding.offsets)
        weights[cut] = 0.0  # predicted by the prefix's last token: the same for every branch, learnt there
        pieces.append((encoding.ids[cut:], weights[cut:]))
    prefix_weights = token_weights(prefix, tokenizer.encode(prefix).offsets)
    return BranchRows(torch.tensor(prefix_ids), torch.tensor(prefix_weights), _rows(pieces, seq_len, pad_id, cut))


def _rows(pieces: list[tuple[list[int], list[float]]], seq_len: int, pad_id: int, first_position: int) -> PackedRows:
    rows: list[tuple[list[int], list[int], list[float], list[int]]] = []
    open_rows: list[int] = []
    for ids, weights in pieces:
        target = next((r for r in open_rows if len(rows[r][0]) + len(ids) <= seq_len), None)
        if target is None:
            rows.append(([], [], [], []))
            target = len(rows) - 1
            open_rows = (open_rows + [target])[-OPEN_ROWS:]
        row_ids, row_positions, row_weights, row_segments = rows[target]
        segment = row_segments[-1] + 1 if row_segments else 0
        row_ids += ids
        row_positions += range(first_position, first_position + len(ids))
        row_weights += weights
        row_segments += [segment] * len(ids)
    for row_ids, row_positions, row_weights, row_segments in rows:
        pad = seq_len - len(row_ids)
        row_ids += [pad_id] * pad
        row_positions += range(first_position, first_position + pad)
        row_weights += [0.0] * pad
        row_segments += [-1] * pad
    return PackedRows(*(torch.tensor([row[i] for row in rows]) for i in range(4)))


def branch_mask(segments: torch.Tensor, prefix_len: int) -> torch.Tensor:
    """[rows, 1, seq_len, prefix_len + seq_len] attention of branch rows: the whole prefix, then causal within a branch."""
    rows, seq_len = segments.shape
    causal = torch.ones(seq_len, seq_len, dtype=torch.bool).tril()
    own = (segments[:, :, None] == segments[:, None, :]) & causal
    prefix = torch.ones(rows, seq_len, prefix_len, dtype=torch.bool)
    return torch.cat([prefix, own], dim=2)[:, None]


def shared_prefix_forward(model, prefix_ids: torch.Tensor, rows: int):
    """Logits of the prefix and a cache holding its keys and values for ``rows`` rows (gradients flow through it)."""
    out = model(input_ids=prefix_ids[None], use_cache=True)
    cache = out.cache
    for layer in cache.layers:
        layer.keys = layer.keys.expand(rows, -1, -1, -1)
        layer.values = layer.values.expand(rows, -1, -1, -1)
    return out.logits[0], cache
