// Standalone test of the ISA variants (csrc/isa.h), without PyTorch: `harness VARIANT...`.
//
// For every variant named, random cases (all group sizes, symmetric and asymmetric int4, int8, one and
// several activation rows, zero padding rows and columns, all-zero groups, NaN and infinity, fp32 and
// bf16 activations; the 4-bit tiles times fp32 activations (W4A16); bf16 and fp16 weights widened to fp32) must give exactly the scalar reference's
// bits, and the scalar reference must lie within the int8 activation rounding bound (fp32 rounding for
// widened weights) of the exact product. Prints one line per variant and a
// checksum of the reference's outputs (the same on every machine: the tests compare x86 with ARM);
// exits non-zero after the first failures. Built by tests/quant/test_isa_variants.py, natively and, for ARM,
// cross-compiled and run under qemu-aarch64.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <string>
#include <type_traits>
#include <vector>

#include "isa.h"
#include "pack_math.h"

using edge_infer::Int8Rows;
using edge_infer::IsaKernels;
using edge_infer::kTileRows;

namespace {

struct Rng {  // splitmix64: the same cases on every machine
  uint64_t state;
  uint64_t next() {
    uint64_t z = (state += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
  }
  int below(int n) { return static_cast<int>(next() % static_cast<uint64_t>(n)); }
  float uniform() { return static_cast<float>(next() >> 40) / static_cast<float>(1 << 24) * 2.f - 1.f; }
};

uint16_t to_bf16(float f) {  // round to nearest even
  uint32_t bits;
  std::memcpy(&bits, &f, sizeof bits);
  return static_cast<uint16_t>((bits + 0x7FFF + ((bits >> 16) & 1)) >> 16);
}

float from_bf16(uint16_t v) {
  const uint32_t bits = static_cast<uint32_t>(v) << 16;
  float f;
  std::memcpy(&f, &bits, sizeof f);
  return f;
}

int failures = 0;
int panel_cases = 0;  // matrix cases run through a tile unit's panels as well
uint64_t checksum = 0xCBF29CE484222325ull;  // FNV-1a over the reference's outputs: equal across machines

void mix(float v) {
  uint32_t bits = 0x7FC00000u;  // every NaN alike (payloads differ between architectures)
  if (!std::isnan(v)) std::memcpy(&bits, &v, sizeof bits);
  for (int i = 0; i < 4; ++i) checksum = (checksum ^ ((bits >> (8 * i)) & 0xFF)) * 0x100000001B3ull;
}

bool same(float a, float b) {
  if (std::isnan(a) || std::isnan(b)) return std::isnan(a) && std::isnan(b);
  return std::memcmp(&a, &b, sizeof a) == 0;
}

void fail(const char* variant, const char* what, int item, float got, float want) {
  if (failures++ < 5) std::printf("FAIL %s: %s, item %d: %.9g, expected %.9g\n", variant, what, item, got, want);
}

// Whether activation row i of k values holds a NaN or an infinity.
bool poisoned_row(const std::vector<float>& x, int i, int64_t k) {
  for (int64_t col = 0; col < k; ++col)
    if (!std::isfinite(x[i * k + col])) return true;
  return false;
}

struct Case {
  int bits, m, group, groups;
  bool symmetric, bf16_input, special;  // special: an all-zero group, and NaN / infinity in some rows
  bool extreme = false;  // every code and activation at its largest magnitude: the integer sums' worst case
};

struct Quantized {
  std::vector<int8_t> q;
  std::vector<float> alpha;
  std::vector<int32_t> sum;
};

Quantized quantize(const IsaKernels& isa, const Case& c, const std::vector<float>& x, const std::vector<uint16_t>& xb) {
  const int64_t k = static_cast<int64_t>(c.group) * c.groups;
  Quantized out{std::vector<int8_t>(c.m * k), std::vector<float>(c.m * c.groups), std::vector<int32_t>(c.m * c.groups)};
  for (int i = 0; i < c.m; ++i) {
    int8_t* q = out.q.data() + i * k;
    float* alpha = out.alpha.data() + i * c.groups;
    int32_t* sum = out.sum.data() + i * c.groups;
    if (c.bf16_input)
      isa.quantize_bf16(xb.data() + i * k, k, c.group, q, alpha, sum);
    else
      isa.quantize_f32(x.data() + i * k, k, c.group, q, alpha, sum);
  }
  return out;
}

// The same 4-bit tile times the activations as they are (W4A16): every variant bit-identical to the reference, the
// reference within fp32 rounding of the exact product (rows with a NaN or an infinity: no finite output).
void check_w4a16(const std::vector<const IsaKernels*>& variants, const Case& c, const std::vector<uint8_t>& codes,
                 const std::vector<uint16_t>& sz, const std::vector<float>& x, const std::vector<double>& w) {
  const int64_t k = static_cast<int64_t>(c.group) * c.groups;
  std::vector<float> xsum(c.m * c.groups);
  for (int i = 0; i < c.m; ++i)
    for (int g = 0; g < c.groups; ++g) {
      float total = 0.f;
      for (int col = g * c.group; col < (g + 1) * c.group; ++col) total += x[i * k + col];
      xsum[i * c.groups + g] = total;
    }
  std::vector<float> scaled(x);  // as the tile kernels take them (isa.h's w4a16_shift)
  for (size_t j = 0; j < scaled.size(); ++j) scaled[j] *= 1.f / static_cast<float>(1u << edge_infer::w4a16_shift(j % k));
  std::vector<float> want(c.m * kTileRows);
  variants[0]->w4a16_tile(codes.data(), sz.data(), scaled.data(), xsum.data(), k, c.group, c.m, want.data());
  for (float v : want) mix(v);
  for (int i = 0; i < c.m; ++i) {
    const bool poisoned = poisoned_row(x, i, k);
    for (int r = 0; r < kTileRows; ++r) {
      const float got = want[i * kTileRows + r];
      if (poisoned) {
        if (std::isfinite(got)) fail(variants[0]->name, "w4a16: a NaN or infinite activation must not give a number", r, got, NAN);
        continue;
      }
      // The codes go in as they are (0..15) and -8 sum x is added: a term as large as 15 scale |x| per column.
      double exact = 0.0, magnitude = 0.0;
      for (int64_t col = 0; col < k; ++col) {
        exact += x[i * k + col] * w[r * k + col];
        const uint16_t* group_sz = sz.data() + (col / c.group) * 2 * kTileRows;
        magnitude += std::fabs(x[i * k + col]) * (15.0 * from_bf16(group_sz[r]) + std::fabs(from_bf16(group_sz[kTileRows + r])));
      }
      if (!(std::fabs(got - exact) <= magnitude * (k + 8) * 0x1p-24 + 1e-30))  // a NaN fails too
        fail(variants[0]->name, "w4a16 outside fp32 rounding", r, got, static_cast<float>(exact));
    }
  }
  for (size_t v = 1; v < variants.size(); ++v) {
    std::vector<float> got(c.m * kTileRows, -1.f);
    variants[v]->w4a16_tile(codes.data(), sz.data(), scaled.data(), xsum.data(), k, c.group, c.m, got.data());
    for (size_t j = 0; j < got.size(); ++j)
      if (!same(got[j], want[j])) fail(variants[v]->name, "w4a16 tile", static_cast<int>(j), got[j], want[j]);
  }
}

// One case: a random tile (some rows zero, as padding rows are), random activations, every variant against
// the scalar reference, and the reference against the exact product.
void run_case(const std::vector<const IsaKernels*>& variants, const Case& c, Rng& rng) {
  const int64_t k = static_cast<int64_t>(c.group) * c.groups;
  // Random draws one per statement: the order of a call's arguments differs between compilers.
  const int partial = rng.below(2);
  const int real_rows = kTileRows - partial * rng.below(kTileRows / 2);  // often a partial tile
  const int real_cols = static_cast<int>(k) - rng.below(c.group);       // often padded columns
  std::vector<uint8_t> codes(c.bits == 4 ? kTileRows * k / 2 : kTileRows * k, 0);
  std::vector<uint16_t> sz(c.groups * (c.bits == 4 ? 2 : 1) * kTileRows, 0);
  std::vector<double> w(kTileRows * k, 0.0);  // the weights the codes stand for
  for (int r = 0; r < real_rows; ++r) {
    for (int g = 0; g < c.groups; ++g) {
      const float mantissa = 0.5f + 0.5f * std::fabs(rng.uniform());
      const float scale = from_bf16(to_bf16(std::ldexp(mantissa, -4 - rng.below(6))));
      // Asymmetric: now and then a zero of 0 or -0, so that a group mixes lanes with and without the zero term.
      const int zero_kind = rng.below(8);
      float zero = from_bf16(to_bf16(scale * 8.f * rng.uniform()));
      if (zero_kind == 0) zero = 0.f;
      if (zero_kind == 1) zero = -0.f;
      if (c.symmetric || c.bits == 8) zero = 0.f;
      if (c.bits == 4) {
        sz[g * 2 * kTileRows + r] = to_bf16(scale);
        sz[g * 2 * kTileRows + kTileRows + r] = to_bf16(zero);
      } else {
        sz[g * kTileRows + r] = to_bf16(scale);
      }
      for (int col = g * c.group; col < (g + 1) * c.group && col < real_cols; ++col) {
        if (c.bits == 4) {
          const int code = c.extreme ? 15 : rng.below(16);
          uint8_t& byte = codes[(col / 8) * 4 * kTileRows + r * 4 + col % 4];
          byte |= static_cast<uint8_t>(col % 8 < 4 ? code : code << 4);
          w[r * k + col] = (code - 8) * static_cast<double>(scale) + zero;
        } else {
          const int code = c.extreme ? 127 : rng.below(255) - 127;
          codes[(col / 4) * 4 * kTileRows + r * 4 + col % 4] = static_cast<uint8_t>(static_cast<int8_t>(code));
          w[r * k + col] = code * static_cast<double>(scale);
        }
      }
    }
  }
  std::vector<float> x(c.m * k, 0.f);
  std::vector<uint16_t> xb(c.m * k, 0);
  for (int i = 0; i < c.m; ++i)
    for (int col = 0; col < real_cols; ++col) {
      const float u = rng.uniform();
      const float v = c.extreme ? (i % 2 ? -1.f : 1.f) : std::ldexp(u, rng.below(8) - 4);
      xb[i * k + col] = to_bf16(v);
      x[i * k + col] = c.bf16_input ? from_bf16(xb[i * k + col]) : v;
    }
  if (c.special) {
    for (int col = 0; col < c.group; ++col) x[col] = 0.f, xb[col] = 0;  // row 0, group 0: all zero
    if (c.m > 1) x[1 * k + 3] = NAN, xb[1 * k + 3] = 0x7FC0;
    if (c.m > 2) x[2 * k + k - 1] = -INFINITY, xb[2 * k + k - 1] = 0xFF80;
  }

  const IsaKernels& ref = *variants[0];
  const Quantized qr = quantize(ref, c, x, xb);
  const Int8Rows rows_ref{qr.q.data(), qr.alpha.data(), qr.sum.data(), k, c.group};
  std::vector<float> want(c.m * kTileRows);
  if (c.bits == 4)
    ref.w4a8_tile(codes.data(), sz.data(), rows_ref, c.m, want.data());
  else
    ref.w8a8_tile(reinterpret_cast<const int8_t*>(codes.data()), sz.data(), rows_ref, c.m, want.data());

  for (float v : want) mix(v);
  // The reference against the exact product: within half an int8 step per group times the group's sum |w|.
  for (int i = 0; i < c.m; ++i) {
    const bool poisoned = poisoned_row(x, i, k);
    for (int r = 0; r < kTileRows; ++r) {
      const float got = want[i * kTileRows + r];
      if (poisoned) {
        if (!std::isnan(got) && r < real_rows) fail(ref.name, "a NaN or infinite activation must give NaN", r, got, NAN);
        continue;
      }
      double exact = 0.0, bound = 0.0;
      for (int g = 0; g < c.groups; ++g) {
        double amax = 0.0, wsum = 0.0;
        for (int col = g * c.group; col < (g + 1) * c.group; ++col) {
          exact += x[i * k + col] * w[r * k + col];
          amax = std::fmax(amax, std::fabs(x[i * k + col]));
          wsum += std::fabs(w[r * k + col]);
        }
        bound += amax / 127.0 / 2.0 * wsum;
      }
      bound = bound * (1.0 + 1e-5) + std::fabs(exact) * 1e-5 + 1e-6;  // plus fp32 rounding of the float steps
      if (std::fabs(got - exact) > bound) fail(ref.name, "outside the int8 rounding bound", r, got, static_cast<float>(exact));
    }
  }

  if (c.bits == 4) check_w4a16(variants, c, codes, sz, x, w);
  for (size_t v = 1; v < variants.size(); ++v) {
    const IsaKernels& isa = *variants[v];
    const Quantized qv = quantize(isa, c, x, xb);
    for (size_t j = 0; j < qr.q.size(); ++j)
      if (qv.q[j] != qr.q[j]) fail(isa.name, "activation codes", static_cast<int>(j), qv.q[j], qr.q[j]);
    for (size_t j = 0; j < qr.alpha.size(); ++j) {
      if (!same(qv.alpha[j], qr.alpha[j])) fail(isa.name, "activation scales", static_cast<int>(j), qv.alpha[j], qr.alpha[j]);
      if (qv.sum[j] != qr.sum[j]) fail(isa.name, "activation sums", static_cast<int>(j), qv.sum[j], qr.sum[j]);
    }
    // The tile kernel (kind "tile"), then, on a variant with a tile unit and whole blocks of 16, its panels.
    using W4 = void (*)(const uint8_t*, const uint16_t*, const Int8Rows&, int64_t, float*);
    using W8 = void (*)(const int8_t*, const uint16_t*, const Int8Rows&, int64_t, float*);
    const auto check = [&](W4 w4a8, W8 w8a8, const char* kind) {
      std::vector<float> got(c.m * kTileRows, -1.f);
      if (c.bits == 4)
        w4a8(codes.data(), sz.data(), rows_ref, c.m, got.data());
      else
        w8a8(reinterpret_cast<const int8_t*>(codes.data()), sz.data(), rows_ref, c.m, got.data());
      const std::string what = std::string(c.bits == 4 ? "w4a8 " : "w8a8 ") + kind;
      for (size_t j = 0; j < got.size(); ++j)
        if (!same(got[j], want[j])) fail(isa.name, what.c_str(), static_cast<int>(j), got[j], want[j]);
    };
    check(isa.w4a8_tile, isa.w8a8_tile, "tile");
    if (isa.panels_ready == nullptr || c.m % 16 != 0) continue;
    if (!isa.panels_ready()) {
      fail(isa.name, "the OS refused the tile registers (arch_prctl ARCH_REQ_XCOMP_PERM)", 0, 0.f, 0.f);
      continue;
    }
    check(isa.w4a8_panel, isa.w8a8_panel, "panel");
    ++panel_cases;
  }
}

// 16-bit weights (bf16 or fp16) widened to fp32: every variant bit-identical to the reference, the reference
// within fp32 rounding of the exact product.
void run_w16_case(const std::vector<const IsaKernels*>& variants, bool fp16, int m, Rng& rng) {
  const int k = 1 + rng.below(300);
  std::vector<uint16_t> w(kTileRows * k);
  std::vector<double> wd(kTileRows * k);
  for (size_t j = 0; j < w.size(); ++j) {
    const int sign = rng.below(2), exponent = 10 + rng.below(10), mantissa = rng.below(fp16 ? 1024 : 128);
    if (fp16) {  // built from its fields and decoded independently of the kernels' conversion
      w[j] = static_cast<uint16_t>(sign << 15 | exponent << 10 | mantissa);
      wd[j] = (sign ? -1 : 1) * std::ldexp(1.0 + mantissa / 1024.0, exponent - 15);
    } else {
      w[j] = static_cast<uint16_t>(sign << 15 | (exponent + 112) << 7 | mantissa);
      wd[j] = (sign ? -1 : 1) * std::ldexp(1.0 + mantissa / 128.0, exponent - 15);
    }
  }
  std::vector<float> x(m * k);
  for (float& v : x) v = rng.uniform();
  std::vector<float> want(m * kTileRows);
  variants[0]->w16_tile(w.data(), fp16, x.data(), k, m, want.data());
  for (float v : want) mix(v);
  for (int i = 0; i < m; ++i)
    for (int r = 0; r < kTileRows; ++r) {
      double exact = 0.0, magnitude = 0.0;
      for (int c = 0; c < k; ++c) {
        exact += wd[c * kTileRows + r] * x[i * k + c];
        magnitude += std::fabs(wd[c * kTileRows + r] * x[i * k + c]);
      }
      if (std::fabs(want[i * kTileRows + r] - exact) > magnitude * k * 0x1p-24 + 1e-30)
        fail(variants[0]->name, "w16 outside fp32 rounding", r, want[i * kTileRows + r], static_cast<float>(exact));
    }
  for (size_t v = 1; v < variants.size(); ++v) {
    std::vector<float> got(m * kTileRows, -1.f);
    variants[v]->w16_tile(w.data(), fp16, x.data(), k, m, got.data());
    for (size_t j = 0; j < got.size(); ++j)
      if (!same(got[j], want[j])) fail(variants[v]->name, fp16 ? "w16 tile (fp16)" : "w16 tile (bf16)", static_cast<int>(j), got[j], want[j]);
  }
}

// Rows of bf16 or fp32 values (SwiGLU's activation, RMSNorm): what the reference's element type is made of.
struct Bf16Rows {
  using T = uint16_t;
  static constexpr const char* name = "bf16";
  static T make(float v) { return to_bf16(v); }
  static double value(T v) { return from_bf16(v); }
  static constexpr auto silu_mul = &IsaKernels::silu_mul_bf16;
  static constexpr auto rms_norm = &IsaKernels::rms_norm_bf16;
};
struct F32Rows {
  using T = float;
  static constexpr const char* name = "f32";
  static T make(float v) { return v; }
  static double value(T v) { return v; }
  static constexpr auto silu_mul = &IsaKernels::silu_mul_f32;
  static constexpr auto rms_norm = &IsaKernels::rms_norm_f32;
};

// The attention loops over a block of a bf16 cache, widened to fp32 rows, and of a fp32 one: widening exact
// on every variant; the reference's dot products within fp32 rounding of double precision; every variant's
// dot products and weighted sums bit-identical to the reference's.
template <typename R>
void check_attention_loops(const std::vector<const IsaKernels*>& variants, Rng& rng, int n, int count, int stride) {
  const std::string dot_name = std::string("dot_f32 over ") + R::name + " rows",
                    axpy_name = std::string("axpy_f32 over ") + R::name + " rows";
  std::vector<float> q(n), rows(count * stride);
  for (auto& v : q) v = static_cast<float>(R::value(R::make(rng.uniform() * 4.f)));
  if constexpr (std::is_same_v<typename R::T, uint16_t>) {  // rows as a widened cache block: n apart
    std::vector<uint16_t> cache(count * stride);
    for (auto& v : cache) v = R::make(rng.uniform());
    cache[0] = R::make(NAN);
    rows.assign(count * n, -1.f);
    for (const IsaKernels* variant : variants) {
      std::vector<float> widened(count * n + 16, -1.f);  // 16 past the rows: must stay untouched
      variant->widen_bf16(cache.data(), stride, count, n, widened.data());
      for (int j = 0; j < count * n + 16; ++j) {
        const float want = j < count * n ? from_bf16(cache[j / n * stride + j % n]) : -1.f;
        if (std::memcmp(&widened[j], &want, sizeof want) != 0) fail(variant->name, "widen_bf16", j, widened[j], want);
      }
      rows.assign(widened.begin(), widened.begin() + count * n);
    }
    rows[0] = 1.f;  // the NaN was for widening; the products below are checked against their exact values
    stride = n;
  } else {
    for (auto& v : rows) v = rng.uniform();
  }
  std::vector<float> w(count);
  for (float& v : w) v = rng.uniform();
  std::vector<float> want(count), y_ref(n, 0.5f);
  variants[0]->dot_f32(q.data(), rows.data(), stride, count, n, want.data());
  variants[0]->axpy_f32(w.data(), rows.data(), stride, count, n, y_ref.data());
  for (int r = 0; r < count; ++r) {
    double exact = 0.0, magnitude = 0.0;
    for (int i = 0; i < n; ++i) {
      exact += static_cast<double>(q[i]) * rows[r * stride + i];
      magnitude += std::fabs(static_cast<double>(q[i]) * rows[r * stride + i]);
    }
    if (std::fabs(want[r] - exact) > magnitude * n * 0x1p-24)
      fail(variants[0]->name, (dot_name + " rounding").c_str(), r, want[r], exact);
  }
  for (float v : want) mix(v);
  for (float v : y_ref) mix(v);
  for (size_t v = 1; v < variants.size(); ++v) {
    std::vector<float> got(count), y(n, 0.5f);
    variants[v]->dot_f32(q.data(), rows.data(), stride, count, n, got.data());
    variants[v]->axpy_f32(w.data(), rows.data(), stride, count, n, y.data());
    for (int r = 0; r < count; ++r)
      if (!same(got[r], want[r])) fail(variants[v]->name, dot_name.c_str(), r, got[r], want[r]);
    for (int i = 0; i < n; ++i)
      if (!same(y[i], y_ref[i])) fail(variants[v]->name, axpy_name.c_str(), i, y[i], y_ref[i]);
  }
}

// Code2Wav's SnakeBeta: the reference within float rounding of x + sin^2(alpha x) * inv_beta taken in double,
// every variant bit-identical to it (a NaN and an argument past the range reduction included).
void run_snake_case(const std::vector<const IsaKernels*>& variants, Rng& rng, int n) {
  std::vector<float> x(n);
  const float scale = std::pow(10.f, static_cast<float>(rng.below(5)) - 1.f);
  for (float& v : x) v = (rng.uniform() * 2.f - 1.f) * scale;
  if (n > 20) x[3] = NAN, x[17] = 3e7f;
  const float alpha = 0.5f + rng.uniform(), inv_beta = 0.5f + rng.uniform();
  std::vector<float> want(n);
  variants[0]->snake_f32(x.data(), n, alpha, inv_beta, want.data());
  for (int i = 0; i < n; ++i) {
    const double s = std::sin(static_cast<double>(x[i] * alpha));
    const double exact = static_cast<double>(x[i]) + s * s * inv_beta;
    if (!(std::fabs(want[i] - exact) <= std::fabs(x[i]) * 0x1p-22 + 4e-6) && !(std::isnan(want[i]) && std::isnan(x[i])))
      fail(variants[0]->name, "snake rounding", i, want[i], static_cast<float>(exact));
  }
  for (float v : want) mix(v);
  for (size_t v = 1; v < variants.size(); ++v) {
    std::vector<float> got(n);
    variants[v]->snake_f32(x.data(), n, alpha, inv_beta, got.data());
    for (int i = 0; i < n; ++i)
      if (!same(got[i], want[i])) fail(variants[v]->name, "snake", i, got[i], want[i]);
  }
}

// Attention weights: the reference within a few float roundings of the softmax taken in double (scores far under
// the largest give 0, a NaN score NaN everywhere), every variant bit-identical to it.
void run_softmax_case(const std::vector<const IsaKernels*>& variants, Rng& rng, int n) {
  std::vector<float> scores(n);
  const float spread = std::pow(10.f, static_cast<float>(rng.below(4)));  // up to scores 1000 apart
  for (float& v : scores) v = (rng.uniform() * 2.f - 1.f) * spread;
  const bool poisoned = n > 8 && rng.below(4) == 0;
  if (poisoned) scores[n / 2] = NAN;
  const float scale = 0.125f;
  std::vector<float> want = scores;
  variants[0]->softmax_f32(want.data(), n, scale);
  double top = -INFINITY, total = 0.0;
  for (float v : scores) top = std::max(top, static_cast<double>(v * scale));
  for (float v : scores) total += std::exp(static_cast<double>(v * scale) - top);
  for (int j = 0; j < n; ++j) {
    const double x = static_cast<double>(scores[j] * scale) - top, exact = std::exp(x) / total;
    // The float subtraction's rounding (half an ulp of x) carries into e^x: a relative error of |x| 2^-24.
    const bool ok = poisoned ? std::isnan(want[j]) : std::fabs(want[j] - exact) <= exact * (1e-6 - x * 0x1p-24) + 1e-37;
    if (!ok) fail(variants[0]->name, "softmax rounding", j, want[j], static_cast<float>(exact));
  }
  for (float v : want) mix(v);
  for (size_t v = 1; v < variants.size(); ++v) {
    std::vector<float> got = scores;
    variants[v]->softmax_f32(got.data(), n, scale);
    for (int j = 0; j < n; ++j)
      if (!same(got[j], want[j])) fail(variants[v]->name, "softmax", j, got[j], want[j]);
  }
}

// SwiGLU's activation: the reference within float rounding of gate / (1 + e^-gate) * up taken in double (for bf16
// rows, within the two bf16 roundings), a NaN gate NaN; every variant bit-identical to it.
template <typename R>
void check_silu_mul(const std::vector<const IsaKernels*>& variants, Rng& rng, int n) {
  using T = typename R::T;
  std::vector<T> gate(n), up(n), want(n);
  for (int i = 0; i < n; ++i) {
    gate[i] = R::make((rng.uniform() * 2.f - 1.f) * (i % 7 == 0 ? 120.f : 6.f));  // some past the clamp
    up[i] = R::make(rng.uniform() * 4.f - 2.f);
  }
  if (n > 5) gate[5] = R::make(NAN);
  (variants[0]->*R::silu_mul)(gate.data(), up.data(), n, want.data());
  const double bound = sizeof(T) == 2 ? 0x1p-7 : 0x1p-21;  // two roundings to T, the exponential's ulp
  for (int i = 0; i < n; ++i) {
    const double g = R::value(gate[i]), exact = g / (1.0 + std::exp(-g)) * R::value(up[i]);
    const double got = R::value(want[i]);
    const bool ok = std::isnan(g) ? std::isnan(got) : std::fabs(got - exact) <= std::fabs(exact) * bound + 1e-30;
    if (!ok) fail(variants[0]->name, "silu_mul rounding", i, static_cast<float>(got), static_cast<float>(exact));
    mix(static_cast<float>(got));
  }
  for (size_t v = 1; v < variants.size(); ++v) {
    std::vector<T> got(n);
    (variants[v]->*R::silu_mul)(gate.data(), up.data(), n, got.data());
    for (int i = 0; i < n; ++i)
      if (!same(static_cast<float>(R::value(got[i])), static_cast<float>(R::value(want[i]))))
        fail(variants[v]->name, "silu_mul", i, static_cast<float>(R::value(got[i])), static_cast<float>(R::value(want[i])));
  }
}

// RMSNorm: the reference within the roundings of the formula taken in double (the fp32 normalised value and,
// for bf16 rows, its two roundings to bf16), a NaN anywhere in a row NaN everywhere in it; every variant
// bit-identical to it, in place as well.
template <typename R>
void check_rms_norm(const std::vector<const IsaKernels*>& variants, Rng& rng, int n) {
  using T = typename R::T;
  std::vector<T> x(n), weight(n), want(n);
  for (int i = 0; i < n; ++i) x[i] = R::make(rng.uniform() * 8.f - 4.f), weight[i] = R::make(rng.uniform() * 2.f);
  const float eps = 1e-6f;
  (variants[0]->*R::rms_norm)(x.data(), weight.data(), n, eps, want.data());
  double squares = 0.0;
  for (int i = 0; i < n; ++i) squares += R::value(x[i]) * R::value(x[i]);
  const double r = 1.0 / std::sqrt(squares / n + eps), bound = sizeof(T) == 2 ? 0x1p-7 : 0x1p-21;
  for (int i = 0; i < n; ++i) {
    const double exact = R::value(x[i]) * r * R::value(weight[i]);
    if (std::fabs(R::value(want[i]) - exact) > std::fabs(exact) * bound + 1e-30)
      fail(variants[0]->name, "rms_norm rounding", i, static_cast<float>(R::value(want[i])), static_cast<float>(exact));
    mix(static_cast<float>(R::value(want[i])));
  }
  for (size_t v = 0; v < variants.size(); ++v) {
    std::vector<T> got = x;
    (variants[v]->*R::rms_norm)(got.data(), weight.data(), n, eps, got.data());
    for (int i = 0; i < n; ++i)
      if (!same(static_cast<float>(R::value(got[i])), static_cast<float>(R::value(want[i]))))
        fail(variants[v]->name, "rms_norm", i, static_cast<float>(R::value(got[i])), static_cast<float>(R::value(want[i])));
  }
  x[n / 2] = R::make(NAN);
  (variants[0]->*R::rms_norm)(x.data(), weight.data(), n, eps, want.data());
  for (int i = 0; i < n; ++i)
    if (!std::isnan(R::value(want[i]))) fail(variants[0]->name, "rms_norm of a NaN row", i, static_cast<float>(R::value(want[i])), NAN);
}

float from_bits(uint32_t bits) {
  float f;
  std::memcpy(&f, &bits, sizeof f);
  return f;
}

// round_bf16 and round_add_bf16 over ``n`` values: the reference against the formula, every variant against the
// reference, and nothing written past ``n``. Values of both signs and many magnitudes, ties to even either way,
// zeros of both signs, subnormals, infinities, the largest float (it rounds to infinity) and NaNs of either sign,
// quiet and with a payload in the low half only (a NaN must be told from x, not from its rounding).
void check_rounding(const std::vector<const IsaKernels*>& variants, Rng& rng, int n) {
  constexpr uint16_t kGuard = 0xA5A5;
  constexpr int kSlack = 16;  // a whole vector past n: a tail written as a full vector shows
  std::vector<float> to_round(n);
  for (float& v : to_round) v = std::ldexp(rng.uniform(), rng.below(40) - 20);
  for (int i = 0; i < n; i += 5) {  // exactly halfway between two bf16 values: rounds to the even one
    uint32_t bits;
    std::memcpy(&bits, &to_round[i], sizeof bits);
    bits = (bits & 0xFFFF0000u) | 0x8000u;
    std::memcpy(&to_round[i], &bits, sizeof bits);
  }
  const float specials[] = {NAN, -NAN, from_bits(0x7F800001u), from_bits(0xFF807FFFu), INFINITY, -INFINITY,
                            3.4028235e38f, 0.f, -0.f, from_bits(0x00018000u), from_bits(0x8000FFFFu)};
  for (float v : specials) to_round[rng.below(n)] = v;
  auto nan_or = [](float v, uint16_t bits) -> uint16_t { return std::isnan(v) ? 0x7FC0 : bits; };
  auto run = [&](const IsaKernels* isa, const uint16_t* bias) {
    std::vector<uint16_t> out(n + kSlack, kGuard);
    if (bias == nullptr)
      isa->round_bf16(to_round.data(), n, out.data());
    else
      isa->round_add_bf16(to_round.data(), bias, n, out.data());
    for (int i = n; i < n + kSlack; ++i)
      if (out[i] != kGuard) fail(isa->name, bias == nullptr ? "round_bf16 past n" : "round_add_bf16 past n", i, out[i], kGuard);
    out.resize(n);
    return out;
  };
  const std::vector<uint16_t> rounded_ref = run(variants[0], nullptr);
  for (int i = 0; i < n; ++i)
    if (rounded_ref[i] != nan_or(to_round[i], to_bf16(to_round[i])))
      fail(variants[0]->name, "round_bf16", i, rounded_ref[i], nan_or(to_round[i], to_bf16(to_round[i])));
  for (size_t v = 1; v < variants.size(); ++v)
    if (run(variants[v], nullptr) != rounded_ref) fail(variants[v]->name, "round_bf16", n, 0, 0);
  // round_add_bf16: the product rounded, then the bias added in fp32 and rounded (a NaN product stays NaN).
  std::vector<uint16_t> bias(n);
  for (uint16_t& b : bias) b = to_bf16(std::ldexp(rng.uniform(), rng.below(40) - 20));
  bias[rng.below(n)] = to_bf16(-INFINITY);
  const std::vector<uint16_t> added_ref = run(variants[0], bias.data());
  for (int i = 0; i < n; ++i) {
    const float sum = from_bf16(rounded_ref[i]) + from_bf16(bias[i]);
    if (added_ref[i] != nan_or(sum, to_bf16(sum))) fail(variants[0]->name, "round_add_bf16", i, added_ref[i], nan_or(sum, to_bf16(sum)));
  }
  for (size_t v = 1; v < variants.size(); ++v)
    if (run(variants[v], bias.data()) != added_ref) fail(variants[v]->name, "round_add_bf16", n, 0, 0);
}

// The vector helpers (attention loops over both cache types, attention weights, SwiGLU's activation, RMSNorm,
// bf16 rounding, SnakeBeta): the same bits on every variant.
void run_vector_case(const std::vector<const IsaKernels*>& variants, Rng& rng) {
  const int n = 16 * (1 + rng.below(16)), count = 1 + rng.below(16), stride = n + 16 * rng.below(3);
  check_attention_loops<Bf16Rows>(variants, rng, n, count, stride);
  check_attention_loops<F32Rows>(variants, rng, n, count, stride);
  check_rounding(variants, rng, n);
  check_rounding(variants, rng, 1 + rng.below(80));  // any length: the vector variants' remainders
  // rotate_bf16: three heads of n values, 16 apart beyond their width, against the formula in floats.
  const int heads = 3, head_stride = n + 16;
  std::vector<uint16_t> heads_in(heads * head_stride), rotated_ref(heads * n);
  std::vector<float> cos(n), sin(n);
  for (uint16_t& v : heads_in) v = to_bf16(rng.uniform() * 4.f);
  for (int i = 0; i < n; ++i) cos[i] = rng.uniform(), sin[i] = rng.uniform();
  variants[0]->rotate_bf16(heads_in.data(), heads, head_stride, n, cos.data(), sin.data(), rotated_ref.data());
  for (int h = 0; h < heads; ++h)
    for (int i = 0; i < n; ++i) {
      const float x = from_bf16(heads_in[h * head_stride + i]), r = from_bf16(heads_in[h * head_stride + (i + n / 2) % n]);
      const uint16_t want = to_bf16(std::fma(r, sin[i], x * cos[i]));
      if (rotated_ref[h * n + i] != want) fail(variants[0]->name, "rotate_bf16", h * n + i, rotated_ref[h * n + i], want);
    }
  for (size_t v = 1; v < variants.size(); ++v) {
    std::vector<uint16_t> rotated(heads * n);
    variants[v]->rotate_bf16(heads_in.data(), heads, head_stride, n, cos.data(), sin.data(), rotated.data());
    if (rotated != rotated_ref) fail(variants[v]->name, "rotate_bf16", 0, 0, 0);
  }
  run_softmax_case(variants, rng, 1 + rng.below(600));
  check_silu_mul<Bf16Rows>(variants, rng, 1 + rng.below(700));
  check_silu_mul<F32Rows>(variants, rng, 1 + rng.below(700));
  check_rms_norm<Bf16Rows>(variants, rng, 1 + rng.below(700));
  check_rms_norm<F32Rows>(variants, rng, 1 + rng.below(700));
  run_snake_case(variants, rng, n + rng.below(16));
}

// quantize.py's quantize_rows for one group, written as PyTorch computes it (a min and max, the scale's division
// and bf16 rounding, each value's division, nearbyint's half-to-even rounding, offset and clamp): the reference
// for pack_math.h's quantize_group, which the loader runs.
bool reference_group(const float* v, int n, int bits, bool symmetric, uint8_t* codes, uint16_t* scale, uint16_t* zero) {
  float lo = v[0], hi = v[0];
  for (int j = 0; j < n; ++j) {
    if (!std::isfinite(v[j])) return false;
    lo = std::fmin(lo, v[j]);
    hi = std::fmax(hi, v[j]);
  }
  float s, z = 0.f;
  if (bits == 8 || symmetric) {
    *scale = to_bf16(std::fmax(std::fmax(-lo, hi) / (bits == 8 ? 127.f : 7.f), 1e-12f));
    *zero = 0;
    s = from_bf16(*scale);
  } else {
    *scale = to_bf16(std::fmax((hi - lo) / 15.f, 1e-12f));
    s = from_bf16(*scale);
    *zero = to_bf16(lo + 8.f * s);
    z = from_bf16(*zero);
  }
  if (!std::isfinite(s) || !std::isfinite(z)) return false;
  for (int j = 0; j < n; ++j) {
    const float q = std::nearbyint((v[j] - z) / s);
    codes[j] = static_cast<uint8_t>(static_cast<int>(bits == 8 ? std::fmin(std::fmax(q, -127.f), 127.f)
                                                                : std::fmin(std::fmax(q + 8.f, 0.f), 15.f)));
  }
  return true;
}

// Groups over 120 binary orders, exact ties (power-of-two scales), zeros of both signs and subnormals, values
// near the largest float, NaN and infinity: quantize_group with each loop set built here against the reference.
int check_quantize_groups(Rng& rng) {
  namespace pack = edge_infer::pack;
  std::vector<std::pair<const char*, pack::GroupLoops>> loops{{"baseline loops", pack::group_loops(false)}};
#if defined(__x86_64__)
  if (__builtin_cpu_supports("avx2")) loops.emplace_back("avx2 loops", pack::group_loops(true));
#endif
  const int kGroups = 4000;
  std::vector<float> v(256);
  std::vector<uint8_t> want(256), got(256);
  for (int g = 0; g < kGroups; ++g) {
    const int n = 32 << rng.below(4), bits = rng.below(3) == 0 ? 8 : 4;
    const bool symmetric = bits == 8 || rng.below(2) == 0;
    const int kind = rng.below(5), top = bits == 8 ? 127 : 7;
    const float s = std::ldexp(1.f, rng.below(40) - 20);
    for (int j = 0; j < n; ++j) {
      switch (kind) {
        case 0: v[j] = std::ldexp(rng.uniform(), rng.below(120) - 60); break;
        case 1: v[j] = (symmetric ? rng.below(2 * top) - top : rng.below(14) - 6) * s + 0.5f * s; break;  // ties
        case 2: v[j] = rng.below(3) == 0 ? (rng.below(2) ? -0.f : 0.f) : rng.uniform() * 1e-40f; break;
        case 3: v[j] = rng.uniform() * 3.4e38f; break;
        default: v[j] = rng.uniform(); break;
      }
    }
    if (kind == 1 && symmetric) v[rng.below(n)] = top * s;  // the scale is s exactly
    if (kind == 1 && !symmetric) v[0] = -6 * s, v[1] = 9 * s;  // scale s and zero 2 s exactly
    if (kind == 4) v[rng.below(n)] = rng.below(2) ? NAN : (rng.below(2) ? INFINITY : -INFINITY);
    uint16_t want_scale = 0, want_zero = 0;
    const bool want_ok = reference_group(v.data(), n, bits, symmetric, want.data(), &want_scale, &want_zero);
    for (const auto& [name, set] : loops) {
      uint16_t got_scale = 0, got_zero = 0;
      const bool ok = pack::quantize_group(v.data(), n, bits, symmetric, set, got.data(), &got_scale, &got_zero);
      if (ok != want_ok) {
        fail(name, "quantize_group refusal", g, ok, want_ok);
      } else if (ok) {
        if (got_scale != want_scale || got_zero != want_zero) fail(name, "quantize_group scale/zero", g, got_scale, want_scale);
        for (int j = 0; j < n; ++j)
          if (got[j] != want[j]) {
            fail(name, "quantize_group code", g * 256 + j, got[j], want[j]);
            break;
          }
      }
    }
  }
  return kGroups * static_cast<int>(loops.size());
}

}  // namespace

int main(int argc, char** argv) {
  if (argc < 2) {
    std::printf("usage: %s VARIANT... (built here:", argv[0]);
    for (const char* const* name = edge_infer::built_isas(); *name != nullptr; ++name) std::printf(" %s", *name);
    std::printf(")\n");
    return 2;
  }
  std::vector<const IsaKernels*> variants{edge_infer::find_isa("scalar")};
  for (int i = 1; i < argc; ++i) {
    const IsaKernels* isa = edge_infer::find_isa(argv[i]);
    if (isa == nullptr) {
      std::printf("FAIL %s: not built into this harness\n", argv[i]);
      return 1;
    }
    variants.push_back(isa);
  }
  Rng rng{42};
  int cases = 0;
  for (int bits : {4, 8})
    for (int group : {32, 64, 128, 256})
      for (int symmetric = 0; symmetric < 2; ++symmetric)
        for (int bf16_input = 0; bf16_input < 2; ++bf16_input)
          for (int m : {1, 3, 6, 16, 48}) {  // 16 and 48: whole blocks for the tile units' panels
            if (bits == 8 && !symmetric) continue;  // int8 weights are symmetric
            const int groups = 1 + rng.below(3);
            const bool special = m > 1 && rng.below(2) == 0;
            const Case c{bits, m, group, groups, symmetric == 1, bf16_input == 1, special};
            run_case(variants, c, rng);
            ++cases;
          }
  for (int bits : {4, 8})
    for (int group : {32, 256})
      for (int m : {1, 2, 16}) {
        Case c{bits, m, group, 2, true, true, false};
        c.extreme = true;
        run_case(variants, c, rng);
        ++cases;
      }
  for (int fp16 = 0; fp16 < 2; ++fp16)
    for (int m : {1, 2, 5}) {
      run_w16_case(variants, fp16 == 1, m, rng);
      ++cases;
    }
  for (int i = 0; i < 32; ++i) run_vector_case(variants, rng);
  const int quantized_groups = check_quantize_groups(rng);
  std::printf("%s quantize_group: %d groups against the reference\n", failures ? "FAIL" : "ok", quantized_groups);
  for (size_t v = 0; v < variants.size(); ++v)
    std::printf("%s %s: %d matrix cases%s, 32 vector cases%s\n", failures ? "FAIL" : "ok", variants[v]->name, cases,
                variants[v]->panels_ready != nullptr
                    ? (", " + std::to_string(panel_cases) + " of them also in blocks of 16 on the tile unit").c_str()
                    : "",
                v == 0 ? " (the reference, against exact products)" : " (bit-identical to the reference)");
  std::printf("reference checksum %016llx\n", static_cast<unsigned long long>(checksum));
  return failures ? 1 : 0;
}
