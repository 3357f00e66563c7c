// int4 or int8 weights x int8 activations (W4A8, W8A8), int4 weights x fp32 activations (W4A16) and 16-bit weights x
// fp32 activations (W16A32) linears, through the ISA variant the caller names.
//
// PyTorch's CPU int4 kernel dequantizes every weight to float before it
// multiplies, which makes a single-token product compute-bound (about 19 G
// weights/s per core on an AVX-512 machine, far under memory bandwidth). These
// kernels keep the weights as integers and multiply them with int8-quantized
// activations on integer dot-product instructions (isa_*.cpp), so a
// matrix-vector product runs at the speed the packed bytes stream from memory.
// Which variant runs is chosen in Python from the CPU capability model
// (hardware/kernels.py), so that EDGE_INFER_CPU_FEATURES masks reach it.
#include "linear.h"

#include <ATen/Parallel.h>
#include <torch/library.h>

#include <algorithm>
#include <atomic>
#include <vector>

namespace edge_infer {

const IsaKernels& isa_named(const std::string& name) {
  const IsaKernels* isa = find_isa(name.c_str());
  TORCH_CHECK(isa != nullptr, "edge_infer: the ", name, " kernel variant is not built into this library");
  return *isa;
}

PackedWeight check_packed(const char* what, int64_t bits, const at::Tensor& codes, const at::Tensor& scales, int64_t k,
                          int64_t group, int64_t n) {
  TORCH_CHECK(bits == 4 || bits == 8, what, ": weights are 4 or 8 bits, not ", bits);
  const int64_t per_step = bits == 4 ? 8 : 4;  // input columns per 4 bytes of a row
  TORCH_CHECK(codes.dim() == 4 && codes.size(2) == kTileRows && codes.size(3) == 4 &&
                  codes.scalar_type() == (bits == 4 ? at::kByte : at::kChar) && codes.is_contiguous(),
              what, ": packed codes must be contiguous ", bits == 4 ? "uint8 [Np/64, Kp/8, 64, 4]" : "int8 [Np/64, Kp/4, 64, 4]");
  TORCH_CHECK(group > 0 && group % 16 == 0, what, ": group size ", group, " is not a multiple of 16");
  TORCH_CHECK(codes.size(1) * per_step == k && k % group == 0,
              what, ": the input has ", k, " columns; the weight packs ", codes.size(1) * per_step, " in groups of ", group);
  const int64_t tiles = codes.size(0);
  TORCH_CHECK(n > (tiles - 1) * kTileRows && n <= tiles * kTileRows, what, ": ", n, " outputs do not fit ", tiles, " row tiles");
  const int64_t per_group = bits == 4 ? 2 : 1;  // scales (and zeros) per row and group
  TORCH_CHECK(scales.scalar_type() == at::kBFloat16 && scales.is_contiguous() &&
                  scales.numel() == tiles * (k / group) * per_group * kTileRows,
              what, ": scales must be contiguous bf16 ", bits == 4 ? "[Np/64, Kp/G, 2, 64]" : "[Np/64, Kp/G, 64]");
  return {bits, codes.data_ptr(), reinterpret_cast<const uint16_t*>(scales.data_ptr<at::BFloat16>()), k, group, n};
}

namespace {

constexpr int64_t kRowBlock = 16;  // activation rows per tile call: keeps the float scratch in L1
// Tile-unit panels (isa.h) take activation rows in blocks of kPanelBlock, up to kPanelRows per call: a W4A8
// tile's codes are unpacked once per call, its fp32 sums (32 KiB) stay in L1/L2.
constexpr int64_t kPanelBlock = 16, kPanelRows = 128;
// Fewer rows stay on the vector kernel: padded to a block they cost it more (2048 x 22016 on 2 threads: 8 rows
// tie, 0.95 against 1.0 ms; 10 rows 1.4 on the vector kernel against 1.0 padded; 12, 1.37 against 0.86).
constexpr int64_t kPanelMinRows = 9;

void quantize(const IsaKernels& isa, const float* x, int64_t k, int64_t group, int8_t* q, float* alpha, int32_t* sum) {
  isa.quantize_f32(x, k, group, q, alpha, sum);
}

void quantize(const IsaKernels& isa, const at::BFloat16* x, int64_t k, int64_t group, int8_t* q, float* alpha,
              int32_t* sum) {
  isa.quantize_bf16(reinterpret_cast<const uint16_t*>(x), k, group, q, alpha, sum);
}

// A row of ``cols`` values quantized as k (a whole number of groups; cols > k - group): the columns past
// ``cols`` as zeros, from a copy of the last group, so the caller need not pad the input.
constexpr int64_t kMaxGroup = 1024;
template <typename T>
void quantize_row(const IsaKernels& isa, const T* x, int64_t cols, int64_t k, int64_t group, int8_t* q, float* alpha,
                  int32_t* sum) {
  const int64_t whole = cols / group * group;
  if (whole > 0) quantize(isa, x, whole, group, q, alpha, sum);
  if (whole == k) return;
  T last[kMaxGroup];
  std::fill(std::copy(x + whole, x + cols, last), last + group, T(0));
  quantize(isa, last, group, group, q + whole, alpha + whole / group, sum + whole / group);
}

// One output row of a tile, plus its bias (when not null) as PyTorch would add it after: the bits of the
// separate add, without its pass over the output.
void store(const IsaKernels&, const float* x, const float* bias, int64_t n, float* out) {
  if (bias == nullptr) return (void)std::copy(x, x + n, out);
  for (int64_t j = 0; j < n; ++j) out[j] = x[j] + bias[j];
}

void store(const IsaKernels& isa, const float* x, const at::BFloat16* bias, int64_t n, at::BFloat16* out) {
  if (bias == nullptr) return isa.round_bf16(x, n, reinterpret_cast<uint16_t*>(out));
  isa.round_add_bf16(x, reinterpret_cast<const uint16_t*>(bias), n, reinterpret_cast<uint16_t*>(out));
}

}  // namespace

void for_each_tile(int64_t tiles, const std::function<void(int64_t begin, int64_t end)>& run) {
  const int64_t threads = std::min<int64_t>(at::get_num_threads(), tiles);
  if (threads <= 1) return run(0, tiles);
  std::atomic<int64_t> next{0};
  at::parallel_for(0, threads, 1, [&](int64_t, int64_t) {
    int64_t begin = next.load();
    while (begin < tiles) {
      const int64_t take = std::max<int64_t>(1, (tiles - begin) / (kShareDivisor * threads));
      if (next.compare_exchange_weak(begin, begin + take)) {  // else ``begin`` is reloaded: try again from there
        run(begin, std::min(begin + take, tiles));
        begin = next.load();
      }
    }
  });
}

template <typename T>
void int8_matmul(const IsaKernels& isa, const PackedWeight& w, const T* x, int64_t m, T* out, const T* bias,
                 int64_t x_cols) {
  const int64_t k = w.k, groups = k / w.group, tiles = (w.n + kTileRows - 1) / kTileRows;
  const bool panels = m >= kPanelMinRows && isa.panels_ready != nullptr && isa.panels_ready();
  // The tile unit takes whole blocks of rows: a prompt's last, partial block goes through it padded with
  // rows of zeros (their sums are dropped), not through the vector kernel, which is several times slower per row.
  const int64_t rows_quantized = panels ? (m + kPanelBlock - 1) / kPanelBlock * kPanelBlock : m;
  // Scratch from PyTorch's allocator, not the C++ heap: a thinker's worker reuses its blocks (block_cache.cpp).
  const at::Tensor q_rows = at::empty({rows_quantized * k}, at::kChar),
                   alpha_rows = at::empty({rows_quantized * groups}, at::kFloat),
                   sum_rows = at::empty({rows_quantized * groups}, at::kInt);
  int8_t* q = q_rows.data_ptr<int8_t>();
  float* alpha = alpha_rows.data_ptr<float>();
  int32_t* sum = sum_rows.data_ptr<int32_t>();
  std::fill(q + m * k, q + rows_quantized * k, int8_t{0});
  std::fill(alpha + m * groups, alpha + rows_quantized * groups, 0.f);
  std::fill(sum + m * groups, sum + rows_quantized * groups, 0);
  const int64_t cols = x_cols > 0 ? x_cols : k;
  // Rows are independent: a prompt's are shared out (on the tile unit the products no longer dwarf this pass).
  at::parallel_for(0, m, kRowBlock, [&](int64_t first, int64_t last) {
    for (int64_t i = first; i < last; ++i)
      quantize_row(isa, x + i * cols, cols, k, w.group, q + i * k, alpha + i * groups, sum + i * groups);
  });
  const int64_t tile_codes = kTileRows * k / (w.bits == 4 ? 2 : 1);  // bytes of one tile's codes
  const int64_t tile_scales = groups * (w.bits == 4 ? 2 : 1) * kTileRows;
  // Each thread takes whole row tiles and runs every activation row through a tile while it is in cache:
  // on the tile unit where there is one, else through the tile kernel.
  for_each_tile(tiles, [&](int64_t begin, int64_t end) {
    float scratch[kRowBlock * kTileRows];
    std::vector<float> panel_out(panels ? kPanelRows * kTileRows : 0);
    for (int64_t t = begin; t < end; ++t) {
      const uint8_t* codes = static_cast<const uint8_t*>(w.codes) + t * tile_codes;
      const uint16_t* scales = w.scales + t * tile_scales;
      const int64_t rows = std::min(kTileRows, w.n - t * kTileRows);
      int64_t i0 = 0;
      for (; panels && i0 < m; i0 += kPanelRows) {
        const int64_t block = std::min(kPanelRows, rows_quantized - i0);
        const Int8Rows a{q + i0 * k, alpha + i0 * groups, sum + i0 * groups, k, w.group};
        if (w.bits == 4)
          isa.w4a8_panel(codes, scales, a, block, panel_out.data());
        else
          isa.w8a8_panel(reinterpret_cast<const int8_t*>(codes), scales, a, block, panel_out.data());
        for (int64_t i = 0; i < std::min(block, m - i0); ++i)
          store(isa, panel_out.data() + i * kTileRows, bias == nullptr ? nullptr : bias + t * kTileRows, rows,
                out + (i0 + i) * w.n + t * kTileRows);
      }
      for (; i0 < m; i0 += kRowBlock) {
        const int64_t block = std::min(kRowBlock, m - i0);
        const Int8Rows a{q + i0 * k, alpha + i0 * groups, sum + i0 * groups, k, w.group};
        if (w.bits == 4)
          isa.w4a8_tile(codes, scales, a, block, scratch);
        else
          isa.w8a8_tile(reinterpret_cast<const int8_t*>(codes), scales, a, block, scratch);
        for (int64_t i = 0; i < block; ++i)
          store(isa, scratch + i * kTileRows, bias == nullptr ? nullptr : bias + t * kTileRows, rows,
                out + (i0 + i) * w.n + t * kTileRows);
      }
    }
  });
}

template void int8_matmul<float>(const IsaKernels&, const PackedWeight&, const float*, int64_t, float*, const float*,
                                 int64_t);
template void int8_matmul<at::BFloat16>(const IsaKernels&, const PackedWeight&, const at::BFloat16*, int64_t,
                                        at::BFloat16*, const at::BFloat16*, int64_t);

namespace {

void widen_row(const IsaKernels&, const float* x, int64_t n, float* out) { std::copy(x, x + n, out); }

void widen_row(const IsaKernels& isa, const at::BFloat16* x, int64_t n, float* out) {
  isa.widen_bf16(reinterpret_cast<const uint16_t*>(x), n, 1, n, out);
}

}  // namespace

template <typename T>
void w4a16_matmul(const IsaKernels& isa, const PackedWeight& w, const T* x, int64_t m, T* out, const T* bias,
                  int64_t x_cols) {
  const int64_t k = w.k, groups = k / w.group, tiles = (w.n + kTileRows - 1) / kTileRows;
  const int64_t cols = x_cols > 0 ? x_cols : k;
  // The rows widened to fp32 and padded with zero columns to whole groups, their group sums in column order (here,
  // once, so that every variant adds the same zero terms), then scaled per column as the tile kernels take them.
  const at::Tensor rows = at::zeros({m, k}, at::kFloat), sums = at::empty({m, groups}, at::kFloat);
  float* xf = rows.data_ptr<float>();
  float* xsum = sums.data_ptr<float>();
  at::parallel_for(0, m, kRowBlock, [&](int64_t first, int64_t last) {
    for (int64_t i = first; i < last; ++i) {
      widen_row(isa, x + i * cols, cols, xf + i * k);
      for (int64_t g = 0; g < groups; ++g) {
        float total = 0.f;
        for (int64_t c = g * w.group; c < (g + 1) * w.group; ++c) total += xf[i * k + c];
        xsum[i * groups + g] = total;
      }
      for (int64_t c = 0; c < k; ++c) xf[i * k + c] *= 1.f / static_cast<float>(1u << w4a16_shift(c));  // isa.h
    }
  });
  const int64_t tile_codes = kTileRows * k / 2, tile_scales = groups * 2 * kTileRows;
  for_each_tile(tiles, [&](int64_t begin, int64_t end) {
    float scratch[kRowBlock * kTileRows];
    for (int64_t t = begin; t < end; ++t) {
      const int64_t n = std::min(kTileRows, w.n - t * kTileRows);
      for (int64_t i0 = 0; i0 < m; i0 += kRowBlock) {
        const int64_t block = std::min(kRowBlock, m - i0);
        isa.w4a16_tile(static_cast<const uint8_t*>(w.codes) + t * tile_codes, w.scales + t * tile_scales, xf + i0 * k,
                       xsum + i0 * groups, k, w.group, block, scratch);
        for (int64_t i = 0; i < block; ++i)
          store(isa, scratch + i * kTileRows, bias == nullptr ? nullptr : bias + t * kTileRows, n,
                out + (i0 + i) * w.n + t * kTileRows);
      }
    }
  });
}

template void w4a16_matmul<float>(const IsaKernels&, const PackedWeight&, const float*, int64_t, float*, const float*,
                                  int64_t);
template void w4a16_matmul<at::BFloat16>(const IsaKernels&, const PackedWeight&, const at::BFloat16*, int64_t,
                                         at::BFloat16*, const at::BFloat16*, int64_t);

namespace {

// x [M, K] (bf16 or fp32; K up to the packed Kp, which pads it to whole groups) -> [M, out_features] in x's
// dtype, plus ``bias`` [out_features] of that dtype if given.
at::Tensor int8_linear(const at::Tensor& x, const at::Tensor& codes, const at::Tensor& scales, int64_t bits,
                       int64_t group, int64_t out_features, const std::string& isa, const c10::optional<at::Tensor>& bias) {
  TORCH_CHECK(x.dim() == 2 && x.is_contiguous(), "int8_linear: x must be a contiguous [M, K] tensor");
  const int64_t cols = x.size(1), packed_cols = codes.dim() == 4 ? codes.size(1) * (bits == 4 ? 8 : 4) : cols;
  // Inputs narrower than the packing by less than a group take zeros for the rest (int8_matmul).
  const int64_t k = cols < packed_cols && cols > packed_cols - group && group <= kMaxGroup ? packed_cols : cols;
  const PackedWeight w = check_packed("int8_linear", bits, codes, scales, k, group, out_features);
  TORCH_CHECK(!bias.has_value() || (bias->is_contiguous() && bias->numel() == out_features &&
                                    bias->scalar_type() == x.scalar_type()),
              "int8_linear: the bias must be ", out_features, " contiguous values of the activations' dtype");
  const IsaKernels& kernels = isa_named(isa);
  at::Tensor y = at::empty({x.size(0), out_features}, x.options());
  if (x.scalar_type() == at::kBFloat16) {
    int8_matmul(kernels, w, x.data_ptr<at::BFloat16>(), x.size(0), y.data_ptr<at::BFloat16>(),
                bias.has_value() ? bias->data_ptr<at::BFloat16>() : nullptr, cols);
  } else {
    TORCH_CHECK(x.scalar_type() == at::kFloat, "int8_linear: activations must be bf16 or fp32, got ", x.scalar_type());
    int8_matmul(kernels, w, x.data_ptr<float>(), x.size(0), y.data_ptr<float>(),
                bias.has_value() ? bias->data_ptr<float>() : nullptr, cols);
  }
  return y;
}

// x [M, K] fp32 -> [M, out_features] fp32, for 16-bit weights [Np/64, K, 64] (bf16 or fp16) widened in the kernel.
at::Tensor w16_linear(const at::Tensor& x, const at::Tensor& w, int64_t out_features, const std::string& isa) {
  TORCH_CHECK(x.dim() == 2 && x.is_contiguous() && x.scalar_type() == at::kFloat,
              "w16_linear: x must be a contiguous fp32 [M, K] tensor");
  TORCH_CHECK(w.dim() == 3 && w.size(2) == kTileRows && w.is_contiguous() &&
                  (w.scalar_type() == at::kBFloat16 || w.scalar_type() == at::kHalf),
              "w16_linear: weights must be contiguous bf16 or fp16 [Np/64, K, 64]");
  const int64_t m = x.size(0), k = x.size(1), tiles = w.size(0);
  TORCH_CHECK(w.size(1) == k, "w16_linear: the input has ", k, " columns; the weight ", w.size(1));
  TORCH_CHECK(out_features > (tiles - 1) * kTileRows && out_features <= tiles * kTileRows,
              "w16_linear: ", out_features, " outputs do not fit ", tiles, " row tiles");
  const IsaKernels& kernels = isa_named(isa);
  const bool fp16 = w.scalar_type() == at::kHalf;
  const uint16_t* weights = static_cast<const uint16_t*>(w.data_ptr());
  const float* xp = x.data_ptr<float>();
  at::Tensor y = at::empty({m, out_features}, x.options());
  float* out = y.data_ptr<float>();
  for_each_tile(tiles, [&](int64_t begin, int64_t end) {
    float scratch[kRowBlock * kTileRows];
    for (int64_t t = begin; t < end; ++t) {
      const int64_t rows = std::min(kTileRows, out_features - t * kTileRows);
      for (int64_t i0 = 0; i0 < m; i0 += kRowBlock) {
        const int64_t block = std::min(kRowBlock, m - i0);
        kernels.w16_tile(weights + t * k * kTileRows, fp16, xp + i0 * k, k, block, scratch);
        for (int64_t i = 0; i < block; ++i)
          std::copy(scratch + i * kTileRows, scratch + i * kTileRows + rows, out + (i0 + i) * out_features + t * kTileRows);
      }
    }
  });
  return y;
}

// x [M, cols] (bf16 or fp32, cols up to the packed Kp as int8_linear takes it) -> [M, out_features] in x's dtype,
// for 4-bit codes in W4A8's tiles times the activations as they are, widened to fp32 (W4A16), plus ``bias``.
at::Tensor w4a16_linear(const at::Tensor& x, const at::Tensor& codes, const at::Tensor& scales, int64_t group,
                        int64_t out_features, const std::string& isa, const c10::optional<at::Tensor>& bias) {
  TORCH_CHECK(x.dim() == 2 && x.is_contiguous() && (x.scalar_type() == at::kBFloat16 || x.scalar_type() == at::kFloat),
              "w4a16_linear: x must be a contiguous bf16 or fp32 [M, K] tensor");
  const int64_t cols = x.size(1), k = codes.dim() == 4 ? codes.size(1) * 8 : cols;
  TORCH_CHECK(cols <= k && cols > k - group, "w4a16_linear: the input has ", cols, " columns; the weight packs ", k,
              " in groups of ", group);
  PackedWeight w = check_packed("w4a16_linear", 4, codes, scales, k, group, out_features);
  w.w4a16 = true;
  TORCH_CHECK(!bias.has_value() || (bias->is_contiguous() && bias->numel() == out_features &&
                                    bias->scalar_type() == x.scalar_type()),
              "w4a16_linear: the bias must be ", out_features, " contiguous values of the activations' dtype");
  const IsaKernels& kernels = isa_named(isa);
  at::Tensor y = at::empty({x.size(0), out_features}, x.options());
  if (x.scalar_type() == at::kBFloat16)
    w4a16_matmul(kernels, w, x.data_ptr<at::BFloat16>(), x.size(0), y.data_ptr<at::BFloat16>(),
                 bias.has_value() ? bias->data_ptr<at::BFloat16>() : nullptr, cols);
  else
    w4a16_matmul(kernels, w, x.data_ptr<float>(), x.size(0), y.data_ptr<float>(),
                 bias.has_value() ? bias->data_ptr<float>() : nullptr, cols);
  return y;
}

std::vector<std::string> isa_variants() {
  std::vector<std::string> names;
  for (const char* const* name = built_isas(); *name != nullptr; ++name) names.emplace_back(*name);
  return names;
}

}  // namespace

}  // namespace edge_infer

TORCH_LIBRARY_FRAGMENT(edge_infer, lib) {
  lib.def("int8_linear(Tensor x, Tensor codes, Tensor scales, int bits, int group, int out_features, str isa, "
          "Tensor? bias=None) -> Tensor");
  lib.def("w16_linear(Tensor x, Tensor w, int out_features, str isa) -> Tensor");
  lib.def("w4a16_linear(Tensor x, Tensor codes, Tensor scales, int group, int out_features, str isa, "
          "Tensor? bias=None) -> Tensor");
  lib.def("isa_variants() -> str[]", &edge_infer::isa_variants);  // no tensor to dispatch on: one kernel for all
}

TORCH_LIBRARY_IMPL(edge_infer, CPU, lib) {
  lib.impl("int8_linear", &edge_infer::int8_linear);
  lib.impl("w16_linear", &edge_infer::w16_linear);
  lib.impl("w4a16_linear", &edge_infer::w4a16_linear);
}
