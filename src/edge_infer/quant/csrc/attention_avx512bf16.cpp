// attention.h on AVX512-BF16. vdpbf16ps multiplies 16 lanes of bf16 pairs and adds both products to fp32
// lanes, so both products are laid out with the reduction running along the pairs:
//   scores  = q . k: keys packed per head as [head_dim / 2][keys] pairs (k[t][2j], k[t][2j+1]), one lane per
//             key, against a query pair broadcast to every lane;
//   output  = weights . v: values packed as [keys / 2][head_dim] pairs (v[2j][c], v[2j+1][c]), one lane per
//             column, against a pair of weights broadcast.
// Four query rows share each loaded key or value vector (16 accumulators). Packing costs one pass over
// the keys and values per call, against head_dim multiply-adds per score in each product.
#include <immintrin.h>

#include "attention.h"

namespace edge_infer {
namespace {

constexpr int kRows = 4;  // query rows per register tile

inline int64_t round_up(int64_t n, int64_t m) { return (n + m - 1) / m * m; }

inline __m512 bf16_pairs(const void* p) {  // one 32-bit pair broadcast to every lane
  uint32_t v;
  __builtin_memcpy(&v, p, sizeof v);
  return _mm512_castsi512_ps(_mm512_set1_epi32(static_cast<int>(v)));
}

inline __m512 dot_pairs(__m512 acc, __m512 a, __m512 b) {
  return _mm512_dpbf16_ps(acc, reinterpret_cast<__m512bh&>(a), reinterpret_cast<__m512bh&>(b));
}

// e^x for x <= 0 (scores minus their maximum): 2^n e^r with |r| <= ln2 / 2, a degree-6 polynomial for e^r
// (relative error ~2e-7). Clamped below at -100 (e^-100 underflows to 0 through scalef); NaN stays NaN
// (vmaxps returns its second operand when either is NaN).
inline __m512 exp_nonpositive(__m512 x) {
  x = _mm512_max_ps(_mm512_set1_ps(-100.f), x);
  const __m512 n = _mm512_roundscale_ps(_mm512_mul_ps(x, _mm512_set1_ps(1.44269504f)), _MM_FROUND_TO_NEAREST_INT);
  __m512 r = _mm512_fnmadd_ps(n, _mm512_set1_ps(0.693145752f), x);
  r = _mm512_fnmadd_ps(n, _mm512_set1_ps(1.42860677e-6f), r);
  __m512 p = _mm512_set1_ps(1.f / 720);
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.f / 120));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.f / 24));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.f / 6));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(0.5f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.f));
  return _mm512_scalef_ps(p, n);
}

// Keys [0, n) of one head -> [head_dim / 2][n16] pairs; keys n .. n16 zero.
void pack_keys(const uint16_t* k, int64_t stride, int64_t n, int64_t n16, int64_t d, uint32_t* out) {
  for (int64_t t = 0; t < n; ++t) {
    const uint16_t* row = k + t * stride;
    for (int64_t j = 0; j < d / 2; ++j) __builtin_memcpy(out + j * n16 + t, row + 2 * j, 4);
  }
  for (int64_t j = 0; j < d / 2; ++j)
    for (int64_t t = n; t < n16; ++t) out[j * n16 + t] = 0;
}

// Values [0, n) of one head -> [ceil(n / 2)][head_dim] pairs; an odd last key paired with zeros.
inline __m512 value_pairs(const uint16_t* a, const uint16_t* b) {  // b null: zeros
  const __m512i lo = _mm512_cvtepu16_epi32(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(a)));
  const __m512i hi = b ? _mm512_cvtepu16_epi32(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(b))) : _mm512_setzero_si512();
  return _mm512_castsi512_ps(_mm512_or_si512(lo, _mm512_slli_epi32(hi, 16)));
}

