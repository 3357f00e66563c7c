// What the x86 variants (isa_avx2.cpp, isa_avx512.cpp) share beyond isa_common.h.
#pragma once

#include <immintrin.h>

namespace edge_infer {
namespace {

// Lanes 0-7 of isa.h's dot product, already summed with lanes 8-15, reduced as the contract says:
// l + l+4, then l + l+2, then 0 + 1.
inline float sum_lanes(__m256 eight) {
  const __m128 four = _mm_add_ps(_mm256_castps256_ps128(eight), _mm256_extractf128_ps(eight, 1));
  const __m128 two = _mm_add_ps(four, _mm_movehl_ps(four, four));
  return _mm_cvtss_f32(_mm_add_ss(two, _mm_movehdup_ps(two)));
}

}  // namespace
}  // namespace edge_infer
