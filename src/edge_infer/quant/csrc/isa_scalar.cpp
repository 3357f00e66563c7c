// The scalar reference: the expected result of every ISA variant, read straight off the layouts in isa.h.
// Not a serving path (the planner never picks it); the tests and the harness compare each variant with it.
#include "isa_common.h"

namespace edge_infer {
namespace {

void w4a8_tile(const uint8_t* codes, const uint16_t* sz, const Int8Rows& x, int64_t m, float* out) {
  const int64_t groups = x.k / x.group;
  for (int64_t i = 0; i < m; ++i) {
    const int8_t* q = x.q + i * x.k;
    for (int64_t r = 0; r < kTileRows; ++r) {
      float acc = 0.f;
      for (int64_t g = 0; g < groups; ++g) {
        int32_t dot = 0;
        for (int64_t c = g * x.group; c < (g + 1) * x.group; ++c) {
          const uint8_t byte = codes[(c / 8) * 4 * kTileRows + r * 4 + c % 4];
          dot += q[c] * ((c % 8 < 4 ? byte : byte >> 4) & 15);
        }
        const uint16_t* group_sz = sz + g * 2 * kTileRows;
        const float alpha = x.alpha[i * groups + g];
        const int32_t sum = x.sum[i * groups + g];
        acc = w4a8_group(acc, dot, sum, bf16_to_float(group_sz[r]), bf16_to_float(group_sz[kTileRows + r]), alpha,
                         alpha * static_cast<float>(sum));
      }
      out[i * kTileRows + r] = acc;
    }
  }
}

void w8a8_tile(const int8_t* codes, const uint16_t* scales, const Int8Rows& x, int64_t m, float* out) {
  const int64_t groups = x.k / x.group;
  for (int64_t i = 0; i < m; ++i) {
    const int8_t* q = x.q + i * x.k;
    for (int64_t r = 0; r < kTileRows; ++r) {
      float acc = 0.f;
      for (int64_t g = 0; g < groups; ++g) {
        int32_t dot = 0;
        for (int64_t c = g * x.group; c < (g + 1) * x.group; ++c) dot += q[c] * codes[(c / 4) * 4 * kTileRows + r * 4 + c % 4];
        acc = w8a8_group(acc, dot, bf16_to_float(scales[g * kTileRows + r]), x.alpha[i * groups + g]);
      }
      out[i * kTileRows + r] = acc;
    }
  }
}

void w16_tile(const uint16_t* w, bool fp16, const float* x, int64_t k, int64_t m, float* out) {
  for (int64_t i = 0; i < m; ++i)
    for (int64_t r = 0; r < kTileRows; ++r) {
      float acc = 0.f;
      for (int64_t c = 0; c < k; ++c) {
        const uint16_t v = w[c * kTileRows + r];
        acc = __builtin_fmaf(fp16 ? fp16_to_float(v) : bf16_to_float(v), x[i * k + c], acc);
      }
      out[i * kTileRows + r] = acc;
    }
}

void w4a16_tile(const uint8_t* codes, const uint16_t* sz, const float* x, const float* xsum, int64_t k, int64_t group,
                int64_t m, float* out) {
  const int64_t groups = k / group;
  for (int64_t i = 0; i < m; ++i) {
    float* o = out + i * kTileRows;
    for (int64_t r = 0; r < kTileRows; ++r) o[r] = 0.f;
    for (int64_t g = 0; g < groups; ++g) {
      float acc[kTileRows];
      for (int64_t r = 0; r < kTileRows; ++r) {
        float lo = -8.f * xsum[i * groups + g], hi = 0.f;
        for (int64_t c = g * group; c < (g + 1) * group; ++c) {
          const uint8_t byte = codes[(c / 8) * 4 * kTileRows + r * 4 + c % 4];
          const float activation = x[i * k + c] * static_cast<float>(1u << w4a16_shift(c));  // exact
          if (c % 8 < 4)
            lo = __builtin_fmaf(activation, static_cast<float>(byte & 15), lo);
          else
            hi = __builtin_fmaf(activation, static_cast<float>(byte >> 4), hi);
        }
        acc[r] = lo + hi;
      }
      const uint16_t* s = sz + g * 2 * kTileRows;
      w4a16_group(acc, s, takes_zero_term(s + kTileRows) ? s + kTileRows : nullptr, xsum[i * groups + g], kTileRows, o);
    }
  }
}

// isa.h's 16 lanes, one float each, in the contract's order.
void dot_rows(const float* q, const float* k, int64_t stride, int64_t count, int64_t n, float* out) {
  for (int64_t r = 0; r < count; ++r, k += stride) {
    float lanes[16] = {};
    for (int64_t i = 0; i < n; i += 16)
      for (int j = 0; j < 16; ++j) lanes[j] = __builtin_fmaf(q[i + j], k[i + j], lanes[j]);
    out[r] = reduce_lanes(lanes);
  }
}

// y += w[j] * v_j, one fused multiply-add per value, rows in order.
void axpy_rows(const float* w, const float* v, int64_t stride, int64_t count, int64_t n, float* y) {
  for (int64_t r = 0; r < count; ++r, v += stride)
    for (int64_t i = 0; i < n; ++i) y[i] = __builtin_fmaf(w[r], v[i], y[i]);
}

}  // namespace
}  // namespace edge_infer

EDGE_INFER_ISA_TABLE(kScalar, "scalar")
