#include "model/weights.h"

#include <cstring>

#include "core/arith.h"
#include "core/error.h"
#include "core/formats.h"
#include "core/memory_usage.h"
#include "core/scratch.h"
#include "kernels/gemv.h"

namespace dsv4 {

Weight load_weight(const Checkpoint& ck, const std::string& prefix, Weight::Kind kind, int64_t out, int64_t in,
                   int block) {
  Weight w;
  w.kind = kind;
  w.out = out;
  w.in = in;
  w.block = block;
  const std::string wn = prefix + ".weight";
  auto scale_name = [&]() { return ck.resolve(prefix + ".scale"); };
  switch (kind) {
    case Weight::Kind::kF32:
      w.data = ck.get(wn, DType::kF32, {out, in}).data;
      break;
    case Weight::Kind::kBF16:
      w.data = ck.get(wn, DType::kBF16, {out, in}).data;
      break;
    case Weight::Kind::kFP8:
      w.data = ck.get(wn, DType::kF8E4M3, {out, in}).data;
      w.scale = ck.get(scale_name(), DType::kF8E8M0, {ceil_div(out, int64_t(block)), ceil_div(in, int64_t(block))}).data;
      break;
    case Weight::Kind::kFP4:
      if (in % 32 != 0) throw Error(wn + ": FP4 input width " + std::to_string(in) + " is not a multiple of 32");
      w.data = ck.get_any(wn, {DType::kI8, DType::kU8}, {out, in / 2}).data;
      w.scale = ck.get(scale_name(), DType::kF8E8M0, {out, in / 32}).data;
      break;
  }
  return w;
}

std::vector<float> load_vector(const Checkpoint& ck, const std::string& name, const Shape& shape,
                               const std::vector<DType>& dtypes) {
  const TensorView& t = ck.get_any(name, dtypes, shape);
  std::vector<float> v(size_t(t.numel()));
  if (t.dtype == DType::kF32) {
    std::memcpy(v.data(), t.data, v.size() * 4);
  } else {
    for (size_t i = 0; i < v.size(); ++i) {
      uint16_t h;
      std::memcpy(&h, t.data + 2 * i, 2);
      v[i] = bf16_to_f32(h);
    }
  }
  return v;
}

namespace {

HcWeights load_hc(const Checkpoint& ck, const std::string& p, const ModelConfig& c) {
  const int64_t mix = int64_t(2 + c.hc_mult) * c.hc_mult, width = int64_t(c.hc_mult) * c.hidden_size;
  HcWeights w;
  w.fn = load_vector(ck, p + "_fn", {mix, width}, {DType::kF32});
  w.base = load_vector(ck, p + "_base", {mix}, {DType::kF32});
  w.scale = load_vector(ck, p + "_scale", {3}, {DType::kF32});
  return w;
}

CompressorWeights load_compressor(const Checkpoint& ck, const std::string& p, const ModelConfig& c, LayerKind kind,
                                  int hd, bool indexer) {
  CompressorWeights w;
  w.ratio = kind.ratio;
  w.coff = kind.compressor_overlap();
  w.head_dim = hd;
  w.indexer = indexer;
  const int64_t D = c.hidden_size, width = int64_t(w.coff) * hd;
  w.wkv = load_weight(ck, p + ".wkv", Weight::Kind::kBF16, width, D, c.weight_block_size);
  w.wgate = load_weight(ck, p + ".wgate", Weight::Kind::kBF16, width, D, c.weight_block_size);
  w.ape = load_vector(ck, p + ".ape", {w.ratio, width}, {DType::kF32});
  w.norm = load_vector(ck, p + ".norm.weight", {hd}, {DType::kBF16, DType::kF32});
  return w;
}

// A layer's FP8 and FP4 matrices repacked as panels (kernels/gemv.h
// pack_quant_panels), where the kernels read them (decode's GEMV at 1-2
// rows ran 1.6-1.9x faster on FP4 panels than on the rows, Zen 4, session
// 21; on FP8 ones ~2x; the AVX2 FP4 tiles 1.6-2x, Zen 3, session 33), in
// one block on 2 MB pages. The rows' pages are
// then let go: nothing reads them but fallbacks (scales vdpbf16ps cannot
// take, other kernel variants), which map them in again; kept resident, a
// model the size of the memory would hold them twice. A layer whose panels
// would not fit in the memory available now keeps its rows: a model larger
// than the memory is read from the mapped file as it is used. An FP8 matrix
// with a NaN code keeps its rows too (its slice of the block goes unused).
std::shared_ptr<const uint8_t> repack_quant_panels(LayerWeights& l) {
  std::vector<Weight*> ws;
  size_t bytes = 0;
  auto add = [&](Weight& w) {
    if (const size_t b = quant_panel_bytes(w)) {
      ws.push_back(&w);
      bytes += b;
    }
  };
  for_each_quant_matrix(l, add);
  if (ws.empty() || bytes >= available_memory_bytes()) return nullptr;
  const std::shared_ptr<uint8_t> block = huge_page_block(bytes);
  uint8_t* at = block.get();
  for (Weight* w : ws) {
    const size_t b = quant_panel_bytes(*w);
    if (pack_quant_panels(*w, at)) {
      release_mapped_pages(w->data, size_t(w->out * w->row_bytes()));
      if (w->kind == Weight::Kind::kFP4) release_mapped_pages(w->scale, size_t(w->out * (w->in / 32)));
    }
    at += b;
  }
  return block;
}

// A layer's FP8 matrices decoded to bf16 pair panels (kernels/gemv.h
// pack_pair_panels) where the GEMV tiles run on AVX2: there decoding FP8 in
// registers, not the memory, held decode's attention projections (Zen 3,
// session 29), and twice the bytes decoded by a shift took less time. The
// rows' pages are let go as for the quantised panels; prefill's gemm maps
// them in again. A matrix whose panels would not fit in the memory
// available now keeps its rows.
std::vector<std::shared_ptr<const uint32_t>> repack_pair_panels(LayerWeights& l) {
  std::vector<std::shared_ptr<const uint32_t>> owners;
  for_each_quant_matrix(l, [&](Weight& w) {
    if (w.kind != Weight::Kind::kFP8 || w.fp8_panels || w.out <= 0 ||
        size_t(w.out) * size_t(w.in) * 2 >= available_memory_bytes())
      return;
    if (std::shared_ptr<const uint32_t> p = pack_pair_panels(w)) {
      release_mapped_pages(w.data, size_t(w.out * w.row_bytes()));
      owners.push_back(std::move(p));
    }
  });
  return owners;
}

ExpertWeights load_expert(const Checkpoint& ck, const std::string& p, const ModelConfig& c, Weight::Kind kind) {
  const int64_t D = c.hidden_size, I = c.moe_intermediate_size;
  ExpertWeights e;
  e.w1 = load_weight(ck, p + ".w1", kind, I, D, c.weight_block_size);
  e.w3 = load_weight(ck, p + ".w3", kind, I, D, c.weight_block_size);
  e.w2 = load_weight(ck, p + ".w2", kind, D, I, c.weight_block_size);
  return e;
}

// The attention tensors under prefix `ap` of a layer of the given kind.
AttentionWeights load_attention(const Checkpoint& ck, const std::string& ap, const ModelConfig& c, LayerKind kind) {
  const int64_t D = c.hidden_size, B = c.weight_block_size, H = c.num_attention_heads, d = c.head_dim;
  const auto FP8 = Weight::Kind::kFP8, BF16 = Weight::Kind::kBF16;
  AttentionWeights a;
  a.wq_a = load_weight(ck, ap + "wq_a", FP8, c.q_lora_rank, D, int(B));
  a.q_norm = load_vector(ck, ap + "q_norm.weight", {c.q_lora_rank}, {DType::kBF16, DType::kF32});
  a.wq_b = load_weight(ck, ap + "wq_b", FP8, H * d, c.q_lora_rank, int(B));
  a.wkv = load_weight(ck, ap + "wkv", FP8, d, D, int(B));
  a.kv_norm = load_vector(ck, ap + "kv_norm.weight", {d}, {DType::kBF16, DType::kF32});
  a.wo_a = load_weight(ck, ap + "wo_a", FP8, int64_t(c.o_groups) * c.o_lora_rank, H * d / c.o_groups, int(B));
  a.wo_b = load_weight(ck, ap + "wo_b", FP8, D, int64_t(c.o_groups) * c.o_lora_rank, int(B));
  a.attn_sink = load_vector(ck, ap + "attn_sink", {H}, {DType::kF32});
  if (kind.has_compressor()) a.compressor = load_compressor(ck, ap + "compressor", c, kind, c.head_dim, false);
  if (kind.has_indexer()) {
    const int64_t Hi = c.index_n_heads, di = c.index_head_dim;
    a.indexer.wq_b = load_weight(ck, ap + "indexer.wq_b", FP8, Hi * di, c.q_lora_rank, int(B));
    a.indexer.weights_proj = load_weight(ck, ap + "indexer.weights_proj", BF16, Hi, D, int(B));
    a.indexer.compressor = load_compressor(ck, ap + "indexer.compressor", c, kind, c.index_head_dim, true);
  }
  return a;
}

// Layer L's MoE; routed experts [e0, e1) only.
MoeWeights load_moe(const Checkpoint& ck, const std::string& fp, const ModelConfig& c, int L, int64_t e0, int64_t e1) {
  const int64_t D = c.hidden_size, V = c.vocab_size, B = c.weight_block_size;
  const auto FP8 = Weight::Kind::kFP8, BF16 = Weight::Kind::kBF16;
  MoeWeights f;
  const int64_t E = c.n_routed_experts, k = c.num_experts_per_tok;
  f.gate = load_weight(ck, fp + "gate", BF16, E, D, int(B));
  if (c.is_hash_layer(L)) {
    const TensorView& t = ck.get_any(fp + "gate.tid2eid", {DType::kI64, DType::kI32}, {V, k});
    f.tid2eid.resize(size_t(V * k));
    for (size_t i = 0; i < f.tid2eid.size(); ++i) {
      int64_t v;
      if (t.dtype == DType::kI64) {
        std::memcpy(&v, t.data + 8 * i, 8);
      } else {
        int32_t v32;
        std::memcpy(&v32, t.data + 4 * i, 4);
        v = v32;
      }
      if (v < 0 || v >= E)
        throw Error(t.file + ": tensor '" + t.name + "' entry " + std::to_string(i) + " = " + std::to_string(v) +
                    " is not an expert id < " + std::to_string(E));
      f.tid2eid[i] = int32_t(v);
    }
  } else {
    f.gate_bias = load_vector(ck, ck.resolve(fp + "gate.bias"), {E}, {DType::kF32, DType::kBF16});
  }
  f.experts.resize(static_cast<size_t>(E));
  for (int64_t e = e0; e < e1; ++e)
    f.experts[size_t(e)] = load_expert(ck, fp + "experts." + std::to_string(e), c, Weight::Kind::kFP4);
  f.shared = load_expert(ck, fp + "shared_experts", c, FP8);
  return f;
}

}  // namespace

ModelWeights load_weights(const Checkpoint& ck, const ModelConfig& c, ExpertRange experts) {
  const int64_t e0 = experts.begin, e1 = experts.end < 0 ? c.n_routed_experts : experts.end;
  if (e0 < 0 || e0 >= e1 || e1 > c.n_routed_experts)
    throw Error("expert range [" + std::to_string(e0) + ", " + std::to_string(e1) + ") is not a non-empty part of the " +
                std::to_string(c.n_routed_experts) + " routed experts");
  const int64_t D = c.hidden_size, V = c.vocab_size, hc = c.hc_mult, B = c.weight_block_size;
  const auto BF16 = Weight::Kind::kBF16;
  ModelWeights m;
  m.embed = load_weight(ck, "embed", BF16, V, D, int(B));
  m.head = load_weight(ck, "head", BF16, V, D, int(B));
  m.head_pair_panels = pack_pair_panels(m.head);
  m.norm = load_vector(ck, "norm.weight", {D}, {DType::kBF16, DType::kF32});
  m.hc_head.fn = load_vector(ck, "hc_head_fn", {hc, hc * D}, {DType::kF32});
  m.hc_head.base = load_vector(ck, "hc_head_base", {hc}, {DType::kF32});
  m.hc_head.scale = load_vector(ck, "hc_head_scale", {1}, {DType::kF32});
  for (int L = 0; L < c.num_hidden_layers; ++L) {
    const std::string p = "layers." + std::to_string(L) + ".";
    LayerWeights lw;
    lw.kind = c.layer_kind(L);
    lw.hc_attn = load_hc(ck, p + "hc_attn", c);
    lw.hc_ffn = load_hc(ck, p + "hc_ffn", c);
    lw.attn_norm = load_vector(ck, p + "attn_norm.weight", {D}, {DType::kBF16, DType::kF32});
    lw.ffn_norm = load_vector(ck, p + "ffn_norm.weight", {D}, {DType::kBF16, DType::kF32});
    lw.attn = load_attention(ck, p + "attn.", c, lw.kind);
    lw.ffn = load_moe(ck, p + "ffn.", c, L, e0, e1);
    lw.quant_panels = repack_quant_panels(lw);
    lw.pair_panels = repack_pair_panels(lw);
    m.layers.push_back(std::move(lw));
  }
  return m;
}

}  // namespace dsv4
