// AVX512-VNNI: one zmm register holds 16 rows x 4 bytes of a tile, so a tile of 64 rows is 4 loads per
// 4 (int8) or 8 (int4) input columns, each fed to vpdpbusd (64 multiply-adds) with the same broadcast
// activations. vpdpbusd takes unsigned x signed bytes: the 4-bit codes go in unchanged (their zero
// point is corrected once per group from the activation sum); int8 weights go in as w + 128, and
// 128 times the activation sum is taken off once per group.
#include <immintrin.h>

#define EDGE_INFER_OWN_ROUNDING  // round_bf16 and round_add_bf16 below
#include "isa_common.h"
#include "isa_x86.h"

namespace edge_infer {
namespace {

inline __m512 load_bf16x16(const uint16_t* p) {
  const __m256i raw = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p));
  return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(raw), 16));
}

// to_bf16 on 16 lanes, the result left in the upper halves of fp32 lanes (a bf16 value as fp32, exactly): round to
// nearest even in the integer bits, a NaN to 0x7FC0.
inline __m512 round_to_bf16(__m512 x) {
  const __m512i bits = _mm512_castps_si512(x);
  const __m512i odd = _mm512_and_si512(_mm512_srli_epi32(bits, 16), _mm512_set1_epi32(1));
  const __m512i rounded = _mm512_and_si512(_mm512_add_epi32(bits, _mm512_add_epi32(odd, _mm512_set1_epi32(0x7FFF))),
                                           _mm512_set1_epi32(static_cast<int32_t>(0xFFFF0000u)));
  return _mm512_castsi512_ps(
      _mm512_mask_mov_epi32(rounded, _mm512_cmp_ps_mask(x, x, _CMP_UNORD_Q), _mm512_set1_epi32(0x7FC00000)));
}

inline __m256i to_bf16x16(__m512 x) {
  return _mm512_cvtepi32_epi16(_mm512_srli_epi32(_mm512_castps_si512(round_to_bf16(x)), 16));
}

inline void store_bf16x16(uint16_t* p, __m256i v) { _mm256_storeu_si256(reinterpret_cast<__m256i*>(p), v); }

// A product's rows are stored 64 values at a time: straight-line code, no alias checks or remainder loops to pay
// for on each (the same functions as isa_common.h's): a W4A8 ViT product with a bias 6-10% faster in-process.
void round_bf16(const float* x, int64_t n, uint16_t* out) {
  int64_t i = 0;
  for (; i + 16 <= n; i += 16) store_bf16x16(out + i, to_bf16x16(_mm512_loadu_ps(x + i)));
  for (; i < n; ++i) out[i] = to_bf16(x[i]);
}

void round_add_bf16(const float* x, const uint16_t* bias, int64_t n, uint16_t* out) {
  int64_t i = 0;
  for (; i + 16 <= n; i += 16) {
    const __m512 rounded = round_to_bf16(_mm512_loadu_ps(x + i));
    store_bf16x16(out + i, to_bf16x16(_mm512_add_ps(rounded, load_bf16x16(bias + i))));
  }
  for (; i < n; ++i) out[i] = to_bf16(bf16_to_float(to_bf16(x[i])) + bf16_to_float(bias[i]));
}

inline __m512i broadcast4(const int8_t* p) {
  int32_t v;
  __builtin_memcpy(&v, p, sizeof v);
  return _mm512_set1_epi32(v);
}

// acc += the products of unsigned bytes u and signed bytes s, four to a lane (vpdpbusd). In asm so that the
// accumulator is updated in its register: through the intrinsic GCC 12 copied every accumulator to another
// register and back, and spilled some, on each column step of the tile kernels.
inline void dpbusd(__m512i& acc, __m512i u, __m512i s) { asm("vpdpbusd %2, %1, %0" : "+v"(acc) : "v"(u), "v"(s)); }

