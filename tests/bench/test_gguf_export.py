"""The GGUF exporter: llama.cpp's names, hyperparameters, padded vocabulary, RoPE layout (needs `gguf`)."""
from __future__ import annotations

import json

import pytest
import torch

from edge_infer.bench.baselines.gguf_export import export_gguf, llama3_rope_factors, pairwise_rope_rows
from edge_infer.errors import CheckpointError
from edge_infer.models.config import ModelConfig
from edge_infer.models.layers.rope import apply_rotary, inverse_frequencies
from testutil import write_hf_checkpoint

from .engine_models import add_byte_level_tokenizer

gguf = pytest.importorskip(
    "gguf", reason="the `baseline` extra is not installed (pip install -e '.[baseline]' brings gguf and llama-cpp-python)"
)


@pytest.fixture(scope="module")
def llama_dir(tmp_path_factory):
    # A transformers Llama with Llama-3 RoPE scaling, 6 heads / 2 KV heads, an untied head.
    path = write_hf_checkpoint(tmp_path_factory.mktemp("gguf") / "llama", "llama")
    add_byte_level_tokenizer(path)
    return path


def read(path):
    reader = gguf.GGUFReader(str(path))
    fields = {k: f.contents() for k, f in reader.fields.items() if not k.startswith("GGUF.")}
    tensors = {t.name: t for t in reader.tensors}
    return fields, tensors


def hf_tensor(model_dir, name):
    from safetensors.torch import load_file

    return load_file(str(model_dir / "model.safetensors"))[name]


def test_pairwise_layout_rotates_exactly_like_the_half_split_layout():
    """RoPE on reordered rows (llama.cpp's adjacent pairs) equals reordered RoPE on the original rows."""
    heads, d, positions = 3, 8, 5
    x = torch.randn(positions, heads, d)
    inv = inverse_frequencies(d, 10000.0, None)
    angles = torch.outer(torch.arange(positions, dtype=torch.float32), inv)
    cos = torch.cat([angles.cos()] * 2, -1)[:, None]
    signed_sin = torch.cat([-angles.sin(), angles.sin()], -1)[:, None]  # apply_rotary's convention
    half_split = apply_rotary(x, cos, signed_sin)

    def reorder(t):  # [T, heads, d] -> the same reordering the exporter applies to weight rows
        return pairwise_rope_rows(t.reshape(positions, heads * d).T, heads).T.reshape(positions, heads, d)

    y = reorder(x)
    even, odd = y[..., 0::2], y[..., 1::2]
    c, s = angles.cos()[:, None], angles.sin()[:, None]
    pairwise = torch.stack([even * c - odd * s, even * s + odd * c], -1).reshape(positions, heads, d)
    torch.testing.assert_close(pairwise, reorder(half_split))


