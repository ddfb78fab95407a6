// safetensors checkpoints (CHECKPOINT.md): memory-mapped reading of a single
// file or of shards listed in model.safetensors.index.json, strict validation,
// and a writer for the same layout.
#pragma once
#include <cstdint>
#include <cstring>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <vector>

namespace dsv4 {

enum class DType { kBF16, kF16, kF32, kF8E4M3, kF8E8M0, kI8, kU8, kI32, kI64 };
size_t dtype_size(DType t);
const char* dtype_name(DType t);
bool parse_dtype(const std::string& s, DType* out);

using Shape = std::vector<int64_t>;
std::string shape_str(const Shape& s);

struct TensorView {
  std::string name;
  std::string file;  // the shard it lives in (for messages)
  DType dtype = DType::kF32;
  Shape shape;
  const uint8_t* data = nullptr;
  size_t nbytes = 0;
  int64_t numel() const;
};

// A read-only memory mapping of a whole file.
class MappedFile {
 public:
  explicit MappedFile(const std::string& path);
  ~MappedFile();
  MappedFile(const MappedFile&) = delete;
  MappedFile& operator=(const MappedFile&) = delete;
  const uint8_t* data() const { return data_; }
  size_t size() const { return size_; }
  const std::string& path() const { return path_; }

 private:
  std::string path_;
  const uint8_t* data_ = nullptr;
  size_t size_ = 0;
};

// The longest header accepted (the limit of the safetensors library).
constexpr uint64_t kMaxSafetensorsHeader = 100'000'000;

// Parses a safetensors header held in memory (`size` bytes) and returns its
// tensors with data pointers into `bytes`. Validation failures throw
// dsv4::Error naming `origin` and the tensor.
std::vector<TensorView> parse_safetensors(const uint8_t* bytes, size_t size, const std::string& origin);

class Checkpoint {
 public:
  // Opens DIR/model.safetensors.index.json and its shards, or DIR/model.safetensors.
  static Checkpoint open(const std::string& dir);
  Checkpoint() = default;
  Checkpoint(Checkpoint&&) = default;
  Checkpoint& operator=(Checkpoint&&) = default;

  const std::string& dir() const { return dir_; }
  bool has(const std::string& name) const { return tensors_.count(name) != 0; }
  const TensorView* find(const std::string& name) const;
  // The name under which this checkpoint stores the tensor that CHECKPOINT.md
  // calls `name`: `name` itself when present, else its older spelling when
  // that is present (`.weight_scale_inv` for `.scale`,
  // `gate.e_score_correction_bias` for `gate.bias`), else `name` (so that a
  // missing tensor is reported under its official name).
  std::string resolve(const std::string& name) const;
  // The named tensor, which must exist and have this dtype and shape.
  const TensorView& get(const std::string& name, DType dtype, const Shape& shape) const;
  // Like get, with a choice of dtypes.
  const TensorView& get_any(const std::string& name, const std::vector<DType>& dtypes, const Shape& shape) const;
  const std::map<std::string, TensorView>& tensors() const { return tensors_; }
  size_t total_bytes() const;

 private:
  std::string dir_;
  std::vector<std::shared_ptr<MappedFile>> files_;
  std::map<std::string, TensorView> tensors_;
};

// ---- Writing ---------------------------------------------------------------
//
// Writing is streamed: a file's header is built from the planned list of
// tensors, then each tensor's bytes are produced by a callback and written
// before the next one is produced, so only one tensor is ever held in memory
// (a synthetic Flash layer is ~3 GB of experts).

// A tensor planned for writing.
struct TensorSpec {
  std::string name;
  DType dtype = DType::kF32;
  Shape shape;
  size_t nbytes() const;  // product(shape) x dtype size
};

// Produces the bytes of `spec` into dst (exactly spec.nbytes() bytes).
using TensorFill = std::function<void(const TensorSpec& spec, uint8_t* dst)>;

// Writes one safetensors file holding `specs` (data in the given order, except
// that wider dtypes come first so that every tensor is naturally aligned; the
// data block starts 8-byte aligned). Throws dsv4::Error on a duplicate or
// reserved name or an I/O failure.
void write_safetensors_file(const std::string& path, const std::vector<TensorSpec>& specs, const TensorFill& fill);

// Writes DIR/model.safetensors when shards == 1 (no index), else the tensors
// split in order into `shards` files of roughly equal bytes,
// DIR/model-0000k-of-0000n.safetensors, plus model.safetensors.index.json.
// Checkpoint files of an earlier write in DIR (model.safetensors, the index,
// model-*-of-*.safetensors) are removed first so that none is left stale.
// Returns the total number of data bytes.
size_t write_safetensors_dir(const std::string& dir, const std::vector<TensorSpec>& specs, int shards,
                             const TensorFill& fill);

// Collects tensors in memory and writes them with the functions above.
class SafetensorsWriter {
 public:
  void add(const std::string& name, DType dtype, const Shape& shape, std::vector<uint8_t> bytes);
  template <class T>
  void add_values(const std::string& name, DType dtype, const Shape& shape, const std::vector<T>& v) {
    std::vector<uint8_t> b(v.size() * sizeof(T));
    if (!b.empty()) std::memcpy(b.data(), v.data(), b.size());  // memcpy(null, null, 0) is UB
    add(name, dtype, shape, std::move(b));
  }
  // See write_safetensors_dir.
  void write_dir(const std::string& dir, int shards) const;
  // Writes all tensors to one file.
  void write_file(const std::string& path) const;
  size_t total_bytes() const;

 private:
  std::vector<TensorSpec> specs_;
  std::map<std::string, std::vector<uint8_t>> bytes_;
  TensorFill filler() const;
};

}  // namespace dsv4
