// Working buffers kept from call to call: one workspace per thread.
//
// A hot function that needs a large temporary (an activation block, a
// query's scores, a gemm's decoded panels) takes it from the calling
// thread's workspace: workspace<T>(Buf::kName, n) returns that thread's
// buffer kName with room for n values. A buffer grows to the largest size
// asked of it and stays, so steady-state calls allocate nothing. A fresh
// std::vector per call would be zero-filled every time and, over glibc's
// mmap threshold (blocks of up to 32 MB get their own mapping), also mapped
// and faulted in anew, which costs a large product as much as its
// arithmetic. Buffers of 4 MB and more are advised into huge pages before
// their first touch.
//
// Every thread has its own workspace (each pool worker, and each thread
// that calls a kernel), created on its first use and freed when the thread
// ends. The rule for holding a buffer:
//  - Each Buf belongs to the one function named at its entry below; only
//    that function asks for it.
//  - It holds the buffer for one call: from asking for it until it
//    returns. It may hand the pointer to the tasks of its own parallel_for
//    (they end before the call does) but to nothing that outlives the call.
//  - Asking for the same Buf again on the same thread may move the buffer,
//    so the owner must not be re-entered on its thread while it holds one
//    (a nested parallel_for runs inline on the caller's thread: what runs
//    inside must not be the owner again; gemm's row slices call gemm before
//    it takes its buffers).
//  - The contents are undefined when the call takes the buffer: it writes
//    every element it reads.
#pragma once
#include <cstddef>
#include <cstdint>
#include <memory>
#include <type_traits>
#include <vector>

namespace dsv4 {

enum class Buf {
  kGemmAPairs,       // gemm: A packed into bf16 pairs (read by the tasks on every thread)
  kGemmARows,        // gemm: A copied with a padded row stride
  kGemmPanels,       // gemm's tasks: their B panels in fp32
  kGemmPanelPairs,   // gemm's tasks: their B panels as bf16 pairs
  kGemmSums,         // gemm's tasks: a chunk's partial sums
  kPanelRow,         // Weight::dequant_panel_reference: one dequantised row
  kLinearInput,      // linear: the FP8-quantised input rows
  kGemvInputPairs,   // gemv: the input rows as bf16 pairs, for the BF16 dot-product tiles
  kAttentionScores,  // attend_query (either path): the query's scores
  kAttentionQPairs,  // attend_query: q as bf16 pair panels
  kAttentionQColumns,  // attend_query: q transposed
  kSamplerLogits,    // sample: the logits with the request's penalties and biases
  kSamplerWeights,   // sample: every id's weight
  kSamplerKept,      // sample: the ids the filters keep
  kSamplerRanks,     // sample: ids with their weights, in rank order
  kSamplerSortSpare,  // sample: the rank sort's second buffer
  kCount
};

// Asks the kernel to back [p, p + bytes) with transparent huge pages where
// it allows them on request (Linux THP "madvise" mode; elsewhere nothing).
// Fresh memory faulted in 4 KB at a time costs milliseconds per MB (~3.5 ms
// on the project VM); 2 MB pages take 512 times fewer faults.
void advise_huge_pages(void* p, size_t bytes);

// A block of `bytes`, 2 MB aligned and advised into huge pages, that frees
// itself: for the large copies made once at load (packed weights).
std::shared_ptr<uint8_t> huge_page_block(size_t bytes);

namespace detail {
struct WorkspaceBuffer {
  void* data = nullptr;
  size_t bytes = 0;
};
// The calling thread's buffer b.
WorkspaceBuffer& workspace_buffer(Buf b);
// Replaces b's memory with a fresh block of at least `bytes` (64-byte
// aligned, huge pages advised from 4 MB); the old contents are not kept.
void grow_workspace_buffer(WorkspaceBuffer& b, size_t bytes);
}  // namespace detail

// The calling thread's buffer b, with room for n values of T (see the
// rule above).
template <class T>
T* workspace(Buf b, size_t n) {
  static_assert(std::is_trivially_copyable_v<T> && std::is_trivially_destructible_v<T>, "plain values only");
  detail::WorkspaceBuffer& w = detail::workspace_buffer(b);
  if (w.bytes < n * sizeof(T)) detail::grow_workspace_buffer(w, n * sizeof(T));
  return static_cast<T*>(w.data);
}

// The same growth for a vector its owner keeps itself (the model's and the
// engine's per-thread buffers): v holds at least n elements; what it held
// before is not kept when it grows.
template <class T>
T* scratch(std::vector<T>& v, size_t n) {
  if (v.size() < n) {
    std::vector<T> fresh;
    fresh.reserve(n);
    if (n * sizeof(T) >= (size_t(4) << 20)) advise_huge_pages(fresh.data(), n * sizeof(T));
    fresh.resize(n);
    v.swap(fresh);
  }
  return v.data();
}

}  // namespace dsv4