// w4a8_group's zero term, in the lanes whose zero is not 0.
inline __m512 add_zero_term(__m512 acc, __m512 zero, __m512 total) {
  return _mm512_mask3_fmadd_ps(zero, total, acc, _mm512_cmp_ps_mask(zero, _mm512_setzero_ps(), _CMP_NEQ_UQ));
}

// Activation rows i .. i + kRows - 1 through the whole tile: out[p * 64 + r] for row i + p. Several rows of a
// prefill chunk share each unpacked weight register. With 4 rows the tile's 64 rows go in two passes of 32
// (two zmm slices each): a pass's accumulators (4 x 2 dot products, as many float sums) then fit the 32
// registers with the unpacked codes, where all four slices at once made GCC spill dot products to the stack
// on every column step (15-17% slower products at 304 and 1,024 rows on a Zen 4). The second pass reads the
// group's codes again from L1. A single row (decode) keeps one pass: it streams the tile from memory once.
template <int kRows>
void w4a8_rows(const uint8_t* codes, const uint16_t* sz, const Int8Rows& x, int64_t i, float* out) {
  constexpr int kSlices = kRows >= 4 ? 2 : 4;  // zmm slices of 16 tile rows per pass
  const int64_t groups = x.k / x.group;
  const __m512i low = _mm512_set1_epi8(0x0F);
  for (int half = 0; half < 4 / kSlices; ++half) {
    __m512 acc[kRows][kSlices];
    for (int p = 0; p < kRows; ++p)
      for (int r = 0; r < kSlices; ++r) acc[p][r] = _mm512_setzero_ps();
    for (int64_t g = 0; g < groups; ++g) {
      __m512i dot[kRows][kSlices];
      for (int p = 0; p < kRows; ++p)
        for (int r = 0; r < kSlices; ++r) dot[p][r] = _mm512_setzero_si512();
      const uint8_t* w = codes + g * x.group * (kTileRows / 2) + 64 * kSlices * half;
      for (int64_t c = g * x.group; c < (g + 1) * x.group; c += 8, w += 4 * kTileRows) {
        if (half == 0) prefetch_ahead(w, 4 * kTileRows);
        __m512i lo[kSlices], hi[kSlices];
        for (int r = 0; r < kSlices; ++r) {
          const __m512i bytes = _mm512_loadu_si512(w + 64 * r);
          lo[r] = _mm512_and_si512(bytes, low);
          hi[r] = _mm512_and_si512(_mm512_srli_epi16(bytes, 4), low);
        }
        for (int p = 0; p < kRows; ++p) {
          const __m512i a_lo = broadcast4(x.q + (i + p) * x.k + c), a_hi = broadcast4(x.q + (i + p) * x.k + c + 4);
          for (int r = 0; r < kSlices; ++r) {
            dpbusd(dot[p][r], lo[r], a_lo);
            dpbusd(dot[p][r], hi[r], a_hi);
          }
        }
      }
      const uint16_t* s = sz + g * 2 * kTileRows + 16 * kSlices * half;
      const bool zeros = takes_zero_term(sz + g * 2 * kTileRows + kTileRows);
      for (int p = 0; p < kRows; ++p) {
        const float alpha = x.alpha[(i + p) * groups + g];
        const int32_t sum = x.sum[(i + p) * groups + g];
        const __m512 al = _mm512_set1_ps(alpha), total = _mm512_set1_ps(alpha * static_cast<float>(sum));
        const __m512i eight_sums = _mm512_set1_epi32(8 * sum);
        for (int r = 0; r < kSlices; ++r) {
          const __m512i exact = _mm512_sub_epi32(dot[p][r], eight_sums);
          acc[p][r] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(exact), _mm512_mul_ps(load_bf16x16(s + 16 * r), al), acc[p][r]);
          if (zeros) acc[p][r] = add_zero_term(acc[p][r], load_bf16x16(s + kTileRows + 16 * r), total);
        }
      }
    }
    for (int p = 0; p < kRows; ++p)
      for (int r = 0; r < kSlices; ++r) _mm512_storeu_ps(out + p * kTileRows + 16 * (kSlices * half + r), acc[p][r]);
  }
}

