// The kernel interface every ISA variant implements, and the packed weight layouts they share.
//
// Plain C++ (no PyTorch): each variant lives in its own translation unit
// compiled with its own instruction-set flags (isa_<variant>.cpp), so the
// same objects link into the PyTorch extension (linear.cpp, decode_layer.cpp)
// and into a standalone test harness (tests/quant/native/harness.cpp), which
// also runs the ARM variant under qemu. isa_scalar.cpp is the reference:
// every variant computes the same integer sums and the same float operations
// in the same order, so their outputs are bit-identical to it.
//
// Layouts (written by csrc/pack.cpp while loading; 64-row tiles, padded with zero rows):
//   W4A8 codes  uint8 [Np/64, Kp/8, 64, 4]: for 8 input columns k..k+7, row r's 4 bytes hold
//               codes (k+i) | (k+4+i) << 4, i = 0..3; a code q stands for (q - 8) * scale + zero.
//        sz     bf16  [Np/64, Kp/G, 2, 64]: each group's 64 scales, then its 64 zeros.
//   W8A8 codes  int8  [Np/64, Kp/4, 64, 4]: for 4 input columns k..k+3, row r's 4 weights, each -127..127;
//               a code q stands for q * scale.
//        scales bf16  [Np/64, Kp/G, 64].
//   W4A16       the W4A8 codes and scales times fp32 activations: the codes' -8 is taken off as -8 sum x.
//   W16A32      bf16 or fp16 [Np/64, K, 64]: column k's 64 weights, widened to fp32 in registers and
//               multiplied with fp32 activations (no quantization: the checkpoint's 16-bit weights as they are).
// One vector load thus feeds several rows at once with 4 or 8 columns each, and
// the matching activations are broadcast: no horizontal sums anywhere.
//
// Activations are quantized per row and group of G columns, x = alpha * q with q
// in -127..127. For one output row and one group, with exact int32 sums:
//   W4A8: sum x w = alpha * scale * (sum q code - 8 sum q) + zero * alpha * sum q
// (the parenthesis exact in int32; the zero term only where zero is not 0: a symmetric checkpoint has none)
//   W8A8: sum x w = alpha * scale * sum q code
// W16A32 accumulates one fused multiply-add per column, in column order.
#pragma once

#include <cstdint>

