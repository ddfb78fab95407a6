// Software prefetches for the decode kernels, which stream many weight rows
// at once (more streams than the hardware prefetchers follow).
//
// Written as asm statements, not _mm_prefetch: GCC 12's local mod/ref pass
// declares the inline _mm_prefetch const, and a call to a const function
// whose result is unused may be deleted before it is inlined. Functions
// that did nothing but prefetch lost every prefetch that way: the AVX2
// GEMV tiles' object held not one prefetch instruction
// (docs/PERFORMANCE_LOG.md, session 32).
#pragma once

namespace dsv4 {

// Asks for the cache line holding p into L1 (prefetcht0).
inline void prefetch_l1(const void* p) { asm volatile("prefetcht0 %0" : : "m"(*static_cast<const char*>(p))); }

// Asks for the cache line holding p into L2 (prefetcht1).
inline void prefetch_l2(const void* p) { asm volatile("prefetcht1 %0" : : "m"(*static_cast<const char*>(p))); }

}  // namespace dsv4
