// quantize.py's group-wise quantization of one group of float weights, in plain C++ without PyTorch: the
// loader's (pack.cpp) and the standalone harness's (tests/quant/native/harness.cpp, natively and for ARM under
// qemu), compiled with the same flags (no contraction into multiply-adds, no trapping math), so the harness
// checks the arithmetic the loader runs on each architecture.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>

namespace edge_infer {
namespace pack {

constexpr float kMinScale = 1e-12f;  // quantize.py's MIN_SCALE: keeps an all-zero group's scale finite

inline uint16_t bf16_bits(float value) {  // round to nearest even (the values here are finite)
  uint32_t bits;
  std::memcpy(&bits, &value, 4);
  return static_cast<uint16_t>((bits + 0x7fffu + ((bits >> 16) & 1u)) >> 16);
}

inline float bf16_value(uint16_t bits) {
  const uint32_t wide = static_cast<uint32_t>(bits) << 16;
  float value;
  std::memcpy(&value, &wide, 4);
  return value;
}

// Round half to even, as torch.round: exact for |x| < 2^22 in the default rounding mode (group_codes clamps
// to ±256 first, past every code), and vectorizable, unlike a call to nearbyintf.
inline float round_even(float x) {
  constexpr float kShift = 12582912.0f;  // 1.5 * 2^23
  return (x + kShift) - kShift;
}

// A float's bits as an integer that orders as the float does (NaN aside): the group's minimum and maximum
// as integer reductions, which the compiler vectorizes (a float min/max reduction it will not reorder).
inline int32_t order_key(int32_t bits) { return bits ^ ((bits >> 31) & 0x7fffffff); }  // its own inverse

inline float from_key(int32_t key) {
  const int32_t bits = order_key(key);
  float value;
  std::memcpy(&value, &bits, 4);
  return value;
}

// The two loops over a group's values, written once and compiled twice on x86: for AVX2 (eight lanes, half
// the time of the baseline's four at a 3B model's load) and for the baseline; the caller picks by the ISA
// variant the capability model chose. The same operations on every lane: the same bits either way.
#define EDGE_INFER_INLINE inline __attribute__((always_inline))

// Codes of one group: clamp(round((v - zero) / scale) + offset, lowest, highest), as quantize.py's fp32 steps.
EDGE_INFER_INLINE void group_codes(const float* v, int64_t n, float scale, float zero, float offset, float lowest,
                                   float highest, uint8_t* out) {
  for (int64_t j = 0; j < n; ++j) {
    float q = std::min(std::max((v[j] - zero) / scale, -256.0f), 256.0f);
    q = std::min(std::max(round_even(q) + offset, lowest), highest);
    out[j] = static_cast<uint8_t>(static_cast<int>(q));  // 8-bit codes wrap to their int8 bits
  }
}

// The order keys of a group's least and greatest value; false when it holds NaN or infinity.
EDGE_INFER_INLINE bool group_range(const float* values, int64_t n, int32_t* lo_key, int32_t* hi_key) {
  int32_t lo = INT32_MAX, hi = INT32_MIN;
  uint32_t special = 0;  // NaN's and infinity's exponent
  for (int64_t j = 0; j < n; ++j) {
    int32_t bits;
    std::memcpy(&bits, values + j, 4);
    special |= static_cast<uint32_t>((bits & 0x7f800000) == 0x7f800000);
    const int32_t key = order_key(bits);
    lo = std::min(lo, key);
    hi = std::max(hi, key);
  }
  *lo_key = lo;
  *hi_key = hi;
  return special == 0;
}

struct GroupLoops {
  bool (*range)(const float*, int64_t, int32_t*, int32_t*);
  void (*codes)(const float*, int64_t, float, float, float, float, float, uint8_t*);
};

inline bool range_base(const float* v, int64_t n, int32_t* lo, int32_t* hi) { return group_range(v, n, lo, hi); }
inline void codes_base(const float* v, int64_t n, float s, float z, float offset, float lowest, float highest,
                       uint8_t* out) {
  group_codes(v, n, s, z, offset, lowest, highest, out);
}
#if defined(__x86_64__)
inline __attribute__((target("avx2"))) bool range_avx2(const float* v, int64_t n, int32_t* lo, int32_t* hi) {
  return group_range(v, n, lo, hi);
}
inline __attribute__((target("avx2"))) void codes_avx2(const float* v, int64_t n, float s, float z, float offset,
                                                       float lowest, float highest, uint8_t* out) {
  group_codes(v, n, s, z, offset, lowest, highest, out);
}
#endif
#undef EDGE_INFER_INLINE

// The AVX2 loops (every x86 variant but the scalar reference has AVX2), or the baseline's.
inline GroupLoops group_loops(bool avx2) {
#if defined(__x86_64__)
  if (avx2) return {range_avx2, codes_avx2};
#endif
  (void)avx2;
  return {range_base, codes_base};
}

// One group's codes and bf16 side values from ``values`` (n of them, the padded columns as zeros), as
// quantize_rows chooses them; false when the group holds NaN or infinity, or its scale or zero would overflow
// (the codes would mean nothing).
inline bool quantize_group(const float* values, int64_t n, int bits, bool symmetric, const GroupLoops& loops,
                           uint8_t* codes, uint16_t* scale, uint16_t* zero) {
  int32_t lo, hi;
  if (!loops.range(values, n, &lo, &hi)) return false;
  const float low = from_key(lo), high = from_key(hi);
  float s, z = 0.0f;
  if (bits == 8 || symmetric) {
    *scale = bf16_bits(std::max(std::max(-low, high) / (bits == 8 ? 127.0f : 7.0f), kMinScale));
    *zero = 0;
    s = bf16_value(*scale);
  } else {
    *scale = bf16_bits(std::max((high - low) / 15.0f, kMinScale));
    s = bf16_value(*scale);
    *zero = bf16_bits(low + 8.0f * s);
    z = bf16_value(*zero);
  }
  if (!std::isfinite(s) || !std::isfinite(z)) return false;
  if (bits == 8)
    loops.codes(values, n, s, 0.0f, 0.0f, -127.0f, 127.0f, codes);
  else
    loops.codes(values, n, s, z, 8.0f, 0.0f, 15.0f, codes);
  return true;
}

}  // namespace pack
}  // namespace edge_infer
