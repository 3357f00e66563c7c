// AVX2 (vpmaddubsw + vpmaddwd) and, compiled again with EDGE_INFER_AVX_VNNI, AVX-VNNI (256-bit vpdpbusd).
//
// One ymm register holds 8 rows x 4 bytes of a tile, so a tile of 64 rows is 8 loads per 4 (int8) or
// 8 (int4) input columns, each multiplied with the same broadcast activations. The 4-bit codes go into
// the unsigned operand unchanged (no sign trick: the zero point is corrected once per group from the
// activation sum). On AVX2 the products stay int16 through a 32-column slice (two nibbles' pairs per
// step, four steps: at most 4 * 2 * 2 * 15 * 127 = 30480, within int16's 32767) and are widened to int32
// once per slice: a quarter of the vpmaddwd and vpaddd the loop would otherwise run on every step.
//
// EDGE_INFER_VNNI_EVEX (tests only) spells the AVX-VNNI dot product with its AVX512-VL encoding, so the
// variant's code can be checked on a CPU that has AVX512-VNNI but not AVX-VNNI.
#include <immintrin.h>

#define EDGE_INFER_OWN_ROUNDING  // round_bf16 and round_add_bf16 below
#include "isa_common.h"
#include "isa_x86.h"

namespace edge_infer {
namespace {

#if defined(EDGE_INFER_AVX_VNNI)
inline __m256i dpbusd(__m256i acc, __m256i u, __m256i s) {
#if defined(EDGE_INFER_VNNI_EVEX)
  return _mm256_dpbusd_epi32(acc, u, s);
#else
  return _mm256_dpbusd_avx_epi32(acc, u, s);
#endif
}

// partial + sum of 4 products lo * a_lo and 4 products hi * a_hi per int32 lane.
inline __m256i dot_nibbles(__m256i partial, __m256i lo, __m256i hi, __m256i a_lo, __m256i a_hi) {
  return dpbusd(dpbusd(partial, lo, a_lo), hi, a_hi);
}

// The partial sums are int32 already.
inline __m256i add_partial(__m256i acc, __m256i partial) { return _mm256_add_epi32(acc, partial); }

// acc + sum of 4 products (w + 128) * a per lane (vpdpbusd takes an unsigned operand): see kInt8Offset.
inline __m256i dot_int8(__m256i acc, __m256i w, __m256i a) {
  return dpbusd(acc, _mm256_xor_si256(w, _mm256_set1_epi8(-128)), a);
}
constexpr int32_t kInt8Offset = 128;
#else
// partial + the products lo * a_lo and hi * a_hi, summed in pairs per int16 lane. A partial takes the
// kNibbleSteps steps of a 32-column slice: 4 * 2 * 2 * 15 * 127 at most, within int16.
inline __m256i dot_nibbles(__m256i partial, __m256i lo, __m256i hi, __m256i a_lo, __m256i a_hi) {
  return _mm256_add_epi16(partial, _mm256_add_epi16(_mm256_maddubs_epi16(lo, a_lo), _mm256_maddubs_epi16(hi, a_hi)));
}

// acc + the int16 partial sums widened and summed in pairs: once per slice, not once per step.
inline __m256i add_partial(__m256i acc, __m256i partial) {
  return _mm256_add_epi32(acc, _mm256_madd_epi16(partial, _mm256_set1_epi16(1)));
}

// vpmaddubsw takes unsigned x signed: |w| x (a with w's sign); |w|, |a| <= 127 keeps a pair within int16.
inline __m256i dot_int8(__m256i acc, __m256i w, __m256i a) {
  const __m256i pairs = _mm256_maddubs_epi16(_mm256_abs_epi8(w), _mm256_sign_epi8(a, w));
  return _mm256_add_epi32(acc, _mm256_madd_epi16(pairs, _mm256_set1_epi16(1)));
}
constexpr int32_t kInt8Offset = 0;
#endif

// 8-column steps whose products a partial sum takes before it is added to the int32 dot products.
constexpr int kNibbleSteps = 4;

inline __m256 load_bf16x8(const uint16_t* p) {
  const __m128i raw = _mm_loadu_si128(reinterpret_cast<const __m128i*>(p));
  return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(raw), 16));
}

