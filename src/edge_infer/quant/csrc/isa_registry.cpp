// The variants of this architecture, by name. Compiled with the baseline flags: it only looks tables up.
#include <cstring>

#include "isa.h"

namespace edge_infer {

// Weak references: a variant whose instruction set the compiler lacks is left out of the build
// (quant/native_build.py) and then resolves to a null address here.
extern const IsaKernels kScalar;
#if defined(__x86_64__)
extern const IsaKernels kAvx2 __attribute__((weak));
extern const IsaKernels kAvxVnni __attribute__((weak));
extern const IsaKernels kAvx512Vnni __attribute__((weak));
extern const IsaKernels kAmxInt8 __attribute__((weak));
#elif defined(__aarch64__)
extern const IsaKernels kNeonDotprod __attribute__((weak));
#endif

namespace {

const IsaKernels* const kCandidates[] = {
    &kScalar,
#if defined(__x86_64__)
    &kAvx2, &kAvxVnni, &kAvx512Vnni, &kAmxInt8,
#elif defined(__aarch64__)
    &kNeonDotprod,
#endif
};
constexpr int kCount = sizeof kCandidates / sizeof kCandidates[0];

}  // namespace

const IsaKernels* find_isa(const char* name) {
  for (const IsaKernels* isa : kCandidates)
    if (isa != nullptr && std::strcmp(isa->name, name) == 0) return isa;
  return nullptr;
}

const char* const* built_isas() {
  static const struct Names {  // a static initialized once, thread-safely
    const char* list[kCount + 1] = {};
    Names() {
      int n = 0;
      for (const IsaKernels* isa : kCandidates)
        if (isa != nullptr) list[n++] = isa->name;
    }
  } names;
  return names.list;
}

}  // namespace edge_infer