void pack_values(const uint16_t* v, int64_t stride, int64_t n, int64_t d, uint32_t* out) {
  for (int64_t t = 0; t < n; t += 2, out += d) {
    const uint16_t* a = v + t * stride;
    for (int64_t c = 0; c < d; c += 16)
      _mm512_storeu_ps(reinterpret_cast<float*>(out + c), value_pairs(a + c, t + 1 < n ? a + stride + c : nullptr));
  }
}

// Where the product loops read key pair j of keys 16 v .. 16 v + 15 and value pair j of columns c .. c + 15:
// from the packed copies, or straight from the rows (a gather; for a few query rows, which would not
// repay packing). Both give the same vectors, so a row's result does not depend on which one ran.
struct PackedOperands {
  const uint32_t* keys;
  const uint32_t* values;
  int64_t n16, d;
  __m512 key(int64_t j, int64_t v) const { return _mm512_castsi512_ps(_mm512_loadu_si512(keys + j * n16 + 16 * v)); }
  __m512 value(int64_t j, int64_t c) const { return _mm512_loadu_ps(reinterpret_cast<const float*>(values + j * d + c)); }
};

struct RowOperands {
  const uint16_t* k;
  const uint16_t* v;
  int64_t k_stride, v_stride, n;
  __m512i offsets;  // bytes from key 16 v to keys 16 v + l
  __m512 key(int64_t j, int64_t vec) const {
    const int64_t left = n - 16 * vec;
    const __mmask16 m = left >= 16 ? 0xFFFF : static_cast<__mmask16>((1u << left) - 1);
    const uint16_t* base = k + 16 * vec * k_stride + 2 * j;
    return _mm512_castsi512_ps(_mm512_mask_i32gather_epi32(_mm512_setzero_si512(), m, offsets, base, 1));
  }
  __m512 value(int64_t j, int64_t c) const {
    const uint16_t* a = v + 2 * j * v_stride + c;
    return value_pairs(a, 2 * j + 1 < n ? a + v_stride : nullptr);
  }
};

// scores[r][t] = q_r . k_t for kR rows and keys 16 v0 .. 16 (v0 + kVecs) (row stride ``stride``).
template <int kR, int kVecs, class Operands>
void score_tile(const uint16_t* const* q, const Operands& ops, int64_t v0, int64_t d, float* scores, int64_t stride) {
  __m512 acc[kR][kVecs];
  for (int r = 0; r < kR; ++r)
    for (int u = 0; u < kVecs; ++u) acc[r][u] = _mm512_setzero_ps();
  for (int64_t j = 0; j < d / 2; ++j) {
    __m512 qj[kR];
    for (int r = 0; r < kR; ++r) qj[r] = bf16_pairs(q[r] + 2 * j);
    for (int u = 0; u < kVecs; ++u) {
      const __m512 kv = ops.key(j, v0 + u);
      for (int r = 0; r < kR; ++r) acc[r][u] = dot_pairs(acc[r][u], qj[r], kv);
    }
  }
  for (int r = 0; r < kR; ++r)
    for (int u = 0; u < kVecs; ++u) _mm512_storeu_ps(scores + r * stride + (v0 + u) * 16, acc[r][u]);
}

// One row: scores [0, visible) scaled -> e^(s - max) as bf16 weights, zero up to ``width`` (a multiple
// of 16); returns the fp32 sum of the (unrounded) weights. Zeros past ``visible`` change no sum.
float softmax_row(float* s, int64_t visible, int64_t width, float scale, uint16_t* weights) {
  const __m512 sc = _mm512_set1_ps(scale);
  __m512 top = _mm512_set1_ps(-__builtin_inff());
  for (int64_t t = 0; t < visible; t += 16) {
    const __mmask16 m = visible - t >= 16 ? 0xFFFF : static_cast<__mmask16>((1u << (visible - t)) - 1);
    const __m512 x = _mm512_mul_ps(_mm512_maskz_loadu_ps(m, s + t), sc);
    _mm512_storeu_ps(s + t, x);
    top = _mm512_mask_max_ps(top, m, x, top);  // NaN scores pass through to the exponential below
  }
  const __m512 mx = _mm512_set1_ps(_mm512_reduce_max_ps(top));
  __m512 total = _mm512_setzero_ps();
  for (int64_t t = 0; t < width; t += 16) {
    const __mmask16 m = t >= visible ? 0 : visible - t >= 16 ? 0xFFFF : static_cast<__mmask16>((1u << (visible - t)) - 1);
    const __m512 e = _mm512_maskz_mov_ps(m, exp_nonpositive(_mm512_sub_ps(_mm512_loadu_ps(s + t), mx)));
    total = _mm512_add_ps(total, e);
    const __m256bh w = _mm512_cvtneps_pbh(e);
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(weights + t), reinterpret_cast<const __m256i&>(w));
  }
  return _mm512_reduce_add_ps(total);
}

