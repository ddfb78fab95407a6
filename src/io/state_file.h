// Saved request states on disk (the engine's prefix cache, --state-dir): one
// file per state, written under a temporary name and renamed into place, so
// that a reader never sees half a file. Layout, little-endian as the host:
//
//   "DSV4STAT"  u32 version  u32 0  u64 model fingerprint  u64 n_tokens
//   u64 payload bytes  u64 XXH3 of the payload  u64 XXH3 of everything
//   before this field and of the token ids
//   int32 token ids [n_tokens]
//   payload (engine/snapshot.h's blob)
//
// The header's own checksum lets a directory be indexed from the headers
// alone; the payload's is checked when a state is read. A file of another
// model, another format version, cut short or with any byte changed is
// refused with an Error naming the file and what was expected.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include "io/config.h"
#include "io/safetensors.h"

namespace dsv4 {

constexpr uint32_t kStateFileVersion = 1;
constexpr const char* kStateFileSuffix = ".dsv4state";

// Identifies what a state belongs to: the config and the tensor index
// (names, dtypes, shapes; not the weights' bytes), with XXH3.
uint64_t model_fingerprint(const ModelConfig& c, const Checkpoint& ckpt);

struct StateFileHeader {
  std::string path;
  std::vector<int32_t> tokens;
  uint64_t payload_bytes = 0;
  uint64_t payload_hash = 0;
  size_t payload_offset = 0;
};

// DIR/<XXH3 of the tokens>-<n>.dsv4state: a state's file name follows from
// its token ids, so the same state is written once.
std::string state_file_name(const std::vector<int32_t>& tokens);

// Writes the file atomically (PATH.tmp.PID, then rename) and returns its
// header as read_state_header would. Throws Error naming the path and the
// failing step (full disk, unwritable directory).
StateFileHeader write_state_file(const std::string& path, uint64_t fingerprint, const std::vector<int32_t>& tokens,
                      const std::vector<uint8_t>& payload);

// Reads and checks a file's header and token ids (not the payload's bytes).
StateFileHeader read_state_header(const std::string& path, uint64_t fingerprint);

// The payload of a file whose header was read, checked against its length
// and checksum.
std::vector<uint8_t> read_state_payload(const StateFileHeader& h);

}  // namespace dsv4
