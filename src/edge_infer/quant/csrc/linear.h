// The PyTorch side of the tile kernels' linears, shared by the linear op (linear.cpp) and the fused
// decode layer (decode_layer.cpp): checking packed weights and running one through an ISA variant.
#pragma once

#include <ATen/ATen.h>

#include <functional>
#include <string>

#include "isa.h"

namespace edge_infer {

// The variant of this name, refused by name (TORCH_CHECK) when this library lacks it.
const IsaKernels& isa_named(const std::string& name);

// A packed weight (layouts in isa.h) as the kernels read it.
struct PackedWeight {
  int64_t bits;  // 4 (W4A8, W4A16) or 8 (W8A8)
  const void* codes;
  const uint16_t* scales;  // bf16: 4-bit scales and zeros, W8A8 scales
  int64_t k, group, n;     // padded input columns, group size, outputs
  bool w4a16 = false;      // 4-bit codes times the activations as they are, not int8-quantized ones
};

// Refuses (TORCH_CHECK, naming ``what``) packed tensors that do not take k input columns in groups of
// ``group`` and give n outputs.
PackedWeight check_packed(const char* what, int64_t bits, const at::Tensor& codes, const at::Tensor& scales, int64_t k,
                          int64_t group, int64_t n);

// Runs ``run`` over [0, tiles) in chunks the threads claim as they finish the last one, not in one
// static share each: a thread slowed by the host (a busy sibling vCPU, an efficiency core) then takes
// fewer tiles instead of holding up the others at the barrier. Each claim takes 1 / (kShareDivisor *
// threads) of the tiles left, at least one: long contiguous runs first (the prefetchers' streams), single
// tiles at the end, so the threads reach the barrier within about a tile of each other (a 0.5B decode
// step's layers 2-3% faster than with fixed claims of an eighth of a thread's share, 4 in-process A/Bs).
constexpr int64_t kShareDivisor = 2;
void for_each_tile(int64_t tiles, const std::function<void(int64_t begin, int64_t end)>& run);

// out[m, n] = x[m, k] W^T (+ bias[n], added as PyTorch adds it, when not null); T is float or at::BFloat16.
// x's rows hold ``x_cols`` values (0: w.k; otherwise more than w.k - w.group), the rest taken as zeros.
template <typename T>
void int8_matmul(const IsaKernels& isa, const PackedWeight& w, const T* x, int64_t m, T* out, const T* bias = nullptr,
                 int64_t x_cols = 0);

// The same for a 4-bit weight times x as it is, widened to fp32 (W4A16: isa.h's w4a16_tile).
template <typename T>
void w4a16_matmul(const IsaKernels& isa, const PackedWeight& w, const T* x, int64_t m, T* out, const T* bias = nullptr,
                  int64_t x_cols = 0);

// int8_matmul or w4a16_matmul, as ``w`` is run.
template <typename T>
void tile_matmul(const IsaKernels& isa, const PackedWeight& w, const T* x, int64_t m, T* out, const T* bias = nullptr) {
  w.w4a16 ? w4a16_matmul(isa, w, x, m, out, bias) : int8_matmul(isa, w, x, m, out, bias);
}

}  // namespace edge_infer
