// Small integer and hashing helpers used across the code, so that each is
// written once. The files compiled with -mavx512f spell these out instead:
// they call no inline function of another header (kernels/gemm_micro.h
// says why).
#pragma once
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <string>
#include <type_traits>

namespace dsv4 {

// ⌈a / b⌉ for a >= 0, b > 0.
template <typename T>
constexpr T ceil_div(T a, T b) {
  static_assert(std::is_integral_v<T>);
  return (a + b - 1) / b;
}

// a rounded up to a multiple of b (a >= 0, b > 0).
template <typename T>
constexpr T round_up(T a, T b) {
  return ceil_div(a, b) * b;
}

// FNV-1a 64 over bytes, continuing from `h` (the offset basis by default):
// checksums that say "these bytes are equal", not a cryptographic hash.
constexpr uint64_t kFnv1aBasis = 0xcbf29ce484222325ull;
inline uint64_t fnv1a64(const void* data, size_t bytes, uint64_t h = kFnv1aBasis) {
  const auto* p = static_cast<const unsigned char*>(data);
  for (size_t i = 0; i < bytes; ++i) h = (h ^ p[i]) * 0x100000001b3ull;
  return h;
}

// A checksum as 16 hex digits, as the reports print them.
inline std::string hex16(uint64_t v) {
  char buf[17];
  std::snprintf(buf, sizeof buf, "%016llx", (unsigned long long)v);
  return buf;
}

}  // namespace dsv4
