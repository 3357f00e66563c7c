// Writing weights into the int8-activation kernels' 64-row tiles (layouts in isa.h) while a model loads, and
// quantizing them for PyTorch's int4 kernel (cpu_int4), which packs its own layout from int32 codes.
// As PyTorch operators, quantizing a block of rows took ~8 passes over a widened copy and packing it a
// strided copy of 4-byte pieces: most of a 3B thinker's load (W4A8 decoder and towers from bf16: 30 s, from
// stored codes 18-20 s; here 14.5 s and 12-13 s, on a VM whose fresh memory faults in slowly). Each half tile is
// one task: its rows are read once, their codes chosen as quantize.py chooses them (the same fp32
// operations in the same order, so the same bits) and written where the kernels read them.
#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <torch/library.h>

#include "pack_math.h"

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <limits>
#include <mutex>
#include <string>
#include <vector>

namespace edge_infer {
namespace {

constexpr int64_t kTileRows = 64;

// Where a packed weight's tiles start: the codes [tiles, k / columns_per_step, 64, 4] bytes and the bf16
// scales [tiles, groups, parts, 64] (parts: scale and zero for 4 bits, the scale alone for 8).
struct TileDest {
  uint8_t* codes;
  uint16_t* scales;
  int64_t bits, k, group, parts, first_tile;
  int64_t rows_out;  // the block's rows padded to whole tiles

  int64_t steps() const { return k / (bits == 4 ? 8 : 4); }
  uint8_t* tile_codes(int64_t tile) const { return codes + tile * steps() * kTileRows * 4; }
  uint16_t* tile_scales(int64_t tile) const { return scales + tile * (k / group) * parts * kTileRows; }

  // One row's codes (k of them, one per byte: 0..15 for 4 bits, -127..127 for 8) into row r of a tile.
  void put_codes(uint8_t* tile, int64_t r, const uint8_t* row) const {
    uint8_t* out = tile + r * 4;
    if (bits == 4) {  // columns k..k+7: byte i holds column k+i (low nibble) and k+4+i (high)
      for (int64_t s = 0; s < steps(); ++s, row += 8, out += kTileRows * 4)
        for (int i = 0; i < 4; ++i) out[i] = static_cast<uint8_t>(row[i] | (row[4 + i] << 4));
    } else {
      for (int64_t s = 0; s < steps(); ++s, row += 4, out += kTileRows * 4) std::memcpy(out, row, 4);
    }
  }

  // Row ``row`` of the block (counted from first_tile's first row): its codes and per-group side values.
  void put_row(int64_t row, const uint8_t* row_codes, const uint16_t* scale, const uint16_t* zero) const {
    const int64_t tile = first_tile + row / kTileRows, r = row % kTileRows;
    put_codes(tile_codes(tile), r, row_codes);
    uint16_t* side = tile_scales(tile) + r;
    for (int64_t g = 0; g < k / group; ++g, side += parts * kTileRows) {
      side[0] = scale[g];
      if (parts == 2) side[kTileRows] = zero[g];
    }
  }
};

// Half tiles are the tasks: a block of one tile (a wide linear's 64 rows) is still two, and on 64-byte cache
// lines two threads never write one line (the tensors start on a line; a half tile's pieces of one step are
// 128 contiguous bytes, its side values of a group 64).
constexpr int64_t kTaskRows = 32;

// run(first, last) over rows [0, rows_out) in whole tasks (the last may be short).
template <typename F>
void for_each_task(int64_t rows_out, const F& run) {
  const int64_t tasks = (rows_out + kTaskRows - 1) / kTaskRows;
  at::parallel_for(0, tasks, 1, [&](int64_t begin, int64_t end) {
    run(begin * kTaskRows, std::min(end * kTaskRows, rows_out));
  });
}

TileDest tile_dest(const at::Tensor& codes, const at::Tensor& scales, int64_t bits, int64_t group, int64_t first_tile,
                   int64_t rows) {
  TORCH_CHECK(bits == 4 || bits == 8, "bits must be 4 or 8, got ", bits);
  TORCH_CHECK(codes.dim() == 4 && codes.is_contiguous() && codes.size(2) == kTileRows && codes.size(3) == 4 &&
                  codes.scalar_type() == (bits == 4 ? at::kByte : at::kChar),
              "codes must be the kernel's contiguous [tiles, steps, 64, 4] tensor");
  const int64_t k = codes.size(1) * (bits == 4 ? 8 : 4), parts = bits == 4 ? 2 : 1, groups = group > 0 ? k / group : 0;
  TORCH_CHECK(group > 0 && k % group == 0, "group size ", group, " does not divide ", k, " padded columns");
  TORCH_CHECK(scales.scalar_type() == at::kBFloat16 && scales.is_contiguous() &&
                  scales.numel() == codes.size(0) * groups * parts * kTileRows,
              "scales must be the kernel's contiguous bf16 [tiles, groups, ", parts, ", 64] tensor");
  const int64_t tiles = (rows + kTileRows - 1) / kTileRows;
  TORCH_CHECK(first_tile >= 0 && first_tile + tiles <= codes.size(0), "rows from tile ", first_tile, " on do not fit ",
              codes.size(0), " tiles");
  return {static_cast<uint8_t*>(codes.data_ptr()), reinterpret_cast<uint16_t*>(scales.data_ptr<at::BFloat16>()), bits, k, group,
          parts, first_tile, tiles * kTileRows};
}

// Row-major int32 codes [rows_out, k] (PyTorch's int4 kernel packs them into its own layout) and that kernel's
// (scale, zero) pairs [groups, pair_rows, 2] from row first_row on, in its dtype: bf16, or fp32 holding the bf16
// values.
struct RowDest {
  int32_t* codes;
  void* pairs;
  bool pairs_fp32;
  int64_t pair_rows, first_row;
  int64_t bits, k, group;
  int64_t rows_out;