void w4a8_tile(const uint8_t* codes, const uint16_t* sz, const Int8Rows& x, int64_t m, float* out) {
  int64_t i = 0;
  for (; i + 3 < m; i += 4) w4a8_rows<4>(codes, sz, x, i, out + i * kTileRows);
  for (; i < m; ++i) w4a8_rows<1>(codes, sz, x, i, out + i * kTileRows);
}

// Activation rows i .. i + kRows - 1 through the whole tile, as w4a8_rows.
template <int kRows>
void w8a8_rows(const int8_t* codes, const uint16_t* scales, const Int8Rows& x, int64_t i, float* out) {
  const int64_t groups = x.k / x.group;
  const __m512i flip = _mm512_set1_epi8(-128);
  __m512 acc[kRows][4];
  for (int p = 0; p < kRows; ++p)
    for (int r = 0; r < 4; ++r) acc[p][r] = _mm512_setzero_ps();
  for (int64_t g = 0; g < groups; ++g) {
    __m512i dot[kRows][4];
    for (int p = 0; p < kRows; ++p)
      for (int r = 0; r < 4; ++r) dot[p][r] = _mm512_setzero_si512();
    const int8_t* w = codes + g * x.group * kTileRows;
    for (int64_t c = g * x.group; c < (g + 1) * x.group; c += 4, w += 4 * kTileRows) {
      prefetch_ahead(w, 4 * kTileRows);
      __m512i a[kRows];
      for (int p = 0; p < kRows; ++p) a[p] = broadcast4(x.q + (i + p) * x.k + c);
      for (int r = 0; r < 4; ++r) {
        const __m512i weights = _mm512_xor_si512(_mm512_loadu_si512(w + 64 * r), flip);
        for (int p = 0; p < kRows; ++p) dpbusd(dot[p][r], weights, a[p]);
      }
    }
    for (int p = 0; p < kRows; ++p) {
      const __m512i offset = _mm512_set1_epi32(128 * x.sum[(i + p) * groups + g]);
      const __m512 al = _mm512_set1_ps(x.alpha[(i + p) * groups + g]);
      for (int r = 0; r < 4; ++r) {
        const __m512 scale = load_bf16x16(scales + g * kTileRows + 16 * r);
        acc[p][r] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(_mm512_sub_epi32(dot[p][r], offset)), _mm512_mul_ps(scale, al),
                                    acc[p][r]);
      }
    }
  }
  for (int p = 0; p < kRows; ++p)
    for (int r = 0; r < 4; ++r) _mm512_storeu_ps(out + p * kTileRows + 16 * r, acc[p][r]);
}

void w8a8_tile(const int8_t* codes, const uint16_t* scales, const Int8Rows& x, int64_t m, float* out) {
  int64_t i = 0;
  for (; i + 3 < m; i += 4) w8a8_rows<4>(codes, scales, x, i, out + i * kTileRows);
  for (; i < m; ++i) w8a8_rows<1>(codes, scales, x, i, out + i * kTileRows);
}

// 16 weights of one column widened to fp32: bf16 by a shift, fp16 by vcvtph2ps.
template <bool kFp16>
inline __m512 widen16(const uint16_t* p) {
  if (kFp16) return _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(p)));
  return load_bf16x16(p);
}

template <bool kFp16>
void w16_rows(const uint16_t* w, const float* x, int64_t k, int64_t m, float* out) {
  for (int64_t i = 0; i < m; ++i, out += kTileRows, x += k) {
    __m512 acc[4] = {_mm512_setzero_ps(), _mm512_setzero_ps(), _mm512_setzero_ps(), _mm512_setzero_ps()};
    for (int64_t c = 0; c < k; ++c) {
      prefetch_ahead(w + c * kTileRows, 2 * kTileRows);
      const __m512 a = _mm512_set1_ps(x[c]);
      for (int r = 0; r < 4; ++r) acc[r] = _mm512_fmadd_ps(widen16<kFp16>(w + c * kTileRows + 16 * r), a, acc[r]);
    }
    for (int r = 0; r < 4; ++r) _mm512_storeu_ps(out + 16 * r, acc[r]);
  }
}

