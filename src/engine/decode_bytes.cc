#include "engine/decode_bytes.h"

#include <algorithm>

namespace dsv4 {

namespace {

constexpr double kF32 = 4, kBf16 = 2;

double ceil_div(int64_t a, int64_t b) { return double((a + b - 1) / b); }

// One compressor (MODEL.md §7) of row width hd at step t: its matrices and
// ape row; when t completes a row, the norm and the ring slots it pools.
void add_compressor(const ModelConfig& c, const WeightFormats& f, LayerKind kind, int64_t hd, int64_t t,
                    DecodeBytes& b) {
  const int64_t D = c.hidden_size, coff = kind.compressor_overlap(), r = kind.ratio;
  b.compressors += 2 * matrix_bytes(f.compressor, coff * hd, D, c.weight_block_size) + kF32 * double(coff * hd);
  if ((t + 1) % r != 0) return;
  b.compressors += kF32 * double(hd);
  // Row ci pools block ci (and, overlapping, block ci − 1 when there is
  // one); each slot gives hd values and hd scores.
  const int64_t ci = (t + 1) / r - 1, slots = r + (coff == 2 && ci > 0 ? r : 0);
  b.compressor_ring += kF32 * double(slots * 2 * hd);
}

// The weights of layer L's attention sublayer (projections, compressors,
// indexer) and the cache rows it reads at step t.
void add_attention(const ModelConfig& c, const WeightFormats& f, int L, int64_t t, DecodeBytes& b) {
  const int64_t D = c.hidden_size, H = c.num_attention_heads, d = c.head_dim, ql = c.q_lora_rank,
                ol = c.o_lora_rank, G = c.o_groups, B = c.weight_block_size, Hi = c.index_n_heads,
                di = c.index_head_dim;
  const LayerKind kind = c.layer_kind(L);
  b.attention += matrix_bytes(f.attention, ql, D, int(B)) + matrix_bytes(f.attention, H * d, ql, int(B)) +
                 matrix_bytes(f.attention, d, D, int(B)) + matrix_bytes(f.attention, G * ol, H * d / G, int(B)) +
                 matrix_bytes(f.attention, D, G * ol, int(B)) + kF32 * double(ql + d + H);
  b.window += kBf16 * double(std::min<int64_t>(c.sliding_window - 1, t) * d);
  if (!kind.has_compressor()) return;
  add_compressor(c, f, kind, d, t, b);
  const int64_t visible = kind.visible_rows(t);
  if (!kind.has_indexer()) {
    b.compressed += kBf16 * double(visible * d);
    return;
  }
  add_compressor(c, f, kind, di, t, b);
  b.indexer += matrix_bytes(f.attention, Hi * di, ql, int(B)) + matrix_bytes(f.indexer_proj, Hi, D, int(B));
  b.compressed += kBf16 * double(std::min<int64_t>(c.index_topk, visible) * d);
  if (visible > c.index_topk) b.indexer_rows += kBf16 * double(visible * di);
}

// Layer L's hc mixers and norms, gate and experts.
void add_ffn_and_hc(const ModelConfig& c, const WeightFormats& f, int L, DecodeBytes& b) {
  const int64_t D = c.hidden_size, hc = c.hc_mult, mix = (2 + hc) * hc, E = c.n_routed_experts,
                k = c.num_experts_per_tok, I = c.moe_intermediate_size, B = c.weight_block_size;
  // hc_attn and hc_ffn: fn [mix][hc·D], base [mix], scale [3]; attn_norm, ffn_norm.
  b.hc += 2 * kF32 * double(mix * hc * D + mix + 3) + 2 * kF32 * double(D);
  b.gate += matrix_bytes(f.gate, E, D, int(B)) + (c.is_hash_layer(L) ? 4.0 * double(k) : kF32 * double(E));
  b.routed_experts += double(k) * routed_expert_bytes(c, f);
  b.shared_experts += double(c.n_shared_experts) *
                      (2 * matrix_bytes(f.shared_experts, I, D, int(B)) + matrix_bytes(f.shared_experts, D, I, int(B)));
}

}  // namespace

double matrix_bytes(WeightFormat f, int64_t out, int64_t in, int block) {
  const double n = double(out) * double(in);
  switch (f) {
    case WeightFormat::kFP8: return n + ceil_div(out, block) * ceil_div(in, block);
    case WeightFormat::kFP4: return n / 2 + n / 32;
    case WeightFormat::kBF16: return kBf16 * n;
    case WeightFormat::kF32: return kF32 * n;
  }
  return 0;
}

double routed_expert_bytes(const ModelConfig& c, const WeightFormats& f) {
  const int64_t D = c.hidden_size, I = c.moe_intermediate_size;
  return 2 * matrix_bytes(f.routed_experts, I, D, c.weight_block_size) +
         matrix_bytes(f.routed_experts, D, I, c.weight_block_size);
}

DecodeBytes decode_step_bytes(const ModelConfig& c, const WeightFormats& f, int64_t t) {
  DecodeBytes b;
  for (int L = 0; L < c.num_hidden_layers; ++L) {
    add_attention(c, f, L, t, b);
    add_ffn_and_hc(c, f, L, b);
  }
  const int64_t D = c.hidden_size, hc = c.hc_mult;
  // One embedding row; hc_head fn [hc][hc·D], base [hc], scale [1]; the
  // final norm; the head [vocab][D].
  b.head = matrix_bytes(f.embed, 1, D, c.weight_block_size) + kF32 * double(hc * hc * D + hc + 1) +
           kF32 * double(D) + matrix_bytes(f.head, c.vocab_size, D, c.weight_block_size);
  return b;
}

}  // namespace dsv4