  void put_row(int64_t row, const uint8_t* row_codes, const uint16_t* scale, const uint16_t* zero) const {
    int32_t* out = codes + row * k;
    for (int64_t j = 0; j < k; ++j) out[j] = row_codes[j];
    const int64_t at = first_row + row;
    for (int64_t g = 0; g < k / group; ++g) {
      const int64_t i = (g * pair_rows + at) * 2;
      if (pairs_fp32) {
        static_cast<float*>(pairs)[i] = pack::bf16_value(scale[g]);
        static_cast<float*>(pairs)[i + 1] = pack::bf16_value(zero[g]);
      } else {
        static_cast<uint16_t*>(pairs)[i] = scale[g];
        static_cast<uint16_t*>(pairs)[i + 1] = zero[g];
      }
    }
  }
};

// Codes and side values of one row of a float weight (pack_math.h's quantize_group for each group); false
// when a group has none. ``values`` is scratch for one group.
template <typename T, typename Dest>
bool quantize_row(const T* w, int64_t cols, const Dest& d, const pack::GroupLoops& loops, bool symmetric,
                  float* values, uint8_t* codes, uint16_t* scale, uint16_t* zero) {
  for (int64_t g = 0; g * d.group < d.k; ++g) {
    const int64_t c0 = g * d.group, real = std::max<int64_t>(0, std::min(d.group, cols - c0));
    for (int64_t j = 0; j < real; ++j) values[j] = static_cast<float>(w[c0 + j]);
    std::fill(values + real, values + d.group, 0.0f);  // padded columns are zeros and count, as in quantize.py
    if (!pack::quantize_group(values, d.group, static_cast<int>(d.bits), symmetric, loops, codes + c0, scale + g, zero + g))
      return false;
  }
  return true;
}

// The block's rows quantized into ``d``; rows past the weight's (to rows_out) get zero codes and side values.
template <typename T, typename Dest>
int64_t quantize_block(const at::Tensor& weight, const Dest& d, const pack::GroupLoops& loops, bool symmetric) {
  const int64_t rows = weight.size(0), cols = weight.size(1), groups = d.k / d.group;
  const T* w = weight.data_ptr<T>();
  std::mutex bad_lock;
  int64_t first_bad = std::numeric_limits<int64_t>::max();
  for_each_task(d.rows_out, [&](int64_t first, int64_t last) {
    std::vector<float> values(d.group);
    std::vector<uint8_t> codes(d.k);
    std::vector<uint16_t> scale(groups), zero(groups);
    for (int64_t row = first; row < last; ++row) {
      if (row >= rows) {  // a partial last tile: zero codes and side values (weights of 0, never stored out)
        std::fill(codes.begin(), codes.end(), 0);
        std::fill(scale.begin(), scale.end(), 0);
        std::fill(zero.begin(), zero.end(), 0);
      } else if (!quantize_row(w + row * cols, cols, d, loops, symmetric, values.data(), codes.data(), scale.data(), zero.data())) {
        std::lock_guard<std::mutex> hold(bad_lock);
        first_bad = std::min(first_bad, row);
        continue;
      }
      d.put_row(row, codes.data(), scale.data(), zero.data());
    }
  });
  return first_bad == std::numeric_limits<int64_t>::max() ? -1 : first_bad;
}

// weight [rows, cols] (fp32, bf16 or fp16, contiguous) quantized group-wise into ``d`` with the loops of ``isa``;
// returns the first row holding a NaN or infinity, or a group too wide for a finite bf16 scale (no codes), or -1.
template <typename Dest>
int64_t quantize_weight(const at::Tensor& weight, const Dest& d, bool symmetric, const std::string& isa) {
  TORCH_CHECK(weight.dim() == 2 && weight.is_contiguous(), "weight must be a contiguous [rows, columns] tensor");
  TORCH_CHECK(weight.size(1) <= d.k && weight.size(1) > d.k - d.group, "weight has ", weight.size(1),
              " columns; the kernel takes ", d.k, " padded to groups of ", d.group);
  TORCH_CHECK(weight.size(0) <= d.rows_out, "weight has ", weight.size(0), " rows; the block holds ", d.rows_out);
  TORCH_CHECK(d.bits == 4 || symmetric, "8-bit weights are symmetric");
  const pack::GroupLoops loops = pack::group_loops(isa != "scalar");
  switch (weight.scalar_type()) {
    case at::kFloat: return quantize_block<float>(weight, d, loops, symmetric);
    case at::kBFloat16: return quantize_block<at::BFloat16>(weight, d, loops, symmetric);
    case at::kHalf: return quantize_block<at::Half>(weight, d, loops, symmetric);
    default: TORCH_CHECK_VALUE(false, "quantizing takes fp32, bf16 or fp16 weights, got ", weight.scalar_type());
  }
  return -1;  // not reached
}

// Into the int8 kernels' tiles from first_tile on.
int64_t quantize_into_tiles(const at::Tensor& weight, at::Tensor& codes, at::Tensor& scales, int64_t bits, int64_t group,
                            bool symmetric, int64_t first_tile, const std::string& isa) {
  return quantize_weight(weight, tile_dest(codes, scales, bits, group, first_tile, weight.size(0)), symmetric, isa);
}

// 4-bit, for PyTorch's int4 kernel: codes int32 [block rows, k] (rows past the weight's: zeros, the kernel's
// padding) and the kernel's scale/zero pairs [k / group, rows, 2] (bf16 or fp32) from row first_row on.
int64_t quantize_into_rows(const at::Tensor& weight, at::Tensor& codes, at::Tensor& pairs, int64_t group, bool symmetric,
                           int64_t first_row, const std::string& isa) {
  TORCH_CHECK(codes.dim() == 2 && codes.is_contiguous() && codes.scalar_type() == at::kInt,
              "codes must be a contiguous int32 [rows, columns] tensor");
  const int64_t k = codes.size(1);
  TORCH_CHECK(group > 0 && k % group == 0, "group size ", group, " does not divide ", k, " padded columns");
  TORCH_CHECK(pairs.dim() == 3 && pairs.is_contiguous() && pairs.size(0) == k / group && pairs.size(2) == 2 &&
                  (pairs.scalar_type() == at::kBFloat16 || pairs.scalar_type() == at::kFloat),
              "pairs must be the kernel's contiguous bf16 or fp32 [", k / group, ", rows, 2] tensor");
  TORCH_CHECK(first_row >= 0 && first_row + codes.size(0) <= pairs.size(1), "rows ", first_row, " to ",
              first_row + codes.size(0), " do not fit the kernel's ", pairs.size(1));
  const RowDest d{codes.data_ptr<int32_t>(), pairs.data_ptr(), pairs.scalar_type() == at::kFloat, pairs.size(1),
                  first_row, 4, k, group, codes.size(0)};
  return quantize_weight(weight, d, symmetric, isa);
}

// Codes already chosen (a checkpoint's): codes [rows, k] one per byte, or for 4 bits [rows, k / 2] two per
// byte as stored (column 2j in the low nibble); scales and zeros [rows, k / group] bf16 (zeros: 4 bits only).
void pack_into_tiles(const at::Tensor& row_codes, const at::Tensor& row_scales, const c10::optional<at::Tensor>& row_zeros,
                     at::Tensor& codes, at::Tensor& scales, int64_t bits, int64_t group, int64_t first_tile) {
  TORCH_CHECK(row_codes.dim() == 2, "codes must be a [rows, columns] tensor");
  const int64_t rows = row_codes.size(0);
  const TileDest d = tile_dest(codes, scales, bits, group, first_tile, rows);
  const bool nibbles = bits == 4 && row_codes.size(1) == d.k / 2;
  TORCH_CHECK(row_codes.is_contiguous() && row_codes.element_size() == 1 && (nibbles || row_codes.size(1) == d.k),
              "codes must be contiguous bytes [rows, ", d.k, "]", bits == 4 ? " or two per byte" : "");
  const int64_t groups = d.k / group;
  for (const at::Tensor* t : {&row_scales, row_zeros.has_value() ? &*row_zeros : &row_scales})
    TORCH_CHECK(t->scalar_type() == at::kBFloat16 && t->is_contiguous() && t->dim() == 2 && t->size(0) == rows &&
                    t->size(1) == groups,
                "scales and zeros must be contiguous bf16 [", rows, ", ", groups, "]");
  const uint8_t* in = static_cast<const uint8_t*>(row_codes.data_ptr());
  const uint16_t* s_in = reinterpret_cast<const uint16_t*>(row_scales.data_ptr<at::BFloat16>());
  const uint16_t* z_in = row_zeros.has_value() ? reinterpret_cast<const uint16_t*>(row_zeros->data_ptr<at::BFloat16>()) : nullptr;
  for_each_task(d.rows_out, [&](int64_t first, int64_t last) {
    std::vector<uint8_t> unpacked(d.k);
    std::vector<uint16_t> none(groups, 0);
    for (int64_t row = first; row < last; ++row) {
      if (row >= rows) {  // a partial last tile, as above
        std::fill(unpacked.begin(), unpacked.end(), 0);
        d.put_row(row, unpacked.data(), none.data(), none.data());
        continue;
      }
      const uint8_t* row_in = in + row * row_codes.size(1);
      if (nibbles)
        for (int64_t j = 0; j < d.k / 2; ++j) {
          unpacked[2 * j] = row_in[j] & 15;
          unpacked[2 * j + 1] = row_in[j] >> 4;
        }
      d.put_row(row, nibbles ? unpacked.data() : row_in, s_in + row * groups, z_in ? z_in + row * groups : none.data());
    }
  });
}

}  // namespace
}  // namespace edge_infer

TORCH_LIBRARY_FRAGMENT(edge_infer, lib) {
  lib.def("quantize_into_tiles(Tensor weight, Tensor(a!) codes, Tensor(b!) scales, int bits, int group, bool symmetric, "
          "int first_tile, str isa) -> int");
  lib.def("pack_into_tiles(Tensor row_codes, Tensor row_scales, Tensor? row_zeros, Tensor(a!) codes, Tensor(b!) scales, "
          "int bits, int group, int first_tile) -> ()");
  lib.def("quantize_into_rows(Tensor weight, Tensor(a!) codes, Tensor(b!) pairs, int group, bool symmetric, int first_row, "
          "str isa) -> int");
}

TORCH_LIBRARY_IMPL(edge_infer, CPU, lib) {
  lib.impl("quantize_into_tiles", &edge_infer::quantize_into_tiles);
  lib.impl("pack_into_tiles", &edge_infer::pack_into_tiles);
  lib.impl("quantize_into_rows", &edge_infer::quantize_into_rows);
}
