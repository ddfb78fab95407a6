#include "io/safetensors.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <future>
#include <sstream>

#include <nlohmann/json.hpp>

#include "core/error.h"
#include "io/text_file.h"
#include "io/mapping_guard.h"

namespace dsv4 {

using nlohmann::json;
namespace fs = std::filesystem;

namespace {
struct DTypeInfo { DType t; const char* name; size_t size; };
const DTypeInfo kDTypes[] = {
    {DType::kBF16, "BF16", 2}, {DType::kF16, "F16", 2},         {DType::kF32, "F32", 4},
    {DType::kF8E4M3, "F8_E4M3", 1}, {DType::kF8E8M0, "F8_E8M0", 1}, {DType::kI8, "I8", 1},
    {DType::kU8, "U8", 1},     {DType::kI32, "I32", 4},          {DType::kI64, "I64", 8},
};
}  // namespace

size_t dtype_size(DType t) {
  for (auto& d : kDTypes) if (d.t == t) return d.size;
  return 0;
}
const char* dtype_name(DType t) {
  for (auto& d : kDTypes) if (d.t == t) return d.name;
  return "?";
}
bool parse_dtype(const std::string& s, DType* out) {
  for (auto& d : kDTypes) if (s == d.name) { *out = d.t; return true; }
  return false;
}
std::string shape_str(const Shape& s) {
  std::string r = "[";
  for (size_t i = 0; i < s.size(); ++i) r += (i ? ", " : "") + std::to_string(s[i]);
  return r + "]";
}
int64_t TensorView::numel() const {
  int64_t n = 1;
  for (auto d : shape) n *= d;
  return n;
}

MappedFile::MappedFile(const std::string& path) : path_(path) {
  int fd = ::open(path.c_str(), O_RDONLY);
  if (fd < 0) throw Error(path + ": cannot open: " + std::strerror(errno));
  struct stat st;
  if (fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) {
    ::close(fd);
    throw Error(path + ": not a regular file");
  }
  size_ = size_t(st.st_size);
  if (size_ > 0) {
    void* p = mmap(nullptr, size_, PROT_READ, MAP_PRIVATE, fd, 0);
    if (p == MAP_FAILED) {
      ::close(fd);
      throw Error(path + ": mmap failed: " + std::strerror(errno));
    }
    data_ = static_cast<const uint8_t*>(p);
    register_mapping(data_, size_, &path_);  // names the file in a SIGBUS message
  }
  ::close(fd);
}

MappedFile::~MappedFile() {
  if (data_) {
    unregister_mapping(data_);
    munmap(const_cast<uint8_t*>(data_), size_);
  }
}

namespace {

// The JSON header of a safetensors file of `size` bytes; *n: its length.
json read_header(const uint8_t* bytes, size_t size, const std::string& origin, uint64_t* n_out) {
  if (size < 8) throw Error(origin + ": file too short for a safetensors header (" + std::to_string(size) + " bytes)");
  uint64_t n = 0;
  for (int i = 7; i >= 0; --i) n = (n << 8) | bytes[i];
  if (n > size - 8)
    throw Error(origin + ": header length " + std::to_string(n) + " is beyond the file size " + std::to_string(size));
  // The safetensors format's own bound (a real Flash shard's header is ~1 MB):
  // a larger one is rejected before any of it is read.
  if (n > kMaxSafetensorsHeader)
    throw Error(origin + ": header length " + std::to_string(n) + " exceeds the limit of " +
                std::to_string(kMaxSafetensorsHeader) + " bytes");
  // Parsed in place (no copy): garbage fails at its first bad byte.
  json h = json::parse(bytes + 8, bytes + 8 + n, nullptr, false);
  if (h.is_discarded()) throw Error(origin + ": header is not valid JSON");
  if (!h.is_object()) throw Error(origin + ": header must be a JSON object");
  *n_out = n;
  return h;
}

// The header entry `t` of tensor `name`, checked against the data block
// [base, base + data_size); *range: its byte range in the block.
TensorView parse_entry(const std::string& name, const json& t, const std::string& origin, const uint8_t* base,
                       uint64_t data_size, std::pair<uint64_t, uint64_t>* range) {
  const std::string where = origin + ": tensor '" + name + "'";
  if (!t.is_object()) throw Error(where + ": entry must be an object");
  auto dt = t.find("dtype");
  auto sh = t.find("shape");
  auto off = t.find("data_offsets");
  if (dt == t.end() || !dt->is_string()) throw Error(where + ": missing or invalid 'dtype'");
  if (sh == t.end() || !sh->is_array()) throw Error(where + ": missing or invalid 'shape'");
  if (off == t.end() || !off->is_array() || off->size() != 2 || !(*off)[0].is_number_unsigned() ||
      !(*off)[1].is_number_unsigned())
    throw Error(where + ": missing or invalid 'data_offsets'");
  TensorView v;
  v.name = name;
  v.file = origin;
  if (!parse_dtype(dt->get<std::string>(), &v.dtype))
    throw Error(where + ": unknown dtype '" + dt->get<std::string>() + "'");
  uint64_t numel = 1;
  for (const json& d : *sh) {
    if (!d.is_number_unsigned()) throw Error(where + ": shape entries must be non-negative integers");
    uint64_t di = d.get<uint64_t>();
    // Bounded so that numel x dtype size (<= 8) below cannot overflow.
    if (di != 0 && numel > (uint64_t(1) << 60) / di) throw Error(where + ": shape is too large");
    numel *= di;
    v.shape.push_back(int64_t(di));
  }
  uint64_t b = (*off)[0].get<uint64_t>(), e = (*off)[1].get<uint64_t>();
  if (b > e || e > data_size)
    throw Error(where + ": data_offsets [" + std::to_string(b) + ", " + std::to_string(e) +
                "] out of range of the data block (" + std::to_string(data_size) + " bytes)");
  uint64_t want = numel * dtype_size(v.dtype);
  if (e - b != want)
    throw Error(where + ": byte size " + std::to_string(e - b) + " != product(shape " + shape_str(v.shape) +
                ") x " + std::to_string(dtype_size(v.dtype)) + " = " + std::to_string(want));
  v.data = base + b;
  v.nbytes = size_t(e - b);
  *range = {b, e};
  return v;
}

// Throws when two tensors' non-empty byte ranges overlap. Over the ranges
// sorted by begin: a range overlaps an earlier one iff it begins before the
// furthest end seen so far (checking only neighbours would miss a range
// nested after a zero-size one).
void check_no_overlap(const std::vector<TensorView>& out, const std::vector<std::pair<uint64_t, uint64_t>>& ranges,
                      const std::string& origin) {
  std::vector<size_t> order;
  for (size_t i = 0; i < out.size(); ++i)
    if (ranges[i].second > ranges[i].first) order.push_back(i);
  std::sort(order.begin(), order.end(), [&](size_t a, size_t b) { return ranges[a] < ranges[b]; });
  size_t furthest = 0;  // index (into out) of the range with the largest end so far
  for (size_t k = 0; k < order.size(); ++k) {
    const size_t i = order[k];
    if (k > 0 && ranges[i].first < ranges[furthest].second)
      throw Error(origin + ": tensors '" + out[furthest].name + "' and '" + out[i].name +
                  "' have overlapping data_offsets");
    if (k == 0 || ranges[i].second > ranges[furthest].second) furthest = i;
  }
}

}  // namespace

std::vector<TensorView> parse_safetensors(const uint8_t* bytes, size_t size, const std::string& origin) {
  uint64_t n = 0;
  const json h = read_header(bytes, size, origin, &n);
  const uint8_t* base = bytes + 8 + n;
  const uint64_t data_size = size - 8 - n;
  std::vector<TensorView> out;
  std::vector<std::pair<uint64_t, uint64_t>> ranges;
  for (auto it = h.begin(); it != h.end(); ++it) {
    if (it.key() == "__metadata__") continue;
    ranges.emplace_back();
    out.push_back(parse_entry(it.key(), it.value(), origin, base, data_size, &ranges.back()));
  }
  check_no_overlap(out, ranges, origin);
  return out;
}

Checkpoint Checkpoint::open(const std::string& dir) {
  Checkpoint ck;
  ck.dir_ = dir;
  require_directory(dir, "model directory");
  // The error_code overloads: the throwing ones would escape as
  // filesystem_error (e.g. on a permission problem), not as dsv4::Error.
  std::error_code ec;
  fs::path index = fs::path(dir) / "model.safetensors.index.json";
  std::vector<std::string> shard_names;
  json weight_map;
  if (fs::exists(index, ec)) {
    const json j = parse_json(read_text_file(index.string(), "shard index"), index.string());
    if (!j.is_object()) throw Error(index.string() + ": expected a JSON object");
    if (!j.contains("weight_map") || !j["weight_map"].is_object())
      throw Error(index.string() + ": missing object 'weight_map'");
    weight_map = j["weight_map"];
    for (auto it = weight_map.begin(); it != weight_map.end(); ++it) {
      if (!it.value().is_string()) throw Error(index.string() + ": weight_map entry '" + it.key() + "' is not a string");
      std::string s = it.value().get<std::string>();
      if (s.find('/') != std::string::npos)
        throw Error(index.string() + ": weight_map entry '" + it.key() + "' names a path outside the directory");
      if (std::find(shard_names.begin(), shard_names.end(), s) == shard_names.end()) shard_names.push_back(s);
    }
    std::sort(shard_names.begin(), shard_names.end());
  } else if (fs::exists(fs::path(dir) / "model.safetensors", ec)) {
    shard_names.push_back("model.safetensors");
  } else {
    throw Error(dir + ": no model.safetensors.index.json or model.safetensors");
  }
  for (const std::string& s : shard_names) {
    std::string path = (fs::path(dir) / s).string();
    auto mf = std::make_shared<MappedFile>(path);
    for (TensorView& v : parse_safetensors(mf->data(), mf->size(), path)) {
      if (!weight_map.is_null()) {
        auto it = weight_map.find(v.name);
        if (it == weight_map.end() || it->get<std::string>() != s)
          continue;  // the index is authoritative about where a tensor lives
      }
      if (ck.tensors_.count(v.name)) throw Error(path + ": tensor '" + v.name + "' appears twice");
      std::string name = v.name;
      ck.tensors_.emplace(name, std::move(v));
    }
    ck.files_.push_back(std::move(mf));
  }
  if (!weight_map.is_null()) {
    for (auto it = weight_map.begin(); it != weight_map.end(); ++it)
      if (!ck.tensors_.count(it.key()))
        throw Error((fs::path(dir) / it.value().get<std::string>()).string() + ": tensor '" + it.key() +
                    "' listed in the index is missing from the shard");
  }
  return ck;
}

const TensorView* Checkpoint::find(const std::string& name) const {
  auto it = tensors_.find(name);
  return it == tensors_.end() ? nullptr : &it->second;
}

std::string Checkpoint::resolve(const std::string& name) const {
  static const std::pair<const char*, const char*> kOlderSpellings[] = {
      {".scale", ".weight_scale_inv"}, {"gate.bias", "gate.e_score_correction_bias"}};
  if (has(name)) return name;
  for (const auto& [official, older] : kOlderSpellings) {
    const std::string suffix = official;
    if (name.size() <= suffix.size() || name.compare(name.size() - suffix.size(), suffix.size(), suffix) != 0) continue;
    std::string alt = name.substr(0, name.size() - suffix.size()) + older;
    if (has(alt)) return alt;
  }
  return name;
}

const TensorView& Checkpoint::get_any(const std::string& name, const std::vector<DType>& dtypes,
                                      const Shape& shape) const {
  const TensorView* v = find(name);
  if (!v) throw Error(dir_ + ": tensor '" + name + "' is missing");
  if (std::find(dtypes.begin(), dtypes.end(), v->dtype) == dtypes.end()) {
    std::string want;
    for (size_t i = 0; i < dtypes.size(); ++i) want += (i ? " or " : "") + std::string(dtype_name(dtypes[i]));
    throw Error(v->file + ": tensor '" + name + "' has dtype " + dtype_name(v->dtype) + ", expected " + want);
  }
  if (v->shape != shape)
    throw Error(v->file + ": tensor '" + name + "' has shape " + shape_str(v->shape) + ", expected " + shape_str(shape));
  return *v;
}

const TensorView& Checkpoint::get(const std::string& name, DType dtype, const Shape& shape) const {
  return get_any(name, {dtype}, shape);
}

size_t Checkpoint::total_bytes() const {
  size_t n = 0;
  for (auto& kv : tensors_) n += kv.second.nbytes;
  return n;
}

size_t TensorSpec::nbytes() const {
  size_t n = dtype_size(dtype);
  for (auto d : shape) n *= size_t(d);
  return n;
}

namespace {

// Writes `n` bytes or throws naming the file.
void write_all(std::FILE* f, const void* p, size_t n, const std::string& path) {
  if (n && std::fwrite(p, 1, n, f) != n) throw Error(path + ": write failed: " + std::strerror(errno));
}

// A file written as PATH.tmp and renamed to PATH by commit(), so a failed
// write never leaves a half-written file under the final name.
class AtomicFile {
 public:
  explicit AtomicFile(std::string path) : path_(std::move(path)), tmp_(path_ + ".tmp") {
    f_ = std::fopen(tmp_.c_str(), "wb");
    if (!f_) throw Error(path_ + ": cannot create: " + std::strerror(errno));
  }
  ~AtomicFile() {
    if (f_) {
      std::fclose(f_);
      std::remove(tmp_.c_str());
    }
  }
  AtomicFile(const AtomicFile&) = delete;
  AtomicFile& operator=(const AtomicFile&) = delete;
  void write(const void* p, size_t n) { write_all(f_, p, n, path_); }
  void commit() {
    int rc = std::fclose(f_);
    f_ = nullptr;
    if (rc != 0) {
      std::remove(tmp_.c_str());
      throw Error(path_ + ": write failed: " + std::strerror(errno));
    }
    std::error_code ec;
    fs::rename(tmp_, path_, ec);
    if (ec) throw Error(path_ + ": cannot rename from " + tmp_ + ": " + ec.message());
  }

