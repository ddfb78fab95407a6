// Which vector instructions the kernels use, chosen at run time.
//
// One binary runs on every x86-64 machine with AVX2 + FMA (the build floor)
// and takes the AVX-512 GEMM micro-kernel where the CPU and the OS support
// it. The choice changes speed, never a result: every kernel variant keeps
// the one-FMA-chain-per-output order of its scalar reference, so outputs are
// bitwise equal across variants and machines (PREFILL.md §6).
//
// kAvx512Bf16 adds the BF16 dot-product instruction vdpbf16ps to the GEMM.
// Per 32-bit lane it is two fused multiply-adds in a row, the high bf16 half
// first, with subnormal inputs and results flushed to zero (Intel's
// definition; on the AMD family-26 CPU here it matched fp32 FMAs done that
// way in 3.2 million random cases). With each pair stored high = k, low =
// k + 1 it continues the same ascending-k chain, so gemm uses it only where
// that is exact: every operand a bf16 value and products far enough from the
// subnormal range that no flush can happen (kernels/gemm.cc).
#pragma once
#include <string>
#include <vector>

namespace dsv4 {

enum class Isa { kScalar, kAvx2, kAvx512, kAvx512Bf16 };

const char* isa_name(Isa isa);

// Variants this build has and this CPU can run, slowest first.
std::vector<Isa> supported_isas();

// The variant kernel_isa() starts with: the last of supported_isas(),
// except that AVX512-BF16 gives way to AVX-512 where vdpbf16ps does fewer
// flops per second than fp32 FMA (core/peak.h). On the Intel Xeon of
// session 18 it does half as many, and the fp32 kernels prefilled 1.45×
// faster (docs/PERFORMANCE.md).
Isa default_isa();

// The variant the kernels use now: default_isa() unless set.
Isa kernel_isa();

// The variant the GEMV tiles (kernels/gemv.h: decode, a few input rows)
// use now: kernel_isa(), except while that is default_isa() where
// default_isa() gave way to AVX-512: there the last of supported_isas(),
// AVX512-BF16. At a few rows the time is the weights' trip from memory and
// their decoding, which the bf16 pair decoders do in half the instructions;
// the rate of vdpbf16ps, which lost the measurement, hardly counts. On the
// Intel Xeon of sessions 13-18 and 28 one stream decoded 9.6-11.6 tokens/s
// that way against 8.7-9.6 on the fp32 tiles (docs/PERFORMANCE.md). Past
// 8 input rows kernels/gemv.cc still takes fp32 FMAs there. Every variant
// gives the same bits, so any pair of them may run together.
Isa gemv_isa();

// Throws Error when `isa` is not supported here. Sets gemv_isa() too: to
// `isa`, or where `isa` is default_isa(), to gemv_isa()'s default.
void set_kernel_isa(Isa isa);

// Sets gemv_isa() alone (until the next set_kernel_isa); throws Error when
// `isa` is not supported here.
void set_gemv_isa(Isa isa);

// Parses "scalar", "avx2", "avx512" or "avx512bf16" (the DSV4_ISA environment variable
// of the dsv4 command); throws Error naming `what` otherwise.
Isa parse_isa(const std::string& s, const std::string& what);

}  // namespace dsv4
