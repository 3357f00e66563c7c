// Rows of a 4-bit weight dequantized into a float block, so that a prompt's products run on the BLAS PyTorch calls
// (MKL's fp32 GEMM, oneDNN's bf16 one), at several times a vector kernel's rate at a prompt's rows; the block is a
// few output rows' worth, reused. Two layouts: PyTorch's int4 kernel's (cpu_int4, quant/kernel.py) and edge-infer's
// W4A8 tiles (cpu_w4a16, quant/int8_kernels.py; csrc/isa.h).
//
// The layout is PyTorch's, learned by probing in kernel.py (tile_rows, _tile_positions): tiles of t rows, each
// k-major: column c's t codes in t / 2 bytes, row r's at nibble position[r] (byte position / 2, the high nibble
// when odd). A code q stands for (q - 8) * scale + zero, in fp32, per group of ``group`` columns.
#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <torch/library.h>

#include <algorithm>
#include <cstdint>
#include <cstring>

#include "pack_math.h"

namespace edge_infer {
namespace {

constexpr int64_t kMaxTileRows = 64;
constexpr int64_t kTaskColumns = 512;  // columns per task, rounded up to whole groups

// Whether row r < t / 2 sits in byte r's low nibble and row t / 2 + r in its high one (PyTorch's AVX2 and AVX-512
// layouts): the codes of a column then come out in row order without a gather, and the loops vectorize.
bool split_layout(const int64_t* position, int64_t t) {
  for (int64_t r = 0; r < t; ++r)
    if (position[r] != (r < t / 2 ? 2 * r : 2 * (r - t / 2) + 1)) return false;
  return true;
}

template <typename P, typename O>
void dequantize_tiles(const uint8_t* packed, const P* pairs, const int64_t* position, int64_t t, int64_t k,
                      int64_t group, int64_t n_padded, int64_t first_row, int64_t rows, O* out) {
  const bool split = split_layout(position, t);
  // One task per tile and span of columns (whole groups): its t rows of out^T over those columns, i.e. t adjacent
  // values in each of their rows of out [k, rows]. A block has a few tiles, so the columns share out the threads.
  const int64_t span = (kTaskColumns + group - 1) / group * group, spans = (k + span - 1) / span;
  at::parallel_for(0, rows / t * spans, 1, [&](int64_t begin, int64_t end) {
    float scale[kMaxTileRows], zero[kMaxTileRows], codes[kMaxTileRows];
    for (int64_t task = begin; task < end; ++task) {
      const int64_t tile = task / spans, c0 = task % spans * span, c1 = c0 + span < k ? c0 + span : k;
      const int64_t row0 = first_row + tile * t;
      const uint8_t* bytes = packed + row0 * (k / 2) + c0 * (t / 2);
      for (int64_t c = c0; c < c1; ++c, bytes += t / 2) {
        if (c % group == 0) {
          const P* pair = pairs + ((c / group) * n_padded + row0) * 2;
          for (int64_t r = 0; r < t; ++r) scale[r] = static_cast<float>(pair[2 * r]), zero[r] = static_cast<float>(pair[2 * r + 1]);
        }
        if (split) {
          for (int64_t j = 0; j < t / 2; ++j) codes[j] = static_cast<float>(bytes[j] & 15);
          for (int64_t j = 0; j < t / 2; ++j) codes[t / 2 + j] = static_cast<float>(bytes[j] >> 4);
        } else {
          for (int64_t r = 0; r < t; ++r) codes[r] = static_cast<float>((bytes[position[r] / 2] >> (4 * (position[r] % 2))) & 15);
        }
        O* o = out + c * rows + tile * t;
        for (int64_t r = 0; r < t; ++r) o[r] = static_cast<O>((codes[r] - 8.f) * scale[r] + zero[r]);
      }
    }
  });
}

// out [k, rows] = W^T for weight rows first_row .. first_row + rows (tiles of position.numel() rows) of the
// packed [n_padded, k / 2] weight with its (scale, zero) pairs [k / group, n_padded, 2]: fp32, or the pairs' bf16.
void int4_rows_transposed(const at::Tensor& packed, const at::Tensor& pairs, const at::Tensor& position,
                          int64_t group, int64_t first_row, at::Tensor& out) {
  const int64_t t = position.numel(), n_padded = packed.size(0), k = 2 * packed.size(1), rows = out.size(1);
  TORCH_CHECK(packed.dim() == 2 && packed.scalar_type() == at::kByte && packed.is_contiguous(),
              "int4_rows_transposed: packed must be contiguous uint8 [n_padded, k / 2]");
  TORCH_CHECK(t >= 2 && t <= kMaxTileRows && t % 2 == 0 && position.scalar_type() == at::kLong && position.is_contiguous(),
              "int4_rows_transposed: position must be a tile's int64 nibble positions (2 to 64 rows)");
  TORCH_CHECK(group > 0 && k % group == 0 && pairs.is_contiguous() && pairs.dim() == 3 && pairs.size(0) == k / group &&
                  pairs.size(1) == n_padded && pairs.size(2) == 2,
              "int4_rows_transposed: pairs must be contiguous [k / group, n_padded, 2]");
  TORCH_CHECK(out.dim() == 2 && out.size(0) == k && out.is_contiguous() &&
                  (out.scalar_type() == at::kFloat || out.scalar_type() == pairs.scalar_type()),
              "int4_rows_transposed: out must be contiguous [k, rows], fp32 or the pairs' dtype");
  // A partial last tile (48 rows after tiles of 64) starts where the whole tiles end, not at a multiple of its size.
  TORCH_CHECK(first_row >= 0 && rows % t == 0 && first_row + rows <= n_padded,
              "int4_rows_transposed: rows ", first_row, " .. ", first_row + rows, " are not whole tiles of ", t,
              " within ", n_padded);
  const int64_t* pos = position.data_ptr<int64_t>();
  for (int64_t r = 0; r < t; ++r) TORCH_CHECK(pos[r] >= 0 && pos[r] < t, "int4_rows_transposed: position out of the tile");
  const uint8_t* codes = packed.data_ptr<uint8_t>();
  TORCH_CHECK(pairs.scalar_type() == at::kBFloat16 || pairs.scalar_type() == at::kFloat,
              "int4_rows_transposed: pairs must be bf16 or fp32");
  if (pairs.scalar_type() == at::kFloat) {
    dequantize_tiles(codes, pairs.data_ptr<float>(), pos, t, k, group, n_padded, first_row, rows, out.data_ptr<float>());
  } else if (out.scalar_type() == at::kFloat) {
    dequantize_tiles(codes, pairs.data_ptr<at::BFloat16>(), pos, t, k, group, n_padded, first_row, rows,
                     out.data_ptr<float>());
  } else {
    dequantize_tiles(codes, pairs.data_ptr<at::BFloat16>(), pos, t, k, group, n_padded, first_row, rows,
                     out.data_ptr<at::BFloat16>());
  }
}

// out [k, 64 * tiles] = W^T for the row tiles first_tile .. first_tile + tiles of a weight in W4A8's tiles (codes
// uint8 [Np/64, Kp/8, 64, 4], bf16 scales and zeros [Np/64, Kp/G, 2, 64]): (code - 8) * scale + zero in fp32, then
// rounded to out's dtype (fp32 or bf16).
template <typename O>
void dequantize_w4_tiles(const uint8_t* codes, const uint16_t* sz, int64_t k, int64_t group, int64_t first_tile,
                         int64_t tiles, O* out) {
  constexpr int64_t kRows = 64;
  const int64_t groups = k / group, rows = tiles * kRows;
  const int64_t span = (kTaskColumns + group - 1) / group * group, spans = (k + span - 1) / span;
  using pack::bf16_value;
  at::parallel_for(0, tiles * spans, 1, [&](int64_t begin, int64_t end) {
    for (int64_t task = begin; task < end; ++task) {
      const int64_t tile = task / spans, c0 = task % spans * span, c1 = std::min(c0 + span, k);
      const uint8_t* tile_codes = codes + (first_tile + tile) * kRows * (k / 2);
      const uint16_t* tile_sz = sz + (first_tile + tile) * groups * 2 * kRows;
      float scale[kRows], zero[kRows];
      uint32_t words[kRows];  // 8 columns' codes of each row (isa.h's W4A8 layout)
      for (int64_t c = c0; c < c1; c += 8) {  // groups are multiples of 16 columns
        if (c % group == 0)
          for (int64_t r = 0; r < kRows; ++r)
            scale[r] = bf16_value(tile_sz[c / group * 2 * kRows + r]),
            zero[r] = bf16_value(tile_sz[(c / group * 2 + 1) * kRows + r]);
        std::memcpy(words, tile_codes + c / 8 * 4 * kRows, sizeof words);
        // Column by column over the 64 rows: contiguous loads and stores, which the compiler vectorizes.
        for (int j = 0; j < 8; ++j) {
          const int shift = 8 * (j % 4) + 4 * (j / 4);
          O* o = out + (c + j) * rows + tile * kRows;
          for (int64_t r = 0; r < kRows; ++r)
            o[r] = static_cast<O>(static_cast<float>(static_cast<int32_t>((words[r] >> shift) & 15) - 8) * scale[r] + zero[r]);
        }
      }
    }
  });
}

void w4_tiles_transposed(const at::Tensor& codes, const at::Tensor& scales, int64_t group, int64_t first_tile,
                         at::Tensor& out) {
  TORCH_CHECK(codes.dim() == 4 && codes.size(2) == 64 && codes.size(3) == 4 && codes.scalar_type() == at::kByte &&
                  codes.is_contiguous(),
              "w4_tiles_transposed: codes must be contiguous uint8 [Np/64, Kp/8, 64, 4]");
  const int64_t k = codes.size(1) * 8, tiles = out.dim() == 2 ? out.size(1) / 64 : 0;
  TORCH_CHECK(group > 0 && k % group == 0 && scales.scalar_type() == at::kBFloat16 && scales.is_contiguous() &&
                  scales.numel() == codes.size(0) * (k / group) * 2 * 64,
              "w4_tiles_transposed: scales must be contiguous bf16 [Np/64, Kp/G, 2, 64]");
  TORCH_CHECK(out.dim() == 2 && out.size(0) == k && out.size(1) % 64 == 0 && out.is_contiguous() &&
                  (out.scalar_type() == at::kFloat || out.scalar_type() == at::kBFloat16),
              "w4_tiles_transposed: out must be contiguous fp32 or bf16 [Kp, 64 * tiles]");
  TORCH_CHECK(first_tile >= 0 && first_tile + tiles <= codes.size(0), "w4_tiles_transposed: tiles ", first_tile, " .. ",
              first_tile + tiles, " are not within the weight's ", codes.size(0));
  const uint8_t* c = codes.data_ptr<uint8_t>();
  const uint16_t* s = reinterpret_cast<const uint16_t*>(scales.data_ptr<at::BFloat16>());
  if (out.scalar_type() == at::kFloat)
    dequantize_w4_tiles(c, s, k, group, first_tile, tiles, out.data_ptr<float>());
  else
    dequantize_w4_tiles(c, s, k, group, first_tile, tiles, out.data_ptr<at::BFloat16>());
}

}  // namespace
}  // namespace edge_infer

TORCH_LIBRARY_FRAGMENT(edge_infer, lib) {
  lib.def("int4_rows_transposed(Tensor packed, Tensor pairs, Tensor position, int group, int first_row, "
          "Tensor(a!) out) -> ()");
  lib.def("w4_tiles_transposed(Tensor codes, Tensor scales, int group, int first_tile, Tensor(a!) out) -> ()");
}

TORCH_LIBRARY_IMPL(edge_infer, CPU, lib) {
  lib.impl("int4_rows_transposed", &edge_infer::int4_rows_transposed);
  lib.impl("w4_tiles_transposed", &edge_infer::w4_tiles_transposed);
}