def test_llama_export_has_llama_cpp_names_hparams_and_a_padded_vocabulary(llama_dir, tmp_path):
    out = export_gguf(llama_dir, tmp_path / "m.gguf", "f32").path
    fields, tensors = read(out)
    cfg = ModelConfig.from_dir(llama_dir)

    assert fields["general.architecture"] == "llama"
    assert fields["llama.block_count"] == cfg.num_hidden_layers
    assert fields["llama.embedding_length"] == cfg.hidden_size
    assert fields["llama.feed_forward_length"] == cfg.intermediate_size
    assert fields["llama.attention.head_count"] == cfg.num_attention_heads
    assert fields["llama.attention.head_count_kv"] == cfg.num_key_value_heads
    assert fields["llama.rope.freq_base"] == cfg.rope_theta

    tok = json.loads((llama_dir / "tokenizer.json").read_text())
    assert fields["tokenizer.ggml.model"] == "gpt2"
    assert len(fields["tokenizer.ggml.tokens"]) == cfg.vocab_size > len(tok["model"]["vocab"])
    assert fields["tokenizer.ggml.tokens"][-1] == f"[PAD{cfg.vocab_size - 1}]"
    types = fields["tokenizer.ggml.token_type"]
    special = {t["id"] for t in tok["added_tokens"]}
    assert {types[i] for i in special} == {gguf.TokenType.CONTROL}
    assert types[-1] == gguf.TokenType.UNUSED
    assert len(fields["tokenizer.ggml.merges"]) == len(tok["model"]["merges"])
    assert fields["tokenizer.chat_template"].startswith("{% for m in messages %}")

    per_layer = {"attn_norm", "attn_q", "attn_k", "attn_v", "attn_output", "ffn_norm", "ffn_gate", "ffn_up", "ffn_down"}
    expected = {"token_embd.weight", "output_norm.weight", "output.weight", "rope_freqs.weight"}
    expected |= {f"blk.{i}.{n}.weight" for i in range(cfg.num_hidden_layers) for n in per_layer}
    assert set(tensors) == expected

    q = hf_tensor(llama_dir, "model.layers.1.self_attn.q_proj.weight")
    k = hf_tensor(llama_dir, "model.layers.1.self_attn.k_proj.weight")
    v = hf_tensor(llama_dir, "model.layers.1.self_attn.v_proj.weight")
    assert torch.equal(torch.from_numpy(tensors["blk.1.attn_q.weight"].data.copy()), pairwise_rope_rows(q, cfg.num_attention_heads))
    assert torch.equal(torch.from_numpy(tensors["blk.1.attn_k.weight"].data.copy()), pairwise_rope_rows(k, cfg.num_key_value_heads))
    assert torch.equal(torch.from_numpy(tensors["blk.1.attn_v.weight"].data.copy()), v)

    # rope_freqs divides each angle: base frequencies over the engine's Llama-3-scaled ones.
    ratio = inverse_frequencies(cfg.head_dim, cfg.rope_theta, None) / inverse_frequencies(cfg.head_dim, cfg.rope_theta, cfg.rope_scaling)
    torch.testing.assert_close(torch.from_numpy(tensors["rope_freqs.weight"].data.copy()), ratio.float())
    torch.testing.assert_close(torch.from_numpy(llama3_rope_factors(cfg)), ratio.float())


def test_bf16_export_stores_the_rounded_weights_and_keeps_norms_f32(tmp_path):
    model = write_hf_checkpoint(tmp_path / "qwen3", "qwen3")
    add_byte_level_tokenizer(model)
    fields, tensors = read(export_gguf(model, tmp_path / "m.gguf", "bf16").path)
    assert fields["general.architecture"] == "qwen3"
    assert fields["general.file_type"] == gguf.LlamaFileType.MOSTLY_BF16
    assert "output.weight" not in tensors  # tied: llama.cpp reuses token_embd
    gate = tensors["blk.0.ffn_gate.weight"]
    assert gate.tensor_type == gguf.GGMLQuantizationType.BF16
    bits = torch.from_numpy(gate.data.copy().view("uint16").astype("int32")).to(torch.int16).view(torch.bfloat16)
    source = hf_tensor(model, "model.layers.0.mlp.gate_proj.weight")
    assert torch.equal(bits.reshape(source.shape), source.to(torch.bfloat16))  # qwen rows are not reordered
    assert tensors["blk.0.attn_q_norm.weight"].tensor_type == gguf.GGMLQuantizationType.F32


def test_export_refuses_what_llama_cpp_would_compute_differently(tmp_path):
    mistral = write_hf_checkpoint(tmp_path / "mistral", "mistral")  # sliding_window=24
    add_byte_level_tokenizer(mistral)
    with pytest.raises(CheckpointError, match="sliding_window=24"):
        export_gguf(mistral, tmp_path / "m.gguf")
    assert not (tmp_path / "m.gguf").exists()


def test_export_refuses_a_tokenizer_that_is_not_byte_level_bpe(tmp_path):
    from tokenizers import Tokenizer, models

    model = write_hf_checkpoint(tmp_path / "qwen2", "qwen2")
    Tokenizer(models.WordLevel({"a": 0, "[UNK]": 1}, unk_token="[UNK]")).save(str(model / "tokenizer.json"))
    with pytest.raises(CheckpointError, match="byte-level BPE"):
        export_gguf(model, tmp_path / "m.gguf")