// out_r[c0 .. c0 + 16 kV) = (weights_r . v) / sum_r for kR rows over ``pairs`` key pairs.
template <int kR, int kV, class Operands>
void weigh_values(const uint16_t* weights, int64_t w_stride, const Operands& ops, int64_t pairs, int64_t c0,
                  const float* sums, uint16_t* const* out) {
  __m512 acc[kR][kV];
  for (int r = 0; r < kR; ++r)
    for (int u = 0; u < kV; ++u) acc[r][u] = _mm512_setzero_ps();
  for (int64_t j = 0; j < pairs; ++j) {
    __m512 wj[kR];
    for (int r = 0; r < kR; ++r) wj[r] = bf16_pairs(weights + r * w_stride + 2 * j);
    for (int u = 0; u < kV; ++u) {
      const __m512 vv = ops.value(j, c0 + 16 * u);
      for (int r = 0; r < kR; ++r) acc[r][u] = dot_pairs(acc[r][u], wj[r], vv);
    }
  }
  for (int r = 0; r < kR; ++r) {
    const __m512 sum = _mm512_set1_ps(sums[r]);
    for (int u = 0; u < kV; ++u) {
      const __m256bh y = _mm512_cvtneps_pbh(_mm512_div_ps(acc[r][u], sum));
      _mm256_storeu_si256(reinterpret_cast<__m256i*>(out[r] + c0 + 16 * u), reinterpret_cast<const __m256i&>(y));
    }
  }
}

// kR query rows (their queries, outputs and how many keys each sees) through scores, softmax and values.
// Four key vectors per score tile where four rows leave the registers for them, one for more rows.
template <int kR, class Operands>
void attend_block(const uint16_t* const* q, uint16_t* const* out, const int64_t* visible, const Operands& ops,
                  int64_t d, float scale, const AttentionScratch& s, int64_t stride) {
  int64_t widest = 0;
  for (int r = 0; r < kR; ++r) widest = visible[r] > widest ? visible[r] : widest;
  const int64_t vectors = round_up(widest, 16) / 16;
  constexpr int kVecs = kR <= 4 ? 4 : 1;
  int64_t v = 0;
  for (; v + kVecs <= vectors; v += kVecs) score_tile<kR, kVecs>(q, ops, v, d, s.scores, stride);
  for (; v < vectors; ++v) score_tile<kR, 1>(q, ops, v, d, s.scores, stride);
  float sums[kR];
  for (int r = 0; r < kR; ++r) sums[r] = softmax_row(s.scores + r * stride, visible[r], 16 * vectors, scale, s.weights + r * stride);
  const int64_t pairs = (widest + 1) / 2;
  constexpr int kV = kR <= 4 ? 4 : 2;
  int64_t c = 0;
  for (; c + 16 * kV <= d; c += 16 * kV) weigh_values<kR, kV>(s.weights, stride, ops, pairs, c, sums, out);
  for (; c < d; c += 16) weigh_values<kR, 1>(s.weights, stride, ops, pairs, c, sums, out);
}