// to_bf16 on 8 lanes, the result left in the upper halves of fp32 lanes (a bf16 value as fp32, exactly): round to
// nearest even in the integer bits, a NaN to 0x7FC0.
inline __m256 round_to_bf16(__m256 x) {
  const __m256i bits = _mm256_castps_si256(x);
  const __m256i odd = _mm256_and_si256(_mm256_srli_epi32(bits, 16), _mm256_set1_epi32(1));
  const __m256i rounded = _mm256_and_si256(_mm256_add_epi32(bits, _mm256_add_epi32(odd, _mm256_set1_epi32(0x7FFF))),
                                           _mm256_set1_epi32(static_cast<int32_t>(0xFFFF0000u)));
  return _mm256_blendv_ps(_mm256_castsi256_ps(rounded), _mm256_castsi256_ps(_mm256_set1_epi32(0x7FC00000)),
                          _mm256_cmp_ps(x, x, _CMP_UNORD_Q));
}

// Two vectors of round_to_bf16's values as 16 bf16 in order (vpackusdw interleaves the 128-bit halves).
inline void store_bf16x16(uint16_t* p, __m256 a, __m256 b) {
  const __m256i packed = _mm256_packus_epi32(_mm256_srli_epi32(_mm256_castps_si256(a), 16),
                                             _mm256_srli_epi32(_mm256_castps_si256(b), 16));
  _mm256_storeu_si256(reinterpret_cast<__m256i*>(p), _mm256_permute4x64_epi64(packed, 0xD8));
}

// A product's rows are stored 64 values at a time: straight-line code, no alias checks or remainder loops to pay
// for on each (the same functions as isa_common.h's).
void round_bf16(const float* x, int64_t n, uint16_t* out) {
  int64_t i = 0;
  for (; i + 16 <= n; i += 16)
    store_bf16x16(out + i, round_to_bf16(_mm256_loadu_ps(x + i)), round_to_bf16(_mm256_loadu_ps(x + i + 8)));
  for (; i < n; ++i) out[i] = to_bf16(x[i]);
}

void round_add_bf16(const float* x, const uint16_t* bias, int64_t n, uint16_t* out) {
  int64_t i = 0;
  for (; i + 16 <= n; i += 16)
    store_bf16x16(out + i, round_to_bf16(_mm256_add_ps(round_to_bf16(_mm256_loadu_ps(x + i)), load_bf16x8(bias + i))),
                  round_to_bf16(_mm256_add_ps(round_to_bf16(_mm256_loadu_ps(x + i + 8)), load_bf16x8(bias + i + 8))));
  for (; i < n; ++i) out[i] = to_bf16(bf16_to_float(to_bf16(x[i])) + bf16_to_float(bias[i]));
}

inline __m256i broadcast4(const int8_t* p) {
  int32_t v;
  __builtin_memcpy(&v, p, sizeof v);
  return _mm256_set1_epi32(v);
}

// Activation rows i .. i + kRows - 1 through the tile's rows r0 .. r0 + 8 kRegs - 1: out[p * 64 + r] for row i + p.
// Two activation rows share each unpacked weight register (a prefill chunk); one row takes the whole tile.
template <int kRows, int kRegs>
void w4a8_rows(const uint8_t* codes, const uint16_t* sz, const Int8Rows& x, int64_t i, int r0, float* out) {
  const int64_t groups = x.k / x.group;
  const __m256i low = _mm256_set1_epi8(0x0F);
  __m256 acc[kRows][kRegs];
  for (int p = 0; p < kRows; ++p)
    for (int r = 0; r < kRegs; ++r) acc[p][r] = _mm256_setzero_ps();
  for (int64_t g = 0; g < groups; ++g) {
    __m256i dot[kRows][kRegs];
    for (int p = 0; p < kRows; ++p)
      for (int r = 0; r < kRegs; ++r) dot[p][r] = _mm256_setzero_si256();
    const uint8_t* w = codes + g * x.group * (kTileRows / 2) + 4 * r0;
    for (int64_t slice = g * x.group; slice < (g + 1) * x.group; slice += 8 * kNibbleSteps) {  // groups: 32 | size
      __m256i partial[kRows][kRegs];
      for (int p = 0; p < kRows; ++p)
        for (int r = 0; r < kRegs; ++r) partial[p][r] = _mm256_setzero_si256();
      for (int64_t c = slice; c < slice + 8 * kNibbleSteps; c += 8, w += 4 * kTileRows) {
        prefetch_ahead(w, 32 * kRegs);
        __m256i a_lo[kRows], a_hi[kRows];
        for (int p = 0; p < kRows; ++p) {
          a_lo[p] = broadcast4(x.q + (i + p) * x.k + c);
          a_hi[p] = broadcast4(x.q + (i + p) * x.k + c + 4);
        }
        for (int r = 0; r < kRegs; ++r) {
          const __m256i bytes = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(w + 32 * r));
          const __m256i lo = _mm256_and_si256(bytes, low), hi = _mm256_and_si256(_mm256_srli_epi16(bytes, 4), low);
          for (int p = 0; p < kRows; ++p) partial[p][r] = dot_nibbles(partial[p][r], lo, hi, a_lo[p], a_hi[p]);
        }
      }
      for (int p = 0; p < kRows; ++p)
        for (int r = 0; r < kRegs; ++r) dot[p][r] = add_partial(dot[p][r], partial[p][r]);
    }
    const uint16_t* s = sz + g * 2 * kTileRows;
    const bool zeros = takes_zero_term(s + kTileRows);
    s += r0;
    for (int p = 0; p < kRows; ++p) {
      const float alpha = x.alpha[(i + p) * groups + g];
      const int32_t sum = x.sum[(i + p) * groups + g];
      const __m256 al = _mm256_set1_ps(alpha), total = _mm256_set1_ps(alpha * static_cast<float>(sum));
      const __m256i eight_sums = _mm256_set1_epi32(8 * sum);
      for (int r = 0; r < kRegs; ++r) {
        const __m256i exact = _mm256_sub_epi32(dot[p][r], eight_sums);
        acc[p][r] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(exact), _mm256_mul_ps(load_bf16x8(s + 8 * r), al), acc[p][r]);
        if (zeros) {  // w4a8_group's zero term, in the lanes whose zero is not 0
          const __m256 zero = load_bf16x8(s + kTileRows + 8 * r);
          acc[p][r] = _mm256_blendv_ps(acc[p][r], _mm256_fmadd_ps(zero, total, acc[p][r]),
                                       _mm256_cmp_ps(zero, _mm256_setzero_ps(), _CMP_NEQ_UQ));
        }
      }
    }
  }
  for (int p = 0; p < kRows; ++p)
    for (int r = 0; r < kRegs; ++r) _mm256_storeu_ps(out + p * kTileRows + r0 + 8 * r, acc[p][r]);
}

