// Which vector instructions the kernels use, chosen at run time.
//
// One binary runs on every x86-64 machine with AVX2 + FMA (the build floor)
// and takes the AVX-512 GEMM micro-kernel where the CPU and the OS support
// it. The choice changes speed, never a result: every kernel variant keeps
// the one-FMA-chain-per-output order of its scalar reference, so outputs are
// bitwise equal across variants and machines (PREFILL.md §6). For the same
// reason BF16 dot-product instructions (vdpbf16ps, which adds two products
// before rounding) are not used.
#pragma once
#include <string>
#include <vector>

namespace dsv4 {

enum class Isa { kScalar, kAvx2, kAvx512 };

const char* isa_name(Isa isa);

// Variants this build has and this CPU can run, slowest first.
std::vector<Isa> supported_isas();

// The variant the kernels use now: the fastest supported one unless set.
Isa kernel_isa();

// Throws Error when `isa` is not supported here.
void set_kernel_isa(Isa isa);

// Parses "scalar", "avx2" or "avx512" (the DSV4_ISA environment variable
// of the dsv4 command); throws Error naming `what` otherwise.
Isa parse_isa(const std::string& s, const std::string& what);

}  // namespace dsv4
