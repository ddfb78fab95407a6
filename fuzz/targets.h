// The fuzz entry points, shared by the libFuzzer targets (fuzz/*_fuzz.cc,
// built by scripts/fuzz.sh) and by tests/bad_input_test.cc, which replays
// every file under fuzz/regressions/<target>/ through the same function.
//
// Each entry point feeds arbitrary bytes to one input parser of the engine.
// A dsv4::Error is the expected answer to bad input; any other exception, a
// sanitizer report, a crash or a broken invariant (checked with fuzz_check,
// which aborts) is a finding.
#pragma once
#include <sys/mman.h>
#include <unistd.h>

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <memory>
#include <mutex>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include <nlohmann/json.hpp>

#include "core/error.h"
#include "engine/prefill.h"
#include "io/config.h"
#include "io/npy.h"
#include "io/safetensors.h"
#include "io/token_list.h"
#include "io/tokenizer.h"
#include "kernels/rope.h"
#include "io/synthetic.h"
#include "model/model.h"

namespace dsv4::fuzz {

// The target names: fuzz/<name>_fuzz.cc, fuzz/regressions/<name>/, seeds in
// <corpus>/<name>/.
inline const std::vector<std::string>& target_names() {
  static const std::vector<std::string> names = {"safetensors_header", "checkpoint_index", "config",
                                                 "tokens",             "npy",              "tokenizer_json",
                                                 "tokenizer_encode"};
  return names;
}

// A broken invariant: report and abort (libFuzzer records the input).
#define fuzz_check(cond)                                                                  \
  do {                                                                                    \
    if (!(cond)) {                                                                        \
      std::fprintf(stderr, "fuzz_check failed: %s at %s:%d\n", #cond, __FILE__, __LINE__); \
      std::abort();                                                                       \
    }                                                                                     \
  } while (0)

// Reads every byte of [p, p+n) so that an out-of-bounds view is caught by ASan.
inline void touch(const uint8_t* p, size_t n) {
  volatile uint8_t sink = 0;
  if (n) sink = sink ^ p[0] ^ p[n - 1];
  (void)sink;
}

// ---- safetensors_header: parse_safetensors on arbitrary bytes --------------------------
inline void safetensors_header(const uint8_t* data, size_t size) {
  // A private copy of exactly `size` bytes: ASan sees any read beyond it.
  std::unique_ptr<uint8_t[]> buf(new uint8_t[size ? size : 1]);
  if (size) std::memcpy(buf.get(), data, size);
  try {
    auto views = parse_safetensors(buf.get(), size, "fuzz.safetensors");
    for (const TensorView& v : views) {
      fuzz_check(v.data >= buf.get() && v.data + v.nbytes <= buf.get() + size);
      fuzz_check(uint64_t(v.numel()) * dtype_size(v.dtype) == v.nbytes);
      touch(v.data, v.nbytes);
    }
  } catch (const Error&) {
  }
}

// ---- checkpoint_index: Checkpoint::open on a directory whose index is the input ----------

// Two small shards (model-0000k-of-00002.safetensors) and a model.safetensors
// beside them, written once into `dir` by the project's writer.
inline void write_index_fixture(const std::string& dir) {
  SafetensorsWriter w;
  w.add_values<float>("a", DType::kF32, {2, 3}, {1, 2, 3, 4, 5, 6});
  w.add_values<uint16_t>("b", DType::kBF16, {4}, {0x3f80, 0x4000, 0x4040, 0x4080});
  w.add_values<uint8_t>("c", DType::kF8E4M3, {3}, {1, 2, 3});
  w.add_values<int64_t>("d", DType::kI64, {2}, {7, 8});
  w.add_values<uint8_t>("e", DType::kU8, {0}, {});
  w.write_dir(dir, 2);
  w.write_file(dir + "/model.safetensors");
}

struct IndexFixture {
  std::string dir;
  IndexFixture() {
    char tmpl[] = "/tmp/dsv4-fuzz-index-XXXXXX";
    const char* d = mkdtemp(tmpl);
    if (!d) std::abort();
    dir = d;
    write_index_fixture(dir);
  }
  ~IndexFixture() {
    std::error_code ec;
    std::filesystem::remove_all(dir, ec);
  }
};

inline void checkpoint_index_in(const std::string& dir, const uint8_t* data, size_t size) {
  {
    std::ofstream f(dir + "/model.safetensors.index.json", std::ios::binary | std::ios::trunc);
    f.write(reinterpret_cast<const char*>(data), std::streamsize(size));
  }
  try {
    Checkpoint ck = Checkpoint::open(dir);
    for (const auto& kv : ck.tensors()) touch(kv.second.data, kv.second.nbytes);
    fuzz_check(ck.total_bytes() <= 4096);
  } catch (const Error&) {
  }
}

inline void checkpoint_index(const uint8_t* data, size_t size) {
  static IndexFixture fx;
  checkpoint_index_in(fx.dir, data, size);
}

// ---- config: config.json parsing and validation ----------------------------------------
inline void config(const uint8_t* data, size_t size) {
  nlohmann::json j = nlohmann::json::parse(data, data + size, nullptr, false);
  if (j.is_discarded()) return;
  ModelConfig c;
  try {
    c = ModelConfig::from_json(j, "fuzz.json");
  } catch (const Error&) {
    return;
  }
  // What an accepted config promises: it round-trips, its derived values are
  // in range, and the RoPE tables build.
  const nlohmann::json out = c.to_json();
  ModelConfig c2 = ModelConfig::from_json(out, "round-trip");  // must not throw
  fuzz_check(c2.to_json() == out);
  fuzz_check(int64_t(c.compress_ratios.size()) >= c.num_hidden_layers);
  for (int l = 0; l < c.num_hidden_layers; ++l) fuzz_check(c.ratio(l) == 0 || c.ratio(l) >= 2);
  fuzz_check(c.nope_dim() >= 0 && c.num_experts_per_tok <= c.n_routed_experts);
  fuzz_check(c.bos_token_id < c.vocab_size && c.eos_token_id < c.vocab_size);
  RopeTable swa(rope_params(c, false)), compressed(rope_params(c, true));
  std::vector<float> cs(size_t(c.qk_rope_head_dim));
  compressed.cos_sin(c.max_position_embeddings - 1, cs.data());
}

// ---- tokens: the CLI's --tokens and --requests JSON readers and the prompt checks ---------
inline void tokens(const uint8_t* data, size_t size) {
  static const ModelConfig tiny = [] {
    SyntheticOptions o;
    o.preset = "tiny";
    return synthetic_config(o);
  }();
  // The same bytes as a --requests file: each entry is ids or a text prompt.
  try {
    for (const RequestSpec& r : parse_request_list(std::string_view(reinterpret_cast<const char*>(data), size), "fuzz.json")) {
      fuzz_check(r.is_prompt || r.prompt.empty());
      for (int32_t v : r.tokens) fuzz_check(v >= 0);
    }
  } catch (const Error&) {
  }
  std::vector<int32_t> t;
  try {
    t = parse_token_list(std::string_view(reinterpret_cast<const char*>(data), size), "fuzz.json");
  } catch (const Error&) {
    return;
  }
  for (int32_t v : t) fuzz_check(v >= 0);
  for (int64_t limit : {int64_t(0), int64_t(4), prompt_limit(tiny, 0)}) {
    try {
      validate_prompt(tiny, t, limit);
      fuzz_check(!t.empty() && int64_t(t.size()) <= limit);
      for (int32_t v : t) fuzz_check(v < tiny.vocab_size);
    } catch (const Error&) {
    }
  }
}

// ---- npy: read_npy (the --teacher-force input) -------------------------------------------
inline void npy(const uint8_t* data, size_t size) {
  // An in-memory file, read through its /proc path like any other.
  static int fd = memfd_create("dsv4-fuzz-npy", 0);
  if (fd < 0) std::abort();
  if (ftruncate(fd, 0) != 0 || (size && pwrite(fd, data, size, 0) != ssize_t(size))) std::abort();
  try {
    NpyArray a = read_npy("/proc/self/fd/" + std::to_string(fd));
    size_t n = 1;
    for (int64_t d : a.shape) {
      fuzz_check(d >= 0);
      n *= size_t(d);
    }
    fuzz_check(a.data.size() == n);
    fuzz_check(n * 4 <= size);  // every element came from the file
  } catch (const Error&) {
  }
}

// ---- tokenizer_json: Tokenizer::from_json on arbitrary text ------------------------------
inline void tokenizer_json(const uint8_t* data, size_t size) {
  std::unique_ptr<Tokenizer> t;
  try {
    t = Tokenizer::from_json(std::string_view(reinterpret_cast<const char*>(data), size), "fuzz.json");
  } catch (const Error&) {
    return;
  }
  // A tokenizer that loads must encode and decode without failing.
  for (std::string_view s : {std::string_view("Hello, world! 123 \xe4\xbd\xa0\xe5\xa5\xbd\n"),
                             std::string_view("\xff\xfe a\xc3", 5), std::string_view("")}) {
    std::vector<int32_t> ids;
    try {
      ids = t->encode(s);
    } catch (const Error&) {
      continue;  // e.g. a byte the vocabulary cannot express
    }
    for (int32_t id : ids) fuzz_check(id >= 0 && id < t->size());
    try {
      (void)t->decode(ids);
    } catch (const Error&) {
    }
  }
}

// ---- tokenizer_encode: encode / decode of arbitrary bytes with a real tokenizer -----------

// The tokenizer used: $DSV4_FUZZ_TOKENIZER, else the V4 tokenizer that
// scripts/setup.sh builds (.cache/tokenizer/deepseek-v4/tokenizer.json from
// the repository root), else a small byte-level one with a few merges and the
// V4 BOS as an added token.
inline std::string small_tokenizer_text() {
  using nlohmann::json;
  json vocab = json::object();
  const auto& alpha = byte_level_alphabet();
  for (int b = 0; b < 256; ++b) vocab[alpha[size_t(b)]] = b;
  json merges = json::array();
  int next = 256;
  for (auto [l, r] : std::vector<std::pair<std::string, std::string>>{{"t", "h"}, {"th", "e"}, {" ", "the"},
                                                                       {"\xe4", "\xbd"}, {"1", "2"}}) {
    const std::string L = byte_level_encode(l), R = byte_level_encode(r);
    if (!vocab.contains(L + R)) vocab[L + R] = next++;
    merges.push_back(L + " " + R);
  }
  json added = json::array({{{"id", next}, {"content", kV4BosToken}, {"special", true}, {"normalized", false}},
                            {{"id", next + 1}, {"content", "<tool>"}, {"special", false}, {"normalized", true}}});
  json split = {{"type", "Split"},
                {"pattern", {{"Regex", "\\p{N}{1,3}| ?\\p{L}+| ?[^\\s\\p{L}\\p{N}]+|\\s+"}}},
                {"behavior", "Isolated"},
                {"invert", false}};
  json pre = json::array({split, {{"type", "ByteLevel"}, {"add_prefix_space", false}, {"trim_offsets", true},
                                  {"use_regex", false}}});
  json j = {{"version", "1.0"},
            {"added_tokens", added},
            {"normalizer", {{"type", "Sequence"}, {"normalizers", json::array()}}},
            {"pre_tokenizer", {{"type", "Sequence"}, {"pretokenizers", pre}}},
            {"decoder", {{"type", "ByteLevel"}}},
            {"model", {{"type", "BPE"}, {"dropout", nullptr}, {"unk_token", nullptr}, {"byte_fallback", false},
                       {"vocab", vocab}, {"merges", merges}}}};
  return j.dump();
}

inline const Tokenizer& encode_tokenizer() {
  static std::unique_ptr<Tokenizer> t = [] {
    const char* env = std::getenv("DSV4_FUZZ_TOKENIZER");
    std::string path = env ? env : ".cache/tokenizer/deepseek-v4/tokenizer.json";
    std::error_code ec;
    if (std::filesystem::exists(path, ec)) {
      std::fprintf(stderr, "tokenizer_encode: using %s\n", path.c_str());
      return Tokenizer::load(path);
    }
    std::fprintf(stderr, "tokenizer_encode: using the small built-in tokenizer\n");
    return Tokenizer::from_json(small_tokenizer_text(), "small");
  }();
  return *t;
}

inline void tokenizer_encode_with(const Tokenizer& t, const uint8_t* data, size_t size) {
  const std::string_view text(reinterpret_cast<const char*>(data), size);
  // The documented property: decode(encode(b)) == b for any bytes b.
  const std::vector<int32_t> ids = t.encode(text);
  for (int32_t id : ids) fuzz_check(id >= 0 && id < t.size());
  fuzz_check(t.decode(ids) == text);
  (void)utf8_lossy(text);
  // The input read as ids: decode either works or rejects an unknown id.
  std::vector<int32_t> raw(size / 4);
  if (!raw.empty()) std::memcpy(raw.data(), data, raw.size() * 4);
  try {
    (void)utf8_lossy(t.decode(raw, size % 2 == 1));
  } catch (const Error&) {
  }
}

inline void tokenizer_encode(const uint8_t* data, size_t size) { tokenizer_encode_with(encode_tokenizer(), data, size); }

// By name, for the regression replay.
inline void run_target(const std::string& name, const uint8_t* data, size_t size) {
  if (name == "safetensors_header") return safetensors_header(data, size);
  if (name == "checkpoint_index") return checkpoint_index(data, size);
  if (name == "config") return config(data, size);
  if (name == "tokens") return tokens(data, size);
  if (name == "npy") return npy(data, size);
  if (name == "tokenizer_json") return tokenizer_json(data, size);
  if (name == "tokenizer_encode") return tokenizer_encode(data, size);
  std::fprintf(stderr, "unknown fuzz target '%s'\n", name.c_str());
  std::abort();
}

}  // namespace dsv4::fuzz