void w4a8_tile(const uint8_t* codes, const uint16_t* sz, const Int8Rows& x, int64_t m, float* out) {
  int64_t i = 0;
  for (; i + 1 < m; i += 2)  // pairs of rows, half a tile at a time (16 accumulators would not fit 16 registers)
    for (int r0 = 0; r0 < kTileRows; r0 += 32) w4a8_rows<2, 4>(codes, sz, x, i, r0, out + i * kTileRows);
  for (; i < m; ++i) w4a8_rows<1, 8>(codes, sz, x, i, 0, out + i * kTileRows);
}

// Activation rows i .. i + kRows - 1 through the tile's rows r0 .. r0 + 8 kRegs - 1, as w4a8_rows.
template <int kRows, int kRegs>
void w8a8_rows(const int8_t* codes, const uint16_t* scales, const Int8Rows& x, int64_t i, int r0, float* out) {
  const int64_t groups = x.k / x.group;
  __m256 acc[kRows][kRegs];
  for (int p = 0; p < kRows; ++p)
    for (int r = 0; r < kRegs; ++r) acc[p][r] = _mm256_setzero_ps();
  for (int64_t g = 0; g < groups; ++g) {
    __m256i dot[kRows][kRegs];
    for (int p = 0; p < kRows; ++p)
      for (int r = 0; r < kRegs; ++r) dot[p][r] = _mm256_setzero_si256();
    const int8_t* w = codes + g * x.group * kTileRows + 4 * r0;
    for (int64_t c = g * x.group; c < (g + 1) * x.group; c += 4, w += 4 * kTileRows) {
      prefetch_ahead(w, 32 * kRegs);
      __m256i a[kRows];
      for (int p = 0; p < kRows; ++p) a[p] = broadcast4(x.q + (i + p) * x.k + c);
      for (int r = 0; r < kRegs; ++r) {
        const __m256i weights = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(w + 32 * r));
        for (int p = 0; p < kRows; ++p) dot[p][r] = dot_int8(dot[p][r], weights, a[p]);
      }
    }
    for (int p = 0; p < kRows; ++p) {
      const __m256i offset = _mm256_set1_epi32(kInt8Offset * x.sum[(i + p) * groups + g]);
      const __m256 al = _mm256_set1_ps(x.alpha[(i + p) * groups + g]);
      for (int r = 0; r < kRegs; ++r) {
        const __m256 scale = load_bf16x8(scales + g * kTileRows + r0 + 8 * r);
        const __m256i exact = _mm256_sub_epi32(dot[p][r], offset);
        acc[p][r] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(exact), _mm256_mul_ps(scale, al), acc[p][r]);
      }
    }
  }
  for (int p = 0; p < kRows; ++p)
    for (int r = 0; r < kRegs; ++r) _mm256_storeu_ps(out + p * kTileRows + r0 + 8 * r, acc[p][r]);
}

