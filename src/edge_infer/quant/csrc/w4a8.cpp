// int4 weights x int8 activations (W4A8) linear for AVX512-VNNI CPUs.
//
// PyTorch's CPU int4 kernel dequantizes every weight to float before it
// multiplies, which makes a single-token product compute-bound (about 19 G
// weights/s per core here, far under memory bandwidth). This kernel keeps the
// weights as 4-bit integers and multiplies them with int8-quantized
// activations through vpdpbusd (64 multiply-adds per instruction), so a
// matrix-vector product runs at the speed the packed bytes stream from memory.
//
// Layout (built by edge_infer/quant/w4a8.py):
//   packed  uint8 [Np/64, Kp/8, 64, 4]: for 64 output rows and 8 input columns
//           k..k+7, row r's 4 bytes hold codes (k+i) | (k+4+i) << 4, i = 0..3.
//   sz      bf16  [Np/64, Kp/G, 2, 64]: each group's scale row, then zero row.
// A code q stands for (q - 8) * scale + zero (the cpu_int4 convention).
//
// Activations are quantized per row and group of G columns: a = alpha * aq,
// aq int8 in -127..127. Then for one output row and one group
//   sum_k a_k w_k = alpha * scale * sum_k aq_k q_k + (zero - 8 scale) * alpha * sum_k aq_k,
// the first sum exact in int32 (|aq q| <= 127 * 15, G <= 256 terms).
#include "w4a8.h"

#include <ATen/Parallel.h>
#include <torch/library.h>

#include <algorithm>
#include <cstring>
#include <limits>
#include <vector>

namespace edge_infer {
namespace {

// One activation row's int8 codes, per-group scale, and per-group sum of dequantized values.
template <typename T>
void quantize_row(const T* x, int64_t k, int64_t group, int8_t* q, float* alpha, float* total) {
  for (int64_t g0 = 0; g0 < k; g0 += group) {
    __m512 amax = _mm512_setzero_ps();
    __mmask16 nan = 0;
    for (int64_t i = 0; i < group; i += 16) {
      const __m512 v = load16(x + g0 + i);
      amax = _mm512_max_ps(amax, _mm512_abs_ps(v));
      nan |= _mm512_cmp_ps_mask(v, v, _CMP_UNORD_Q);
    }
    // A NaN input makes the group's scale NaN, so every output it reaches is NaN (not a silent 0).
    const float a = nan ? std::numeric_limits<float>::quiet_NaN() : _mm512_reduce_max_ps(amax) / 127.f;
    const __m512 inv = _mm512_set1_ps(a >= std::numeric_limits<float>::min() ? 1.f / a : 0.f);
    __m512i sum = _mm512_setzero_si512();
    for (int64_t i = 0; i < group; i += 16) {
      // Rounds to nearest even (the default MXCSR mode); |values| <= 127 by construction.
      const __m512i v = _mm512_cvtps_epi32(_mm512_mul_ps(load16(x + g0 + i), inv));
      _mm_storeu_si128(reinterpret_cast<__m128i*>(q + g0 + i), _mm512_cvtepi32_epi8(v));
      sum = _mm512_add_epi32(sum, v);
    }
    alpha[g0 / group] = a;
    total[g0 / group] = a * static_cast<float>(_mm512_reduce_add_epi32(sum));
  }
}

// The outputs of one activation row from one row tile (``rows`` of its 64 are stored).
template <typename T>
void tile_row(const uint8_t* tile, const at::BFloat16* sz, const int8_t* q, const float* alpha,
              const float* total, int64_t k, int64_t group, int64_t rows, T* out) {
  const __m512i low = _mm512_set1_epi8(0x0F);
  __m512 acc[4] = {_mm512_setzero_ps(), _mm512_setzero_ps(), _mm512_setzero_ps(), _mm512_setzero_ps()};
  const int64_t groups = k / group;
  for (int64_t g = 0; g < groups; ++g) {
    __m512i dot[4] = {_mm512_setzero_si512(), _mm512_setzero_si512(), _mm512_setzero_si512(),
                      _mm512_setzero_si512()};
    const uint8_t* w = tile + g * group * (kTileRows / 2);
    const int8_t* a = q + g * group;
    for (int64_t s = 0; s < group; s += 8, w += 4 * kTileRows) {
      int32_t quad[2];  // activations k..k+3 and k+4..k+7, each broadcast to every row
      std::memcpy(quad, a + s, sizeof quad);
      const __m512i a_lo = _mm512_set1_epi32(quad[0]);
      const __m512i a_hi = _mm512_set1_epi32(quad[1]);
      for (int r = 0; r < 4; ++r) {
        const __m512i bytes = _mm512_loadu_si512(w + 64 * r);
        dot[r] = _mm512_dpbusd_epi32(dot[r], _mm512_and_si512(bytes, low), a_lo);
        dot[r] = _mm512_dpbusd_epi32(dot[r], _mm512_and_si512(_mm512_srli_epi16(bytes, 4), low), a_hi);
      }
    }
    const at::BFloat16* scale = sz + g * 2 * kTileRows;
    const __m512 al = _mm512_set1_ps(alpha[g]);
    const __m512 tot = _mm512_set1_ps(total[g]);
    const __m512 eight = _mm512_set1_ps(8.f);
    for (int r = 0; r < 4; ++r) {
      const __m512 s = load16(scale + 16 * r);
      const __m512 z = load16(scale + kTileRows + 16 * r);
      acc[r] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(dot[r]), _mm512_mul_ps(s, al), acc[r]);
      acc[r] = _mm512_fmadd_ps(_mm512_fnmadd_ps(eight, s, z), tot, acc[r]);
    }
  }
  if (rows == kTileRows) {
    for (int r = 0; r < 4; ++r) store(out + 16 * r, acc[r]);
    return;
  }
  alignas(64) float tail[kTileRows];
  for (int r = 0; r < 4; ++r) _mm512_store_ps(tail + 16 * r, acc[r]);
  for (int64_t i = 0; i < rows; ++i) out[i] = static_cast<T>(tail[i]);
}

}  // namespace