namespace edge_infer {

constexpr int64_t kTileRows = 64;

// m activation rows quantized to int8 per group of ``group`` columns.
struct Int8Rows {
  const int8_t* q;     // [m, k]
  const float* alpha;  // [m, k / group]: NaN where the group held a NaN or an infinity
  const int32_t* sum;  // [m, k / group]: the sum of q over the group
  int64_t k, group;
};

struct IsaKernels {
  const char* name;
  // One row of k values (k a multiple of group, group a multiple of 16) -> q, alpha and sum per group.
  void (*quantize_f32)(const float* x, int64_t k, int64_t group, int8_t* q, float* alpha, int32_t* sum);
  void (*quantize_bf16)(const uint16_t* x, int64_t k, int64_t group, int8_t* q, float* alpha, int32_t* sum);
  // One 64-row tile times m activation rows: out[i * 64 + r] for row r of the tile and activation row i.
  void (*w4a8_tile)(const uint8_t* codes, const uint16_t* sz, const Int8Rows& x, int64_t m, float* out);
  void (*w8a8_tile)(const int8_t* codes, const uint16_t* scales, const Int8Rows& x, int64_t m, float* out);
  // One 64-row tile of 16-bit weights (bf16, or fp16 when ``fp16``) times m fp32 rows x [m, k]: out as above.
  void (*w16_tile)(const uint16_t* w, bool fp16, const float* x, int64_t k, int64_t m, float* out);
  // One W4A8 tile (the same codes, scales and zeros) times m fp32 rows x [m, k], the activations not quantized
  // (W4A16), given scaled per column (w4a16_shift below). Per row and group, two chains of fused multiply-adds of
  // x_c with the codes as they are (0..15): lo over the columns c with c % 8 < 4, in order, from -8 xsum; hi over
  // the others, in order, from 0; then w4a16_group's float steps (isa_common.h) on lo + hi. xsum [m, k / group]
  // holds the rows' group sums of the unscaled activations (the caller's).
  void (*w4a16_tile)(const uint8_t* codes, const uint16_t* sz, const float* x, const float* xsum, int64_t k,
                     int64_t group, int64_t m, float* out);
  // n fp32 values -> bf16, rounding to nearest even; NaN stays NaN (0x7FC0, as PyTorch converts it).
  void (*round_bf16)(const float* x, int64_t n, uint16_t* out);
  // Attention inner loops over ``count`` fp32 rows of n values (n a multiple of 16) ``stride`` apart (the keys
  // or values of one cache block; a bf16 cache's widened first, widen_bf16), in fp32: out[j] = q . k_j, and
  // y += w[j] * v_j for j in order. A dot product is 16 fp32 lanes (lane l fuses the products of the columns
  // i = l mod 16, in order) summed pairwise as lanes l + l+8, then l + l+4, l + l+2, and 0 + 1: the same bits
  // on every variant.
  void (*dot_f32)(const float* q, const float* k, int64_t stride, int64_t count, int64_t n, float* out);
  void (*axpy_f32)(const float* w, const float* v, int64_t stride, int64_t count, int64_t n, float* y);
  // The attention weights of one query head, in place: p = softmax(p * scale) in fp32. The largest scaled
  // score is taken off before the exponential (a polynomial every variant computes alike, within 1 ulp of
  // exp), and the sum runs over 16 lanes (lane l takes p[j] for j = l mod 16, in order) reduced as the
  // dot product's. A NaN score makes every weight NaN.
  void (*softmax_f32)(float* p, int64_t n, float scale);
  // SwiGLU's activation over n values: out = silu(gate) * up, silu rounded to the rows' type before the
  // product (bf16 rounds, fp32 does not), e^-gate from the softmax's polynomial (clamped to [e^-87, e^88]).
  void (*silu_mul_bf16)(const uint16_t* gate, const uint16_t* up, int64_t n, uint16_t* out);
  void (*silu_mul_f32)(const float* gate, const float* up, int64_t n, float* out);
  // Code2Wav's SnakeBeta over one channel's n samples: out = x + sin^2(alpha x) * inv_beta (out must not be x).
  void (*snake_f32)(const float* x, int64_t n, float alpha, float inv_beta, float* out);
  // A product's row with its bias: x rounded to bf16, then bias added as PyTorch adds two bf16 tensors (in
  // fp32, rounded): the bits of the separate add it replaces.
  void (*round_add_bf16)(const float* x, const uint16_t* bias, int64_t n, uint16_t* out);
  // Rotary embedding of one token's ``heads`` bf16 heads of d values (d even, at most 512; head h at
  // x + h * stride) in fp32, half-split: out[h] = bf16(fma(roll(x, d / 2), signed_sin, x * cos)), as PyTorch's
  // mul then addcmul round it; out holds the heads contiguously.
  void (*rotate_bf16)(const uint16_t* x, int64_t heads, int64_t stride, int64_t d, const float* cos, const float* sin,
                      uint16_t* out);
  // models/llama.py's RMSNorm of one row of n values: x / sqrt(mean(x^2) + eps) in fp32, rounded to the row's
  // type, times the weight, rounded again (bf16 rounds, fp32 does not). The squares are summed in 16 lanes
  // (lane l takes the columns i = l mod 16, in order) reduced as the dot product's. out may be x.
  void (*rms_norm_bf16)(const uint16_t* x, const uint16_t* weight, int64_t n, float eps, uint16_t* out);
  void (*rms_norm_f32)(const float* x, const float* weight, int64_t n, float eps, float* out);
  // ``rows`` bf16 rows of n values, ``stride`` apart, widened to fp32 rows packed n apart (exact).
  void (*widen_bf16)(const uint16_t* x, int64_t stride, int64_t rows, int64_t n, float* out);
  // Tile matrix units (AMX-INT8; null on variants without one). A prompt's rows in whole blocks of 16 through
  // one 64-row tile: m a multiple of 16, out as w4a8_tile's and bit for bit its result (the same int32 group
  // sums, the same float steps). panels_ready asks the OS for the tile registers once per process: false, and
  // the panels must not run.
  bool (*panels_ready)();
  void (*w4a8_panel)(const uint8_t* codes, const uint16_t* sz, const Int8Rows& x, int64_t m, float* out);
  void (*w8a8_panel)(const int8_t* codes, const uint16_t* scales, const Int8Rows& x, int64_t m, float* out);
};

// W4A16's activation of column c goes into the tile kernel multiplied by 2^-w4a16_shift(c) (exact: a power of
// two), so that a variant may convert a code where it sits in its row's 32 bits (masked, not shifted down):
// code * 2^shift times x_c * 2^-shift is the same exact product. The shift is the nibble's bit, 8 (c % 4) +
// 4 (c % 8 / 4), but 27 for the top nibble (shifted right once, so that it stays positive in a signed int32).
// (static: each translation unit its own copy, as isa_common.h's functions, whatever its instruction set)
static constexpr int w4a16_shift(int64_t c) {
  const int bit = 8 * static_cast<int>(c % 4) + 4 * static_cast<int>(c % 8 / 4);
  return bit == 28 ? 27 : bit;
}

// The variant of this name built into this library, or nullptr (not this architecture, or its compiler
// lacked the instruction set). Names: scalar, avx2, avx-vnni, avx512-vnni, amx-int8, neon-dotprod.
const IsaKernels* find_isa(const char* name);

// The names of the variants built into this library, nullptr-terminated.
const char* const* built_isas();

}  // namespace edge_infer
