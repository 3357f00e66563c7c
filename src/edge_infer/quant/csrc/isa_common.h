// The parts every ISA variant shares, written once as plain loops and compiled into each variant's
// translation unit with that variant's flags (the compiler vectorizes them there).
//
// Everything is in an anonymous namespace: translation units compiled with different instruction sets
// must not share an inline function, or the linker could keep the AVX-512 copy for every caller.
// No standard-library functions either (compiler builtins instead), for the same reason. Floating point
// is written out operation by operation (__builtin_fmaf where the vector code fuses; the build passes
// -ffp-contract=off), so that every variant rounds alike and matches the scalar reference bit for bit.
#pragma once

#include <cstdint>

#include "isa.h"

namespace edge_infer {
namespace {

inline float bf16_to_float(uint16_t v) {
  const uint32_t bits = static_cast<uint32_t>(v) << 16;
  float f;
  __builtin_memcpy(&f, &bits, sizeof f);
  return f;
}

// IEEE half -> float, exactly (subnormals, infinities and NaNs included).
inline float fp16_to_float(uint16_t h) {
  const uint32_t sign = static_cast<uint32_t>(h & 0x8000) << 16;
  uint32_t exp = (h >> 10) & 0x1F, man = h & 0x3FF, bits;
  if (exp == 0x1F) {
    bits = sign | 0x7F800000u | (man << 13);
  } else if (exp != 0) {
    bits = sign | ((exp + 112) << 23) | (man << 13);
  } else if (man == 0) {
    bits = sign;
  } else {  // subnormal: normalize
    exp = 113;
    while (!(man & 0x400)) man <<= 1, --exp;
    bits = sign | (exp << 23) | ((man & 0x3FF) << 13);
  }
  float f;
  __builtin_memcpy(&f, &bits, sizeof f);
  return f;
}

// Hardware prefetchers stop at 4 KiB page boundaries, while a product streams megabytes of packed weights
// once per token: asking for the bytes two pages ahead of the loads keeps enough of them in flight to run
// near memory speed (a 72 MB product with its cache flushed: 1.3x faster on one and two threads of a Xeon).
// Into L2 (locality 2: prefetcht1, PRFM PLDL2KEEP), not L1: L2 tracks more misses in flight than L1's fill
// buffers, which the loads themselves need (8 KiB into L2 beat 4 KiB into L1 by 5-15% on AVX2 and AVX-512).
// A prefetch past the end of the weights is harmless: it never faults.
constexpr int64_t kPrefetchAhead = 8192;

inline void prefetch_ahead(const void* p, int64_t bytes) {
  for (int64_t b = 0; b < bytes; b += 64) __builtin_prefetch(static_cast<const char*>(p) + kPrefetchAhead + b, 0, 2);
}

inline float to_float(float v) { return v; }
inline float to_float(uint16_t v) { return bf16_to_float(v); }

// |v| as the bits of a float: for finite values their order is the order of the magnitudes, and every
// value at or above 0x7F800000 is an infinity or a NaN. One integer max (which vectorizes, where a float
// max with NaN semantics does not) thus finds a group's largest magnitude and whether it is finite.
inline uint32_t magnitude_bits(float v) {
  uint32_t bits;
  __builtin_memcpy(&bits, &v, sizeof bits);
  return bits & 0x7FFFFFFFu;
}
inline uint32_t magnitude_bits(uint16_t v) { return (static_cast<uint32_t>(v) << 16) & 0x7FFFFFFFu; }

// Adding and taking off 1.5 * 2^23 rounds a float under 2^22 in magnitude to the nearest integer, ties to even
// (the default rounding mode), as nearbyint does, in two additions that vectorize.
constexpr float kRoundMagic = 12582912.f;

// One row of k values -> int8 codes, scale and code sum per group (see isa.h).
// A group with a NaN or an infinity gets scale NaN and codes 0, so every output it reaches is NaN.
template <typename T>
void quantize_row(const T* x, int64_t k, int64_t group, int8_t* q, float* alpha, int32_t* sum) {
  for (int64_t g0 = 0; g0 < k; g0 += group) {
    const T* v = x + g0;
    uint32_t top = 0;
    for (int64_t i = 0; i < group; ++i) {
      const uint32_t m = magnitude_bits(v[i]);
      top = m > top ? m : top;
    }
    const int64_t g = g0 / group;
    if (top >= 0x7F800000u) {
      __builtin_memset(q + g0, 0, group);
      alpha[g] = __builtin_nanf("");
      sum[g] = 0;
      continue;
    }
    float amax;
    __builtin_memcpy(&amax, &top, sizeof amax);
    const float a = amax / 127.f;
    const float inv = a >= 1.17549435e-38f ? 1.f / a : 0.f;  // an all-(near-)zero group: codes 0
    int32_t s = 0;
    for (int64_t i = 0; i < group; ++i) {
      // |to_float(v[i]) * inv| <= 127 by construction, far under 2^22.
      const int32_t c = static_cast<int32_t>((to_float(v[i]) * inv + kRoundMagic) - kRoundMagic);
      q[g0 + i] = static_cast<int8_t>(c);
      s += c;
    }
    alpha[g] = a;
    sum[g] = s;
  }
}

void quantize_f32(const float* x, int64_t k, int64_t group, int8_t* q, float* alpha, int32_t* sum) {
  quantize_row(x, k, group, q, alpha, sum);
}

void quantize_bf16(const uint16_t* x, int64_t k, int64_t group, int8_t* q, float* alpha, int32_t* sum) {
  quantize_row(x, k, group, q, alpha, sum);
}

// Defined by each variant (isa.h's lane contract).
void dot_rows(const float* q, const float* k, int64_t stride, int64_t count, int64_t n, float* out);
void axpy_rows(const float* w, const float* v, int64_t stride, int64_t count, int64_t n, float* y);

void dot_f32(const float* q, const float* k, int64_t stride, int64_t count, int64_t n, float* out) {
  dot_rows(q, k, stride, count, n, out);
}

void axpy_f32(const float* w, const float* v, int64_t stride, int64_t count, int64_t n, float* y) {
  axpy_rows(w, v, stride, count, n, y);
}

// x rounded to bf16, to nearest even; NaN stays NaN (0x7FC0, as PyTorch converts it).
inline uint16_t to_bf16(float x) {
  uint32_t bits;
  __builtin_memcpy(&bits, &x, sizeof bits);
  const uint16_t rounded = static_cast<uint16_t>((bits + 0x7FFFu + ((bits >> 16) & 1u)) >> 16);
  return x != x ? static_cast<uint16_t>(0x7FC0) : rounded;
}

// A float as a row of T holds it: bf16 (uint16_t) rounds, fp32 is the value itself.
template <typename T>
inline T from_float(float x);
template <>
inline float from_float<float>(float x) { return x; }
template <>
inline uint16_t from_float<uint16_t>(float x) { return to_bf16(x); }

// A variant that defines EDGE_INFER_OWN_ROUNDING before including this file writes these two itself, with the same
// bits: the compiler vectorizes the loops, but for a tile's row of 64 values (each product's store) its alias checks
// and remainder loops cost more than the rounding (isa_avx512.cpp, isa_avx2.cpp).
#ifndef EDGE_INFER_OWN_ROUNDING
void round_bf16(const float* x, int64_t n, uint16_t* out) {
  for (int64_t i = 0; i < n; ++i) out[i] = to_bf16(x[i]);
}

// Each rounding its own loop, as round_bf16's: the compiler vectorizes one select per loop.
void round_add_bf16(const float* x, const uint16_t* bias, int64_t n, uint16_t* out) {
  round_bf16(x, n, out);
  for (int64_t i = 0; i < n; ++i) out[i] = to_bf16(bf16_to_float(out[i]) + bf16_to_float(bias[i]));
}
#endif

// The 16 lanes of a sum reduced pairwise, as the dot product's (isa.h): l + l+8, l + l+4, l + l+2, then 0 + 1.
inline float reduce_lanes(float* lanes) {
  for (int width = 8; width >= 1; width /= 2)
    for (int l = 0; l < width; ++l) lanes[l] += lanes[l + width];
  return lanes[0];
}

// isa.h's rms_norm over one row of T (bf16 as uint16_t, or fp32). Each rounding its own loop over a chunk, as
// round_add_bf16's, so that the compiler vectorizes both.
template <typename T>
void rms_norm_row(const T* x, const T* weight, int64_t n, float eps, T* out) {
  float lanes[16] = {};
  const int64_t whole = n / 16 * 16;
  for (int64_t i = 0; i < whole; i += 16)
    for (int l = 0; l < 16; ++l) lanes[l] += to_float(x[i + l]) * to_float(x[i + l]);
  for (int64_t i = whole; i < n; ++i) lanes[i - whole] += to_float(x[i]) * to_float(x[i]);
  const float r = 1.f / __builtin_sqrtf(reduce_lanes(lanes) / static_cast<float>(n) + eps);
  constexpr int64_t kChunk = 256;
  T scaled[kChunk];
  for (int64_t i0 = 0; i0 < n; i0 += kChunk) {
    const int64_t len = n - i0 < kChunk ? n - i0 : kChunk;
    for (int64_t i = 0; i < len; ++i) scaled[i] = from_float<T>(to_float(x[i0 + i]) * r);
    for (int64_t i = 0; i < len; ++i) out[i0 + i] = from_float<T>(to_float(scaled[i]) * to_float(weight[i0 + i]));
  }
}

void rms_norm_bf16(const uint16_t* x, const uint16_t* weight, int64_t n, float eps, uint16_t* out) {
  rms_norm_row(x, weight, n, eps, out);
}

void rms_norm_f32(const float* x, const float* weight, int64_t n, float eps, float* out) {
  rms_norm_row(x, weight, n, eps, out);
}

void widen_bf16(const uint16_t* x, int64_t stride, int64_t rows, int64_t n, float* out) {
  for (int64_t r = 0; r < rows; ++r, x += stride, out += n)
    for (int64_t i = 0; i < n; ++i) out[i] = bf16_to_float(x[i]);
}

// models/layers/rope.py's apply_rotary on one token's bf16 heads (head h at x + h * stride), in fp32:
// out = bf16(x * cos + roll(x, d / 2) * signed_sin), rounded as PyTorch's mul_ and then addcmul_ (a fused
// multiply-add of the rolled product onto the rounded first one) round them.
void rotate_bf16(const uint16_t* x, int64_t heads, int64_t stride, int64_t d, const float* cos, const float* sin,
                 uint16_t* out) {
  const int64_t half = d / 2;
  float y[512];  // d <= 512 (the binding checks)
  for (int64_t h = 0; h < heads; ++h, x += stride, out += d) {
    for (int64_t i = 0; i < half; ++i) y[i] = __builtin_fmaf(bf16_to_float(x[i + half]), sin[i], bf16_to_float(x[i]) * cos[i]);
    for (int64_t i = half; i < d; ++i) y[i] = __builtin_fmaf(bf16_to_float(x[i - half]), sin[i], bf16_to_float(x[i]) * cos[i]);
    for (int64_t i = 0; i < d; ++i) out[i] = to_bf16(y[i]);
  }
}

// e^x for -87 <= x <= 88: x = n ln 2 + r with |r| <= ln 2 / 2 (ln 2 in two float parts), e^r from its Taylor
// series to r^7 (remainder under 5e-9 there; within 0.92 ulp of exp over [-87, 0]), times 2^n built in the
// exponent bits (n + 127, 1..254, lands in the low mantissa bits of n + 2^23 + 127: no float-to-int
// conversion). A NaN stays NaN. No branch or select inside, so that a loop of it vectorizes; callers clamp
// in a loop of their own (the compiler vectorizes a select only without fused multiply-adds beside it).
inline float exp_within(float x) {
  const float n = (x * 1.44269504f + kRoundMagic) - kRoundMagic;
  float r = __builtin_fmaf(-n, 0.693145752f, x);
  r = __builtin_fmaf(-n, 1.42860677e-06f, r);
  float p = __builtin_fmaf(r, 1.98412698e-04f, 1.38888889e-03f);  // 1/7!, 1/6!
  p = __builtin_fmaf(p, r, 8.33333333e-03f);                       // 1/5!
  p = __builtin_fmaf(p, r, 4.16666667e-02f);                       // 1/4!
  p = __builtin_fmaf(p, r, 1.66666667e-01f);                       // 1/3!
  p = __builtin_fmaf(p, r, 0.5f);
  p = __builtin_fmaf(p, r, 1.f);
  p = __builtin_fmaf(p, r, 1.f);
  const uint32_t two_n = (__builtin_bit_cast(uint32_t, n + 8388735.f) & 0x7FFFFFu) << 23;
  return p * __builtin_bit_cast(float, two_n);
}

// Each step its own loop: the compiler vectorizes a select or a reduction only alone.
void softmax_f32(float* p, int64_t n, float scale) {
  for (int64_t j = 0; j < n; ++j) p[j] *= scale;
  float lanes[16];  // the largest per lane (NaN scores skipped: they poison the sum below)
  for (int l = 0; l < 16; ++l) lanes[l] = -__builtin_inff();
  int64_t j = 0;
  for (; j + 16 <= n; j += 16)
    for (int l = 0; l < 16; ++l) lanes[l] = lanes[l] < p[j + l] ? p[j + l] : lanes[l];
  for (int l = 0; j + l < n; ++l) lanes[l] = lanes[l] < p[j + l] ? p[j + l] : lanes[l];
  float top = lanes[0];
  for (int l = 1; l < 16; ++l) top = top < lanes[l] ? lanes[l] : top;
  // Clamped at -87 (e^-87 is near the smallest normal float: as good as 0 beside the largest score's 1).
  for (j = 0; j < n; ++j) {
    const float x = p[j] - top;
    p[j] = x < -87.f ? -87.f : x;
  }
  for (j = 0; j < n; ++j) p[j] = exp_within(p[j]);
  for (int l = 0; l < 16; ++l) lanes[l] = 0.f;
  for (j = 0; j + 16 <= n; j += 16)
    for (int l = 0; l < 16; ++l) lanes[l] += p[j + l];
  for (int l = 0; j + l < n; ++l) lanes[l] += p[j + l];
  const float total = reduce_lanes(lanes);
  for (j = 0; j < n; ++j) p[j] /= total;
}

// SwiGLU's activation as models/llama.py computes it in T: silu(gate) = gate / (1 + e^-gate) rounded to T,
// times up, rounded to T. e^-gate is clamped to [e^-87, e^88]: beyond, silu is gate itself or under 1e-36.
constexpr int64_t kSiluChunk = 256;
template <typename T>
void silu_mul_rows(const T* gate, const T* up, int64_t n, T* out) {
  float e[kSiluChunk];
  for (int64_t i0 = 0; i0 < n; i0 += kSiluChunk) {
    const int64_t len = n - i0 < kSiluChunk ? n - i0 : kSiluChunk;
    for (int64_t i = 0; i < len; ++i) {
      const float x = -to_float(gate[i0 + i]);
      e[i] = x < -87.f ? -87.f : (x > 88.f ? 88.f : x);
    }
    for (int64_t i = 0; i < len; ++i) e[i] = exp_within(e[i]);
    for (int64_t i = 0; i < len; ++i) {
      const float g = to_float(gate[i0 + i]);
      out[i0 + i] = from_float<T>(to_float(from_float<T>(g / (1.f + e[i]))) * to_float(up[i0 + i]));
    }
  }
}

void silu_mul_bf16(const uint16_t* gate, const uint16_t* up, int64_t n, uint16_t* out) {
  silu_mul_rows(gate, up, n, out);
}

void silu_mul_f32(const float* gate, const float* up, int64_t n, float* out) { silu_mul_rows(gate, up, n, out); }

// sin^2 y for |y| <= 2^22, in operations the compiler vectorizes. sin^2 has period pi, so y is
// reduced to r = y - n pi in [-pi/2, pi/2] (n = round(y / pi), pi in three float parts, each step one fused
// multiply-add: exact for the n this limit allows) and sin r taken from its Taylor series to r^13, whose
// remainder is under 7e-10 there; the result is within a few float roundings of sin^2 y.
// The bits of 2^22 (magnitude_bits): up to there y / pi + kRoundMagic still rounds to an integer.
constexpr uint32_t kSnakeReduceLimitBits = 0x4A800000u;
inline float sin_squared(float y) {
  const float n = (y * 0.318309886f + kRoundMagic) - kRoundMagic;
  float r = __builtin_fmaf(-n, 3.14159274f, y);
  r = __builtin_fmaf(-n, -8.74227766e-08f, r);
  r = __builtin_fmaf(-n, -3.43030930e-15f, r);
  const float r2 = r * r;
  float p = __builtin_fmaf(r2, 1.6059044e-10f, -2.5052108e-08f);  // 1/13!, -1/11!
  p = __builtin_fmaf(p, r2, 2.7557319e-06f);                       // 1/9!
  p = __builtin_fmaf(p, r2, -1.98412698e-04f);                     // -1/7!
  p = __builtin_fmaf(p, r2, 8.33333333e-03f);                      // 1/5!
  p = __builtin_fmaf(p, r2, -1.66666667e-01f);                     // -1/3!
  const float sin_r = __builtin_fmaf(p * r2, r, r);
  return sin_r * sin_r;
}

void snake_f32(const float* x, int64_t n, float alpha, float inv_beta, float* out) {
  uint32_t beyond = 0;  // any argument past the reduction's range (NaN and infinity included: their bits are larger)
  for (int64_t i = 0; i < n; ++i) {
    const float y = x[i] * alpha;
    beyond |= magnitude_bits(y) > kSnakeReduceLimitBits ? 1u : 0u;
    out[i] = sin_squared(y) * inv_beta + x[i];
  }
  if (!beyond) return;
  for (int64_t i = 0; i < n; ++i) {  // those take the library's sine, as the PyTorch formula does
    const float y = x[i] * alpha;
    if (magnitude_bits(y) > kSnakeReduceLimitBits) {
      const float s = __builtin_sinf(y);
      out[i] = s * s * inv_beta + x[i];
    }
  }
}

// The float part of one group for one output row. dot is the exact int32 sum of q * code (codes 0..15) and sum
// the sum of q, so dot - 8 sum is exactly the sum of q * (code - 8): one rounding for the weights' part, with
// no large offset term to cancel it. The zero term is added only where zero is not 0 (-0 counts as 0): none of
// a symmetric checkpoint's groups takes it, and a variant skips it for a group whose zeros are all 0.
inline float w4a8_group(float acc, int32_t dot, int32_t sum, float scale, float zero, float alpha, float total) {
  acc = __builtin_fmaf(static_cast<float>(dot - 8 * sum), scale * alpha, acc);
  return zero != 0.f ? __builtin_fmaf(zero, total, acc) : acc;
}

// Whether any of a group's 64 zeros (bf16) is not 0, -0 included: whether the group takes the zero term.
inline bool takes_zero_term(const uint16_t* zeros) {
  uint32_t any = 0;
  for (int64_t r = 0; r < kTileRows; ++r) any |= zeros[r] & 0x7FFFu;
  return any != 0;
}

// W4A16's float steps of one group for n rows of a tile and one activation row: out = fma(acc, scale, out), then,
// where zero is not 0 (and ``zero`` is given: a group with none skips it), out = fma(zero, xsum, out). acc is the
// group's fp32 sum of x * (code - 8) (isa.h's two chains), xsum the group's sum of x.
inline void w4a16_group(const float* acc, const uint16_t* scale, const uint16_t* zero, float xsum, int64_t n,
                        float* out) {
  for (int64_t r = 0; r < n; ++r) out[r] = __builtin_fmaf(acc[r], bf16_to_float(scale[r]), out[r]);
  if (zero == nullptr) return;
  for (int64_t r = 0; r < n; ++r)
    if (bf16_to_float(zero[r]) != 0.f) out[r] = __builtin_fmaf(bf16_to_float(zero[r]), xsum, out[r]);
}

inline float w8a8_group(float acc, int32_t dot, float scale, float alpha) {
  return __builtin_fmaf(static_cast<float>(dot), scale * alpha, acc);
}

}  // namespace
}  // namespace edge_infer

// Defines the variant's table from the tile kernels its translation unit implements (and its panels, where it
// has a tile matrix unit).
#define EDGE_INFER_ISA_TABLE_WITH_PANELS(symbol, isa_name, ready, w4a8, w8a8)                            \
  namespace edge_infer {                                                                                   \
  extern const IsaKernels symbol = {isa_name,       quantize_f32,  quantize_bf16,  w4a8_tile,    w8a8_tile,      \
                                    w16_tile,       w4a16_tile,    round_bf16,     dot_f32,      axpy_f32,       \
                                    softmax_f32,    silu_mul_bf16, silu_mul_f32,   snake_f32,    round_add_bf16, \
                                    rotate_bf16,    rms_norm_bf16, rms_norm_f32,   widen_bf16,   ready,          \
                                    w4a8,           w8a8};                                                       \
  }
#define EDGE_INFER_ISA_TABLE(symbol, isa_name) EDGE_INFER_ISA_TABLE_WITH_PANELS(symbol, isa_name, nullptr, nullptr, nullptr)
