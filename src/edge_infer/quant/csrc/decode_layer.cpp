// One decoder layer of a decode step (one new token per sequence) in a single call.
//
// At one token per step a layer's four W4A8 products take ~40% of its time;
// the rest went to ~150 small PyTorch operators (norms, RoPE, cache writes,
// attention, residual adds), each paying Python and dispatcher overhead. Here
// the same arithmetic runs as plain loops around the W4A8 products, with the
// results rounded to bf16 where models/llama.py's DecoderLayer rounds them
// (an fp32 model rounds nowhere).
//
// Supported: bf16 or fp32 activations and KV cache, W4A8, W8A8 or W4A16 weights (all four
// linears alike), fused q/k/v (optional bias) and gate/up, optional per-head
// q/k RMSNorm, half-split RoPE from precomputed tables, full causal attention
// over the paged cache (no sliding window). The products and the attention
// loops run on the ISA variant the caller names (isa.h); every variant gives
// the same bits, so the layer does too. T is the activation type: at::BFloat16 or float.
#include "linear.h"

#include <ATen/Parallel.h>
#include <torch/library.h>

#include <algorithm>
#include <cmath>
#include <type_traits>
#include <vector>

namespace edge_infer {
namespace {

using bf16 = at::BFloat16;

// v as the activation type holds it (bf16 rounds; fp32 is v itself).
template <typename T>
inline float rounded(float v) { return static_cast<float>(static_cast<T>(v)); }

// isa.h's rms_norm for each activation type (out may be x).
void rms_norm(const IsaKernels& isa, const bf16* x, const bf16* weight, int64_t n, float eps, bf16* out) {
  isa.rms_norm_bf16(reinterpret_cast<const uint16_t*>(x), reinterpret_cast<const uint16_t*>(weight), n, eps,
                    reinterpret_cast<uint16_t*>(out));
}
void rms_norm(const IsaKernels& isa, const float* x, const float* weight, int64_t n, float eps, float* out) {
  isa.rms_norm_f32(x, weight, n, eps, out);
}

// apply_rotary: x * cos (rounded) + roll(x, d / 2) * signed_sin, in place over ``heads`` heads.
template <typename T>
void rotate(T* x, int64_t heads, int64_t d, const T* cos, const T* sin) {
  std::vector<float> out(d);
  for (int64_t h = 0; h < heads; ++h, x += d) {
    for (int64_t i = 0; i < d; ++i)
      out[i] = rounded<T>(static_cast<float>(x[i]) * static_cast<float>(cos[i])) +
               static_cast<float>(x[(i + d / 2) % d]) * static_cast<float>(sin[i]);
    for (int64_t i = 0; i < d; ++i) x[i] = static_cast<T>(out[i]);
  }
}

void silu_mul(const IsaKernels& isa, const bf16* gate, const bf16* up, int64_t n, bf16* out) {
  isa.silu_mul_bf16(reinterpret_cast<const uint16_t*>(gate), reinterpret_cast<const uint16_t*>(up), n,
                    reinterpret_cast<uint16_t*>(out));
}
void silu_mul(const IsaKernels& isa, const float* gate, const float* up, int64_t n, float* out) {
  isa.silu_mul_f32(gate, up, n, out);
}

template <typename T>
struct Cache {
  const T* k;
  const T* v;
  int64_t block_size, kv_heads, d;
  // The first of one head's rows in one block; the next is ``stride()`` values on.
  const T* row(const T* base, int64_t block, int64_t head) const {
    return base + (block * block_size * kv_heads + head) * d;
  }
  int64_t stride() const { return kv_heads * d; }
};

// Cache bytes asked for ahead of a layer's attention: what fits a core's L2 beside the products' streams.
constexpr int64_t kContextPrefetchBytes = 512 << 10;

// Asks for the cached keys and values this step's attention will read, before the q/k/v product: they
// arrive from memory while the product streams its weights, where after it each head waited for its rows
// (the layer's weights have evicted them since the last step). Attention over 1,000 cached tokens of the
// 0.5B shape took 109 us a layer, 73 with this; the 24 layers 3.6% less (Zen 4, 2 threads, A/B in one run).
template <typename T>
void prefetch_context(const Cache<T>& c, const int64_t* table, const int64_t* ctx, int64_t m, int64_t max_blocks) {
  int64_t budget = kContextPrefetchBytes;
  for (int64_t i = 0; i < m; ++i)
    for (int64_t j0 = 0; j0 < ctx[i] && budget > 0; j0 += c.block_size) {
      // One block's rows of every head are contiguous, keys and values alike.
      const int64_t bytes = std::min(c.block_size, ctx[i] - j0) * c.stride() * static_cast<int64_t>(sizeof(T));
      const int64_t block = table[i * max_blocks + j0 / c.block_size];
      const char* k = reinterpret_cast<const char*>(c.row(c.k, block, 0));
      const char* v = reinterpret_cast<const char*>(c.row(c.v, block, 0));
      for (int64_t b = 0; b < bytes; b += 64) {
        __builtin_prefetch(k + b, 0, 2);
        __builtin_prefetch(v + b, 0, 2);
      }
      budget -= 2 * bytes;
    }
}

// One cache block's ``count`` rows of a key/value head as fp32 for the isa.h loops: a fp32 cache's rows where
// they are; a bf16 cache's widened into ``scratch`` (exactly, so the products are those of the bf16 values).
struct Rows {
  const float* first;
  int64_t stride;
};
inline Rows fp32_rows(const IsaKernels&, const float* row, int64_t stride, int64_t count, int64_t, float*) {
  return {row, stride};
}
inline Rows fp32_rows(const IsaKernels& isa, const bf16* row, int64_t stride, int64_t count, int64_t d, float* scratch) {
  isa.widen_bf16(reinterpret_cast<const uint16_t*>(row), stride, count, d, scratch);
  return {scratch, d};
}

// Query heads 0 .. ``n_heads`` - 1 at ``q`` (d values apart), all reading key/value head ``kv_head``, over the
// ``ctx`` keys of their sequence's blocks: scores, softmax and weighted sum in fp32 per head (PyTorch's flash
// kernel rounds the probabilities to bf16 first and has its own exp: the two differ in the last bits). Each
// block's rows are read (and a bf16 cache's widened) once for all of them, not once per head: with 1,000
// keys cached, the 0.5B shape's 24 layers (7 heads a group) took 6% less time (11% on the AVX2 variant, 4% with
// a fp32 cache) than with each head on its own (Zen 4, 2 threads, A/B in one run).
template <typename T>
void attend_group(const IsaKernels& isa, const T* q, int64_t n_heads, const Cache<T>& c, const int64_t* blocks,
                  int64_t ctx, int64_t kv_head, float scale, T* out) {
  const int64_t d = c.d;
  std::vector<float> queries(n_heads * d), p(n_heads * ctx), acc(n_heads * d, 0.f);
  std::vector<float> scratch(std::is_same_v<T, float> ? 0 : c.block_size * d);
  for (int64_t i = 0; i < n_heads * d; ++i) queries[i] = static_cast<float>(q[i]);
  for (int64_t j0 = 0; j0 < ctx; j0 += c.block_size) {  // one cache block's keys at a time
    const int64_t count = std::min(c.block_size, ctx - j0);
    const Rows k = fp32_rows(isa, c.row(c.k, blocks[j0 / c.block_size], kv_head), c.stride(), count, d, scratch.data());
    for (int64_t h = 0; h < n_heads; ++h) isa.dot_f32(queries.data() + h * d, k.first, k.stride, count, d, p.data() + h * ctx + j0);
  }
  for (int64_t h = 0; h < n_heads; ++h) isa.softmax_f32(p.data() + h * ctx, ctx, scale);
  for (int64_t j0 = 0; j0 < ctx; j0 += c.block_size) {
    const int64_t count = std::min(c.block_size, ctx - j0);
    const Rows v = fp32_rows(isa, c.row(c.v, blocks[j0 / c.block_size], kv_head), c.stride(), count, d, scratch.data());
    for (int64_t h = 0; h < n_heads; ++h) isa.axpy_f32(p.data() + h * ctx + j0, v.first, v.stride, count, d, acc.data() + h * d);
  }
  for (int64_t i = 0; i < n_heads * d; ++i) out[i] = static_cast<T>(acc[i]);
}

// out[m, n] = in[m, :] W^T; ``in`` has the weight's padded width (zero beyond the real columns).
template <typename T>
void matmul(const IsaKernels& isa, const std::vector<T>& in, int64_t m, const PackedWeight& w, std::vector<T>& out) {
  out.resize(m * w.n);
  tile_matmul(isa, w, in.data(), m, out.data());
}

inline int64_t padded(int64_t n, int64_t group) { return (n + group - 1) / group * group; }

void check_vector(const char* name, const at::Tensor& t, int64_t n, at::ScalarType dtype) {
  TORCH_CHECK(t.scalar_type() == dtype && t.is_contiguous() && t.numel() == n,
              "decode_layer: ", name, " must be ", n, " contiguous ", dtype, " values (the activations' dtype)");
}

// Every slot written and every block read lies inside the cache (an index_copy_ would raise; this writes raw).
void check_cache_indices(const int64_t* slot, const int64_t* table, const int64_t* ctx, int64_t m, int64_t max_blocks,
                         int64_t num_blocks, int64_t block_size) {
  for (int64_t i = 0; i < m; ++i) {
    TORCH_CHECK(slot[i] >= 0 && slot[i] < num_blocks * block_size, "decode_layer: slot ", slot[i], " outside the cache");
    TORCH_CHECK(ctx[i] >= 1 && ctx[i] <= max_blocks * block_size, "decode_layer: context ", ctx[i], " does not fit its block table");
    for (int64_t j = 0; j < (ctx[i] + block_size - 1) / block_size; ++j)
      TORCH_CHECK(table[i * max_blocks + j] >= 0 && table[i * max_blocks + j] < num_blocks,
                  "decode_layer: block ", table[i * max_blocks + j], " outside the cache");
  }
}

at::Tensor decode_layer(const at::Tensor& x, const at::Tensor& cos, const at::Tensor& sin, const at::Tensor& k_cache,
                        const at::Tensor& v_cache, const at::Tensor& slots, const at::Tensor& block_table,
                        const at::Tensor& ctx_lens, const at::Tensor& input_norm, const at::Tensor& post_norm,
                        const c10::optional<at::Tensor>& q_norm, const c10::optional<at::Tensor>& k_norm,
                        const at::Tensor& qkv_packed, const at::Tensor& qkv_sz, const c10::optional<at::Tensor>& qkv_bias,
                        const at::Tensor& o_packed, const at::Tensor& o_sz, const at::Tensor& gate_up_packed,
                        const at::Tensor& gate_up_sz, const at::Tensor& down_packed, const at::Tensor& down_sz,
                        int64_t bits, int64_t group, int64_t heads, int64_t kv_heads, int64_t intermediate, double eps_d,
                        double scale_d, const std::string& isa_name, bool w4a16) {
  TORCH_CHECK(x.scalar_type() == at::kBFloat16 || x.scalar_type() == at::kFloat,
              "decode_layer: activations must be bf16 or fp32, got ", x.scalar_type());
  const at::ScalarType dtype = x.scalar_type();
  TORCH_CHECK(x.dim() == 2 && x.is_contiguous(), "decode_layer: x must be a contiguous [M, hidden] tensor");
  TORCH_CHECK(k_cache.scalar_type() == dtype && v_cache.scalar_type() == dtype && k_cache.dim() == 4 &&
                  k_cache.is_contiguous() && v_cache.is_contiguous() && k_cache.size(2) == kv_heads &&
                  k_cache.size(3) % 16 == 0,
              "decode_layer: caches must be ", dtype, " (the activations' dtype) [blocks, block_size, kv_heads, head_dim], "
              "head_dim a multiple of 16");
  TORCH_CHECK(cos.scalar_type() == dtype && sin.scalar_type() == dtype && cos.is_contiguous() && sin.is_contiguous(),
              "decode_layer: RoPE tables must be contiguous ", dtype, " [M, 1, head_dim]");
  const int64_t m = x.size(0), hidden = x.size(1), d = k_cache.size(3);
  TORCH_CHECK(slots.scalar_type() == at::kLong && block_table.scalar_type() == at::kLong && ctx_lens.scalar_type() == at::kLong &&
                  slots.is_contiguous() && block_table.is_contiguous() && ctx_lens.is_contiguous() &&
                  slots.numel() == m && ctx_lens.numel() == m && block_table.dim() == 2 && block_table.size(0) == m,
              "decode_layer: slots, ctx_lens and block_table must be contiguous int64 with one row per sequence");
  TORCH_CHECK(heads % kv_heads == 0 && v_cache.sizes() == k_cache.sizes(), "decode_layer: head counts or caches do not match");
  TORCH_CHECK(q_norm.has_value() == k_norm.has_value(), "decode_layer: q_norm and k_norm come together");
  const int64_t q_size = heads * d, kv_size = kv_heads * d, qkv_n = q_size + 2 * kv_size;
  TORCH_CHECK(!w4a16 || bits == 4, "decode_layer: W4A16 takes 4-bit weights, not ", bits);
  PackedWeight qkv = check_packed("decode_layer qkv", bits, qkv_packed, qkv_sz, padded(hidden, group), group, qkv_n);
  PackedWeight o = check_packed("decode_layer o_proj", bits, o_packed, o_sz, padded(q_size, group), group, hidden);
  PackedWeight gate_up = check_packed("decode_layer gate_up", bits, gate_up_packed, gate_up_sz, padded(hidden, group),
                                      group, 2 * intermediate);
  PackedWeight down = check_packed("decode_layer down", bits, down_packed, down_sz, padded(intermediate, group), group,
                                   hidden);
  qkv.w4a16 = o.w4a16 = gate_up.w4a16 = down.w4a16 = w4a16;
  const IsaKernels& isa = isa_named(isa_name);
  check_vector("input_norm", input_norm, hidden, dtype);
  check_vector("post_norm", post_norm, hidden, dtype);
  if (q_norm.has_value()) {
    check_vector("q_norm", *q_norm, d, dtype);
    check_vector("k_norm", *k_norm, d, dtype);
  }
  if (qkv_bias.has_value()) check_vector("qkv_bias", *qkv_bias, qkv_n, dtype);
  const float eps = static_cast<float>(eps_d), scale = static_cast<float>(scale_d);
  const int64_t* slot = slots.data_ptr<int64_t>();
  const int64_t* table = block_table.data_ptr<int64_t>();
  const int64_t* ctx = ctx_lens.data_ptr<int64_t>();
  const int64_t max_blocks = block_table.size(1);
  check_cache_indices(slot, table, ctx, m, max_blocks, k_cache.size(0), k_cache.size(1));
  // The layer in the activations' type T, written once for both.
  const auto run = [&](auto type_tag) -> at::Tensor {
    using T = decltype(type_tag);
    const T* xp = x.data_ptr<T>();
    // Attention block: norm, q/k/v, per-head norms, RoPE, cache write, attention, output projection.
    T* kc = k_cache.data_ptr<T>();
    T* vc = v_cache.data_ptr<T>();
    const Cache<T> cache{kc, vc, k_cache.size(1), kv_heads, d};
    prefetch_context(cache, table, ctx, m, max_blocks);
    std::vector<T> h(m * qkv.k, T(0.f)), proj;
    for (int64_t i = 0; i < m; ++i)
      rms_norm(isa, xp + i * hidden, input_norm.data_ptr<T>(), hidden, eps, h.data() + i * qkv.k);
    matmul(isa, h, m, qkv, proj);
    for (int64_t i = 0; i < m; ++i) {
      T* row = proj.data() + i * qkv_n;
      if (qkv_bias.has_value()) {
        const T* b = qkv_bias->data_ptr<T>();
        for (int64_t j = 0; j < qkv_n; ++j) row[j] = static_cast<T>(static_cast<float>(row[j]) + static_cast<float>(b[j]));
      }
      if (q_norm.has_value()) {
        for (int64_t hd = 0; hd < heads; ++hd) rms_norm(isa, row + hd * d, q_norm->data_ptr<T>(), d, eps, row + hd * d);
        for (int64_t hd = 0; hd < kv_heads; ++hd)
          rms_norm(isa, row + q_size + hd * d, k_norm->data_ptr<T>(), d, eps, row + q_size + hd * d);
      }
      rotate(row, heads + kv_heads, d, cos.data_ptr<T>() + i * d, sin.data_ptr<T>() + i * d);
      std::copy(row + q_size, row + q_size + kv_size, kc + slot[i] * kv_size);
      std::copy(row + q_size + kv_size, row + qkv_n, vc + slot[i] * kv_size);
    }
    std::vector<T> attn(m * o.k, T(0.f));
    int64_t keys = 0;
    for (int64_t i = 0; i < m; ++i) keys += ctx[i];
    // Each thread takes an equal run of the (sequence, query head) pairs and goes through it a key/value head's
    // group of query heads at a time: a group's heads share one reading of the cache, and a group is split
    // between threads only where their runs meet.
    const int64_t group = heads / kv_heads;
    // The shortest contexts (the code predictor's first steps) are not worth waking the other threads for;
    // the 0.5B shape shares them out from 19 keys on (at 16, two threads already took 10% less time than one).
    const int64_t grain = keys * heads * d < (1 << 14) ? m * heads : 1;
    at::parallel_for(0, m * heads, grain, [&](int64_t begin, int64_t end) {
      for (int64_t w = begin; w < end;) {
        const int64_t i = w / heads, hd = w % heads, kv = hd / group;
        const int64_t last = std::min(end, i * heads + (kv + 1) * group);  // this group's heads in the run
        attend_group(isa, proj.data() + i * qkv_n + hd * d, last - w, cache, table + i * max_blocks, ctx[i], kv, scale,
                     attn.data() + i * o.k + hd * d);
        w = last;
      }
    });
    matmul(isa, attn, m, o, proj);
    at::Tensor out = at::empty_like(x);
    T* y = out.data_ptr<T>();
    for (int64_t j = 0; j < m * hidden; ++j) y[j] = static_cast<T>(static_cast<float>(xp[j]) + static_cast<float>(proj[j]));

    // MLP block: norm, gate/up, silu(gate) * up, down, residual.
    std::vector<T> h2(m * gate_up.k, T(0.f));
    for (int64_t i = 0; i < m; ++i)
      rms_norm(isa, y + i * hidden, post_norm.data_ptr<T>(), hidden, eps, h2.data() + i * gate_up.k);
    matmul(isa, h2, m, gate_up, proj);
    std::vector<T> act(m * down.k, T(0.f));
    for (int64_t i = 0; i < m; ++i) {
      const T* gate = proj.data() + i * 2 * intermediate;
      silu_mul(isa, gate, gate + intermediate, intermediate, act.data() + i * down.k);
    }
    matmul(isa, act, m, down, proj);
    for (int64_t j = 0; j < m * hidden; ++j) y[j] = static_cast<T>(static_cast<float>(y[j]) + static_cast<float>(proj[j]));
    return out;
  };
  return x.scalar_type() == at::kFloat ? run(float{}) : run(bf16{});
}

}  // namespace
}  // namespace edge_infer

TORCH_LIBRARY_FRAGMENT(edge_infer, lib) {
  lib.def(
      "decode_layer(Tensor x, Tensor cos, Tensor sin, Tensor(a!) k_cache, Tensor(b!) v_cache, Tensor slots, "
      "Tensor block_table, Tensor ctx_lens, Tensor input_norm, Tensor post_norm, Tensor? q_norm, Tensor? k_norm, "
      "Tensor qkv_packed, Tensor qkv_sz, Tensor? qkv_bias, Tensor o_packed, Tensor o_sz, Tensor gate_up_packed, "
      "Tensor gate_up_sz, Tensor down_packed, Tensor down_sz, int bits, int group, int heads, int kv_heads, "
      "int intermediate, float eps, float scale, str isa, bool w4a16=False) -> Tensor");
}

TORCH_LIBRARY_IMPL(edge_infer, CPU, lib) { lib.impl("decode_layer", &edge_infer::decode_layer); }