void w8a8_tile(const int8_t* codes, const uint16_t* scales, const Int8Rows& x, int64_t m, float* out) {
  int64_t i = 0;
  for (; i + 1 < m; i += 2)
    for (int r0 = 0; r0 < kTileRows; r0 += 32) w8a8_rows<2, 4>(codes, scales, x, i, r0, out + i * kTileRows);
  for (; i < m; ++i) w8a8_rows<1, 8>(codes, scales, x, i, 0, out + i * kTileRows);
}

// 8 weights of one column widened to fp32: bf16 by a shift, fp16 by F16C's vcvtph2ps.
template <bool kFp16>
inline __m256 widen8(const uint16_t* p) {
  const __m128i raw = _mm_loadu_si128(reinterpret_cast<const __m128i*>(p));
  if (kFp16) return _mm256_cvtph_ps(raw);
  return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(raw), 16));
}

template <bool kFp16>
void w16_rows(const uint16_t* w, const float* x, int64_t k, int64_t m, float* out) {
  for (int64_t i = 0; i < m; ++i, out += kTileRows, x += k) {
    __m256 acc[8];
    for (int r = 0; r < 8; ++r) acc[r] = _mm256_setzero_ps();
    for (int64_t c = 0; c < k; ++c) {
      prefetch_ahead(w + c * kTileRows, 2 * kTileRows);
      const __m256 a = _mm256_broadcast_ss(x + c);
      for (int r = 0; r < 8; ++r) acc[r] = _mm256_fmadd_ps(widen8<kFp16>(w + c * kTileRows + 8 * r), a, acc[r]);
    }
    for (int r = 0; r < 8; ++r) _mm256_storeu_ps(out + 8 * r, acc[r]);
  }
}

void w16_tile(const uint16_t* w, bool fp16, const float* x, int64_t k, int64_t m, float* out) {
  fp16 ? w16_rows<true>(w, x, k, m, out) : w16_rows<false>(w, x, k, m, out);
}

// The code of input column c + kColumn for 8 rows times 2^w4a16_shift, converted: the nibble masked where it sits in
// each row's 32 bits (isa.h's W4A8 layout), the top one shifted right once first (one operation and the conversion
// per column, where shifting every nibble down took two).
template <int kColumn>
inline __m256 column8(__m256i bytes) {
  constexpr int kShift = w4a16_shift(kColumn);
  const __m256i placed = kShift == 27 ? _mm256_srli_epi32(bytes, 1) : bytes;
  return _mm256_cvtepi32_ps(_mm256_and_si256(placed, _mm256_set1_epi32(0x0F << kShift)));
}

// One input column through every accumulator of its chain (isa.h: lo for columns 0-3 of 8, hi for 4-7); the
// kRows * kRegs chains of a step interleave, so their multiply-adds overlap.
template <int kColumn, int kRows, int kRegs>
inline void w4a16_column(const __m256i (&bytes)[kRegs], const float* x, int64_t k, __m256 (&lo)[kRows][kRegs],
                         __m256 (&hi)[kRows][kRegs]) {
  for (int p = 0; p < kRows; ++p) {
    const __m256 a = _mm256_broadcast_ss(x + p * k + kColumn);
    for (int r = 0; r < kRegs; ++r) {
      __m256& acc = kColumn < 4 ? lo[p][r] : hi[p][r];
      acc = _mm256_fmadd_ps(a, column8<kColumn>(bytes[r]), acc);
    }
  }
}

// W4A16: activation rows i .. i + kRows - 1 through the tile's rows r0 .. r0 + 8 kRegs - 1 (isa.h); each converted
// column serves every row of the call. 2 kRows kRegs accumulators and kRegs code registers fit the 16 ymm.
template <int kRows, int kRegs>
void w4a16_rows(const uint8_t* codes, const uint16_t* sz, const float* x, const float* xsum, int64_t k, int64_t group,
                int64_t i, int r0, float* out) {
  const int64_t groups = k / group;
  for (int p = 0; p < kRows; ++p)
    for (int r = 0; r < 8 * kRegs; ++r) out[p * kTileRows + r0 + r] = 0.f;
  for (int64_t g = 0; g < groups; ++g) {
    __m256 lo[kRows][kRegs], hi[kRows][kRegs];
    for (int p = 0; p < kRows; ++p)
      for (int r = 0; r < kRegs; ++r)
        lo[p][r] = _mm256_set1_ps(-8.f * xsum[(i + p) * groups + g]), hi[p][r] = _mm256_setzero_ps();
    const uint8_t* w = codes + g * group * (kTileRows / 2) + 4 * r0;
    for (int64_t c = g * group; c < (g + 1) * group; c += 8, w += 4 * kTileRows) {
      prefetch_ahead(w, 32 * kRegs);
      __m256i bytes[kRegs];
      for (int r = 0; r < kRegs; ++r) bytes[r] = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(w + 32 * r));
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
      alignas(32) float sums[8 * kRegs];
      for (int r = 0; r < kRegs; ++r) _mm256_store_ps(sums + 8 * r, _mm256_add_ps(lo[p][r], hi[p][r]));
      w4a16_group(sums, s + r0, zeros ? s + kTileRows + r0 : nullptr, xsum[(i + p) * groups + g], 8 * kRegs,
                  out + p * kTileRows + r0);
    }
  }
}

