#include "core/cpu.h"

#include <atomic>

#include "core/error.h"
#include "core/peak.h"

namespace dsv4 {

namespace {

bool cpu_has(Isa isa) {
  switch (isa) {
    case Isa::kScalar: return true;
#if defined(__x86_64__) && defined(__AVX2__) && defined(__FMA__)
    // __builtin_cpu_supports also checks that the OS saves the vector
    // registers (XCR0), so a feature the kernel hides reads as absent.
    case Isa::kAvx2: return __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma");
#ifdef DSV4_HAVE_AVX512_KERNELS
    case Isa::kAvx512: return __builtin_cpu_supports("avx512f");
#ifdef DSV4_HAVE_AVX512BF16_KERNELS
    // The FP4/FP8 pair decoders also use AVX512-BW (vpermw, vpermi2w) and
    // AVX512-VBMI (vpmultishiftqb). Every AVX512-BF16 CPU has BW; all but
    // Intel's Cooper Lake have VBMI (there the engine runs Isa::kAvx512).
    case Isa::kAvx512Bf16:
      return __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
             __builtin_cpu_supports("avx512vbmi") && __builtin_cpu_supports("avx512bf16");
#else
    case Isa::kAvx512Bf16: return false;
#endif
#else
    case Isa::kAvx512:
    case Isa::kAvx512Bf16: return false;
#endif
#else
    default: return false;
#endif
  }
  return false;
}

std::atomic<int> g_isa{-1}, g_gemv_isa{-1};  // -1: not chosen yet

std::string unsupported(Isa isa) {
  std::string have;
  for (Isa i : supported_isas()) have += std::string(have.empty() ? "" : ", ") + isa_name(i);
  return std::string("kernel variant '") + isa_name(isa) + "' is not supported by this CPU or build (supported: " +
         have + ")";
}

}  // namespace

const char* isa_name(Isa isa) {
  switch (isa) {
    case Isa::kScalar: return "scalar";
    case Isa::kAvx2: return "avx2";
    case Isa::kAvx512: return "avx512";
    case Isa::kAvx512Bf16: return "avx512bf16";
  }
  return "?";
}

std::vector<Isa> supported_isas() {
  std::vector<Isa> r;
  for (Isa isa : {Isa::kScalar, Isa::kAvx2, Isa::kAvx512, Isa::kAvx512Bf16})
    if (cpu_has(isa)) r.push_back(isa);
  return r;
}

Isa default_isa() {
  const Isa best = supported_isas().back();
  if (best == Isa::kAvx512Bf16 && bf16_dot_to_fma_ratio() < 1.0) return Isa::kAvx512;
  return best;
}

Isa kernel_isa() {
  int v = g_isa.load(std::memory_order_relaxed);
  if (v < 0) {
    v = int(default_isa());
    g_gemv_isa.store(int(supported_isas().back()), std::memory_order_relaxed);
    g_isa.store(v, std::memory_order_relaxed);
  }
  return Isa(v);
}

Isa gemv_isa() {
  kernel_isa();
  return Isa(g_gemv_isa.load(std::memory_order_relaxed));
}

void set_kernel_isa(Isa isa) {
  if (!cpu_has(isa)) throw Error(unsupported(isa));
  g_gemv_isa.store(int(isa == default_isa() ? supported_isas().back() : isa), std::memory_order_relaxed);
  g_isa.store(int(isa), std::memory_order_relaxed);
}

void set_gemv_isa(Isa isa) {
  if (!cpu_has(isa)) throw Error(unsupported(isa));
  kernel_isa();
  g_gemv_isa.store(int(isa), std::memory_order_relaxed);
}

Isa parse_isa(const std::string& s, const std::string& what) {
  for (Isa isa : {Isa::kScalar, Isa::kAvx2, Isa::kAvx512, Isa::kAvx512Bf16})
    if (s == isa_name(isa)) return isa;
  throw Error(what + ": expected scalar, avx2, avx512 or avx512bf16, got '" + s + "'");
}

}  // namespace dsv4
