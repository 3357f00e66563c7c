// The PyTorch side of attention.h: block-diagonal (segments) and causal (a prompt chunk against its cache)
// attention over bf16 tensors, spread over PyTorch's threads by segment, key/value head and query heads.
//
// PyTorch's CPU flash attention reaches bf16 products through MKL, which runs its AVX2 fp32 code on
// non-Intel CPUs (~100 G multiply-adds/s on 2 Zen 5 cores, docs/multimodal.md); vdpbf16ps runs the same
// products natively, and causal rows skip the keys they cannot see (PyTorch's masked path computes them).
#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <torch/library.h>

#include <algorithm>

#include "attention.h"

namespace edge_infer {

// Weak: left out of the build when the compiler lacks AVX512-BF16 (quant/native_build.py).
void attend_avx512bf16(const AttentionProblem& p, int64_t q_begin, int64_t q_len, int64_t k_begin, int64_t k_len,
                       int64_t kv_head, int64_t head_begin, int64_t head_end, const AttentionScratch& scratch)
    __attribute__((weak));

namespace {

bool bf16_attention_built() { return &attend_avx512bf16 != nullptr; }

void check_operand(const char* name, const at::Tensor& t, int64_t d) {
  TORCH_CHECK(t.dim() == 3 && t.scalar_type() == at::kBFloat16 && t.stride(2) == 1 && t.size(2) == d,
              "segment_attention: ", name, " must be bf16 [tokens, heads, ", d, "] with contiguous head_dim");
}

// q [Tq, H, d], k and v [Tk, Hk, d] (H a multiple of Hk); segment s: query rows q_offsets[s] .. q_offsets[s+1]
// against key rows k_offsets[s] .. k_offsets[s+1]. Returns [Tq, H, d] bf16.
at::Tensor segment_attention(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, at::IntArrayRef q_offsets,
                             at::IntArrayRef k_offsets, bool causal, double scale) {
  TORCH_CHECK(bf16_attention_built(), "segment_attention: this library was built without AVX512-BF16");
  const int64_t d = q.size(-1);
  TORCH_CHECK(d % 16 == 0, "segment_attention: head_dim ", d, " is not a multiple of 16");
  check_operand("q", q, d);
  check_operand("k", k, d);
  check_operand("v", v, d);
  const int64_t heads = q.size(1), kv_heads = k.size(1);
  TORCH_CHECK(v.size(0) == k.size(0) && v.size(1) == kv_heads && heads % kv_heads == 0,
              "segment_attention: ", heads, " query heads over ", kv_heads, " key/value heads (v: ", v.size(1), ")");
  const int64_t segments = static_cast<int64_t>(q_offsets.size()) - 1;
  TORCH_CHECK(segments >= 1 && k_offsets.size() == q_offsets.size() && q_offsets.front() == 0 &&
                  q_offsets.back() == q.size(0) && k_offsets.back() <= k.size(0),
              "segment_attention: offsets must cover the query rows, one key range per segment");
  int64_t longest = 0;
  for (int64_t s = 0; s < segments; ++s) {
    const int64_t q_len = q_offsets[s + 1] - q_offsets[s], k_len = k_offsets[s + 1] - k_offsets[s];
    TORCH_CHECK(q_len >= 0 && k_len >= (causal ? q_len : 1) && k_offsets[s] >= 0,
                "segment_attention: segment ", s, " has ", q_len, " queries and ", k_len, " keys");
    longest = std::max(longest, k_len);
  }
  at::Tensor out = at::empty({q.size(0), heads, d}, q.options());
  const AttentionProblem problem{
      reinterpret_cast<const uint16_t*>(q.data_ptr<at::BFloat16>()),
      reinterpret_cast<const uint16_t*>(k.data_ptr<at::BFloat16>()),
      reinterpret_cast<const uint16_t*>(v.data_ptr<at::BFloat16>()),
      reinterpret_cast<uint16_t*>(out.data_ptr<at::BFloat16>()),
      q.stride(0), q.stride(1), k.stride(0), k.stride(1), v.stride(0), v.stride(1), out.stride(0), out.stride(1),
      d, causal, static_cast<float>(scale)};
  // Work items: (segment, key/value head, part of its query heads). A group's heads share one reading of
  // their keys and values; they are split only as far as needed to give every thread an item.
  const int64_t group = heads / kv_heads, threads = at::get_num_threads();
  const int64_t parts = std::min(group, std::max<int64_t>(1, (threads + segments * kv_heads - 1) / (segments * kv_heads)));
  const int64_t per_part = (group + parts - 1) / parts;
  const int64_t words = attention_scratch_words(longest, d);
  at::Tensor scratch = at::empty({threads, words}, at::kInt);
  at::parallel_for(0, segments * kv_heads * parts, 1, [&](int64_t begin, int64_t end) {
    uint32_t* mine = reinterpret_cast<uint32_t*>(scratch.data_ptr<int32_t>()) + at::get_thread_num() * words;
    for (int64_t item = begin; item < end; ++item) {
      const int64_t s = item / (kv_heads * parts), kv = item / parts % kv_heads, part = item % parts;
      const int64_t k_len = k_offsets[s + 1] - k_offsets[s], padded = (k_len + 15) / 16 * 16;
      uint32_t* const scores = mine + d / 2 * padded + padded / 2 * d;
      const AttentionScratch room{mine, mine + d / 2 * padded, reinterpret_cast<float*>(scores),
                                  reinterpret_cast<uint16_t*>(scores + kAttentionRows * padded)};
      const int64_t first = kv * group + part * per_part, last = std::min(kv * group + group, first + per_part);
      if (first < last && q_offsets[s + 1] > q_offsets[s])
        attend_avx512bf16(problem, q_offsets[s], q_offsets[s + 1] - q_offsets[s], k_offsets[s], k_len, kv, first, last, room);
    }
  });
  return out;
}

}  // namespace
}  // namespace edge_infer

TORCH_LIBRARY_FRAGMENT(edge_infer, lib) {
  lib.def("segment_attention(Tensor q, Tensor k, Tensor v, int[] q_offsets, int[] k_offsets, bool causal, float scale) -> Tensor");
  lib.def("segment_attention_built() -> bool", &edge_infer::bf16_attention_built);
}

TORCH_LIBRARY_IMPL(edge_infer, CPU, lib) { lib.impl("segment_attention", &edge_infer::segment_attention); }
