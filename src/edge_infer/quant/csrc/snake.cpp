// Code2Wav's SnakeBeta activation, x + sin^2(alpha_c x) / beta_c per channel c, in one pass.
//
// As PyTorch operators it is a sine, a square, a scale and an add, each a pass over the decoder's largest
// tensors (channels x samples) and together ~10% of a decode on AVX2; here one vectorized loop per channel
// (isa.h's snake_f32, on the variant the caller names).
#include "linear.h"

#include <ATen/Parallel.h>
#include <torch/library.h>

namespace edge_infer {
namespace {

// x [1, C, T] fp32; alpha and inv_beta [C] fp32 (already exponentiated, as the module holds them as logs).
at::Tensor snake(const at::Tensor& x, const at::Tensor& alpha, const at::Tensor& inv_beta, const std::string& isa_name) {
  TORCH_CHECK(x.dim() == 3 && x.size(0) == 1 && x.scalar_type() == at::kFloat && x.is_contiguous(),
              "snake: x must be a contiguous fp32 [1, channels, samples] tensor");
  const int64_t channels = x.size(1), samples = x.size(2);
  TORCH_CHECK(alpha.scalar_type() == at::kFloat && inv_beta.scalar_type() == at::kFloat && alpha.is_contiguous() &&
                  inv_beta.is_contiguous() && alpha.numel() == channels && inv_beta.numel() == channels,
              "snake: alpha and inv_beta must be ", channels, " contiguous fp32 values");
  const IsaKernels& isa = isa_named(isa_name);
  at::Tensor out = at::empty_like(x);
  const float* in = x.data_ptr<float>();
  const float* a = alpha.data_ptr<float>();
  const float* b = inv_beta.data_ptr<float>();
  float* y = out.data_ptr<float>();
  at::parallel_for(0, channels, 1, [&](int64_t begin, int64_t end) {
    for (int64_t c = begin; c < end; ++c) isa.snake_f32(in + c * samples, samples, a[c], b[c], y + c * samples);
  });
  return out;
}

}  // namespace
}  // namespace edge_infer

TORCH_LIBRARY_FRAGMENT(edge_infer, lib) {
  lib.def("snake(Tensor x, Tensor alpha, Tensor inv_beta, str isa) -> Tensor");
}

TORCH_LIBRARY_IMPL(edge_infer, CPU, lib) { lib.impl("snake", &edge_infer::snake); }