void w16_tile(const uint16_t* w, bool fp16, const float* x, int64_t k, int64_t m, float* out) {
  fp16 ? w16_rows<true>(w, x, k, m, out) : w16_rows<false>(w, x, k, m, out);
}

// The code of input column c + kColumn for 16 rows times 2^w4a16_shift, converted (isa_avx2.cpp's column8).
template <int kColumn>
inline __m512 column16(__m512i bytes) {
  constexpr int kShift = w4a16_shift(kColumn);
  const __m512i placed = kShift == 27 ? _mm512_srli_epi32(bytes, 1) : bytes;
  return _mm512_cvtepi32_ps(_mm512_and_si512(placed, _mm512_set1_epi32(0x0F << kShift)));
}

template <int kColumn, int kRows>
inline void w4a16_column(const __m512i (&bytes)[4], const float* x, int64_t k, __m512 (&lo)[kRows][4],
                         __m512 (&hi)[kRows][4]) {
  for (int p = 0; p < kRows; ++p) {
    const __m512 a = _mm512_set1_ps(x[p * k + kColumn]);
    for (int r = 0; r < 4; ++r) {
      __m512& acc = kColumn < 4 ? lo[p][r] : hi[p][r];
      acc = _mm512_fmadd_ps(a, column16<kColumn>(bytes[r]), acc);
    }
  }
}

// W4A16: activation rows i .. i + kRows - 1 through the whole tile (isa.h), as isa_avx2.cpp's w4a16_rows.
template <int kRows>
void w4a16_rows(const uint8_t* codes, const uint16_t* sz, const float* x, const float* xsum, int64_t k, int64_t group,
                int64_t i, float* out) {
  const int64_t groups = k / group;
  for (int p = 0; p < kRows; ++p)
    for (int r = 0; r < kTileRows; ++r) out[p * kTileRows + r] = 0.f;
  for (int64_t g = 0; g < groups; ++g) {
    __m512 lo[kRows][4], hi[kRows][4];
    for (int p = 0; p < kRows; ++p)
      for (int r = 0; r < 4; ++r)
        lo[p][r] = _mm512_set1_ps(-8.f * xsum[(i + p) * groups + g]), hi[p][r] = _mm512_setzero_ps();
    const uint8_t* w = codes + g * group * (kTileRows / 2);
    for (int64_t c = g * group; c < (g + 1) * group; c += 8, w += 4 * kTileRows) {
      prefetch_ahead(w, 4 * kTileRows);
      __m512i bytes[4];
      for (int r = 0; r < 4; ++r) bytes[r] = _mm512_loadu_si512(w + 64 * r);
      const float* xc = x + i * k + c;
      w4a16_column<0>(bytes, xc, k, lo, hi);
      w4a16_column<4>(bytes, xc, k, lo, hi);
      w4a16_column<1>(bytes, xc, k, lo, hi);
      w4a16_column<5>(bytes, xc, k, lo, hi);
      w4a16_column<2>(bytes, xc, k, lo, hi);
      w4a16_column<6>(bytes, xc, k, lo, hi);
      w4a16_column<3>(bytes, xc, k, lo, hi);
      w4a16_column<7>(bytes, xc, k, lo, hi);
    }
    const uint16_t* s = sz + g * 2 * kTileRows;
    const bool zeros = takes_zero_term(s + kTileRows);
    for (int p = 0; p < kRows; ++p) {
      alignas(64) float sums[kTileRows];
      for (int r = 0; r < 4; ++r) _mm512_store_ps(sums + 16 * r, _mm512_add_ps(lo[p][r], hi[p][r]));
      w4a16_group(sums, s, zeros ? s + kTileRows : nullptr, xsum[(i + p) * groups + g], kTileRows, out + p * kTileRows);
    }
  }
}

