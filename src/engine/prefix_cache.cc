#include "engine/prefix_cache.h"

#include <algorithm>
#include <cstdio>
#include <filesystem>

#include "core/error.h"

namespace dsv4 {

namespace {

void warn(const std::string& line) { std::fprintf(stderr, "dsv4: warning: %s\n", line.c_str()); }

uint64_t hash_of(const std::vector<int32_t>& tokens) {
  uint64_t h = kPrefixHashBasis;
  for (int32_t t : tokens) h = prefix_hash_step(h, t);
  return h;
}

}  // namespace

uint64_t prefix_hash_step(uint64_t h, int32_t token) {
  uint32_t v = uint32_t(token);
  for (int b = 0; b < 4; ++b, v >>= 8) h = (h ^ (v & 0xff)) * 0x100000001b3ull;
  return h;
}

PrefixCache::PrefixCache(size_t budget_bytes, const std::string& dir, uint64_t fingerprint)
    : budget_(budget_bytes), dir_(dir), fingerprint_(fingerprint) {
  if (!dir_.empty()) index_directory();
}

void PrefixCache::index_directory() {
  namespace fs = std::filesystem;
  std::error_code ec;
  fs::create_directories(dir_, ec);
  if (ec || !fs::is_directory(dir_)) {
    warn(dir_ + ": cannot use the state directory (" + (ec ? ec.message() : "not a directory") +
         "); states are kept in memory only");
    dir_.clear();
    return;
  }
  std::vector<std::string> paths;
  for (const fs::directory_entry& f : fs::directory_iterator(dir_, ec))
    if (f.is_regular_file() && f.path().extension() == kStateFileSuffix) paths.push_back(f.path().string());
  std::sort(paths.begin(), paths.end());  // the same index whatever the directory's order
  for (const std::string& p : paths) {
    try {
      StateFileHeader h = read_state_header(p, fingerprint_);
      const uint64_t hash = hash_of(h.tokens);
      if (h.tokens.empty() || find(h.tokens, hash) != entries_.end()) continue;
      entries_.push_back(Entry{h.tokens, hash, nullptr, std::move(h), 0});
      add_index(std::prev(entries_.end()));
    } catch (const Error& e) {
      warn(std::string(e.what()) + "; ignored");
    }
  }
}

PrefixCache::Iter PrefixCache::find(const std::vector<int32_t>& tokens, uint64_t hash) {
  auto [b, e] = by_hash_.equal_range(hash);
  for (auto it = b; it != e; ++it)
    if (it->second->tokens == tokens) return it->second;
  return entries_.end();
}

void PrefixCache::add_index(Iter e) {
  by_hash_.emplace(e->hash, e);
  ++lengths_[int64_t(e->tokens.size())];
}

void PrefixCache::erase(Iter e) {
  auto [b, end] = by_hash_.equal_range(e->hash);
  for (auto it = b; it != end; ++it)
    if (it->second == e) {
      by_hash_.erase(it);
      break;
    }
  auto len = lengths_.find(int64_t(e->tokens.size()));
  if (--len->second == 0) lengths_.erase(len);
  if (e->blob) bytes_ -= e->blob->size();
  entries_.erase(e);
}

bool PrefixCache::contains(const std::vector<int32_t>& tokens) {
  Iter e = find(tokens, hash_of(tokens));
  if (e == entries_.end()) return false;
  e->used = ++clock_;
  return true;
}

bool PrefixCache::make_room(size_t bytes, Iter keep) {
  if (bytes > budget_) return false;
  while (bytes_ + bytes > budget_) {
    Iter lru = entries_.end();
    for (Iter it = entries_.begin(); it != entries_.end(); ++it)
      if (it->blob && it != keep && (lru == entries_.end() || it->used < lru->used)) lru = it;
    if (lru == entries_.end()) return false;
    ++evictions_;
    if (lru->file) {  // stays indexed by its file
      bytes_ -= lru->blob->size();
      lru->blob.reset();
    } else {
      erase(lru);
    }
  }
  return true;
}

void PrefixCache::keep_blob(Iter e, std::shared_ptr<const std::vector<uint8_t>> blob) {
  if (e->blob || !make_room(blob->size(), e)) return;
  bytes_ += blob->size();
  e->blob = std::move(blob);
}

void PrefixCache::insert(const std::vector<int32_t>& tokens, std::vector<uint8_t> blob) {
  if (tokens.empty() || contains(tokens)) return;
  auto shared = std::make_shared<const std::vector<uint8_t>>(std::move(blob));
  std::optional<StateFileHeader> file;
  if (!dir_.empty()) {
    try {
      file = write_state_file((std::filesystem::path(dir_) / state_file_name(tokens)).string(), fingerprint_, tokens,
                              *shared);
    } catch (const Error& e) {
      if (!write_warned_) warn(std::string(e.what()) + "; the state is kept in memory only (further failures not reported)");
      write_warned_ = true;
    }
  }
  if (!file && shared->size() > budget_) return;  // neither memory nor disk can hold it
  entries_.push_back(Entry{tokens, hash_of(tokens), nullptr, std::move(file), ++clock_});
  const Iter e = std::prev(entries_.end());
  add_index(e);
  keep_blob(e, shared);
  if (!e->blob && !e->file) erase(e);
}

std::optional<PrefixCache::Hit> PrefixCache::lookup(const std::vector<int32_t>& prompt) {
  std::vector<uint64_t> hashes(prompt.size() + 1, kPrefixHashBasis);
  for (size_t i = 0; i < prompt.size(); ++i) hashes[i + 1] = prefix_hash_step(hashes[i], prompt[i]);
  for (auto len = lengths_.rbegin(); len != lengths_.rend();) {
    const int64_t n = len->first;
    ++len;
    if (n >= int64_t(prompt.size())) continue;
    auto [b, e] = by_hash_.equal_range(hashes[size_t(n)]);
    Iter hit = entries_.end();
    for (auto it = b; it != e && hit == entries_.end(); ++it)
      if (int64_t(it->second->tokens.size()) == n && std::equal(prompt.begin(), prompt.begin() + n, it->second->tokens.begin()))
        hit = it->second;
    if (hit == entries_.end()) continue;
    std::shared_ptr<const std::vector<uint8_t>> blob = hit->blob;
    if (!blob) {
      try {
        blob = std::make_shared<const std::vector<uint8_t>>(read_state_payload(*hit->file));
      } catch (const Error& e) {
        warn(std::string(e.what()) + "; prefilling instead");
        const bool last_of_length = lengths_[n] == 1;
        erase(hit);
        // The length iterator stays valid unless this was its only entry.
        if (last_of_length) len = std::make_reverse_iterator(lengths_.upper_bound(n - 1));
        continue;
      }
      keep_blob(hit, blob);
    }
    hit->used = ++clock_;
    return Hit{hit->tokens, blob};
  }
  return std::nullopt;
}

void PrefixCache::drop(const std::vector<int32_t>& tokens) {
  Iter e = find(tokens, hash_of(tokens));
  if (e != entries_.end()) erase(e);
}

void PrefixCache::fill_stats(PrefixCacheStats* s) const {
  s->entries = int64_t(entries_.size());
  s->evictions = evictions_;
  s->bytes = bytes_;
}

}  // namespace dsv4
