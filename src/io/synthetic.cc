#include "io/synthetic.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <numbers>
#include <vector>

#include <nlohmann/json.hpp>

#include "core/arith.h"
#include "core/error.h"
#include "core/formats.h"
#include "core/thread_pool.h"
#include "io/safetensors.h"

namespace dsv4 {

namespace fs = std::filesystem;

// ---- Presets -----------------------------------------------------------------

namespace {

// shared/golden/tiny-a/config.json.
ModelConfig tiny_preset() {
  ModelConfig c;
  c.hidden_size = 256;
  c.num_hidden_layers = 4;
  c.num_attention_heads = 4;
  c.num_key_value_heads = 1;
  c.head_dim = 128;
  c.qk_rope_head_dim = 64;
  c.q_lora_rank = 128;
  c.o_lora_rank = 128;
  c.o_groups = 2;
  c.sliding_window = 128;
  c.compress_ratios = {0, 4, 128, 4, 0};
  c.index_n_heads = 4;
  c.index_head_dim = 128;
  c.index_topk = 16;
  c.n_routed_experts = 8;
  c.num_experts_per_tok = 2;
  c.n_shared_experts = 1;
  c.moe_intermediate_size = 128;
  c.num_hash_layers = 1;
  c.scoring_func = ScoringFunc::kSqrtSoftplus;
  c.routed_scaling_factor = 1.5f;
  c.swiglu_limit = 10.f;
  c.hc_mult = 4;
  c.hc_sinkhorn_iters = 20;
  c.hc_eps = 1e-6f;
  c.rms_norm_eps = 1e-6f;
  c.rope_theta = 10000.f;
  c.compress_rope_theta = 160000.f;
  c.rope_factor = 16.f;
  c.rope_original_max_position = 65536;
  c.rope_beta_fast = 32.f;
  c.rope_beta_slow = 1.f;
  // The golden tiny-a file says 4096; the preset allows the 8192-token (and
  // longer) prompts the engine is built for. No value depends on it.
  c.max_position_embeddings = 65536;
  c.vocab_size = 1024;
  c.bos_token_id = 0;
  c.eos_token_id = 1;
  c.num_nextn_predict_layers = 0;
  c.weight_block_size = 128;
  c.scale_pow2 = true;
  return c;
}

// DeepSeek-V4-Flash (MODEL.md §1), without the MTP weights
// (num_nextn_predict_layers 0; compress_ratios keeps the MTP layer's entry).
ModelConfig flash_preset() {
  ModelConfig c = tiny_preset();
  c.hidden_size = 4096;
  c.num_hidden_layers = 43;
  c.num_attention_heads = 64;
  c.head_dim = 512;
  c.qk_rope_head_dim = 64;
  c.q_lora_rank = 1024;
  c.o_lora_rank = 1024;
  c.o_groups = 8;
  c.sliding_window = 128;
  c.compress_ratios.assign(44, 0);
  for (int L = 2; L < 43; ++L) c.compress_ratios[size_t(L)] = L % 2 == 0 ? 4 : 128;
  c.index_n_heads = 64;
  c.index_head_dim = 128;
  c.index_topk = 512;
  c.n_routed_experts = 256;
  c.num_experts_per_tok = 6;
  c.moe_intermediate_size = 2048;
  c.num_hash_layers = 3;
  c.max_position_embeddings = 65536;
  c.vocab_size = 129280;
  return c;
}

// The schedule of a model cut to L layers: layer 0 SWA, then CSA at odd and
// HCA at even indices (4 layers: 0, 4, 128, 4), plus the MTP entry (0).
std::vector<int> cut_schedule(int layers) {
  std::vector<int> r(size_t(layers) + 1, 0);
  for (int L = 1; L < layers; ++L) r[size_t(L)] = L % 2 == 1 ? 4 : 128;
  return r;
}

}  // namespace

ModelConfig synthetic_config(const SyntheticOptions& o) {
  ModelConfig c;
  if (o.preset == "tiny") c = tiny_preset();
  else if (o.preset == "flash") c = flash_preset();
  else throw Error("unknown preset '" + o.preset + "' (expected tiny or flash)");
  const std::string origin = "preset '" + o.preset + "'";
  if (o.layers != -1) {
    if (o.layers < 1) throw Error(origin + ": --layers must be >= 1, got " + std::to_string(o.layers));
    if (o.layers != c.num_hidden_layers) {
      c.compress_ratios = cut_schedule(o.layers);
      c.num_hash_layers = std::min(c.num_hash_layers, o.layers);
      c.num_hidden_layers = o.layers;
    }
  }
  if (o.experts != -1) {
    if (o.experts < 1) throw Error(origin + ": --experts must be >= 1, got " + std::to_string(o.experts));
    c.n_routed_experts = o.experts;
    c.num_experts_per_tok = std::min(c.num_experts_per_tok, o.experts);
  }
  if (o.sliding_window != -1) {
    if (o.sliding_window < 1)
      throw Error(origin + ": sliding_window must be >= 1, got " + std::to_string(o.sliding_window));
    c.sliding_window = o.sliding_window;
  }
  if (o.vocab != -1) {
    const int least = std::max(c.bos_token_id, c.eos_token_id) + 1;
    if (o.vocab < least)
      throw Error(origin + ": --vocab must be > the bos/eos token ids (>= " + std::to_string(least) + "), got " +
                  std::to_string(o.vocab));
    c.vocab_size = o.vocab;
  }
  // The round trip through config.json validates the structure exactly as a
  // load of the written model will.
  return ModelConfig::from_json(c.to_json(), origin);
}

// ---- Random numbers ------------------------------------------------------------
//
// Every tensor has its own stream, keyed by (seed, tensor name), and element
// j of a stream depends only on j (a counter-based splitmix64), so tensors
// can be generated in any order and rows in parallel with byte-identical
// output.

namespace {

inline uint64_t mix64(uint64_t z) {
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  return z ^ (z >> 31);
}
constexpr uint64_t kGamma = 0x9e3779b97f4a7c15ull;

uint64_t stream_key(uint64_t seed, const std::string& name) {
  return mix64(fnv1a64(name.data(), name.size()) ^ mix64(seed + kGamma));
}
// Word i of a stream.
inline uint64_t stream_word(uint64_t key, uint64_t i) { return mix64(key + (i + 1) * kGamma); }

// Standard-normal quantiles at the midpoints (k + 1/2) / 2^16: a 16-bit
// random index into this table is a normal sample (tails cut at ~4.3 sigma),
// four per 64-bit word, far cheaper than Box-Muller for billions of weights.
const float* normal_table() {
  static const std::vector<float> table = [] {
    constexpr int kN = 1 << 16;
    std::vector<float> t(kN);
    double x = 0;  // Newton from the previous quantile: Phi is concave above 0,
                   // so the iterates rise monotonically to the root
    for (int k = kN / 2; k < kN; ++k) {
      const double p = (k + 0.5) / kN;
      for (int it = 0; it < 50; ++it) {
        const double cdf = 0.5 * std::erfc(-x / std::sqrt(2.0));
        const double step = (p - cdf) / (std::exp(-0.5 * x * x) / std::sqrt(2 * std::numbers::pi));
        x += step;
        if (std::fabs(step) < 1e-12) break;
      }
      t[size_t(k)] = float(x);
      t[size_t(kN - 1 - k)] = -float(x);
    }
    return t;
  }();
  return table.data();
}

// out[i] = stddev · N(0,1) sample number first + i of the stream (sample j
// is 16-bit lane j % 4 of word j / 4).
void normals(uint64_t key, uint64_t first, size_t n, float stddev, float* out) {
  const float* q = normal_table();
  auto sample = [&](uint64_t j) { return q[(stream_word(key, j >> 2) >> (16 * (j & 3))) & 0xffff] * stddev; };
  size_t i = 0;
  for (; i < n && ((first + i) & 3); ++i) out[i] = sample(first + i);
  for (; i + 4 <= n; i += 4) {  // whole words
    const uint64_t w = stream_word(key, (first + i) >> 2);
    out[i] = q[w & 0xffff] * stddev;
    out[i + 1] = q[(w >> 16) & 0xffff] * stddev;
    out[i + 2] = q[(w >> 32) & 0xffff] * stddev;
    out[i + 3] = q[w >> 48] * stddev;
  }
  for (; i < n; ++i) out[i] = sample(first + i);
}

// Uniform in (-1, 1) from the top 24 bits of word i.
inline float uniform_pm1(uint64_t key, uint64_t i) {
  return float((double(stream_word(key, i) >> 40) + 0.5) * 0x1p-23 - 1.0);
}

// ---- The tensors ----------------------------------------------------------------

// How a planned tensor's values are drawn.
struct Source {
  enum class Kind {
    kNormal,    // stddev · N(0,1), stored BF16 or F32
    kUniform,   // mean + spread · U(-1,1), stored BF16 or F32 (norms, hc scales)
    kFP8,       // e4m3 codes of stddev · N(0,1), one e8m0 scale per BxB block
    kFP8Scale,
    kFP4,       // packed e2m1 codes, one e8m0 scale per 32 inputs
    kFP4Scale,
    kTid2eid,   // [vocab][k] distinct expert ids < n_experts
  };
  Kind kind = Kind::kNormal;
  float mean = 0.f, spread = 0.f;  // stddev for normals, half-width for uniforms
  int64_t rows = 0, cols = 0;      // of the (unpacked) matrix
  int n_experts = 0;
  std::string stream;              // the name that keys the random stream
};

struct Plan {
  std::vector<TensorSpec> specs;
  std::map<std::string, Source> sources;

