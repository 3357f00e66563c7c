// SwiGLU's activation over a product's rows, silu(gate) * up (isa.h's silu_mul_bf16, the fused decode layer's
// function), in one pass over [rows, 2 i] on the ISA variant the caller names.
//
// As PyTorch operators it is a silu over the strided gate half and a product with the strided up half, two
// passes and two fresh tensors (~5% of one 448x448 image's request at the 3B ViT and thinker shapes).
#include "linear.h"

#include <ATen/Parallel.h>
#include <torch/library.h>

#include <algorithm>
#include <vector>

namespace edge_infer {
namespace {

// gate_up [..., 2 i] contiguous bf16 -> [..., i].
at::Tensor swiglu(const at::Tensor& gate_up, const std::string& isa_name) {
  TORCH_CHECK(gate_up.scalar_type() == at::kBFloat16 && gate_up.is_contiguous() && gate_up.dim() >= 1 &&
                  gate_up.size(-1) % 2 == 0,
              "swiglu: gate_up must be a contiguous bf16 [..., 2 * intermediate] tensor");
  const IsaKernels& isa = isa_named(isa_name);
  const int64_t width = gate_up.size(-1) / 2, rows = width == 0 ? 0 : gate_up.numel() / (2 * width);
  std::vector<int64_t> shape(gate_up.sizes().begin(), gate_up.sizes().end());
  shape.back() = width;
  at::Tensor out = at::empty(shape, gate_up.options());
  const uint16_t* in = reinterpret_cast<const uint16_t*>(gate_up.data_ptr<at::BFloat16>());
  uint16_t* y = reinterpret_cast<uint16_t*>(out.data_ptr<at::BFloat16>());
  // Rows in chunks of ~32k values: one row of a large MLP is enough work for a thread, a decode step's one row too.
  at::parallel_for(0, rows, std::max<int64_t>(1, 32768 / std::max<int64_t>(width, 1)), [&](int64_t begin, int64_t end) {
    for (int64_t r = begin; r < end; ++r) isa.silu_mul_bf16(in + r * 2 * width, in + r * 2 * width + width, width, y + r * width);
  });
  return out;
}

}  // namespace
}  // namespace edge_infer

TORCH_LIBRARY_FRAGMENT(edge_infer, lib) { lib.def("swiglu(Tensor gate_up, str isa) -> Tensor"); }

TORCH_LIBRARY_IMPL(edge_infer, CPU, lib) { lib.impl("swiglu", &edge_infer::swiglu); }
