#include "kernels/sparse_attention.h"

#include <algorithm>
#include <cmath>
#include <vector>

#include "core/arith.h"
#include "core/cpu.h"
#include "core/formats.h"
#include "core/scratch.h"
#include "kernels/exp.h"
#include "kernels/gemm.h"

namespace dsv4 {

namespace {

// Biased exponent of a non-zero bf16 value's bits, 255 for zero.
int bf16_exponent(uint16_t h) { return (h & 0x7fff) ? (h >> 7) & 0xff : 255; }

template <class Bf16At>
int pack_pairs(int64_t d, uint32_t* out, Bf16At at) {
  int e = 255;
  for (int64_t i = 0; i < key_pair_count(d); ++i) {
    const uint16_t hi = at(2 * i), lo = 2 * i + 1 < d ? at(2 * i + 1) : uint16_t(0);
    e = std::min({e, bf16_exponent(hi), bf16_exponent(lo)});
    out[i] = uint32_t(hi) << 16 | lo;
  }
  return e;
}

float key_value(const uint32_t* row, int64_t i) {
  const uint32_t w = row[i / 2];
  return bits_f32(i % 2 ? w << 16 : w & 0xffff0000u);
}

// The scores, softmax and weighted sum of the definition on gemm (its FMA
// chains are the definition's): Isa::kScalar's path.
void attend_query_gemm(const float* q, int64_t H, const uint32_t* const* keys, int64_t nkeys, int64_t d,
                       const float* sinks, float scale, float* out) {
  float* const s = workspace<float>(Buf::kAttentionScores, size_t(H * nkeys));  // every score is written by the gemm
  auto key_panel = [&](int64_t n0, float* panel) {
    for (int j = 0; j < kGemmNR; ++j)
      for (int64_t i = 0; i < d; ++i) panel[i * kGemmNR + j] = n0 + j < nkeys ? key_value(keys[n0 + j], i) : 0.f;
  };
  gemm(q, d, H, d, nkeys, key_panel, GemmOut{s, nkeys, false}, /*parallel=*/false);
  for (int64_t h = 0; h < H; ++h) {
    float* sh = s + h * nkeys;
    float mx = -INFINITY;
    for (int64_t j = 0; j < nkeys; ++j) mx = std::max(mx, sh[j] *= scale);
    float den = 0.f;
    for (int64_t j = 0; j < nkeys; ++j) den += (sh[j] = exp_f32(sh[j] - mx));
    den += exp_f32(sinks[h] - mx);
    for (int64_t j = 0; j < nkeys; ++j) sh[j] /= den;
  }
  // o[h][c] = Σ_j p[h][j] · key_j[c]: B rows are key columns.
  auto key_columns = [&](int64_t c0, float* panel) {
    for (int64_t j = 0; j < nkeys; ++j)
      for (int c = 0; c < kGemmNR; ++c) panel[j * kGemmNR + c] = c0 + c < d ? key_value(keys[j], c0 + c) : 0.f;
  };
  gemm(s, nkeys, H, nkeys, d, key_columns, GemmOut{out, d, true}, /*parallel=*/false);
}

}  // namespace

int pack_key_row(const float* x, int64_t d, uint32_t* out) {
  return pack_pairs(d, out, [&](int64_t i) { return f32_to_bf16(x[i]); });
}

int pack_key_row(const uint16_t* x, int64_t d, uint32_t* out) {
  return pack_pairs(d, out, [&](int64_t i) { return x[i]; });
}

void attend_query(const float* q, int64_t H, const uint32_t* const* keys, int64_t nkeys, int64_t d,
                  int key_min_exponent, const float* sinks, float* out) {
  if (nkeys == 0) {  // no mass but the sink's: every output is 0
    std::fill(out, out + H * d, 0.f);
    return;
  }
  const Isa isa = kernel_isa();
  const float scale = 1.0f / std::sqrt(float(d));
#ifdef DSV4_HAVE_AVX512_KERNELS
  if (isa == Isa::kAvx512 || isa == Isa::kAvx512Bf16) {
    const int64_t Hp = round_up<int64_t>(H, 16), dp = key_pair_count(d);
    const AttentionScratch ws{workspace<float>(Buf::kAttentionScores, size_t(nkeys * Hp)),
                              workspace<uint32_t>(Buf::kAttentionQPairs, size_t(Hp * dp)),
                              workspace<float>(Buf::kAttentionQColumns, size_t(Hp * 2 * dp))};
    return attend_query_avx512(q, H, keys, nkeys, d, key_min_exponent, sinks, scale, out, isa == Isa::kAvx512Bf16,
                               ws);
  }
#endif
#if defined(__AVX2__) && defined(__FMA__)
  if (isa == Isa::kAvx2) {
    const int64_t Hp = round_up<int64_t>(H, 8);
    const AttentionScratch ws{workspace<float>(Buf::kAttentionScores, size_t(nkeys * Hp)), nullptr,
                              workspace<float>(Buf::kAttentionQColumns, size_t(Hp * 2 * key_pair_count(d)))};
    return attend_query_avx2(q, H, keys, nkeys, d, sinks, scale, out, ws);
  }
#endif
  (void)isa;
  attend_query_gemm(q, H, keys, nkeys, d, sinks, scale, out);
}

void attend_head(const float* q, const float* const* keys, int64_t nkeys, int64_t d, float sink, float* out) {
  const float scale = 1.0f / std::sqrt(float(d));
  std::vector<float> s(static_cast<size_t>(nkeys));
  float mx = -INFINITY;
  for (int64_t j = 0; j < nkeys; ++j) {
    float acc = 0.f;
    for (int64_t i = 0; i < d; ++i) acc = std::fma(q[i], keys[j][i], acc);
    mx = std::max(mx, s[size_t(j)] = acc * scale);
  }
  float den = 0.f;
  for (int64_t j = 0; j < nkeys; ++j) den += (s[size_t(j)] = exp_f32(s[size_t(j)] - mx));
  den += exp_f32(sink - mx);
  for (float& p : s) p /= den;
  for (int64_t c = 0; c < d; ++c) {
    float acc = 0.f;
    for (int64_t j = 0; j < nkeys; ++j) acc = std::fma(s[size_t(j)], keys[j][c], acc);
    out[c] = bf16r(acc);
  }
}

}  // namespace dsv4
