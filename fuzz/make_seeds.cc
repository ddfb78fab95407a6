// Writes the seed corpora of the fuzz targets into OUT/<target>/, all made by
// the project's own writers (SafetensorsWriter, write_synthetic_model,
// ModelConfig::to_json, write_npy, the tokenizer JSON layout of
// tests/tokenizer_test.cc). Usage: fuzz_make_seeds OUT
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <sstream>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "core/error.h"
#include "io/config.h"
#include "io/npy.h"
#include "io/safetensors.h"
#include "io/tokenizer.h"
#include "io/synthetic.h"
#include "targets.h"

using namespace dsv4;
using nlohmann::json;
namespace fs = std::filesystem;

namespace {

std::string g_out;
int g_count = 0;

std::string slurp(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(f), {});
}

void seed(const std::string& target, const std::string& name, const std::string& bytes) {
  const fs::path dir = fs::path(g_out) / target;
  fs::create_directories(dir);
  std::ofstream(dir / name, std::ios::binary) << bytes;
  ++g_count;
}

std::string tmp_dir() {
  char tmpl[] = "/tmp/dsv4-seeds-XXXXXX";
  const char* d = mkdtemp(tmpl);
  if (!d) throw Error("cannot create a temporary directory");
  return d;
}

// A copy of a safetensors file with every tensor's shape cut down to ones
// (its names, dtypes and ranks kept), rewritten by SafetensorsWriter.
std::string shrunk_copy(const std::string& path, const std::string& tmp) {
  const std::string bytes = slurp(path);
  auto views = parse_safetensors(reinterpret_cast<const uint8_t*>(bytes.data()), bytes.size(), path);
  SafetensorsWriter w;
  for (const TensorView& v : views) {
    Shape s(v.shape.size(), 1);
    std::vector<uint8_t> b(dtype_size(v.dtype));
    for (size_t i = 0; i < b.size(); ++i) b[i] = v.nbytes > i ? v.data[i] : 0;
    w.add(v.name, v.dtype, s, b);
  }
  w.write_file(tmp + "/shrunk.safetensors");
  return slurp(tmp + "/shrunk.safetensors");
}

void safetensors_seeds(const std::string& tmp) {
  const std::string fx = tmp + "/fixture";
  fuzz::write_index_fixture(fx);
  seed("safetensors_header", "fixture_single", slurp(fx + "/model.safetensors"));
  seed("safetensors_header", "fixture_shard1", slurp(fx + "/model-00001-of-00002.safetensors"));
  seed("safetensors_header", "fixture_shard2", slurp(fx + "/model-00002-of-00002.safetensors"));
  {
    SafetensorsWriter w;
    w.write_file(tmp + "/empty.safetensors");
    seed("safetensors_header", "no_tensors", slurp(tmp + "/empty.safetensors"));
  }
  const DType all[] = {DType::kBF16, DType::kF16,  DType::kF32, DType::kF8E4M3, DType::kF8E8M0,
                       DType::kI8,   DType::kU8,   DType::kI32, DType::kI64};
  for (DType t : all) {
    SafetensorsWriter w;
    w.add("layers.0.attn.wkv.weight", t, {2, 2}, std::vector<uint8_t>(4 * dtype_size(t), 0x11));
    w.write_file(tmp + "/one.safetensors");
    seed("safetensors_header", std::string("one_") + dtype_name(t), slurp(tmp + "/one.safetensors"));
  }
  // The names, dtypes and ranks of a real (synthetic tiny) checkpoint.
  SyntheticOptions o;
  o.preset = "tiny";
  o.shards = 1;
  write_synthetic_model(tmp + "/tiny", o);
  seed("safetensors_header", "tiny_shrunk", shrunk_copy(tmp + "/tiny/model.safetensors", tmp));
}

void index_seeds(const std::string& tmp) {
  const std::string fx = tmp + "/fixture";  // written by safetensors_seeds
  const std::string index = slurp(fx + "/model.safetensors.index.json");
  seed("checkpoint_index", "fixture", index);
  json j = json::parse(index);
  json k = j;
  k["weight_map"]["a"] = "model.safetensors";
  seed("checkpoint_index", "moved", k.dump());
  k = j;
  k["weight_map"].erase("a");
  seed("checkpoint_index", "dropped", k.dump(2));
  k = j;
  k["weight_map"]["zz"] = "model-00002-of-00002.safetensors";
  seed("checkpoint_index", "extra", k.dump());
  seed("checkpoint_index", "empty_map", R"({"metadata":{"total_size":0},"weight_map":{}})");
  seed("checkpoint_index", "outside", R"({"weight_map":{"a":"../model.safetensors"}})");
}

void config_seeds() {
  for (const char* preset : {"tiny", "flash"}) {
    SyntheticOptions o;
    o.preset = preset;
    const json j = synthetic_config(o).to_json();
    seed("config", std::string(preset), j.dump(2));
    json k = j;
    k.erase("rope_scaling");
    k.erase("quantization_config");
    k.erase("scoring_func");
    seed("config", std::string(preset) + "_minimal", k.dump());
  }
}

