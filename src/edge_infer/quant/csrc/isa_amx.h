// AMX-INT8 panels (isa.h), included by isa_avx512.cpp when built as the amx-int8 variant (after its helpers).
//
// vpdpbusd does 64 multiply-adds per instruction; one tile instruction (tdpbssd) does 16 activation
// rows x 16 weight rows x 64 columns, 16,384. A prompt's rows therefore go through the tile unit in blocks of
// 16: activations as the A tile (row-major int8, straight from the quantized rows), weights as B tiles. The
// W8A8 layout (isa.h) already is the B tiles' (4 consecutive columns of 16 weight rows per 64-byte row, each
// step's 64 rows 256 bytes apart); W4A8 codes are unpacked one group at a time into that layout (low nibbles
// are columns k..k+3, high nibbles k+4..k+7: two quads in order) as code - 8, so that tdpbssd sums the
// weights' part of w4a8_group directly (isa_common.h). Each group's int32 sums leave the tile unit through
// memory and take isa_common.h's float steps in AVX-512, so the result is the scalar reference's, bit for bit.
// A symmetric checkpoint's groups have no zero term: three vector operations per 16 sums (convert, scale,
// add), the floor of the reference's order; the tile products themselves take about as long.
#pragma once

#include <immintrin.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <algorithm>
#include <vector>