  void add(const std::string& name, DType dtype, const Shape& shape, Source s) {
    if (s.stream.empty()) s.stream = name;
    specs.push_back({name, dtype, shape});
    sources.emplace(name, std::move(s));
  }
  void normal(const std::string& name, DType dtype, const Shape& shape, float stddev) {
    Source s;
    s.kind = Source::Kind::kNormal;
    s.spread = stddev;
    add(name, dtype, shape, s);
  }
  // Norm weights and hc scales: 1 ± 0.1, uniform.
  void around_one(const std::string& name, DType dtype, const Shape& shape) {
    Source s;
    s.kind = Source::Kind::kUniform;
    s.mean = 1.f;
    s.spread = 0.1f;
    add(name, dtype, shape, s);
  }
  // `prefix`.weight and `prefix`.scale of a block-scaled weight [out][in],
  // both drawn from the weight's stream.
  void quantized(const std::string& prefix, Source::Kind weight_kind, Source::Kind scale_kind, DType weight_dtype,
                 const Shape& weight_shape, const Shape& scale_shape, int64_t out, int64_t in, float stddev) {
    Source s;
    s.kind = weight_kind;
    s.spread = stddev;
    s.rows = out;
    s.cols = in;
    s.stream = prefix + ".weight";
    add(prefix + ".weight", weight_dtype, weight_shape, s);
    s.kind = scale_kind;
    add(prefix + ".scale", DType::kF8E8M0, scale_shape, s);
  }
  // e4m3 with one scale per block x block square.
  void fp8(const std::string& prefix, int64_t out, int64_t in, float stddev, int64_t block) {
    quantized(prefix, Source::Kind::kFP8, Source::Kind::kFP8Scale, DType::kF8E4M3, {out, in},
              {ceil_div(out, block), ceil_div(in, block)}, out, in, stddev);
  }
  // Packed e2m1 pairs with one scale per 32 inputs.
  void fp4(const std::string& prefix, int64_t out, int64_t in, float stddev) {
    quantized(prefix, Source::Kind::kFP4, Source::Kind::kFP4Scale, DType::kI8, {out, in / 2}, {out, in / 32}, out,
              in, stddev);
  }
};

float inv_sqrt(int64_t n) { return float(1.0 / std::sqrt(double(n))); }

// Layer L's attention tensors under prefix `a`.
void plan_attention(Plan& p, const ModelConfig& c, int L, const std::string& a) {
  const int64_t D = c.hidden_size, B = c.weight_block_size;
  const int64_t H = c.num_attention_heads, d = c.head_dim, G = c.o_groups;
  const DType BF16 = DType::kBF16, F32 = DType::kF32;
  p.fp8(a + "wq_a", c.q_lora_rank, D, inv_sqrt(D), int(B));
  p.around_one(a + "q_norm.weight", BF16, {c.q_lora_rank});
  p.fp8(a + "wq_b", H * d, c.q_lora_rank, inv_sqrt(c.q_lora_rank), int(B));
  p.fp8(a + "wkv", d, D, inv_sqrt(D), int(B));
  p.around_one(a + "kv_norm.weight", BF16, {d});
  p.fp8(a + "wo_a", G * c.o_lora_rank, H * d / G, inv_sqrt(H * d / G), int(B));
  p.fp8(a + "wo_b", D, G * c.o_lora_rank, 0.1f * inv_sqrt(G * c.o_lora_rank), int(B));
  p.normal(a + "attn_sink", F32, {H}, 1.f);
  const LayerKind kind = c.layer_kind(L);
  auto compressor = [&](const std::string& cp, int64_t hd) {
    const int64_t width = kind.compressor_overlap() * hd;
    p.normal(cp + ".wkv.weight", BF16, {width, D}, inv_sqrt(D));
    p.normal(cp + ".wgate.weight", BF16, {width, D}, inv_sqrt(D));
    p.normal(cp + ".ape", F32, {kind.ratio, width}, 0.1f);
    p.around_one(cp + ".norm.weight", BF16, {hd});
  };
  if (kind.has_compressor()) compressor(a + "compressor", d);
  if (kind.has_indexer()) {
    const int64_t Hi = c.index_n_heads, di = c.index_head_dim;
    p.fp8(a + "indexer.wq_b", Hi * di, c.q_lora_rank, inv_sqrt(c.q_lora_rank), int(B));
    p.normal(a + "indexer.weights_proj.weight", BF16, {Hi, D}, inv_sqrt(D));
    compressor(a + "indexer.compressor", di);
  }
}

// Layer L's MoE tensors under prefix `f`.
void plan_ffn(Plan& p, const ModelConfig& c, int L, const std::string& f) {
  const int64_t D = c.hidden_size, V = c.vocab_size, B = c.weight_block_size, I = c.moe_intermediate_size;
  const DType BF16 = DType::kBF16, F32 = DType::kF32;
  const int64_t E = c.n_routed_experts;
  p.normal(f + "gate.weight", BF16, {E, D}, inv_sqrt(D));
  if (c.is_hash_layer(L)) {
    Source s;
    s.kind = Source::Kind::kTid2eid;
    s.rows = V;
    s.cols = c.num_experts_per_tok;
    s.n_experts = int(E);
    p.add(f + "gate.tid2eid", DType::kI64, {V, s.cols}, s);
  } else {
    p.normal(f + "gate.bias", F32, {E}, 0.1f);
  }
  for (int64_t e = 0; e < E; ++e) {
    const std::string x = f + "experts." + std::to_string(e) + ".";
    p.fp4(x + "w1", I, D, inv_sqrt(D));
    p.fp4(x + "w3", I, D, inv_sqrt(D));
    p.fp4(x + "w2", D, I, 0.1f * inv_sqrt(I));
  }
  p.fp8(f + "shared_experts.w1", I, D, inv_sqrt(D), int(B));
  p.fp8(f + "shared_experts.w3", I, D, inv_sqrt(D), int(B));
  p.fp8(f + "shared_experts.w2", D, I, 0.1f * inv_sqrt(I), int(B));
}

// Every tensor load_weights (model/weights.cc) reads, with the official
// dtypes and the value scales of shared/golden/tiny-a/README.md: linear
// weights std fan_in^-1/2 (wo_b and the w2s 0.1·fan_in^-1/2), embeddings
// N(0,1), head D^-1/2, norms 1 ± 0.1, hc_*_fn 0.02, attn_sink N(0,1).
Plan plan_model(const ModelConfig& c) {
  Plan p;
  const int64_t D = c.hidden_size, V = c.vocab_size, hc = c.hc_mult;
  const int64_t mix = (2 + hc) * hc;
  const DType BF16 = DType::kBF16, F32 = DType::kF32;

  p.normal("embed.weight", BF16, {V, D}, 1.f);
  for (int L = 0; L < c.num_hidden_layers; ++L) {
    const std::string l = "layers." + std::to_string(L) + ".";
    const size_t first = p.specs.size();
    for (const char* h : {"hc_attn", "hc_ffn"}) {
      p.normal(l + h + "_fn", F32, {mix, hc * D}, 0.02f);
      p.normal(l + h + "_base", F32, {mix}, 0.1f);
      p.around_one(l + h + "_scale", F32, {3});
    }
    p.around_one(l + "attn_norm.weight", BF16, {D});
    p.around_one(l + "ffn_norm.weight", BF16, {D});

    plan_attention(p, c, L, l + "attn.");
    plan_ffn(p, c, L, l + "ffn.");
    // Within a layer, name order (as in the official shards).
    std::sort(p.specs.begin() + std::ptrdiff_t(first), p.specs.end(),
              [](const TensorSpec& x, const TensorSpec& y) { return x.name < y.name; });
  }
  p.normal("head.weight", BF16, {V, D}, inv_sqrt(D));
  p.normal("hc_head_fn", F32, {hc, hc * D}, 0.02f);
  p.normal("hc_head_base", F32, {hc}, 0.1f);
  p.around_one("hc_head_scale", F32, {1});
  p.around_one("norm.weight", BF16, {D});
  return p;
}

// ---- Generation ------------------------------------------------------------------

inline uint8_t e8m0_of(float pow2) { return uint8_t(f32_bits(pow2) >> 23); }  // a normal power of two

// A quantised matrix: codes and scales come from one pass over the values,
// so the pair is kept until both halves have been written (only the latest
// pair is held).
struct Quantised {
  std::string stream;
  std::vector<uint8_t> codes, scales;
};

void gen_fp8(const Source& s, uint64_t key, int block, Quantised* q) {
  const int64_t R = s.rows, C = s.cols, rb = ceil_div(R, int64_t(block)), cb = ceil_div(C, int64_t(block));
  q->codes.resize(size_t(R * C));
  q->scales.resize(size_t(rb * cb));
  ThreadPool::global().parallel_for(rb, [&](int64_t b0, int64_t b1, int) {
    std::vector<float> x;
    std::vector<float> amax(static_cast<size_t>(cb));
    for (int64_t b = b0; b < b1; ++b) {
      const int64_t r0 = b * block, r1 = std::min(R, r0 + block);
      x.resize(size_t((r1 - r0) * C));
      normals(key, uint64_t(r0 * C), x.size(), s.spread, x.data());
      std::fill(amax.begin(), amax.end(), 0.f);
      for (int64_t r = 0; r < r1 - r0; ++r)
        for (int64_t i = 0; i < C; ++i) {
          float& m = amax[size_t(i / block)];
          m = std::max(m, std::fabs(x[size_t(r * C + i)]));
        }
      for (int64_t j = 0; j < cb; ++j) {
        const float sc = fp8_pow2_scale(amax[size_t(j)]);
        q->scales[size_t(b * cb + j)] = e8m0_of(sc);
        const float inv = 1.f / sc;  // exact: sc is a power of two
        const int64_t i0 = j * block, i1 = std::min(C, i0 + block);
        for (int64_t r = 0; r < r1 - r0; ++r)
          for (int64_t i = i0; i < i1; ++i) {
            const uint8_t c = f32_to_e4m3(x[size_t(r * C + i)] * inv);
            q->codes[size_t((r0 + r) * C + i)] = c == 0x80 ? 0 : c;  // no negative zero
          }
      }
    }
  });
}

void gen_fp4(const Source& s, uint64_t key, Quantised* q) {
  const int64_t R = s.rows, C = s.cols;
  q->codes.resize(size_t(R * C / 2));
  q->scales.resize(size_t(R * C / 32));
  ThreadPool::global().parallel_for(R, [&](int64_t r0, int64_t r1, int) {
    std::vector<float> x(static_cast<size_t>(C));
    for (int64_t r = r0; r < r1; ++r) {
      normals(key, uint64_t(r * C), x.size(), s.spread, x.data());
      for (int64_t b = 0; b < C / 32; ++b) {
        const float* v = x.data() + b * 32;
        // amax on the magnitude bits: the same order as on the floats, and
        // an integer max reduction vectorises.
        uint32_t amax = 0;
        for (int i = 0; i < 32; ++i) amax = std::max(amax, f32_bits(v[i]) & 0x7fffffffu);
        const float sc = fp4_pow2_scale(bits_f32(amax));
        q->scales[size_t(r * (C / 32) + b)] = e8m0_of(sc);
        const float inv = 1.f / sc;  // exact: sc is a power of two
        uint8_t code[32];
        for (int i = 0; i < 32; ++i) {
          const uint8_t c = f32_to_e2m1(v[i] * inv);
          code[i] = (c & 7) ? c : 0;  // no negative zero (as in the official files)
        }
        uint8_t* out = q->codes.data() + r * (C / 2) + b * 16;
        for (int i = 0; i < 16; ++i) out[i] = uint8_t(code[2 * i] | (code[2 * i + 1] << 4));  // low nibble: even index
      }
    }
  }, 16);
}

void gen_tid2eid(const Source& s, uint64_t key, uint8_t* dst) {
  const int64_t k = s.cols;
  std::vector<int64_t> row(static_cast<size_t>(k));
  for (int64_t r = 0; r < s.rows; ++r) {
    // k distinct ids by rejection from the row's own sub-stream.
    const uint64_t rk = mix64(key ^ (uint64_t(r) * kGamma));
    uint64_t w = 0;
    for (int64_t j = 0; j < k; ++j) {
      int64_t id;
      do {
        id = int64_t((unsigned __int128)stream_word(rk, w++) * uint64_t(s.n_experts) >> 64);
      } while (std::find(row.begin(), row.begin() + j, id) != row.begin() + j);
      row[size_t(j)] = id;
    }
    std::memcpy(dst + size_t(r * k) * 8, row.data(), size_t(k) * 8);
  }
}

// Normal or uniform values, stored as BF16 or F32, generated in parallel chunks.
void gen_values(const Source& s, const TensorSpec& t, uint64_t key, uint8_t* dst) {
  const int64_t n = int64_t(t.nbytes() / dtype_size(t.dtype));
  constexpr int64_t kChunk = 1 << 16;
  ThreadPool::global().parallel_for(ceil_div(n, kChunk), [&](int64_t c0, int64_t c1, int) {
    std::vector<float> x(static_cast<size_t>(kChunk));
    for (int64_t c = c0; c < c1; ++c) {
      const int64_t i0 = c * kChunk, m = std::min(n, i0 + kChunk) - i0;
      if (s.kind == Source::Kind::kNormal) {
        normals(key, uint64_t(i0), size_t(m), s.spread, x.data());
      } else {
        for (int64_t i = 0; i < m; ++i) x[size_t(i)] = s.mean + s.spread * uniform_pm1(key, uint64_t(i0 + i));
      }
      if (t.dtype == DType::kBF16) {
        for (int64_t i = 0; i < m; ++i) {
          const uint16_t h = f32_to_bf16(x[size_t(i)]);
          std::memcpy(dst + 2 * (i0 + i), &h, 2);
        }
      } else {
        std::memcpy(dst + 4 * i0, x.data(), size_t(m) * 4);
      }
    }
  });
}

}  // namespace

std::vector<TensorSpec> checkpoint_tensor_specs(const ModelConfig& c) { return plan_model(c).specs; }

SyntheticSummary write_synthetic_model(const std::string& dir, const SyntheticOptions& o) {
  const ModelConfig c = synthetic_config(o);
  const Plan plan = plan_model(c);
  Quantised q;
  auto fill = [&](const TensorSpec& t, uint8_t* dst) {
    const Source& s = plan.sources.at(t.name);
    const uint64_t key = stream_key(o.seed, s.stream);
    switch (s.kind) {
      case Source::Kind::kNormal:
      case Source::Kind::kUniform:
        gen_values(s, t, key, dst);
        return;
      case Source::Kind::kTid2eid:
        gen_tid2eid(s, key, dst);
        return;
      case Source::Kind::kFP8:
      case Source::Kind::kFP8Scale:
      case Source::Kind::kFP4:
      case Source::Kind::kFP4Scale: {
        if (q.stream != s.stream) {
          if (s.kind == Source::Kind::kFP8 || s.kind == Source::Kind::kFP8Scale) gen_fp8(s, key, c.weight_block_size, &q);
          else gen_fp4(s, key, &q);
          q.stream = s.stream;
        }
        const bool scale = s.kind == Source::Kind::kFP8Scale || s.kind == Source::Kind::kFP4Scale;
        const std::vector<uint8_t>& b = scale ? q.scales : q.codes;
        std::memcpy(dst, b.data(), b.size());
        return;
      }
    }
  };

  SyntheticSummary r;
  r.tensors = plan.specs.size();
  r.bytes = write_safetensors_dir(dir, plan.specs, o.shards, fill);
  const std::string cfg = (fs::path(dir) / "config.json").string();
  std::ofstream f(cfg);
  f << c.to_json().dump(2) << "\n";
  f.close();
  if (!f) throw Error(cfg + ": cannot write");
  return r;
}

}  // namespace dsv4
