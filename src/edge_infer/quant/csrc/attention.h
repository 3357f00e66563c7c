// Attention over bf16 queries, keys and values on AVX512-BF16 (attention_avx512bf16.cpp): the media
// encoders' windows and frames, and a prompt's prefill against its cached keys.
//
// Plain C++ like isa.h: the kernel is compiled on its own with -mavx512bf16 and linked into the PyTorch
// binding (attention.cpp) when the compiler has the instruction set.
//
// For one segment (q_len query rows against k_len key rows) and one query head: scores q . k in fp32
// (vdpbf16ps: bf16 pairs multiplied exactly, summed in fp32), times ``scale``; causal: query row i sees
// keys 0 .. k_len - q_len + i (a chunk of a prompt whose earlier tokens are cached); softmax in fp32
// (the largest score taken off before the exponential); the weights rounded to bf16 for the product with
// the values, as PyTorch's flash attention does for bf16; the weighted sum divided by the fp32 sum of
// the weights, rounded to bf16. Each row's result depends only on its own row and keys: never on how
// rows are grouped into segments, chunks or threads.
#pragma once

#include <cstdint>

namespace edge_infer {

// Tensors as [tokens, heads, head_dim] with head_dim contiguous; strides in elements.
struct AttentionProblem {
  const uint16_t* q;
  const uint16_t* k;
  const uint16_t* v;
  uint16_t* out;
  int64_t q_token, q_head, k_token, k_head, v_token, v_head, out_token, out_head;
  int64_t head_dim;  // a multiple of 16
  bool causal;
  float scale;
};

// Query rows (of every head of a call) up to which a call reads keys and values in place; more are
// worth packing them first (then taken in blocks of 4). Either way a row gets the same bits.
constexpr int64_t kAttentionRows = 8;

// Per-thread working memory for key rows up to ``keys`` (rounded up to 16: ``padded``).
struct AttentionScratch {
  uint32_t* packed_keys;    // [head_dim / 2, padded]
  uint32_t* packed_values;  // [padded / 2, head_dim]
  float* scores;            // [kAttentionRows, padded]
  uint16_t* weights;        // [kAttentionRows, padded]
};

// 32-bit words of scratch one thread needs for ``keys`` key rows of ``head_dim``.
inline int64_t attention_scratch_words(int64_t keys, int64_t head_dim) {
  const int64_t padded = (keys + 15) / 16 * 16;
  return head_dim / 2 * padded + padded / 2 * head_dim + kAttentionRows * padded + kAttentionRows / 2 * padded;
}

// Query heads [head_begin, head_end) of rows q_begin .. q_begin + q_len, all reading key/value head
// ``kv_head`` at rows k_begin .. k_begin + k_len.
void attend_avx512bf16(const AttentionProblem& p, int64_t q_begin, int64_t q_len, int64_t k_begin, int64_t k_len,
                       int64_t kv_head, int64_t head_begin, int64_t head_end, const AttentionScratch& scratch);

}  // namespace edge_infer