void w4a16_tile(const uint8_t* codes, const uint16_t* sz, const float* x, const float* xsum, int64_t k, int64_t group,
                int64_t m, float* out) {
  int64_t i = 0;
  for (; i + 1 < m; i += 2)
    for (int r0 = 0; r0 < kTileRows; r0 += 16) w4a16_rows<2, 2>(codes, sz, x, xsum, k, group, i, r0, out + i * kTileRows);
  for (; i < m; ++i)
    for (int r0 = 0; r0 < kTileRows; r0 += 32) w4a16_rows<1, 4>(codes, sz, x, xsum, k, group, i, r0, out + i * kTileRows);
}

// isa.h's 16 lanes in two registers (lanes 0-7 and 8-15), reduced pairwise as the contract says.
inline __m256 load8(const float* p) { return _mm256_loadu_ps(p); }

// Four keys at a time: their accumulator chains overlap, and each query load serves four keys.
void dot_rows(const float* q, const float* k, int64_t stride, int64_t count, int64_t n, float* out) {
  int64_t r = 0;
  for (; r + 4 <= count; r += 4, k += 4 * stride) {
    __m256 lo[4], hi[4];
    for (int j = 0; j < 4; ++j) lo[j] = hi[j] = _mm256_setzero_ps();
    for (int64_t i = 0; i < n; i += 16) {
      const __m256 q_lo = load8(q + i), q_hi = load8(q + i + 8);
      for (int j = 0; j < 4; ++j) {
        lo[j] = _mm256_fmadd_ps(q_lo, load8(k + j * stride + i), lo[j]);
        hi[j] = _mm256_fmadd_ps(q_hi, load8(k + j * stride + i + 8), hi[j]);
      }
    }
    for (int j = 0; j < 4; ++j) out[r + j] = sum_lanes(_mm256_add_ps(lo[j], hi[j]));
  }
  for (; r < count; ++r, k += stride) {
    __m256 lo = _mm256_setzero_ps(), hi = _mm256_setzero_ps();
    for (int64_t i = 0; i < n; i += 16) {
      lo = _mm256_fmadd_ps(load8(q + i), load8(k + i), lo);
      hi = _mm256_fmadd_ps(load8(q + i + 8), load8(k + i + 8), hi);
    }
    out[r] = sum_lanes(_mm256_add_ps(lo, hi));
  }
}

// kVecs * 8 values of y in registers through every row (not loaded and stored once per row), each a chain
// of fused multiply-adds in row order.
template <int kVecs>
void axpy_slice(const float* w, const float* v, int64_t stride, int64_t count, float* y) {
  __m256 acc[kVecs];
  for (int r = 0; r < kVecs; ++r) acc[r] = _mm256_loadu_ps(y + 8 * r);
  for (int64_t j = 0; j < count; ++j, v += stride) {
    const __m256 a = _mm256_set1_ps(w[j]);
    for (int r = 0; r < kVecs; ++r) acc[r] = _mm256_fmadd_ps(a, load8(v + 8 * r), acc[r]);
  }
  for (int r = 0; r < kVecs; ++r) _mm256_storeu_ps(y + 8 * r, acc[r]);
}

// Slices of 64 values: eight independent chains hide the multiply-add's latency.
void axpy_rows(const float* w, const float* v, int64_t stride, int64_t count, int64_t n, float* y) {
  int64_t i = 0;
  for (; i + 64 <= n; i += 64) axpy_slice<8>(w, v + i, stride, count, y + i);
  for (; i < n; i += 16) axpy_slice<2>(w, v + i, stride, count, y + i);
}

}  // namespace
}  // namespace edge_infer

#if defined(EDGE_INFER_AVX_VNNI)
EDGE_INFER_ISA_TABLE(kAvxVnni, "avx-vnni")
#else
EDGE_INFER_ISA_TABLE(kAvx2, "avx2")
#endif
