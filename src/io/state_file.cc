#include "io/state_file.h"

#include <xxhash.h>
#include <unistd.h>

#include <cerrno>
#include <cstddef>
#include <cstdio>
#include <cstring>
#include <filesystem>

#include <nlohmann/json.hpp>

#include "core/error.h"

namespace dsv4 {

namespace {

constexpr char kMagic[8] = {'D', 'S', 'V', '4', 'S', 'T', 'A', 'T'};

struct FixedHeader {
  char magic[8];
  uint32_t version;
  uint32_t zero;
  uint64_t fingerprint;
  uint64_t n_tokens;
  uint64_t payload_bytes;
  uint64_t payload_hash;
  uint64_t header_hash;  // of the fields above and the token ids
};
static_assert(sizeof(FixedHeader) == 56, "the state file header is 56 bytes");

uint64_t header_hash(const FixedHeader& h, const std::vector<int32_t>& tokens) {
  XXH3_state_t* s = XXH3_createState();
  XXH3_64bits_reset(s);
  XXH3_64bits_update(s, &h, offsetof(FixedHeader, header_hash));
  XXH3_64bits_update(s, tokens.data(), tokens.size() * sizeof(int32_t));
  const uint64_t v = XXH3_64bits_digest(s);
  XXH3_freeState(s);
  return v;
}

std::string hex(uint64_t v) {
  char b[17];
  std::snprintf(b, sizeof b, "%016llx", static_cast<unsigned long long>(v));
  return b;
}

// Closes the file (even on error) and throws naming the path when any
// write or the close failed.
void finish_write(std::FILE* f, const std::string& tmp, bool ok) {
  ok = ok && std::fflush(f) == 0;
  const int err = ok ? 0 : errno;
  ok = (std::fclose(f) == 0) && ok;
  if (!ok) {
    std::remove(tmp.c_str());
    throw Error(tmp + ": cannot write the state file: " + std::strerror(err ? err : errno));
  }
}

}  // namespace

uint64_t model_fingerprint(const ModelConfig& c, const Checkpoint& ckpt) {
  std::string s = c.to_json().dump();
  for (const auto& [name, t] : ckpt.tensors()) {
    s += '\n' + name + ' ' + dtype_name(t.dtype);
    for (int64_t d : t.shape) s += ' ' + std::to_string(d);
  }
  return XXH3_64bits(s.data(), s.size());
}

std::string state_file_name(const std::vector<int32_t>& tokens) {
  return hex(XXH3_64bits(tokens.data(), tokens.size() * sizeof(int32_t))) + "-" + std::to_string(tokens.size()) +
         kStateFileSuffix;
}

StateFileHeader write_state_file(const std::string& path, uint64_t fingerprint, const std::vector<int32_t>& tokens,
                      const std::vector<uint8_t>& payload) {
  FixedHeader h{};
  std::memcpy(h.magic, kMagic, sizeof kMagic);
  h.version = kStateFileVersion;
  h.fingerprint = fingerprint;
  h.n_tokens = tokens.size();
  h.payload_bytes = payload.size();
  h.payload_hash = XXH3_64bits(payload.data(), payload.size());
  h.header_hash = header_hash(h, tokens);
  const std::string tmp = path + ".tmp." + std::to_string(getpid());
  std::FILE* f = std::fopen(tmp.c_str(), "wb");
  if (!f) throw Error(tmp + ": cannot create the state file: " + std::strerror(errno));
  bool ok = std::fwrite(&h, sizeof h, 1, f) == 1;
  ok = ok && (tokens.empty() || std::fwrite(tokens.data(), sizeof(int32_t) * tokens.size(), 1, f) == 1);
  ok = ok && (payload.empty() || std::fwrite(payload.data(), payload.size(), 1, f) == 1);
  finish_write(f, tmp, ok);
  if (std::rename(tmp.c_str(), path.c_str()) != 0) {
    const int err = errno;
    std::remove(tmp.c_str());
    throw Error(path + ": cannot rename the state file into place: " + std::strerror(err));
  }
  StateFileHeader out;
  out.path = path;
  out.tokens = tokens;
  out.payload_bytes = h.payload_bytes;
  out.payload_hash = h.payload_hash;
  out.payload_offset = sizeof h + tokens.size() * sizeof(int32_t);
  return out;
}

StateFileHeader read_state_header(const std::string& path, uint64_t fingerprint) {
  std::error_code ec;
  const uint64_t size = std::filesystem::file_size(path, ec);
  if (ec) throw Error(path + ": cannot read the state file: " + ec.message());
  FixedHeader h{};
  std::FILE* f = std::fopen(path.c_str(), "rb");
  if (!f) throw Error(path + ": cannot open the state file: " + std::strerror(errno));
  const bool got = std::fread(&h, sizeof h, 1, f) == 1;
  if (!got || std::memcmp(h.magic, kMagic, sizeof kMagic) != 0) {
    std::fclose(f);
    throw Error(path + (got ? ": not a dsv4 state file (expected the DSV4STAT magic)"
                            : ": truncated state file: " + std::to_string(size) + " bytes, shorter than its header"));
  }
  if (h.version != kStateFileVersion) {
    std::fclose(f);
    throw Error(path + ": state file format version " + std::to_string(h.version) + ", expected " +
                std::to_string(kStateFileVersion));
  }
  const uint64_t expected = sizeof h + h.n_tokens * sizeof(int32_t) + h.payload_bytes;
  if (h.n_tokens > (size >> 2) || h.payload_bytes > size || size != expected) {
    std::fclose(f);
    throw Error(path + ": state file of " + std::to_string(size) + " bytes, its header says " +
                std::to_string(expected) + " (truncated or damaged)");
  }
  StateFileHeader out;
  out.tokens.resize(size_t(h.n_tokens));
  const bool read_tokens = out.tokens.empty() || std::fread(out.tokens.data(), out.tokens.size() * 4, 1, f) == 1;
  std::fclose(f);
  if (!read_tokens) throw Error(path + ": cannot read the state file's token ids");
  if (header_hash(h, out.tokens) != h.header_hash) throw Error(path + ": state file header checksum mismatch (damaged)");
  if (h.fingerprint != fingerprint)
    throw Error(path + ": state file of another model (fingerprint " + hex(h.fingerprint) + ", expected " +
                hex(fingerprint) + ")");
  out.path = path;
  out.payload_bytes = h.payload_bytes;
  out.payload_hash = h.payload_hash;
  out.payload_offset = sizeof h + out.tokens.size() * sizeof(int32_t);
  return out;
}

std::vector<uint8_t> read_state_payload(const StateFileHeader& h) {
  std::vector<uint8_t> payload(size_t(h.payload_bytes));
  std::FILE* f = std::fopen(h.path.c_str(), "rb");
  if (!f) throw Error(h.path + ": cannot open the state file: " + std::strerror(errno));
  bool ok = std::fseek(f, long(h.payload_offset), SEEK_SET) == 0;
  ok = ok && (payload.empty() || std::fread(payload.data(), payload.size(), 1, f) == 1);
  std::fclose(f);
  if (!ok) throw Error(h.path + ": state file truncated: expected " + std::to_string(h.payload_bytes) + " payload bytes");
  if (XXH3_64bits(payload.data(), payload.size()) != h.payload_hash)
    throw Error(h.path + ": state file payload checksum mismatch (damaged)");
  return payload;
}

}  // namespace dsv4