void w4a16_tile(const uint8_t* codes, const uint16_t* sz, const float* x, const float* xsum, int64_t k, int64_t group,
                int64_t m, float* out) {
  int64_t i = 0;
  for (; i + 1 < m; i += 2) w4a16_rows<2>(codes, sz, x, xsum, k, group, i, out + i * kTileRows);
  for (; i < m; ++i) w4a16_rows<1>(codes, sz, x, xsum, k, group, i, out + i * kTileRows);
}

// isa.h's 16 lanes in one register, reduced pairwise as the contract says.
inline __m512 load16(const float* p) { return _mm512_loadu_ps(p); }

inline float sum_lanes(__m512 acc) {
  const __m256 upper = _mm256_castpd_ps(_mm512_extractf64x4_pd(_mm512_castps_pd(acc), 1));
  return sum_lanes(_mm256_add_ps(_mm512_castps512_ps256(acc), upper));
}

// Four keys at a time: their accumulator chains overlap, and each query load serves four keys.
void dot_rows(const float* q, const float* k, int64_t stride, int64_t count, int64_t n, float* out) {
  int64_t r = 0;
  for (; r + 4 <= count; r += 4, k += 4 * stride) {
    __m512 acc[4];
    for (int j = 0; j < 4; ++j) acc[j] = _mm512_setzero_ps();
    for (int64_t i = 0; i < n; i += 16) {
      const __m512 qi = load16(q + i);
      for (int j = 0; j < 4; ++j) acc[j] = _mm512_fmadd_ps(qi, load16(k + j * stride + i), acc[j]);
    }
    for (int j = 0; j < 4; ++j) out[r + j] = sum_lanes(acc[j]);
  }
  for (; r < count; ++r, k += stride) {
    __m512 acc = _mm512_setzero_ps();
    for (int64_t i = 0; i < n; i += 16) acc = _mm512_fmadd_ps(load16(q + i), load16(k + i), acc);
    out[r] = sum_lanes(acc);
  }
}

// kVecs * 16 values of y in registers through every row (not loaded and stored once per row), each a chain
// of fused multiply-adds in row order.
template <int kVecs>
void axpy_slice(const float* w, const float* v, int64_t stride, int64_t count, float* y) {
  __m512 acc[kVecs];
  for (int r = 0; r < kVecs; ++r) acc[r] = _mm512_loadu_ps(y + 16 * r);
  for (int64_t j = 0; j < count; ++j, v += stride) {
    const __m512 a = _mm512_set1_ps(w[j]);
    for (int r = 0; r < kVecs; ++r) acc[r] = _mm512_fmadd_ps(a, load16(v + 16 * r), acc[r]);
  }
  for (int r = 0; r < kVecs; ++r) _mm512_storeu_ps(y + 16 * r, acc[r]);
}

// Slices of 128 values where they fit (eight independent chains hide the multiply-add's latency), then 16.
void axpy_rows(const float* w, const float* v, int64_t stride, int64_t count, int64_t n, float* y) {
  int64_t i = 0;
  for (; i + 128 <= n; i += 128) axpy_slice<8>(w, v + i, stride, count, y + i);
  for (; i + 64 <= n; i += 64) axpy_slice<4>(w, v + i, stride, count, y + i);
  for (; i < n; i += 16) axpy_slice<1>(w, v + i, stride, count, y + i);
}

}  // namespace
}  // namespace edge_infer

#ifdef EDGE_INFER_AMX
// The same kernels plus the tile unit's panels for blocks of 16 prompt rows.
#include "isa_amx.h"
EDGE_INFER_ISA_TABLE_WITH_PANELS(kAmxInt8, "amx-int8", panels_ready, w4a8_panel, w8a8_panel)
#else
EDGE_INFER_ISA_TABLE(kAvx512Vnni, "avx512-vnni")
#endif