template <typename T>
void w4a8_matmul(const T* xp, int64_t m, int64_t k, const uint8_t* w, const at::BFloat16* s, int64_t group, int64_t n,
                 T* out) {
  const int64_t tiles = (n + kTileRows - 1) / kTileRows, ng = k / group;
  std::vector<int8_t> q(m * k);
  std::vector<float> alpha(m * ng), total(m * ng);
  for (int64_t i = 0; i < m; ++i)
    quantize_row(xp + i * k, k, group, q.data() + i * k, alpha.data() + i * ng, total.data() + i * ng);
  // Each thread takes whole row tiles and runs every activation row through a tile while it is in cache.
  at::parallel_for(0, tiles, 1, [&](int64_t begin, int64_t end) {
    for (int64_t t = begin; t < end; ++t) {
      const int64_t rows = std::min(kTileRows, n - t * kTileRows);
      for (int64_t i = 0; i < m; ++i)
        tile_row(w + t * kTileRows * (k / 2), s + t * ng * 2 * kTileRows, q.data() + i * k, alpha.data() + i * ng,
                 total.data() + i * ng, k, group, rows, out + i * n + t * kTileRows);
    }
  });
}

void check_packed(const char* what, const at::Tensor& packed, const at::Tensor& sz, int64_t k, int64_t group, int64_t n) {
  TORCH_CHECK(packed.dim() == 4 && packed.size(2) == kTileRows && packed.size(3) == 4 &&
                  packed.scalar_type() == at::kByte && packed.is_contiguous(),
              what, ": packed codes must be contiguous uint8 [Np/64, Kp/8, 64, 4]");
  TORCH_CHECK(group > 0 && group % 16 == 0, what, ": group size ", group, " is not a multiple of 16");
  TORCH_CHECK(packed.size(1) * 8 == k && k % group == 0,
              what, ": the input has ", k, " columns; the weight packs ", packed.size(1) * 8, " in groups of ", group);
  const int64_t tiles = packed.size(0);
  TORCH_CHECK(n > (tiles - 1) * kTileRows && n <= tiles * kTileRows,
              what, ": ", n, " outputs do not fit ", tiles, " row tiles");
  TORCH_CHECK(sz.scalar_type() == at::kBFloat16 && sz.is_contiguous() && sz.numel() == tiles * (k / group) * 2 * kTileRows,
              what, ": scales and zeros must be contiguous bf16 [Np/64, Kp/G, 2, 64]");
}

template void w4a8_matmul<float>(const float*, int64_t, int64_t, const uint8_t*, const at::BFloat16*, int64_t, int64_t,
                                 float*);
template void w4a8_matmul<at::BFloat16>(const at::BFloat16*, int64_t, int64_t, const uint8_t*, const at::BFloat16*,
                                        int64_t, int64_t, at::BFloat16*);

namespace {

// x [M, Kp] (bf16 or fp32) -> [M, out_features] in x's dtype.
at::Tensor w4a8_linear(const at::Tensor& x, const at::Tensor& packed, const at::Tensor& sz, int64_t group,
                       int64_t out_features) {
  TORCH_CHECK(x.dim() == 2 && x.is_contiguous(), "w4a8_linear: x must be a contiguous [M, K] tensor");
  const int64_t k = x.size(1);
  check_packed("w4a8_linear", packed, sz, k, group, out_features);
  at::Tensor y = at::empty({x.size(0), out_features}, x.options());
  const uint8_t* w = packed.data_ptr<uint8_t>();
  const at::BFloat16* s = sz.data_ptr<at::BFloat16>();
  if (x.scalar_type() == at::kBFloat16) {
    w4a8_matmul(x.data_ptr<at::BFloat16>(), x.size(0), k, w, s, group, out_features, y.data_ptr<at::BFloat16>());
  } else {
    TORCH_CHECK(x.scalar_type() == at::kFloat, "w4a8_linear: activations must be bf16 or fp32, got ", x.scalar_type());
    w4a8_matmul(x.data_ptr<float>(), x.size(0), k, w, s, group, out_features, y.data_ptr<float>());
  }
  return y;
}

}  // namespace

}  // namespace edge_infer

TORCH_LIBRARY_FRAGMENT(edge_infer, lib) {
  lib.def("w4a8_linear(Tensor x, Tensor packed, Tensor sz, int group, int out_features) -> Tensor");
}

TORCH_LIBRARY_IMPL(edge_infer, CPU, lib) { lib.impl("w4a8_linear", &edge_infer::w4a8_linear); }
