#include "engine/flops.h"

#include <algorithm>

namespace dsv4 {

double FlopCounts::stage(Stage s) const {
  switch (s) {
    case Stage::kProjections: return projections;
    case Stage::kCompressors: return compressors;
    case Stage::kIndexer: return indexer_proj + indexer_scores;
    case Stage::kAttention: return attention;
    case Stage::kGate: return gate;
    case Stage::kExperts: return routed_experts + shared_experts;
    case Stage::kHc: return hc;
    case Stage::kHead: return head;
    default: return 0;
  }
}

FlopCounts& FlopCounts::operator+=(const FlopCounts& o) {
  projections += o.projections;
  compressors += o.compressors;
  indexer_proj += o.indexer_proj;
  indexer_scores += o.indexer_scores;
  attention += o.attention;
  gate += o.gate;
  routed_experts += o.routed_experts;
  shared_experts += o.shared_experts;
  hc += o.hc;
  head += o.head;
  return *this;
}

namespace {

// Multiply-adds to flops.
constexpr double kFma = 2.0;

// wkv and wgate of a compressor over rows of width hd (coff halves: two when
// the windows overlap, CSA).
double compressor_macs(const ModelConfig& c, LayerKind kind, int64_t hd) {
  const double coff = kind.compressor_overlap();
  return 2.0 * coff * double(hd) * double(c.hidden_size);
}

// The parts that do not depend on the position.
FlopCounts per_token_fixed(const ModelConfig& c, int layer) {
  const double D = c.hidden_size, H = c.num_attention_heads, d = c.head_dim, ql = c.q_lora_rank,
               ol = c.o_lora_rank, G = c.o_groups, Hi = c.index_n_heads, di = c.index_head_dim,
               E = c.n_routed_experts, k = c.num_experts_per_tok, I = c.moe_intermediate_size,
               hc = c.hc_mult;
  const LayerKind kind = c.layer_kind(layer);
  FlopCounts f;
  // wq_a, wq_b, wkv, then the grouped wo_a (G blocks of ol × H·d/G) and wo_b.
  f.projections = kFma * (D * ql + ql * H * d + D * d + ol * H * d + G * ol * D);
  if (kind.has_compressor()) f.compressors = kFma * compressor_macs(c, kind, c.head_dim);
  if (kind.has_indexer()) {
    f.compressors += kFma * compressor_macs(c, kind, c.index_head_dim);
    f.indexer_proj = kFma * (ql * Hi * di + D * Hi);
  }
  f.gate = kFma * D * E;
  const double expert = 3.0 * D * I;  // w1, w3: I × D; w2: D × I
  f.routed_experts = kFma * k * expert;
  f.shared_experts = kFma * double(c.n_shared_experts) * expert;
  // Per sublayer (attention, MoE): hc_pre's fn product ((2+hc)·hc × hc·D)
  // and weighted sum (hc·D), hc_post's post·f + Σ_j C[j][k]·X[j] (hc·(hc+1)·D).
  f.hc = 2.0 * kFma * ((2 + hc) * hc * hc * D + hc * D + hc * (hc + 1) * D);
  return f;
}

}  // namespace

int64_t visible_compressed_rows(const ModelConfig& c, int layer, int64_t t) {
  return c.layer_kind(layer).visible_rows(t);
}

int64_t attention_keys(const ModelConfig& c, int layer, int64_t t) {
  const int64_t window = std::min<int64_t>(c.sliding_window, t + 1);
  const int64_t vis = visible_compressed_rows(c, layer, t);
  const int64_t comp = c.layer_kind(layer).has_indexer() ? std::min<int64_t>(c.index_topk, vis) : vis;
  return window + comp;
}

FlopCounts token_flops(const ModelConfig& c, int layer, int64_t t) {
  FlopCounts f = per_token_fixed(c, layer);
  const double H = c.num_attention_heads, d = c.head_dim;
  f.attention = kFma * 2.0 * double(attention_keys(c, layer, t)) * H * d;  // QK and PV
  if (c.layer_kind(layer).has_indexer())
    f.indexer_scores = kFma * double(visible_compressed_rows(c, layer, t)) * double(c.index_n_heads) *
                       double(c.index_head_dim);
  return f;
}

FlopCounts layer_flops(const ModelConfig& c, int layer, int64_t n_tokens) {
  FlopCounts f;
  if (n_tokens <= 0) return f;
  f = per_token_fixed(c, layer);
  const double n = double(n_tokens);
  f.projections *= n;
  f.compressors *= n;
  f.indexer_proj *= n;
  f.gate *= n;
  f.routed_experts *= n;
  f.shared_experts *= n;
  f.hc *= n;
  // Exact per position; integer sums stay exact (far below 2^63).
  int64_t keys = 0, scored = 0;
  const bool idx = c.layer_kind(layer).has_indexer();
  for (int64_t t = 0; t < n_tokens; ++t) {
    keys += attention_keys(c, layer, t);
    if (idx) scored += visible_compressed_rows(c, layer, t);
  }
  f.attention = kFma * 2.0 * double(keys) * double(c.num_attention_heads) * double(c.head_dim);
  f.indexer_scores = kFma * double(scored) * double(c.index_n_heads) * double(c.index_head_dim);
  return f;
}

FlopCounts prefill_flops(const ModelConfig& c, int64_t n_tokens, int64_t head_rows) {
  FlopCounts f;
  for (int L = 0; L < c.num_hidden_layers; ++L) f += layer_flops(c, L, n_tokens);
  const double D = c.hidden_size, hc = c.hc_mult;
  // hc_head: fn (hc × hc·D) and the weighted sum; then the head (vocab × D).
  f.head = kFma * double(head_rows) * (hc * hc * D + hc * D + double(c.vocab_size) * D);
  return f;
}

}  // namespace dsv4
