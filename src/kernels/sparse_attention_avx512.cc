// attend_query on AVX-512 (kernels/sparse_attention.h gives the definition
// it keeps bit for bit). This file alone is compiled with -mavx512f (and
// -mavx512bf16 where the compiler has it); like the gemm kernels it calls
// no inline function of another header with external linkage
// (exp_f32_lanes, kernels/exp.h, has internal linkage), nor std::vector's
// (an out-of-line copy compiled here could be the one the linker keeps for
// every caller): the caller owns the memory.
//
// Layout: the scores are kept key-major, S[j][h], heads in vector lanes.
// The keys are then the broadcast operand: a key row's pair dwords feed
// vdpbf16ps as they are stored, so nothing is gathered or transposed per
// query but q (H × d once, against nkeys × d keys). The softmax runs down
// the key axis with 16 heads a vector (the sum over j stays one sequential
// sum per head), and the weighted sum reads the pair rows again: a dword's
// high half is an even column, its low half the next odd one, so even and
// odd columns go to two accumulators and are interleaved once at the end.
#include "core/bf16_simd.h"
#include "core/formats.h"
#include "kernels/exp.h"
#include "kernels/gemm.h"
#include "kernels/gemm_micro.h"
#include "kernels/sparse_attention.h"

#ifdef __AVX512F__
#include <immintrin.h>

#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"  // GCC bug 105593, as in gemm_avx512bf16.cc
#pragma GCC diagnostic ignored "-Wuninitialized"

