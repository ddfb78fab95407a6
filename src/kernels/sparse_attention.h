// Sparse attention with sink for one query (MODEL.md §6.5): all H heads of
// q against the same key rows (K = V), which the caller has gathered.
//
// Definition (attend_head, per head, and every variant bit for bit):
//   s_j = (FMA chain of q·k_j in ascending i) · d^(−1/2),  M = max_j s_j,
//   e_j = exp_f32(s_j − M),  den = (Σ_j e_j in ascending j) + exp_f32(sink − M),
//   o[c] = bf16(FMA chain of (e_j / den) · k_j[c] in ascending j).
// The keys come in the order the caller fixed (window, then compressed
// rows), so the result does not depend on tiling or threads.
#pragma once
#include <cstdint>

#include "core/arith.h"

namespace dsv4 {

// Key rows are bf16 values stored as pairs (kernels/gemm_micro.h): dword i
// holds value 2i in its high half and 2i + 1 in its low half (zero past d),
// ceil(d/2) dwords a row. The BF16 dot-product kernel reads them as they
// are, and they are half the bytes of fp32 rows.
inline int64_t key_pair_count(int64_t d) { return ceil_div<int64_t>(d, 2); }

// Packs d fp32 values into a pair row, rounding each to bf16 (keys are bf16
// values: exact). Returns the smallest biased exponent among the non-zero
// values, 255 when there are none (the BF16 kernel's exactness check).
int pack_key_row(const float* x, int64_t d, uint32_t* out);
// The same for a row already stored as bf16.
int pack_key_row(const uint16_t* x, int64_t d, uint32_t* out);

// out [H][d] (bf16 values). keys[j]: nkeys pair rows of d values;
// key_min_exponent: a lower bound of their non-zero values' biased
// exponents (the smallest pack_key_row returned), which decides only
// whether the BF16 kernel may take the scores, never the result.
void attend_query(const float* q, int64_t H, const uint32_t* const* keys, int64_t nkeys, int64_t d,
                  int key_min_exponent, const float* sinks, float* out);

// The definition for one head over fp32 key rows: plain loops.
void attend_head(const float* q, const float* const* keys, int64_t nkeys, int64_t d, float sink, float* out);

// The vector kernels. sparse_attention_avx512.cc, where kernel_isa() allows
// Isa::kAvx512: attend_query on 16-lane vectors (nkeys > 0, scale =
// d^(−1/2)); `bf16_dot`: the scores may use vdpbf16ps (Isa::kAvx512Bf16).
// Its working memory, with Hp = H rounded up to 16 and dp =
// key_pair_count(d): scores nkeys × Hp, q_pairs Hp × dp, q_columns Hp × 2·dp.
// sparse_attention_avx2.cc, where kernel_isa() is Isa::kAvx2: the same on
// 8-lane vectors, with Hp = H rounded up to 8 and no q_pairs.
struct AttentionScratch {
  float* scores;
  uint32_t* q_pairs;
  float* q_columns;
};
void attend_query_avx512(const float* q, int64_t H, const uint32_t* const* keys, int64_t nkeys, int64_t d,
                         int key_min_exponent, const float* sinks, float scale, float* out, bool bf16_dot,
                         const AttentionScratch& scratch);
void attend_query_avx2(const float* q, int64_t H, const uint32_t* const* keys, int64_t nkeys, int64_t d,
                       const float* sinks, float scale, float* out, const AttentionScratch& scratch);

}  // namespace dsv4