 private:
  std::string path_, tmp_;
  std::FILE* f_ = nullptr;
};

bool is_checkpoint_file(const std::string& name) {
  if (name == "model.safetensors" || name == "model.safetensors.index.json") return true;
  unsigned a = 0, b = 0;
  int used = 0;
  return std::sscanf(name.c_str(), "model-%5u-of-%5u.safetensors%n", &a, &b, &used) == 2 &&
         size_t(used) == name.size();
}

}  // namespace

void write_safetensors_file(const std::string& path, const std::vector<TensorSpec>& specs, const TensorFill& fill) {
  // Wider dtypes first (stable), as the safetensors library does: every
  // tensor's byte size is a multiple of its element size, so each tensor then
  // starts at a multiple of its element size inside the 8-aligned data block.
  std::vector<const TensorSpec*> order;
  for (const TensorSpec& t : specs) order.push_back(&t);
  std::stable_sort(order.begin(), order.end(),
                   [](const TensorSpec* a, const TensorSpec* b) { return dtype_size(a->dtype) > dtype_size(b->dtype); });

  json h = json::object();
  uint64_t off = 0;
  for (const TensorSpec* t : order) {
    if (t->name.empty() || t->name == "__metadata__") throw Error(path + ": invalid tensor name '" + t->name + "'");
    if (h.contains(t->name)) throw Error(path + ": tensor '" + t->name + "' is written twice");
    const size_t n = t->nbytes();
    h[t->name] = {{"dtype", dtype_name(t->dtype)}, {"shape", t->shape}, {"data_offsets", {off, off + n}}};
    off += n;
  }
  h["__metadata__"] = {{"format", "pt"}};
  std::string text = h.dump();
  while ((8 + text.size()) % 8) text += ' ';  // the data block starts 8-byte aligned

  AtomicFile f(path);
  uint8_t len[8];
  for (int i = 0; i < 8; ++i) len[i] = uint8_t(uint64_t(text.size()) >> (8 * i));
  f.write(len, 8);
  f.write(text.data(), text.size());
  // Double-buffered: tensor k is written on a helper thread while tensor k+1
  // is being produced (generation and the copy into the page cache overlap).
  std::vector<uint8_t> buf[2];
  std::future<void> pending;  // declared after buf and f: destroyed (waited for) first
  for (size_t k = 0; k < order.size(); ++k) {
    std::vector<uint8_t>& b = buf[k & 1];
    b.resize(order[k]->nbytes());
    fill(*order[k], b.data());
    if (pending.valid()) pending.get();  // rethrows a write error
    pending = std::async(std::launch::async, [&f, &b] { f.write(b.data(), b.size()); });
  }
  if (pending.valid()) pending.get();
  f.commit();
}

size_t write_safetensors_dir(const std::string& dir, const std::vector<TensorSpec>& specs, int shards,
                             const TensorFill& fill) {
  if (shards < 1) throw Error(dir + ": the number of shards must be >= 1, got " + std::to_string(shards));
  if (size_t(shards) > std::max<size_t>(specs.size(), 1))
    throw Error(dir + ": cannot split " + std::to_string(specs.size()) + " tensors into " + std::to_string(shards) +
                " shards");
  std::error_code ec;
  fs::create_directories(dir, ec);
  if (ec || !fs::is_directory(dir)) throw Error(dir + ": cannot create directory: " + ec.message());
  try {
    for (const auto& entry : fs::directory_iterator(dir)) {
      if (entry.is_regular_file() && is_checkpoint_file(entry.path().filename().string())) fs::remove(entry.path());
    }
  } catch (const fs::filesystem_error& e) {
    throw Error(dir + ": cannot remove the files of an earlier checkpoint: " + e.code().message());
  }

  // prefix[i] = bytes of the tensors before i.
  const size_t n = specs.size();
  std::vector<uint64_t> prefix(n + 1, 0);
  for (size_t i = 0; i < n; ++i) prefix[i + 1] = prefix[i] + specs[i].nbytes();
  const uint64_t total = prefix[n];
  if (shards == 1) {
    write_safetensors_file((fs::path(dir) / "model.safetensors").string(), specs, fill);
    return size_t(total);
  }

  // Shard k holds tensors [cut[k], cut[k+1]): each cut is the tensor boundary
  // nearest to k/shards of the bytes, then nudged so no shard is empty.
  const size_t K = size_t(shards);
  std::vector<size_t> cut(K + 1, 0);
  cut[K] = n;
  for (size_t k = 1; k < K; ++k) {
    const uint64_t target = total / K * k + total % K * k / K;  // k·total/K without overflow
    size_t i = size_t(std::lower_bound(prefix.begin(), prefix.end(), target) - prefix.begin());
    if (i > 0 && target - prefix[i - 1] < prefix[i] - target) --i;
    cut[k] = std::max(i, cut[k - 1] + 1);
  }
  for (size_t k = K - 1; k >= 1; --k) cut[k] = std::min(cut[k], cut[k + 1] - 1);

  json wm = json::object();
  char name[64];
  for (size_t k = 0; k < K; ++k) {
    std::snprintf(name, sizeof name, "model-%05zu-of-%05zu.safetensors", k + 1, K);
    std::vector<TensorSpec> part(specs.begin() + std::ptrdiff_t(cut[k]), specs.begin() + std::ptrdiff_t(cut[k + 1]));
    write_safetensors_file((fs::path(dir) / name).string(), part, fill);
    for (const TensorSpec& t : part) wm[t.name] = name;
  }
  const std::string text = json{{"metadata", {{"total_size", total}}}, {"weight_map", wm}}.dump(2) + "\n";
  AtomicFile f((fs::path(dir) / "model.safetensors.index.json").string());
  f.write(text.data(), text.size());
  f.commit();
  return size_t(total);
}

void SafetensorsWriter::add(const std::string& name, DType dtype, const Shape& shape, std::vector<uint8_t> bytes) {
  TensorSpec t{name, dtype, shape};
  if (t.nbytes() != bytes.size())
    throw Error("writer: tensor '" + name + "' has " + std::to_string(bytes.size()) + " bytes, shape " +
                shape_str(shape) + " needs " + std::to_string(t.nbytes()));
  if (bytes_.count(name)) throw Error("writer: tensor '" + name + "' is added twice");
  specs_.push_back(std::move(t));
  bytes_.emplace(name, std::move(bytes));
}

size_t SafetensorsWriter::total_bytes() const {
  size_t n = 0;
  for (auto& kv : bytes_) n += kv.second.size();
  return n;
}

TensorFill SafetensorsWriter::filler() const {
  return [this](const TensorSpec& t, uint8_t* dst) {
    const std::vector<uint8_t>& b = bytes_.at(t.name);
    if (!b.empty()) std::memcpy(dst, b.data(), b.size());  // an empty tensor: null pointers
  };
}

void SafetensorsWriter::write_file(const std::string& path) const { write_safetensors_file(path, specs_, filler()); }

void SafetensorsWriter::write_dir(const std::string& dir, int shards) const {
  write_safetensors_dir(dir, specs_, shards, filler());
}

}  // namespace dsv4