namespace dsv4 {

namespace {

constexpr int kScoreRows = 6;  // keys per score tile: 6 × 4 accumulators + 4 q vectors + 1 broadcast
constexpr int kMaxGroups = 4;  // 16-head vectors per score tile
constexpr int kPvHeads = 8;    // heads per weighted-sum tile: 8 × 2 accumulators

// The 16-lane steps of exp_f32_lanes (kernels/exp.h).
struct Lanes16 {
  static __m512 splat(float v) { return _mm512_set1_ps(v); }
  static __m512 clamp(__m512 x, __m512 lo, __m512 hi) { return _mm512_min_ps(_mm512_max_ps(x, lo), hi); }
  static __m512 round(__m512 x) { return _mm512_roundscale_ps(x, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC); }
  static __m512 fma(__m512 a, __m512 b, __m512 c) { return _mm512_fmadd_ps(a, b, c); }
};

// One key row's value i (even: a dword's high half, odd: its low half).
__m512 key_value16(const uint32_t* row, int64_t i) {
  const uint32_t w = row[i / 2];
  return _mm512_castsi512_ps(_mm512_set1_epi32(int(i % 2 ? w << 16 : w & 0xffff0000u)));
}

// S[r][v·16 + lane] for R keys and NG head vectors, fp32 FMAs: qt[i][lane]
// is q's value i of head lane of the first vector, vectors qstride apart.
template <int R, int NG>
void scores_f32(const uint32_t* const* keys, int64_t d, const float* qt, int64_t qstride, float* S, int64_t lds) {
  __m512 c[R][NG];
#pragma GCC unroll 8
  for (int r = 0; r < R; ++r)
#pragma GCC unroll 4
    for (int v = 0; v < NG; ++v) c[r][v] = _mm512_setzero_ps();
  for (int64_t i = 0; i < d; ++i) {
    __m512 b[NG];
#pragma GCC unroll 4
    for (int v = 0; v < NG; ++v) b[v] = _mm512_loadu_ps(qt + v * qstride + i * 16);
#pragma GCC unroll 8
    for (int r = 0; r < R; ++r) {
      const __m512 a = key_value16(keys[r], i);
#pragma GCC unroll 4
      for (int v = 0; v < NG; ++v) c[r][v] = _mm512_fmadd_ps(a, b[v], c[r][v]);
    }
  }
#pragma GCC unroll 8
  for (int r = 0; r < R; ++r)
#pragma GCC unroll 4
    for (int v = 0; v < NG; ++v) _mm512_storeu_ps(S + r * lds + v * 16, c[r][v]);
}

#ifdef __AVX512BF16__
// The same tile with vdpbf16ps (core/cpu.h: the high half's FMA first, so
// each lane continues the ascending chain): qp[p][lane] is the pair dword
// p of q's head lane.
template <int R, int NG>
void scores_dot(const uint32_t* const* keys, int64_t dp, const uint32_t* qp, int64_t qstride, float* S, int64_t lds) {
  __m512 c[R][NG];
  const uint32_t* k[R];
#pragma GCC unroll 8
  for (int r = 0; r < R; ++r) {
    k[r] = keys[r];
#pragma GCC unroll 4
    for (int v = 0; v < NG; ++v) c[r][v] = _mm512_setzero_ps();
  }
  for (int64_t p = 0; p < dp; ++p) {
    __m512bh b[NG];
#pragma GCC unroll 4
    for (int v = 0; v < NG; ++v) b[v] = (__m512bh)_mm512_loadu_si512(qp + v * qstride + p * 16);
#pragma GCC unroll 8
    for (int r = 0; r < R; ++r) {
      const __m512bh a = (__m512bh)_mm512_set1_epi32(int(k[r][p]));
#pragma GCC unroll 4
      for (int v = 0; v < NG; ++v) c[r][v] = _mm512_dpbf16_ps(c[r][v], a, b[v]);
    }
  }
#pragma GCC unroll 8
  for (int r = 0; r < R; ++r)
#pragma GCC unroll 4
    for (int v = 0; v < NG; ++v) _mm512_storeu_ps(S + r * lds + v * 16, c[r][v]);
}
#endif

// Runs Tile<R, NG> for `rows` ≤ kScoreRows keys, dispatching the row count.
template <int NG, template <int, int> class Tile, int R = kScoreRows, class... Args>
void score_rows(int rows, Args... args) {
  if constexpr (R > 1) {
    if (rows < R) return score_rows<NG, Tile, R - 1>(rows, args...);
  }
  Tile<R, NG>::run(args...);
}

template <int R, int NG>
struct ScoresF32 {
  static void run(const uint32_t* const* keys, int64_t d, const float* qt, int64_t qs, float* S, int64_t lds) {
    scores_f32<R, NG>(keys, d, qt, qs, S, lds);
  }
};
#ifdef __AVX512BF16__
template <int R, int NG>
struct ScoresDot {
  static void run(const uint32_t* const* keys, int64_t dp, const uint32_t* qp, int64_t qs, float* S, int64_t lds) {
    scores_dot<R, NG>(keys, dp, qp, qs, S, lds);
  }
};
#endif

template <template <int, int> class Tile, class... Args>
void score_tile(int groups, int rows, Args... args) {
  switch (groups) {
    case 1: return score_rows<1, Tile>(rows, args...);
    case 2: return score_rows<2, Tile>(rows, args...);
    case 3: return score_rows<3, Tile>(rows, args...);
    default: return score_rows<4, Tile>(rows, args...);
  }
}

// o[r][c] for R heads and the 32 columns of 16 pair dwords from dword c0 of
// every key (`m`: the dwords that exist): chains over j ascending.
template <int R>
void weighted_sum_tile(const uint32_t* const* keys, int64_t nkeys, const float* P, int64_t ldp, int64_t c0,
                       __mmask16 m, float* o, int64_t ldo, int64_t ncols) {
  __m512 even[R], odd[R];
#pragma GCC unroll 8
  for (int r = 0; r < R; ++r) even[r] = odd[r] = _mm512_setzero_ps();
  for (int64_t j = 0; j < nkeys; ++j) {
    const __m512i w = _mm512_maskz_loadu_epi32(m, keys[j] + c0);
    const __m512 e = bf16_high(w), od = bf16_low(w);
    const float* p = P + j * ldp;
#pragma GCC unroll 8
    for (int r = 0; r < R; ++r) {
      const __m512 pr = _mm512_set1_ps(p[r]);
      even[r] = _mm512_fmadd_ps(pr, e, even[r]);
      odd[r] = _mm512_fmadd_ps(pr, od, odd[r]);
    }
  }
  const __m512i lo_idx = _mm512_setr_epi32(0, 16, 1, 17, 2, 18, 3, 19, 4, 20, 5, 21, 6, 22, 7, 23);
  const __m512i hi_idx = _mm512_add_epi32(lo_idx, _mm512_set1_epi32(8));
  const __mmask16 m_lo = ncols >= 16 ? __mmask16(0xffff) : __mmask16((1u << ncols) - 1);
  const __mmask16 m_hi = ncols >= 32   ? __mmask16(0xffff)
                         : ncols <= 16 ? __mmask16(0)
                                       : __mmask16((1u << (ncols - 16)) - 1);
#pragma GCC unroll 8
  for (int r = 0; r < R; ++r) {
    _mm512_mask_storeu_ps(o + r * ldo, m_lo, _mm512_permutex2var_ps(even[r], lo_idx, odd[r]));
    _mm512_mask_storeu_ps(o + r * ldo + 16, m_hi, _mm512_permutex2var_ps(even[r], hi_idx, odd[r]));
  }
}

template <int R = kPvHeads>
void weighted_sum_rows(int heads, const uint32_t* const* keys, int64_t nkeys, const float* P, int64_t ldp, int64_t c0,
                       __mmask16 m, float* o, int64_t ldo, int64_t ncols) {
  if constexpr (R > 1) {
    if (heads < R) return weighted_sum_rows<R - 1>(heads, keys, nkeys, P, ldp, c0, m, o, ldo, ncols);
  }
  weighted_sum_tile<R>(keys, nkeys, P, ldp, c0, m, o, ldo, ncols);
}

// q's heads as the score tiles read them, 16 heads to a group. With
// bf16_dot, pair panels [dp][16] per group where the BF16 kernel may take
// them (gemm.h's exactness rule): returns true. Otherwise q transposed,
// [group][i][16] with i up to 2·dp (the last one zero for odd d).
bool prepare_q(const float* q, int64_t H, int64_t d, int key_min_exponent, bool bf16_dot,
               const AttentionScratch& scratch) {
  const int64_t dp = (d + 1) / 2, groups = (H + 15) / 16;
#ifdef __AVX512BF16__
  if (bf16_dot) {
    bool dot = true;
    int q_min_exponent = 255;
    for (int64_t g = 0; g < groups && dot; ++g) {
      const float* rows[16];
      for (int l = 0; l < 16; ++l) rows[l] = g * 16 + l < H ? q + (g * 16 + l) * d : nullptr;
      int e = 255;
      dot = gemm_pack_gathered_rows_bf16(rows, d, scratch.q_pairs + g * dp * 16, &e);
      q_min_exponent = e < q_min_exponent ? e : q_min_exponent;
    }
    if (dot && q_min_exponent + key_min_exponent >= kDotMinBiasedExponentSum) return true;
  }
#else
  (void)key_min_exponent, (void)bf16_dot;
#endif
  for (int64_t g = 0; g < groups; ++g)
    for (int64_t i = 0; i < 2 * dp; ++i)
      for (int l = 0; l < 16; ++l) {
        const int64_t h = g * 16 + l;
        scratch.q_columns[(g * 2 * dp + i) * 16 + l] = h < H && i < d ? q[h * d + i] : 0.f;
      }
  return false;
}

// S[j][h] = q_h · key_j (unscaled), in tiles of kScoreRows keys by up to
// kMaxGroups head groups; `dot`: from the pair panels (prepare_q).
void compute_scores(int64_t H, const uint32_t* const* keys, int64_t nkeys, int64_t d, bool dot,
                    const AttentionScratch& scratch, float* S, int64_t Hp) {
  const int64_t dp = (d + 1) / 2, groups = (H + 15) / 16;
  for (int64_t g0 = 0; g0 < groups; g0 += kMaxGroups) {
    const int ng = int(groups - g0 < kMaxGroups ? groups - g0 : kMaxGroups);
    for (int64_t j = 0; j < nkeys; j += kScoreRows) {
      const int rows = int(nkeys - j < kScoreRows ? nkeys - j : kScoreRows);
      float* s = S + j * Hp + g0 * 16;
#ifdef __AVX512BF16__
      if (dot) {
        score_tile<ScoresDot>(ng, rows, keys + j, dp, (const uint32_t*)scratch.q_pairs + g0 * dp * 16, dp * 16, s,
                              Hp);
        continue;
      }
#endif
      score_tile<ScoresF32>(ng, rows, keys + j, 2 * dp, (const float*)scratch.q_columns + g0 * 2 * dp * 16,
                            2 * dp * 16, s, Hp);
    }
  }
  (void)dot;
}

// Softmax down the key axis, 16 heads at a time, in the definition's order:
// S[j][h] becomes head h's weight of key j.
void softmax_columns(float* S, int64_t nkeys, int64_t H, int64_t Hp, const float* sinks, float scale) {
  const __m512 scale_v = _mm512_set1_ps(scale);
  for (int64_t g = 0; g < Hp / 16; ++g) {
    float* s = S + g * 16;
    __m512 mx = _mm512_set1_ps(-INFINITY);
    for (int64_t j = 0; j < nkeys; ++j) {
      const __m512 v = _mm512_mul_ps(_mm512_loadu_ps(s + j * Hp), scale_v);
      _mm512_storeu_ps(s + j * Hp, v);
      mx = _mm512_max_ps(v, mx);  // std::max(mx, v): mx unless mx < v
    }
    __m512 den = _mm512_setzero_ps();
    for (int64_t j = 0; j < nkeys; ++j) {
      const __m512 e = exp_f32_lanes<Lanes16>(_mm512_sub_ps(_mm512_loadu_ps(s + j * Hp), mx));
      _mm512_storeu_ps(s + j * Hp, e);
      den = _mm512_add_ps(den, e);
    }
    const int64_t lanes = H - g * 16 < 16 ? H - g * 16 : 16;
    const __mmask16 m = __mmask16((1u << lanes) - 1);
    den = _mm512_add_ps(den, exp_f32_lanes<Lanes16>(_mm512_sub_ps(_mm512_maskz_loadu_ps(m, sinks + g * 16), mx)));
    for (int64_t j = 0; j < nkeys; ++j) _mm512_storeu_ps(s + j * Hp, _mm512_div_ps(_mm512_loadu_ps(s + j * Hp), den));
  }
}

// out[h][c] = Σ_j S[j][h] · key_j[c], rounded to bf16: per tile of heads,
// per 32 columns (16 dwords of every key).
void weighted_sum(const float* S, int64_t Hp, int64_t H, const uint32_t* const* keys, int64_t nkeys, int64_t d,
                  float* out) {
  const int64_t dp = (d + 1) / 2;
  for (int64_t h = 0; h < H; h += kPvHeads) {
    const int heads = int(H - h < kPvHeads ? H - h : kPvHeads);
    for (int64_t c0 = 0; c0 < dp; c0 += 16) {
      const int64_t left = dp - c0;
      const __mmask16 m = left >= 16 ? __mmask16(0xffff) : __mmask16((1u << left) - 1);
      weighted_sum_rows(heads, keys, nkeys, S + h, Hp, c0, m, out + h * d + 2 * c0, d,
                        d - 2 * c0 < 32 ? d - 2 * c0 : 32);
    }
  }
  bf16r_inplace(out, size_t(H * d));
}

}  // namespace

void attend_query_avx512(const float* q, int64_t H, const uint32_t* const* keys, int64_t nkeys, int64_t d,
                         int key_min_exponent, const float* sinks, float scale, float* out, bool bf16_dot,
                         const AttentionScratch& scratch) {
  const int64_t Hp = (H + 15) / 16 * 16;
  float* const S = scratch.scores;  // [nkeys][Hp]
  const bool dot = prepare_q(q, H, d, key_min_exponent, bf16_dot, scratch);
  compute_scores(H, keys, nkeys, d, dot, scratch, S, Hp);
  softmax_columns(S, nkeys, H, Hp, sinks, scale);
  weighted_sum(S, Hp, H, keys, nkeys, d, out);
}

}  // namespace dsv4
#endif
