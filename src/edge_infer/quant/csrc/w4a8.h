// Shared by the W4A8 linear (w4a8.cpp) and the fused decode layer (decode_layer.cpp).
#pragma once

#include <ATen/ATen.h>
#include <immintrin.h>

#include <cstdint>

namespace edge_infer {

constexpr int64_t kTileRows = 64;  // output rows per packed tile

inline __m512 load16(const float* p) { return _mm512_loadu_ps(p); }
inline __m512 load16(const at::BFloat16* p) {
  const __m256i raw = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p));
  return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(raw), 16));
}

// Round-to-nearest-even float -> bf16 of 16 values; NaN stays NaN (so that checks downstream see it).
inline void store_bf16(at::BFloat16* out, __m512 v) {
  const __m512i bits = _mm512_castps_si512(v);
  const __m512i odd = _mm512_and_si512(_mm512_srli_epi32(bits, 16), _mm512_set1_epi32(1));
  __m512i rounded = _mm512_add_epi32(bits, _mm512_add_epi32(odd, _mm512_set1_epi32(0x7FFF)));
  rounded = _mm512_mask_mov_epi32(rounded, _mm512_cmp_ps_mask(v, v, _CMP_UNORD_Q), _mm512_set1_epi32(0x7FC00000));
  _mm256_storeu_si256(reinterpret_cast<__m256i*>(out), _mm512_cvtepi32_epi16(_mm512_srli_epi32(rounded, 16)));
}

inline void store(float* out, __m512 v) { _mm512_storeu_ps(out, v); }
inline void store(at::BFloat16* out, __m512 v) { store_bf16(out, v); }

// Refuses (TORCH_CHECK, naming ``what``) a packed weight that does not take k input columns in groups of
// ``group`` and give n outputs.
void check_packed(const char* what, const at::Tensor& packed, const at::Tensor& sz, int64_t k, int64_t group, int64_t n);

// out[m, n] = x[m, k] W^T for a W4A8-packed weight (layout in w4a8.cpp); T is float or at::BFloat16.
template <typename T>
void w4a8_matmul(const T* x, int64_t m, int64_t k, const uint8_t* packed, const at::BFloat16* sz, int64_t group,
                 int64_t n, T* out);

}  // namespace edge_infer
