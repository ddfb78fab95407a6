#include "io/safetensors.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <sstream>

#include <nlohmann/json.hpp>

#include "core/error.h"

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
  }
  ::close(fd);
}

MappedFile::~MappedFile() {
  if (data_) munmap(const_cast<uint8_t*>(data_), size_);
}

std::vector<TensorView> parse_safetensors(const uint8_t* bytes, size_t size, const std::string& origin) {
  if (size < 8) throw Error(origin + ": file too short for a safetensors header (" + std::to_string(size) + " bytes)");
  uint64_t n = 0;
  for (int i = 7; i >= 0; --i) n = (n << 8) | bytes[i];
  if (n > size - 8)
    throw Error(origin + ": header length " + std::to_string(n) + " is beyond the file size " + std::to_string(size));
  std::string text(reinterpret_cast<const char*>(bytes + 8), size_t(n));
  json h = json::parse(text, nullptr, false);
  if (h.is_discarded()) throw Error(origin + ": header is not valid JSON");
  if (!h.is_object()) throw Error(origin + ": header must be a JSON object");
  const uint8_t* base = bytes + 8 + n;
  const uint64_t data_size = size - 8 - n;

  std::vector<TensorView> out;
  std::vector<std::pair<uint64_t, uint64_t>> ranges;
  for (auto it = h.begin(); it != h.end(); ++it) {
    if (it.key() == "__metadata__") continue;
    const std::string where = origin + ": tensor '" + it.key() + "'";
    const json& t = it.value();
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
    v.name = it.key();
    v.file = origin;
    if (!parse_dtype(dt->get<std::string>(), &v.dtype))
      throw Error(where + ": unknown dtype '" + dt->get<std::string>() + "'");
    uint64_t numel = 1;
    for (const json& d : *sh) {
      if (!d.is_number_unsigned()) throw Error(where + ": shape entries must be non-negative integers");
      uint64_t di = d.get<uint64_t>();
      if (di != 0 && numel > (uint64_t(1) << 62) / di) throw Error(where + ": shape is too large");
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
    ranges.push_back({b, e});
    out.push_back(std::move(v));
  }
  std::vector<size_t> order(out.size());
  for (size_t i = 0; i < order.size(); ++i) order[i] = i;
  std::sort(order.begin(), order.end(), [&](size_t a, size_t b) { return ranges[a] < ranges[b]; });
  for (size_t i = 1; i < order.size(); ++i) {
    auto& p = ranges[order[i - 1]];
    auto& q = ranges[order[i]];
    if (q.first < p.second && q.second > q.first && p.second > p.first)
      throw Error(origin + ": tensors '" + out[order[i - 1]].name + "' and '" + out[order[i]].name +
                  "' have overlapping data_offsets");
  }
  return out;
}

Checkpoint Checkpoint::open(const std::string& dir) {
  Checkpoint ck;
  ck.dir_ = dir;
  if (!fs::is_directory(dir)) throw Error(dir + ": model directory does not exist");
  fs::path index = fs::path(dir) / "model.safetensors.index.json";
  std::vector<std::string> shard_names;
  json weight_map;
  if (fs::exists(index)) {
    std::ifstream f(index);
    if (!f) throw Error(index.string() + ": cannot open");
    std::stringstream ss;
    ss << f.rdbuf();
    json j = json::parse(ss.str(), nullptr, false);
    if (j.is_discarded() || !j.is_object()) throw Error(index.string() + ": invalid JSON");
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
  } else if (fs::exists(fs::path(dir) / "model.safetensors")) {
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

void SafetensorsWriter::add(const std::string& name, DType dtype, const Shape& shape, std::vector<uint8_t> bytes) {
  int64_t n = 1;
  for (auto d : shape) n *= d;
  if (size_t(n) * dtype_size(dtype) != bytes.size())
    throw Error("writer: tensor '" + name + "' has " + std::to_string(bytes.size()) + " bytes, shape " +
                shape_str(shape) + " needs " + std::to_string(size_t(n) * dtype_size(dtype)));
  entries_.push_back({name, dtype, shape, std::move(bytes)});
}

size_t SafetensorsWriter::total_bytes() const {
  size_t n = 0;
  for (auto& e : entries_) n += e.bytes.size();
  return n;
}

void SafetensorsWriter::write_entries(const std::string& path, const std::vector<const Entry*>& entries) const {
  json h = json::object();
  uint64_t off = 0;
  for (const Entry* e : entries) {
    h[e->name] = {{"dtype", dtype_name(e->dtype)}, {"shape", e->shape}, {"data_offsets", {off, off + e->bytes.size()}}};
    off += e->bytes.size();
  }
  h["__metadata__"] = {{"format", "pt"}};
  std::string text = h.dump();
  while (text.size() % 8) text += ' ';  // keep the data block 8-byte aligned
  std::ofstream f(path, std::ios::binary);
  if (!f) throw Error(path + ": cannot create");
  uint64_t n = text.size();
  uint8_t len[8];
  for (int i = 0; i < 8; ++i) len[i] = uint8_t(n >> (8 * i));
  f.write(reinterpret_cast<const char*>(len), 8);
  f.write(text.data(), std::streamsize(text.size()));
  for (const Entry* e : entries) f.write(reinterpret_cast<const char*>(e->bytes.data()), std::streamsize(e->bytes.size()));
  if (!f) throw Error(path + ": write failed");
}

void SafetensorsWriter::write_file(const std::string& path) const {
  std::vector<const Entry*> all;
  for (auto& e : entries_) all.push_back(&e);
  write_entries(path, all);
}

void SafetensorsWriter::write_dir(const std::string& dir, int shards) const {
  fs::create_directories(dir);
  if (shards <= 1) {
    write_file((fs::path(dir) / "model.safetensors").string());
    return;
  }
  // Fill shards in tensor order up to an even share of the bytes each.
  size_t total = total_bytes(), per = (total + size_t(shards) - 1) / size_t(shards);
  std::vector<std::vector<const Entry*>> parts(static_cast<size_t>(shards));
  size_t k = 0, acc = 0;
  for (auto& e : entries_) {
    if (acc >= per && k + 1 < parts.size()) { ++k; acc = 0; }
    parts[k].push_back(&e);
    acc += e.bytes.size();
  }
  json wm = json::object();
  char name[64];
  for (size_t i = 0; i < parts.size(); ++i) {
    std::snprintf(name, sizeof name, "model-%05zu-of-%05d.safetensors", i + 1, shards);
    write_entries((fs::path(dir) / name).string(), parts[i]);
    for (const Entry* e : parts[i]) wm[e->name] = name;
  }
  json index = {{"metadata", {{"total_size", total}}}, {"weight_map", wm}};
  std::ofstream f(fs::path(dir) / "model.safetensors.index.json");
  f << index.dump(2) << "\n";
  if (!f) throw Error(dir + ": cannot write model.safetensors.index.json");
}

}  // namespace dsv4