// Rows [first, first + kR) of the flat list ``row -> (head_begin + row / q_len, query row % q_len)``.
template <int kR, class Operands>
void attend_rows(const AttentionProblem& p, int64_t q_begin, int64_t q_len, int64_t k_len, int64_t head_begin,
                 int64_t first, const Operands& ops, const AttentionScratch& s) {
  const uint16_t* q[kR];
  uint16_t* out[kR];
  int64_t visible[kR];
  for (int r = 0; r < kR; ++r) {
    const int64_t h = head_begin + (first + r) / q_len, i = (first + r) % q_len;
    q[r] = p.q + (q_begin + i) * p.q_token + h * p.q_head;
    out[r] = p.out + (q_begin + i) * p.out_token + h * p.out_head;
    visible[r] = p.causal ? k_len - q_len + i + 1 : k_len;
  }
  attend_block<kR>(q, out, visible, ops, p.head_dim, p.scale, s, round_up(k_len, 16));
}

// Up to kAttentionRows rows in one block (their count chosen at run time).
template <class Operands>
void attend_few(const AttentionProblem& p, int64_t q_begin, int64_t q_len, int64_t k_len, int64_t head_begin,
                int64_t rows, const Operands& ops, const AttentionScratch& s) {
  switch (rows) {
    case 8: return attend_rows<8>(p, q_begin, q_len, k_len, head_begin, 0, ops, s);
    case 7: return attend_rows<7>(p, q_begin, q_len, k_len, head_begin, 0, ops, s);
    case 6: return attend_rows<6>(p, q_begin, q_len, k_len, head_begin, 0, ops, s);
    case 5: return attend_rows<5>(p, q_begin, q_len, k_len, head_begin, 0, ops, s);
    case 4: return attend_rows<4>(p, q_begin, q_len, k_len, head_begin, 0, ops, s);
    case 3: return attend_rows<3>(p, q_begin, q_len, k_len, head_begin, 0, ops, s);
    case 2: return attend_rows<2>(p, q_begin, q_len, k_len, head_begin, 0, ops, s);
    default: return attend_rows<1>(p, q_begin, q_len, k_len, head_begin, 0, ops, s);
  }
}

}  // namespace

void attend_avx512bf16(const AttentionProblem& p, int64_t q_begin, int64_t q_len, int64_t k_begin, int64_t k_len,
                       int64_t kv_head, int64_t head_begin, int64_t head_end, const AttentionScratch& scratch) {
  const int64_t d = p.head_dim, rows = (head_end - head_begin) * q_len;
  const uint16_t* k = p.k + k_begin * p.k_token + kv_head * p.k_head;
  const uint16_t* v = p.v + k_begin * p.v_token + kv_head * p.v_head;
  if (rows <= kAttentionRows) {  // a decode step's heads, say: gather the keys rather than pack them
    const __m512i offsets = _mm512_mullo_epi32(_mm512_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15),
                                               _mm512_set1_epi32(static_cast<int>(2 * p.k_token)));
    return attend_few(p, q_begin, q_len, k_len, head_begin, rows, RowOperands{k, v, p.k_token, p.v_token, k_len, offsets},
                      scratch);
  }
  const int64_t n16 = round_up(k_len, 16);
  pack_keys(k, p.k_token, k_len, n16, d, scratch.packed_keys);
  pack_values(v, p.v_token, k_len, d, scratch.packed_values);
  const PackedOperands ops{scratch.packed_keys, scratch.packed_values, n16, d};
  // Each head's rows in blocks of four (rows of one block never span two heads: their keys are the same
  // either way, but the causal counts then rise within a block, as attend_block's widest assumes nothing).
  for (int64_t h = 0; h < head_end - head_begin; ++h) {
    int64_t i = 0;
    for (; i + 4 <= q_len; i += 4) attend_rows<4>(p, q_begin, q_len, k_len, head_begin, h * q_len + i, ops, scratch);
    for (; i < q_len; ++i) attend_rows<1>(p, q_begin, q_len, k_len, head_begin, h * q_len + i, ops, scratch);
  }
}

}  // namespace edge_infer
