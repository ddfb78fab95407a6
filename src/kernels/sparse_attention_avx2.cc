// attend_query on AVX2 + FMA (kernels/sparse_attention.h gives the definition
// it keeps bit for bit): the AVX-512 kernel's layout at 8 lanes, for CPUs
// without AVX-512. Before it, those CPUs ran attention on gemm, which packs
// an fp32 panel of every key twice per query (once for the scores, once for
// the weighted sum): a third of the FLOP peak, against two thirds for the
// rest of prefill on the Zen 3 of session 29.
//
// Layout: the scores are kept key-major, S[j][h], eight heads in a vector's
// lanes; a key's pair dword is broadcast and split into its even value
// (high half) and odd value (low half), which continue every lane's
// ascending chain over q's transposed columns. The softmax runs down the key
// axis, a sequential sum per head lane. The weighted sum reads 8 pair dwords
// (16 columns) of each key at a time into an even and an odd accumulator
// per head, interleaved once at the end.
#include "kernels/sparse_attention.h"

#if defined(__AVX2__) && defined(__FMA__)
#include <immintrin.h>

#include "core/bf16_simd.h"
#include "core/formats.h"
#include "kernels/exp.h"

namespace dsv4 {

namespace {

constexpr int kLanes = 8;
// Score tile: 2 keys × 4 head vectors, 8 accumulators. Per pair dword, each
// key's even (then odd) value meets 4 vectors of q's column, which GCC
// takes as the FMAs' memory operands: 18 loads (2 of them broadcasts) feed
// 16 FMAs, about what Zen 3's two ymm loads a cycle allow; it ran at ~75%
// of one thread's FMA peak (docs/PERFORMANCE_LOG.md, session 30).
constexpr int kScoreRows = 2;
constexpr int kMaxGroups = 4;
// Weighted-sum tile: 6 heads × 16 columns, 12 accumulators; one 8-dword load
// and 6 broadcasts of P feed 12 FMAs.
constexpr int kPvHeads = 6;

// S[r][v·8 + lane] for R keys and NG head vectors: qt[i][lane] is q's value i
// of head lane of the first vector (i < 2·dp), vectors qstride apart.
template <int R, int NG>
void scores_tile(const uint32_t* const* keys, int64_t dp, const float* qt, int64_t qstride, float* S, int64_t lds) {
  __m256 c[R][NG];
  const uint32_t* k[R];
#pragma GCC unroll 8
  for (int r = 0; r < R; ++r) {
    k[r] = keys[r];
#pragma GCC unroll 8
    for (int v = 0; v < NG; ++v) c[r][v] = _mm256_setzero_ps();
  }
  for (int64_t p = 0; p < dp; ++p) {
#pragma GCC unroll 2
    for (int half = 0; half < 2; ++half) {  // q's columns 2p, then 2p + 1
      __m256 b[NG];
#pragma GCC unroll 8
      for (int v = 0; v < NG; ++v) b[v] = _mm256_loadu_ps(qt + (2 * p + half) * kLanes + v * qstride);
#pragma GCC unroll 8
      for (int r = 0; r < R; ++r) {
        const __m256i w = _mm256_set1_epi32(int(k[r][p]));
        const __m256 a = half == 0 ? bf16_high(w) : bf16_low(w);
#pragma GCC unroll 8
        for (int v = 0; v < NG; ++v) c[r][v] = _mm256_fmadd_ps(a, b[v], c[r][v]);
      }
    }
  }
#pragma GCC unroll 8
  for (int r = 0; r < R; ++r)
#pragma GCC unroll 8
    for (int v = 0; v < NG; ++v) _mm256_storeu_ps(S + r * lds + v * kLanes, c[r][v]);
}

template <int NG>
void score_rows(int rows, const uint32_t* const* keys, int64_t dp, const float* qt, int64_t qs, float* S,
                int64_t lds) {
  static_assert(kScoreRows == 2);
  if (rows == 2) return scores_tile<2, NG>(keys, dp, qt, qs, S, lds);
  scores_tile<1, NG>(keys, dp, qt, qs, S, lds);
}

// S[j][h] = q_h · key_j (unscaled), in tiles of kScoreRows keys by up to
// kMaxGroups head vectors.
void compute_scores(const uint32_t* const* keys, int64_t nkeys, int64_t dp, const float* q_columns, float* S,
                    int64_t Hp) {
  const int64_t groups = Hp / kLanes, qs = 2 * dp * kLanes;
  static_assert(kMaxGroups == 4);
  for (int64_t g0 = 0; g0 < groups; g0 += kMaxGroups) {
    const int ng = int(groups - g0 < kMaxGroups ? groups - g0 : kMaxGroups);
    const float* const qt = q_columns + g0 * qs;
    for (int64_t j = 0; j < nkeys; j += kScoreRows) {
      const int rows = int(nkeys - j < kScoreRows ? nkeys - j : kScoreRows);
      float* const s = S + j * Hp + g0 * kLanes;
      switch (ng) {
        case 1: score_rows<1>(rows, keys + j, dp, qt, qs, s, Hp); break;
        case 2: score_rows<2>(rows, keys + j, dp, qt, qs, s, Hp); break;
        case 3: score_rows<3>(rows, keys + j, dp, qt, qs, s, Hp); break;
        default: score_rows<4>(rows, keys + j, dp, qt, qs, s, Hp); break;
      }
    }
  }
}

// q transposed, [group][i][8] with i < 2·dp, zero past H and past d.
void transpose_q(const float* q, int64_t H, int64_t d, int64_t Hp, float* q_columns) {
  const int64_t di = 2 * key_pair_count(d);
  for (int64_t g = 0; g < Hp / kLanes; ++g)
    for (int64_t i = 0; i < di; ++i)
      for (int l = 0; l < kLanes; ++l) {
        const int64_t h = g * kLanes + l;
        q_columns[(g * di + i) * kLanes + l] = h < H && i < d ? q[h * d + i] : 0.f;
      }
}

// Lanes below n set, as maskload/maskstore read them.
__m256i lane_mask(int64_t n) {
  return _mm256_cmpgt_epi32(_mm256_set1_epi32(int(n < kLanes ? n : kLanes)), _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7));
}

// Softmax down the key axis, 8 heads at a time, in the definition's order:
// S[j][h] becomes head h's weight of key j.
void softmax_columns(float* S, int64_t nkeys, int64_t H, int64_t Hp, const float* sinks, float scale) {
  const __m256 scale_v = _mm256_set1_ps(scale);
  for (int64_t g = 0; g < Hp / kLanes; ++g) {
    float* const s = S + g * kLanes;
    __m256 mx = _mm256_set1_ps(-INFINITY);
    for (int64_t j = 0; j < nkeys; ++j) {
      const __m256 v = _mm256_mul_ps(_mm256_loadu_ps(s + j * Hp), scale_v);
      _mm256_storeu_ps(s + j * Hp, v);
      mx = _mm256_max_ps(v, mx);  // std::max(mx, v): mx unless mx < v
    }
    __m256 den = _mm256_setzero_ps();
    for (int64_t j = 0; j < nkeys; ++j) {
      const __m256 e = exp_f32_lanes<Lanes8>(_mm256_sub_ps(_mm256_loadu_ps(s + j * Hp), mx));
      _mm256_storeu_ps(s + j * Hp, e);
      den = _mm256_add_ps(den, e);
    }
    const __m256 sink = _mm256_maskload_ps(sinks + g * kLanes, lane_mask(H - g * kLanes));
    den = _mm256_add_ps(den, exp_f32_lanes<Lanes8>(_mm256_sub_ps(sink, mx)));
    for (int64_t j = 0; j < nkeys; ++j) _mm256_storeu_ps(s + j * Hp, _mm256_div_ps(_mm256_loadu_ps(s + j * Hp), den));
  }
}

// o[r][0..ncols) for R heads, the columns of the 8 pair dwords from dword c0
// of every key (`m`: the dwords that exist, `full`: all 8): chains over j
// ascending.
template <int R>
void weighted_sum_tile(const uint32_t* const* keys, int64_t nkeys, const float* P, int64_t ldp, int64_t c0, bool full,
                       __m256i m, float* o, int64_t ldo, int64_t ncols) {
  __m256 even[R], odd[R];
#pragma GCC unroll 8
  for (int r = 0; r < R; ++r) even[r] = odd[r] = _mm256_setzero_ps();
  for (int64_t j = 0; j < nkeys; ++j) {
    const uint32_t* const k = keys[j] + c0;
    // vpmaskmovd only for the last block: on Zen 3 it held the tile to
    // two thirds of the rate of plain loads.
    const __m256i w = full ? _mm256_loadu_si256(reinterpret_cast<const __m256i*>(k))
                           : _mm256_maskload_epi32(reinterpret_cast<const int*>(k), m);
    const __m256 e = bf16_high(w), od = bf16_low(w);
    const float* const p = P + j * ldp;
#pragma GCC unroll 8
    for (int r = 0; r < R; ++r) {
      const __m256 pr = _mm256_broadcast_ss(p + r);
      even[r] = _mm256_fmadd_ps(pr, e, even[r]);
      odd[r] = _mm256_fmadd_ps(pr, od, odd[r]);
    }
  }
#pragma GCC unroll 8
  for (int r = 0; r < R; ++r) {
    // unpack interleaves within 128-bit halves: lo = columns 0–3 | 8–11,
    // hi = 4–7 | 12–15.
    const __m256 lo = _mm256_unpacklo_ps(even[r], odd[r]), hi = _mm256_unpackhi_ps(even[r], odd[r]);
    alignas(32) float cols[2 * kLanes];
    _mm256_store_ps(cols, _mm256_permute2f128_ps(lo, hi, 0x20));
    _mm256_store_ps(cols + kLanes, _mm256_permute2f128_ps(lo, hi, 0x31));
    for (int64_t c = 0; c < ncols; ++c) o[r * ldo + c] = cols[c];
  }
}

template <int R = kPvHeads, class... Args>
void weighted_sum_rows(int heads, Args... args) {
  if constexpr (R > 1) {
    if (heads < R) return weighted_sum_rows<R - 1>(heads, args...);
  }
  weighted_sum_tile<R>(args...);
}

// out[h][c] = Σ_j S[j][h] · key_j[c], rounded to bf16: per column block of 8
// pair dwords, per tile of heads.
void weighted_sum(const float* S, int64_t Hp, int64_t H, const uint32_t* const* keys, int64_t nkeys, int64_t d,
                  float* out) {
  const int64_t dp = key_pair_count(d);
  for (int64_t c0 = 0; c0 < dp; c0 += kLanes) {
    const bool full = dp - c0 >= kLanes;
    const __m256i m = lane_mask(dp - c0);
    const int64_t ncols = d - 2 * c0 < 2 * kLanes ? d - 2 * c0 : 2 * kLanes;
    for (int64_t h = 0; h < H; h += kPvHeads) {
      const int heads = int(H - h < kPvHeads ? H - h : kPvHeads);
      weighted_sum_rows(heads, keys, nkeys, S + h, Hp, c0, full, m, out + h * d + 2 * c0, d, ncols);
    }
  }
  bf16r_inplace(out, size_t(H * d));
}

}  // namespace

void attend_query_avx2(const float* q, int64_t H, const uint32_t* const* keys, int64_t nkeys, int64_t d,
                       const float* sinks, float scale, float* out, const AttentionScratch& scratch) {
  const int64_t Hp = (H + kLanes - 1) / kLanes * kLanes;
  float* const S = scratch.scores;  // [nkeys][Hp]
  transpose_q(q, H, d, Hp, scratch.q_columns);
  compute_scores(keys, nkeys, key_pair_count(d), scratch.q_columns, S, Hp);
  softmax_columns(S, nkeys, H, Hp, sinks, scale);
  weighted_sum(S, Hp, H, keys, nkeys, d, out);
}

}  // namespace dsv4
#endif
