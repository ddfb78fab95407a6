// The engine's prefix cache: snapshot blobs (engine/snapshot.h) indexed by
// the token ids that led to them, so that a new request can start from the
// longest state whose tokens begin its prompt. Blobs live in host memory
// (never in pool pages: running sessions hold pages of their own, so
// nothing here can take a running request's state away) under a byte
// budget, least recently used first out; with a state directory every
// state is also written there (io/state_file.h) and an evicted one stays
// indexed by its file, read again on demand.
//
// Not thread-safe: the engine is driven from one thread, and so is this.
#pragma once
#include <cstddef>
#include <cstdint>
#include <list>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <unordered_map>
#include <vector>

#include "engine/engine.h"
#include "io/state_file.h"

namespace dsv4 {

class PrefixCache {
 public:
  // Indexes DIR's state files of this model (when `dir` is not empty; made
  // if missing). Files that cannot be used are named on stderr, one line
  // each, and left alone.
  PrefixCache(size_t budget_bytes, const std::string& dir, uint64_t fingerprint);

  // Whether a state of exactly these tokens is held (it becomes the most
  // recently used).
  bool contains(const std::vector<int32_t>& tokens);
  // Keeps the state of `tokens` (non-empty): in memory if it fits the
  // budget (evicting the least recently used), and on disk with a state
  // directory (a failed write is a warning, once).
  void insert(const std::vector<int32_t>& tokens, std::vector<uint8_t> blob);

  struct Hit {
    std::vector<int32_t> tokens;
    std::shared_ptr<const std::vector<uint8_t>> blob;
  };
  // The longest held state whose tokens are a prefix of `prompt` and
  // shorter than it, its blob in memory. A file that fails its checks is
  // named on stderr, dropped, and the next shorter state tried.
  std::optional<Hit> lookup(const std::vector<int32_t>& prompt);
  // Forgets a state (one whose blob did not restore).
  void drop(const std::vector<int32_t>& tokens);

  // entries, evictions, bytes (the engine counts the rest).
  void fill_stats(PrefixCacheStats* s) const;

 private:
  struct Entry {
    std::vector<int32_t> tokens;
    uint64_t hash = 0;  // prefix_hash of all its tokens
    std::shared_ptr<const std::vector<uint8_t>> blob;  // null: only on disk
    std::optional<StateFileHeader> file;
    uint64_t used = 0;  // LRU clock
  };
  using Iter = std::list<Entry>::iterator;

  Iter find(const std::vector<int32_t>& tokens, uint64_t hash);
  void add_index(Iter e);
  void erase(Iter e);
  // Makes room for `bytes` under the budget, never evicting `keep`.
  bool make_room(size_t bytes, Iter keep);
  void keep_blob(Iter e, std::shared_ptr<const std::vector<uint8_t>> blob);
  void index_directory();

  size_t budget_;
  std::string dir_;
  uint64_t fingerprint_;
  std::list<Entry> entries_;
  std::unordered_multimap<uint64_t, Iter> by_hash_;
  std::map<int64_t, int64_t> lengths_;  // token count -> entries of that length
  uint64_t clock_ = 0;
  size_t bytes_ = 0;
  int64_t evictions_ = 0;
  bool write_warned_ = false;
};

// Hash of tokens[0, n) that extends one token at a time (FNV-1a over the
// ids), so all prefixes of a prompt hash in one pass.
uint64_t prefix_hash_step(uint64_t h, int32_t token);
constexpr uint64_t kPrefixHashBasis = 0xcbf29ce484222325ull;

}  // namespace dsv4