namespace edge_infer {
namespace {

constexpr int64_t kBlockRows = 16;  // activation rows per tile

// Linux gives a process the tile registers' state only on request (kernel 5.16 on); one grant covers every
// thread of the process.
bool panels_ready() {
  constexpr long kArchReqXcompPerm = 0x1023, kXfeatureXtiledata = 18;
  static const bool granted = syscall(SYS_arch_prctl, kArchReqXcompPerm, kXfeatureXtiledata) == 0;
  return granted;
}

// tmm0-3: int32 sums, 16 activation rows x 16 weight rows each; tmm4-5: 16 activation rows x ``cols`` int8
// columns; tmm6-7: cols / 4 column quads x 16 weight rows x 4 bytes.
void configure_tiles(int64_t cols) {
  struct alignas(64) {
    uint8_t palette = 1, start_row = 0, reserved[14] = {};
    uint16_t bytes_per_row[16] = {};
    uint8_t rows[16] = {};
  } config;
  for (int t = 0; t < 4; ++t) config.bytes_per_row[t] = 64, config.rows[t] = kBlockRows;
  for (int t = 4; t < 6; ++t) config.bytes_per_row[t] = static_cast<uint16_t>(cols), config.rows[t] = kBlockRows;
  for (int t = 6; t < 8; ++t) config.bytes_per_row[t] = 64, config.rows[t] = static_cast<uint8_t>(cols / 4);
  _tile_loadconfig(&config);
}

// The int32 sums of one group for 32 activation rows (a, x.k apart) x the tile's 64 rows (w: [group/4, 64, 4])
// into dots [32, 64]: 2 x 2 blocks of 16 per pass, each loaded tile feeding two products.
void sums32(const int8_t* a, int64_t k, const uint8_t* w, int64_t group, int64_t cols, int32_t* dots) {
  for (int half = 0; half < 2; ++half) {
    _tile_zero(0);
    _tile_zero(1);
    _tile_zero(2);
    _tile_zero(3);
    for (int64_t c = 0; c < group; c += cols) {
      const uint8_t* b = w + c * kTileRows + 128 * half;  // column quad c / 4, weight rows 32 half ..
      _tile_loadd(4, a + c, k);
      _tile_loadd(5, a + 16 * k + c, k);
      _tile_loadd(6, b, 4 * kTileRows);
      _tile_loadd(7, b + 64, 4 * kTileRows);
      _tile_dpbssd(0, 4, 6);
      _tile_dpbssd(1, 4, 7);
      _tile_dpbssd(2, 5, 6);
      _tile_dpbssd(3, 5, 7);
    }
    int32_t* d = dots + 32 * half;
    _tile_stored(0, d, 4 * kTileRows);
    _tile_stored(1, d + 16, 4 * kTileRows);
    _tile_stored(2, d + 16 * kTileRows, 4 * kTileRows);
    _tile_stored(3, d + 16 * kTileRows + 16, 4 * kTileRows);
  }
}

// The same for 16 activation rows: dots [16, 64].
void sums16(const int8_t* a, int64_t k, const uint8_t* w, int64_t group, int64_t cols, int32_t* dots) {
  _tile_zero(0);
  _tile_zero(1);
  _tile_zero(2);
  _tile_zero(3);
  for (int64_t c = 0; c < group; c += cols) {
    const uint8_t* b = w + c * kTileRows;
    _tile_loadd(4, a + c, k);
    _tile_loadd(6, b, 4 * kTileRows);
    _tile_loadd(7, b + 64, 4 * kTileRows);
    _tile_dpbssd(0, 4, 6);
    _tile_dpbssd(1, 4, 7);
    _tile_loadd(6, b + 128, 4 * kTileRows);
    _tile_loadd(7, b + 192, 4 * kTileRows);
    _tile_dpbssd(2, 4, 6);
    _tile_dpbssd(3, 4, 7);
  }
  _tile_stored(0, dots, 4 * kTileRows);
  _tile_stored(1, dots + 16, 4 * kTileRows);
  _tile_stored(2, dots + 32, 4 * kTileRows);
  _tile_stored(3, dots + 48, 4 * kTileRows);
}

// One group of a W4A8 tile's codes ([group/8, 64, 4] nibble pairs) as W8A8's layout of signed bytes code - 8.
void unpack_group(const uint8_t* codes, int64_t group, uint8_t* out) {
  const __m512i low = _mm512_set1_epi8(0x0F), eight = _mm512_set1_epi8(8);
  for (int64_t step = 0; step < group / 8; ++step, codes += 4 * kTileRows, out += 8 * kTileRows)
    for (int r = 0; r < 4; ++r) {
      const __m512i bytes = _mm512_loadu_si512(codes + 64 * r);
      _mm512_storeu_si512(out + 64 * r, _mm512_sub_epi8(_mm512_and_si512(bytes, low), eight));
      _mm512_storeu_si512(out + 4 * kTileRows + 64 * r,
                          _mm512_sub_epi8(_mm512_and_si512(_mm512_srli_epi16(bytes, 4), low), eight));
    }
}

// Adds one group's sums (dots [16, 64] int32, one block of activation rows) to the block's accumulators out
// [16, 64], as w4a8_group / w8a8_group do.
template <bool kZeros>
void add_group(const int32_t* dots, const uint16_t* scales, const Int8Rows& x, int64_t first_row, int64_t g,
               float* out) {
  const int64_t groups = x.k / x.group;
  __m512 scale[4], zero[4];
  for (int r = 0; r < 4; ++r) {
    scale[r] = load_bf16x16(scales + 16 * r);
    if (kZeros) zero[r] = load_bf16x16(scales + kTileRows + 16 * r);
  }
  for (int64_t p = 0; p < kBlockRows; ++p, dots += kTileRows, out += kTileRows) {
    const float alpha = x.alpha[(first_row + p) * groups + g];
    const __m512 al = _mm512_set1_ps(alpha);
    const __m512 total = _mm512_set1_ps(alpha * static_cast<float>(x.sum[(first_row + p) * groups + g]));
    for (int r = 0; r < 4; ++r) {
      __m512 acc = _mm512_fmadd_ps(_mm512_cvtepi32_ps(_mm512_load_si512(dots + 16 * r)),
                                   _mm512_mul_ps(scale[r], al), _mm512_loadu_ps(out + 16 * r));
      if (kZeros) acc = add_zero_term(acc, zero[r], total);
      _mm512_storeu_ps(out + 16 * r, acc);
    }
  }
}

// Group by group: the group's weights as B tiles (W4A8: unpacked once for all the rows), then the activation
// rows through them in blocks of 32 (the last, if odd, of 16).
template <bool kInt4>
void panel(const uint8_t* codes, const uint16_t* scales, const Int8Rows& x, int64_t m, float* out) {
  const int64_t groups = x.k / x.group;
  const int64_t cols = x.group % 64 == 0 ? 64 : 32;  // columns per tile instruction (groups: 32, 64, 128, 256)
  thread_local std::vector<uint8_t> unpacked;
  if (kInt4) unpacked.resize(x.group * kTileRows);
  alignas(64) int32_t dots[2 * kBlockRows * kTileRows];
  configure_tiles(cols);
  std::fill(out, out + m * kTileRows, 0.f);
  for (int64_t g = 0; g < groups; ++g) {
    const uint8_t* w = codes + g * x.group * kTileRows;  // [group/4, 64, 4]
    const uint16_t* group_scales = scales + g * (kInt4 ? 2 : 1) * kTileRows;
    const bool zeros = kInt4 && takes_zero_term(group_scales + kTileRows);
    if (kInt4) {
      unpack_group(codes + g * x.group * kTileRows / 2, x.group, unpacked.data());
      w = unpacked.data();
    }
    for (int64_t i = 0; i < m;) {
      const int64_t rows = m - i >= 2 * kBlockRows ? 2 * kBlockRows : kBlockRows;
      const int8_t* a = x.q + i * x.k + g * x.group;
      if (rows == kBlockRows)
        sums16(a, x.k, w, x.group, cols, dots);
      else
        sums32(a, x.k, w, x.group, cols, dots);
      for (int64_t p = 0; p < rows; p += kBlockRows)
        (zeros ? add_group<true> : add_group<false>)(dots + p * kTileRows, group_scales, x, i + p, g,
                                                     out + (i + p) * kTileRows);
      i += rows;
    }
  }
  _tile_release();
}

void w4a8_panel(const uint8_t* codes, const uint16_t* sz, const Int8Rows& x, int64_t m, float* out) {
  panel<true>(codes, sz, x, m, out);
}

void w8a8_panel(const int8_t* codes, const uint16_t* scales, const Int8Rows& x, int64_t m, float* out) {
  panel<false>(reinterpret_cast<const uint8_t*>(codes), scales, x, m, out);
}

}  // namespace
}  // namespace edge_infer
