// Elementwise steps of the bf16 layers in one pass each, on the ISA variant the caller names:
// - SwiGLU's activation over a product's rows, silu(gate) * up (isa.h's silu_mul_bf16, the fused decode
//   layer's function): as PyTorch operators a silu over the strided gate half and a product with the strided
//   up half, two passes and two fresh tensors (~5% of one 448x448 image's request at the 3B ViT and thinker
//   shapes);
// - the ViT's rotary embedding of q and k in fp32 (isa.h's rotate_bf16): as PyTorch operators a widened
//   copy, a roll, a product, a product-sum and a rounded copy, five passes over twice the bytes (~3%);
// - RMSNorm (isa.h's rms_norm_bf16, the fused decode layer's too): as PyTorch operators a widened copy, its
//   square, a mean, a product and two rounded copies, ~6 passes that leave the cache at the ViT's 1024 x 1280
//   (3.8 ms each on 2 Xeon cores, ~65 of them per 448x448 image).
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

// x [T, heads, d] bf16 (d contiguous, heads evenly strided), cos and signed sin [T, d] fp32 -> [T, heads, d] bf16.
at::Tensor rotate(const at::Tensor& x, const at::Tensor& cos, const at::Tensor& sin, const std::string& isa_name) {
  TORCH_CHECK(x.dim() == 3 && x.scalar_type() == at::kBFloat16 && x.stride(2) == 1 && x.size(2) % 2 == 0 &&
                  x.size(2) <= 512,
              "rotate: x must be bf16 [tokens, heads, head_dim] with contiguous head_dim, even and at most 512");
  const int64_t tokens = x.size(0), heads = x.size(1), d = x.size(2);
  for (const at::Tensor* t : {&cos, &sin})
    TORCH_CHECK(t->scalar_type() == at::kFloat && t->is_contiguous() && t->numel() == tokens * d,
                "rotate: cos and sin must be contiguous fp32 [", tokens, ", ", d, "]");
  const IsaKernels& isa = isa_named(isa_name);
  at::Tensor out = at::empty({tokens, heads, d}, x.options());
  const uint16_t* in = reinterpret_cast<const uint16_t*>(x.data_ptr<at::BFloat16>());
  uint16_t* y = reinterpret_cast<uint16_t*>(out.data_ptr<at::BFloat16>());
  const float* c = cos.data_ptr<float>();
  const float* s = sin.data_ptr<float>();
  at::parallel_for(0, tokens, std::max<int64_t>(1, 16384 / std::max<int64_t>(heads * d, 1)), [&](int64_t begin, int64_t end) {
    for (int64_t t = begin; t < end; ++t)
      isa.rotate_bf16(in + t * x.stride(0), heads, x.stride(1), d, c + t * d, s + t * d, y + t * heads * d);
  });
  return out;
}

// x [T, n] or [T, G, n] bf16 (n contiguous, rows evenly strided: q and k heads inside a q/k/v product),
// weight [n] or [G, n] (head g's own row) -> a contiguous tensor of x's shape.
at::Tensor rms_norm(const at::Tensor& x, const at::Tensor& weight, double eps, const std::string& isa_name) {
  TORCH_CHECK((x.dim() == 2 || x.dim() == 3) && x.scalar_type() == at::kBFloat16 && x.stride(-1) == 1,
              "rms_norm: x must be bf16 [tokens, n] or [tokens, heads, n] with n contiguous");
  const int64_t n = x.size(-1), heads = x.dim() == 3 ? x.size(1) : 1, tokens = x.size(0);
  TORCH_CHECK(weight.scalar_type() == at::kBFloat16 && weight.is_contiguous() &&
                  (weight.numel() == n || (x.dim() == 3 && weight.numel() == heads * n)),
              "rms_norm: the weight must be ", n, " contiguous bf16 values (or one row of them per head)");
  const IsaKernels& isa = isa_named(isa_name);
  at::Tensor out = at::empty(x.sizes(), x.options());
  const uint16_t* in = reinterpret_cast<const uint16_t*>(x.data_ptr<at::BFloat16>());
  const uint16_t* w = reinterpret_cast<const uint16_t*>(weight.data_ptr<at::BFloat16>());
  uint16_t* y = reinterpret_cast<uint16_t*>(out.data_ptr<at::BFloat16>());
  const int64_t head_stride = x.dim() == 3 ? x.stride(1) : 0, per_head = weight.numel() == n ? 0 : n;
  const float epsilon = static_cast<float>(eps);
  at::parallel_for(0, tokens * heads, std::max<int64_t>(1, 16384 / std::max<int64_t>(n, 1)), [&](int64_t begin, int64_t end) {
    for (int64_t r = begin; r < end; ++r) {
      const int64_t t = r / heads, h = r % heads;
      isa.rms_norm_bf16(in + t * x.stride(0) + h * head_stride, w + h * per_head, n, epsilon, y + r * n);
    }
  });
  return out;
}

}  // namespace
}  // namespace edge_infer

TORCH_LIBRARY_FRAGMENT(edge_infer, lib) {
  lib.def("swiglu(Tensor gate_up, str isa) -> Tensor");
  lib.def("rotate(Tensor x, Tensor cos, Tensor sin, str isa) -> Tensor");
  lib.def("rms_norm(Tensor x, Tensor weight, float eps, str isa) -> Tensor");
}

TORCH_LIBRARY_IMPL(edge_infer, CPU, lib) {
  lib.impl("swiglu", &edge_infer::swiglu);
  lib.impl("rotate", &edge_infer::rotate);
  lib.impl("rms_norm", &edge_infer::rms_norm);
}
