// ARM NEON with the dot-product extension (sdot, Armv8.2-A+dotprod: Cortex-A76/Pi 5 and later, Apple M1+).
//
// One q register holds 4 rows x 4 bytes of a tile; vdotq_laneq_s32 multiplies it with 4 activations
// taken from one lane of a 16-byte activation register, so a 16-byte activation load serves 16 input
// columns of all 64 rows. sdot is signed x signed: 4-bit codes (0..15) and int8 weights go in as they
// are, and the result is the same exact int32 sum the x86 variants form. Floats accumulate in memory
// (16 registers would not leave room for the 16 int32 accumulators); they are touched once per group.
//
// i8mm (smmla) is not used: it multiplies 2x8 by 8x2 blocks, which pays for two or more activation
// rows, and no ARM machine was at hand to measure whether it pays for prefill.
#include <arm_neon.h>

#include "isa_common.h"

namespace edge_infer {
namespace {

inline float32x4_t load_bf16x4(const uint16_t* p) { return vreinterpretq_f32_u32(vshll_n_u16(vld1_u16(p), 16)); }

// acc[r] = fma rounds of one group for the 64 rows (see w4a8_group / w8a8_group in isa_common.h): dot less
// ``offset`` (W4A8: 8 times the activations' sum), then the zero term where ``zero`` is given.
inline void finish_group(float* acc, const int32x4_t* dot, int32_t offset, const uint16_t* scale, const uint16_t* zero,
                         float alpha, float total) {
  const float32x4_t al = vdupq_n_f32(alpha), tot = vdupq_n_f32(total);
  const int32x4_t off = vdupq_n_s32(offset);
  for (int r = 0; r < 16; ++r) {
    const float32x4_t s = load_bf16x4(scale + 4 * r);
    float32x4_t a = vfmaq_f32(vld1q_f32(acc + 4 * r), vcvtq_f32_s32(vsubq_s32(dot[r], off)), vmulq_f32(s, al));
    if (zero != nullptr) {  // in the lanes whose zero is not 0
      const float32x4_t z = load_bf16x4(zero + 4 * r);
      a = vbslq_f32(vmvnq_u32(vceqq_f32(z, vdupq_n_f32(0.f))), vfmaq_f32(a, z, tot), a);
    }
    vst1q_f32(acc + 4 * r, a);
  }
}

void w4a8_tile(const uint8_t* codes, const uint16_t* sz, const Int8Rows& x, int64_t m, float* out) {
  const int64_t groups = x.k / x.group;
  const uint8x16_t low = vdupq_n_u8(0x0F);
  for (int64_t i = 0; i < m; ++i, out += kTileRows) {
    const int8_t* q = x.q + i * x.k;
    for (int r = 0; r < kTileRows; ++r) out[r] = 0.f;
    for (int64_t g = 0; g < groups; ++g) {
      int32x4_t dot[16];
      for (int r = 0; r < 16; ++r) dot[r] = vdupq_n_s32(0);
      const uint8_t* w = codes + g * x.group * (kTileRows / 2);
      for (int64_t c = g * x.group; c < (g + 1) * x.group; c += 16, w += 8 * kTileRows) {
        prefetch_ahead(w, 8 * kTileRows);
        const int8x16_t a = vld1q_s8(q + c);  // lanes 0, 1: columns c..c+7; lanes 2, 3: c+8..c+15
        for (int r = 0; r < 16; ++r) {
          const uint8x16_t first = vld1q_u8(w + 16 * r), second = vld1q_u8(w + 4 * kTileRows + 16 * r);
          dot[r] = vdotq_laneq_s32(dot[r], vreinterpretq_s8_u8(vandq_u8(first, low)), a, 0);
          dot[r] = vdotq_laneq_s32(dot[r], vreinterpretq_s8_u8(vshrq_n_u8(first, 4)), a, 1);
          dot[r] = vdotq_laneq_s32(dot[r], vreinterpretq_s8_u8(vandq_u8(second, low)), a, 2);
          dot[r] = vdotq_laneq_s32(dot[r], vreinterpretq_s8_u8(vshrq_n_u8(second, 4)), a, 3);
        }
      }
      const float alpha = x.alpha[i * groups + g];
      const int32_t sum = x.sum[i * groups + g];
      const uint16_t* s = sz + g * 2 * kTileRows;
      finish_group(out, dot, 8 * sum, s, takes_zero_term(s + kTileRows) ? s + kTileRows : nullptr, alpha,
                   alpha * static_cast<float>(sum));
    }
  }
}

void w8a8_tile(const int8_t* codes, const uint16_t* scales, const Int8Rows& x, int64_t m, float* out) {
  const int64_t groups = x.k / x.group;
  for (int64_t i = 0; i < m; ++i, out += kTileRows) {
    const int8_t* q = x.q + i * x.k;
    for (int r = 0; r < kTileRows; ++r) out[r] = 0.f;
    for (int64_t g = 0; g < groups; ++g) {
      int32x4_t dot[16];
      for (int r = 0; r < 16; ++r) dot[r] = vdupq_n_s32(0);
      const int8_t* w = codes + g * x.group * kTileRows;
      for (int64_t c = g * x.group; c < (g + 1) * x.group; c += 16, w += 16 * kTileRows) {
        prefetch_ahead(w, 16 * kTileRows);
        const int8x16_t a = vld1q_s8(q + c);  // lane j: columns c + 4j .. c + 4j + 3
        for (int r = 0; r < 16; ++r) {
          dot[r] = vdotq_laneq_s32(dot[r], vld1q_s8(w + 16 * r), a, 0);
          dot[r] = vdotq_laneq_s32(dot[r], vld1q_s8(w + 4 * kTileRows + 16 * r), a, 1);
          dot[r] = vdotq_laneq_s32(dot[r], vld1q_s8(w + 8 * kTileRows + 16 * r), a, 2);
          dot[r] = vdotq_laneq_s32(dot[r], vld1q_s8(w + 12 * kTileRows + 16 * r), a, 3);
        }
      }
      finish_group(out, dot, 0, scales + g * kTileRows, nullptr, x.alpha[i * groups + g], 0.f);
    }
  }
}

// 4 weights of one column widened to fp32: bf16 by a shift, fp16 by fcvtl.
template <bool kFp16>
inline float32x4_t widen4(const uint16_t* p) {
  if (kFp16) return vcvt_f32_f16(vreinterpret_f16_u16(vld1_u16(p)));
  return load_bf16x4(p);
}

template <bool kFp16>
void w16_rows(const uint16_t* w, const float* x, int64_t k, int64_t m, float* out) {
  for (int64_t i = 0; i < m; ++i, out += kTileRows, x += k) {
    float32x4_t acc[16];
    for (int r = 0; r < 16; ++r) acc[r] = vdupq_n_f32(0.f);
    for (int64_t c = 0; c < k; ++c) {
      prefetch_ahead(w + c * kTileRows, 2 * kTileRows);
      const float32x4_t a = vdupq_n_f32(x[c]);
      for (int r = 0; r < 16; ++r) acc[r] = vfmaq_f32(acc[r], widen4<kFp16>(w + c * kTileRows + 4 * r), a);
    }
    for (int r = 0; r < 16; ++r) vst1q_f32(out + 4 * r, acc[r]);
  }
}

void w16_tile(const uint16_t* w, bool fp16, const float* x, int64_t k, int64_t m, float* out) {
  fp16 ? w16_rows<true>(w, x, k, m, out) : w16_rows<false>(w, x, k, m, out);
}

// The code of input column c + kColumn for 4 rows times 2^w4a16_shift, converted (isa_avx2.cpp's column8).
template <int kColumn>
inline float32x4_t column4(uint32x4_t bytes) {
  constexpr int kShift = w4a16_shift(kColumn);
  uint32x4_t placed = bytes;
  if constexpr (kShift == 27) placed = vshrq_n_u32(bytes, 1);
  return vcvtq_f32_u32(vandq_u32(placed, vdupq_n_u32(0x0Fu << kShift)));
}

// W4A16 (isa.h): one activation row through the tile, 16 rows at a time (8 accumulators: lo and hi per 4 rows),
// a lane of an activation register per column.
void w4a16_tile(const uint8_t* codes, const uint16_t* sz, const float* x, const float* xsum, int64_t k, int64_t group,
                int64_t m, float* out) {
  const int64_t groups = k / group;
  for (int64_t i = 0; i < m; ++i, out += kTileRows, x += k) {
    for (int r = 0; r < kTileRows; ++r) out[r] = 0.f;
    for (int64_t g = 0; g < groups; ++g) {
      const uint16_t* s = sz + g * 2 * kTileRows;
      const uint16_t* zero = takes_zero_term(s + kTileRows) ? s + kTileRows : nullptr;
      const float start = -8.f * xsum[i * groups + g];
      for (int r0 = 0; r0 < kTileRows; r0 += 16) {
        float32x4_t lo[4], hi[4];
        for (int r = 0; r < 4; ++r) lo[r] = vdupq_n_f32(start), hi[r] = vdupq_n_f32(0.f);
        const uint8_t* w = codes + g * group * (kTileRows / 2) + 4 * r0;
        for (int64_t c = g * group; c < (g + 1) * group; c += 8, w += 4 * kTileRows) {
          prefetch_ahead(w, 64);
          const float32x4_t a_lo = vld1q_f32(x + c), a_hi = vld1q_f32(x + c + 4);
          for (int r = 0; r < 4; ++r) {
            const uint32x4_t bytes = vld1q_u32(reinterpret_cast<const uint32_t*>(w + 16 * r));
            lo[r] = vfmaq_laneq_f32(lo[r], column4<0>(bytes), a_lo, 0);
            hi[r] = vfmaq_laneq_f32(hi[r], column4<4>(bytes), a_hi, 0);
            lo[r] = vfmaq_laneq_f32(lo[r], column4<1>(bytes), a_lo, 1);
            hi[r] = vfmaq_laneq_f32(hi[r], column4<5>(bytes), a_hi, 1);
            lo[r] = vfmaq_laneq_f32(lo[r], column4<2>(bytes), a_lo, 2);
            hi[r] = vfmaq_laneq_f32(hi[r], column4<6>(bytes), a_hi, 2);
            lo[r] = vfmaq_laneq_f32(lo[r], column4<3>(bytes), a_lo, 3);
            hi[r] = vfmaq_laneq_f32(hi[r], column4<7>(bytes), a_hi, 3);
          }
        }
        float sums[16];
        for (int r = 0; r < 4; ++r) vst1q_f32(sums + 4 * r, vaddq_f32(lo[r], hi[r]));
        w4a16_group(sums, s + r0, zero == nullptr ? nullptr : zero + r0, xsum[i * groups + g], 16, out + r0);
      }
    }
  }
}

// isa.h's 16 lanes in four registers (lanes 0-3, 4-7, 8-11, 12-15), reduced pairwise as the contract says.
inline float32x4_t load4(const float* p) { return vld1q_f32(p); }

// Lanes 0-3, 4-7, 8-11, 12-15 reduced as the contract says: l + l+8, l + l+4, l + l+2, 0 + 1.
inline float sum_lanes(const float32x4_t acc[4]) {
  const float32x4_t four = vaddq_f32(vaddq_f32(acc[0], acc[2]), vaddq_f32(acc[1], acc[3]));
  const float32x2_t two = vadd_f32(vget_low_f32(four), vget_high_f32(four));
  return vget_lane_f32(two, 0) + vget_lane_f32(two, 1);
}

// Two keys at a time: their accumulator chains overlap, and each query load serves both.
void dot_rows(const float* q, const float* k, int64_t stride, int64_t count, int64_t n, float* out) {
  int64_t r = 0;
  for (; r + 2 <= count; r += 2, k += 2 * stride) {
    float32x4_t a[4], b[4];
    for (int j = 0; j < 4; ++j) a[j] = b[j] = vdupq_n_f32(0.f);
    for (int64_t i = 0; i < n; i += 16)
      for (int j = 0; j < 4; ++j) {
        const float32x4_t qj = load4(q + i + 4 * j);
        a[j] = vfmaq_f32(a[j], qj, load4(k + i + 4 * j));
        b[j] = vfmaq_f32(b[j], qj, load4(k + stride + i + 4 * j));
      }
    out[r] = sum_lanes(a);
    out[r + 1] = sum_lanes(b);
  }
  for (; r < count; ++r, k += stride) {
    float32x4_t acc[4] = {vdupq_n_f32(0.f), vdupq_n_f32(0.f), vdupq_n_f32(0.f), vdupq_n_f32(0.f)};
    for (int64_t i = 0; i < n; i += 16)
      for (int j = 0; j < 4; ++j) acc[j] = vfmaq_f32(acc[j], load4(q + i + 4 * j), load4(k + i + 4 * j));
    out[r] = sum_lanes(acc);
  }
}

// kVecs * 4 values of y in registers through every row (not loaded and stored once per row), each a chain
// of fused multiply-adds in row order.
template <int kVecs>
void axpy_slice(const float* w, const float* v, int64_t stride, int64_t count, float* y) {
  float32x4_t acc[kVecs];
  for (int r = 0; r < kVecs; ++r) acc[r] = vld1q_f32(y + 4 * r);
  for (int64_t j = 0; j < count; ++j, v += stride) {
    const float32x4_t a = vdupq_n_f32(w[j]);
    for (int r = 0; r < kVecs; ++r) acc[r] = vfmaq_f32(acc[r], a, load4(v + 4 * r));
  }
  for (int r = 0; r < kVecs; ++r) vst1q_f32(y + 4 * r, acc[r]);
}

// Slices of 64 values: sixteen independent chains hide the multiply-add's latency.
void axpy_rows(const float* w, const float* v, int64_t stride, int64_t count, int64_t n, float* y) {
  int64_t i = 0;
  for (; i + 64 <= n; i += 64) axpy_slice<16>(w, v + i, stride, count, y + i);
  for (; i < n; i += 16) axpy_slice<4>(w, v + i, stride, count, y + i);
}

}  // namespace
}  // namespace edge_infer

EDGE_INFER_ISA_TABLE(kNeonDotprod, "neon-dotprod")