void tokens_seeds() {
  seed("tokens", "short", "[0, 1, 2, 3]");
  seed("tokens", "empty", "[]");
  seed("tokens", "edge", "[1023, 2147483647, 0]");
  std::string s = "[0";
  for (int i = 1; i < 300; ++i) s += "," + std::to_string((i * 7919) % 1024);
  seed("tokens", "long", s + "]");
  seed("tokens", "requests", "[[0, 1, 2], {\"tokens\": [5, 6]}, {\"prompt\": \"Hello\"}, []]");
}

void npy_seeds(const std::string& tmp) {
  const std::vector<float> v = {1.f, -2.f, 3.5f, 0.f, 1e-3f, 7.f};
  write_npy(tmp + "/a.npy", v.data(), {6});
  seed("npy", "vector", slurp(tmp + "/a.npy"));
  write_npy(tmp + "/b.npy", v.data(), {2, 3});
  seed("npy", "matrix", slurp(tmp + "/b.npy"));
  write_npy(tmp + "/c.npy", v.data(), {1, 2, 1, 3});
  seed("npy", "rank4", slurp(tmp + "/c.npy"));
  // float64, format 2.0 (what numpy writes for a long header).
  std::string h = "{'descr': '<f8', 'fortran_order': False, 'shape': (2,), }";
  while ((12 + h.size() + 1) % 64) h += ' ';
  h += '\n';
  std::string b = std::string("\x93NUMPY\x02\x00", 8);
  for (int i = 0; i < 4; ++i) b += char((h.size() >> (8 * i)) & 0xff);
  b += h;
  const double d[2] = {0.25, -8.0};
  b.append(reinterpret_cast<const char*>(d), sizeof d);
  seed("npy", "f8_v2", b);
}

void tokenizer_seeds() {
  const std::string small = fuzz::small_tokenizer_text();
  seed("tokenizer_json", "small", small);
  json j = json::parse(small);
  j["added_tokens"] = json::array();
  seed("tokenizer_json", "no_added", j.dump());
  // The DeepSeek-V3/V4 pre-tokenizer (three Split regexes) over the small vocabulary.
  json v4 = json::parse(small);
  json pre = json::array();
  for (const char* re : {"\\p{N}{1,3}", "[\u4e00-\u9fa5\u3040-\u309f\u30a0-\u30ff]+",
                         "[!\"#$%&'()*+,\\-./:;<=>?@\\[\\\\\\]^_`{|}~][A-Za-z]+|[^\r\n\\p{L}\\p{P}\\p{S}]?[\\p{L}\\p{M}]+| "
                         "?[\\p{P}\\p{S}]+[\r\n]*|\\s*[\r\n]+|\\s+(?!\\S)|\\s+"})
    pre.push_back({{"type", "Split"}, {"pattern", {{"Regex", re}}}, {"behavior", "Isolated"}, {"invert", false}});
  pre.push_back({{"type", "ByteLevel"}, {"add_prefix_space", false}, {"trim_offsets", true}, {"use_regex", false}});
  v4["pre_tokenizer"]["pretokenizers"] = pre;
  seed("tokenizer_json", "v4_pretokenizer", v4.dump());

  const std::string texts[] = {
      "The quick brown fox jumps over the lazy dog.",
      "def f(x):\n    return x ** 2  # 12345\n",
      "\xe4\xbd\xa0\xe5\xa5\xbd\xef\xbc\x8c\xe4\xb8\x96\xe7\x95\x8c\xe3\x81\x93\xe3\x82\x93\xe3\x81\xab\xe3\x81\xa1\xe3\x81\xaf",
      "\xf0\x9f\x98\x80 emoji and \xed\x95\x9c\xea\xb8\x80",
      std::string(kV4BosToken) + "Hi<tool>",
      "\xff\xfe\xc3(\x80\xe2\x82 broken utf-8",
      "   \t\r\n\n  spaces",
  };
  int i = 0;
  for (const std::string& t : texts) seed("tokenizer_encode", "text" + std::to_string(i++), t);
}

}  // namespace

int main(int argc, char** argv) {
  if (argc != 2) {
    std::fprintf(stderr, "usage: fuzz_make_seeds OUT\n");
    return 2;
  }
  g_out = argv[1];
  const std::string tmp = tmp_dir();
  try {
    safetensors_seeds(tmp);
    index_seeds(tmp);
    config_seeds();
    tokens_seeds();
    npy_seeds(tmp);
    tokenizer_seeds();
  } catch (const Error& e) {
    std::fprintf(stderr, "fuzz_make_seeds: %s\n", e.what());
    fs::remove_all(tmp);
    return 2;
  }
  fs::remove_all(tmp);
  std::printf("fuzz_make_seeds: %d seeds in %s\n", g_count, g_out.c_str());
  return 0;
}
