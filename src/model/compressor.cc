#include "model/compressor.h"

#include <algorithm>
#include <cmath>

#include "core/formats.h"
#include "core/scratch.h"
#include "kernels/hadamard.h"
#include "kernels/norm.h"

namespace dsv4 {

void CompressorState::init(CachePool* pool, const CompressorWeights& w) {
  ring = PagedRows(pool, size_t(2 * w.coff * w.head_dim) * sizeof(float));
  rows = PagedRows(pool, size_t(w.head_dim) * sizeof(uint16_t));
  n_rows = 0;
}

size_t CompressorState::pages_missing(const CompressorWeights& w, int64_t n_tokens) const {
  return ring.pages_missing(std::min(n_tokens, w.ring_slots())) + rows.pages_missing(n_tokens / w.ratio);
}

void CompressorState::reserve(const CompressorWeights& w, int64_t n_tokens) {
  ring.reserve(std::min(n_tokens, w.ring_slots()));
  rows.reserve(n_tokens / w.ratio);
}

void CompressorState::read_rows(int64_t n, int hd, float* dst) const {
  for (int64_t r = 0; r < n; ++r) {
    const uint16_t* src = rows.row_bf16(r);
    for (int k = 0; k < hd; ++k) dst[r * hd + k] = bf16_to_f32(src[k]);
  }
}

void compressor_emit_row(const CompressorWeights& w, const ModelConfig& c, const RopeTable& rope,
                         const CompressorState& st, int64_t ci, float* out) {
  const int r = w.ratio, hd = w.head_dim, coff = w.coff, slots = coff * r, width = coff * hd;
  // Slot list: with overlapping windows (coff 2, CSA), block ci−1 (first
  // half channels) then block ci (second half); otherwise block ci only.
  std::vector<int64_t> tok;
  std::vector<int> half;
  if (coff == 2) {
    for (int s = 0; s < r; ++s) { tok.push_back((ci - 1) * r + s); half.push_back(0); }
    for (int s = 0; s < r; ++s) { tok.push_back(ci * r + s); half.push_back(1); }
  } else {
    for (int s = 0; s < r; ++s) { tok.push_back(ci * r + s); half.push_back(0); }
  }
  const int ns = int(tok.size());
  std::vector<const float*> src(static_cast<size_t>(ns), nullptr);
  for (int s = 0; s < ns; ++s)
    if (tok[s] >= 0) src[size_t(s)] = st.ring.row_f32(tok[s] % slots) + half[s] * hd;
  std::vector<float> p(static_cast<size_t>(ns));
  for (int ch = 0; ch < hd; ++ch) {
    float mx = -INFINITY;
    for (int s = 0; s < ns; ++s) {
      if (tok[s] < 0) { p[s] = -INFINITY; continue; }
      p[s] = src[size_t(s)][width + ch];
      mx = std::max(mx, p[s]);
    }
    float sum = 0.f;
    for (int s = 0; s < ns; ++s) sum += (p[s] = tok[s] < 0 ? 0.f : std::exp(p[s] - mx));
    float v = 0.f;
    for (int s = 0; s < ns; ++s) {
      if (tok[s] < 0) continue;
      v += (p[s] / sum) * src[size_t(s)][ch];
    }
    out[ch] = bf16r(v);
  }
  rms_norm_bf16(out, w.norm.data(), hd, c.rms_norm_eps, out);
  std::vector<float> cs(size_t(rope.rd()));
  rope.cos_sin(ci * r, cs.data());
  rope.rotate(out + hd - rope.rd(), cs.data());
  if (w.indexer) {
    hadamard_bf16(out, hd);
    q4_inplace(out, size_t(hd), 32);
  } else {
    q8_inplace(out, size_t(hd - rope.rd()), 64, c.scale_pow2);
  }
}

void compressor_project(const CompressorWeights& w, const float* x, int64_t n, CompressorActivations& act) {
  const int64_t width = int64_t(w.coff) * w.head_dim;
  LinearOpts fp32_out;
  fp32_out.out_bf16 = false;
  linear(w.wkv, x, n, scratch(act.a, size_t(n * width)), fp32_out);
  linear(w.wgate, x, n, scratch(act.g, size_t(n * width)), fp32_out);
}

void compressor_update(const CompressorWeights& w, const ModelConfig& c, const RopeTable& rope,
                       const CompressorActivations& act, int64_t i0, int64_t p0, int64_t n, CompressorState& st) {
  const int r = w.ratio, hd = w.head_dim, slots = w.coff * r, width = w.coff * hd;
  const float* const A = act.a.data() + i0 * width;
  const float* const G = act.g.data() + i0 * width;
  std::vector<float> row(static_cast<size_t>(hd));
  for (int64_t i = 0; i < n; ++i) {
    const int64_t t = p0 + i;
    float* slot = st.ring.row_f32(t % slots);
    const float* ape = w.ape.data() + (t % r) * width;
    for (int k = 0; k < width; ++k) {
      slot[k] = A[i * width + k];
      slot[width + k] = G[i * width + k] + ape[k];
    }
    if ((t + 1) % r == 0) {
      const int64_t ci = (t + 1) / r - 1;
      compressor_emit_row(w, c, rope, st, ci, row.data());
      uint16_t* dst = st.rows.row_bf16(ci);
      for (int k = 0; k < hd; ++k) dst[k] = f32_to_bf16(row[size_t(k)]);
      st.n_rows = ci + 1;
    }
  }
}

}  // namespace dsv4
