#include "engine/snapshot.h"

#include <algorithm>
#include <cstring>

#include "core/error.h"

namespace dsv4 {

namespace {

// Blob layout: int64 n_tokens; int64 n_rows of every compressor in layer
// order (the main one, then the indexer's); then the sections below, rows
// back to back. Every size follows from the config and those counts, so a
// blob of another model or a cut one is refused by its length alone.
enum class Part { kWindow, kRows, kRing };

struct Section {
  size_t layer;
  int comp;  // 0: the main compressor, 1: the indexer's (kRows, kRing)
  Part part;
  int64_t rows;
  size_t row_bytes;
  const CompressorWeights* w;  // kRows, kRing
};

int n_compressors(const ModelConfig& c) {
  int n = 0;
  for (int l = 0; l < c.num_hidden_layers; ++l)
    n += int(c.layer_kind(l).has_compressor()) + int(c.layer_kind(l).has_indexer());
  return n;
}

// The sections of a state at N positions whose compressors hold n_rows[k]
// rows each (k counts compressors in blob order).
std::vector<Section> sections(const Model& m, int64_t N, const std::vector<int64_t>& n_rows) {
  const ModelConfig& c = m.config;
  std::vector<Section> out;
  size_t k = 0;
  for (int l = 0; l < c.num_hidden_layers; ++l) {
    const LayerKind kind = c.layer_kind(l);
    const AttentionWeights& aw = m.weights.layers[size_t(l)].attn;
    out.push_back({size_t(l), 0, Part::kWindow, std::min<int64_t>(N, c.sliding_window),
                   size_t(c.head_dim) * sizeof(uint16_t), nullptr});
    for (int comp = 0; comp < 2; ++comp) {
      if (comp == 0 ? !kind.has_compressor() : !kind.has_indexer()) continue;
      const CompressorWeights& w = comp == 0 ? aw.compressor : aw.indexer.compressor;
      out.push_back({size_t(l), comp, Part::kRows, n_rows[k++], size_t(w.head_dim) * sizeof(uint16_t), &w});
      out.push_back({size_t(l), comp, Part::kRing, std::min<int64_t>(N, w.ring_slots()),
                     size_t(2 * w.coff * w.head_dim) * sizeof(float), &w});
    }
  }
  return out;
}

template <class State>
auto& paged_rows(State& a, const Section& s) {
  if (s.part == Part::kWindow) return a.window;
  auto& comp = s.comp == 0 ? a.comp : a.indexer.comp;
  return s.part == Part::kRows ? comp.rows : comp.ring;
}

template <class State>
auto& compressor(State& a, int comp) {
  return comp == 0 ? a.comp : a.indexer.comp;
}

size_t header_bytes(const ModelConfig& c) { return sizeof(int64_t) * size_t(1 + n_compressors(c)); }

size_t payload_bytes(const std::vector<Section>& secs) {
  size_t b = 0;
  for (const Section& s : secs) b += size_t(s.rows) * s.row_bytes;
  return b;
}

int64_t read_i64(const uint8_t* p) {
  int64_t v;
  std::memcpy(&v, p, sizeof v);
  return v;
}

// Reads and checks the blob's counts: throws when they or its length do not
// fit the model.
std::vector<Section> blob_sections(const Model& m, const std::vector<uint8_t>& blob, int64_t* N) {
  const ModelConfig& c = m.config;
  const size_t head = header_bytes(c);
  if (blob.size() < head)
    throw Error("snapshot: " + std::to_string(blob.size()) + " bytes, shorter than its header of " +
                std::to_string(head) + " bytes");
  *N = read_i64(blob.data());
  if (*N < 0 || *N > c.max_position_embeddings)
    throw Error("snapshot: position " + std::to_string(*N) + " outside [0, max_position_embeddings]");
  std::vector<int64_t> n_rows(size_t(n_compressors(c)));
  for (size_t k = 0; k < n_rows.size(); ++k) n_rows[k] = read_i64(blob.data() + sizeof(int64_t) * (1 + k));
  std::vector<Section> secs = sections(m, *N, n_rows);
  for (const Section& s : secs)
    if (s.part == Part::kRows && (s.rows < 0 || s.rows > *N / s.w->ratio))
      throw Error("snapshot: layer " + std::to_string(s.layer) + " has " + std::to_string(s.rows) +
                  " compressed rows, expected at most " + std::to_string(*N / s.w->ratio));
  const size_t expected = head + payload_bytes(secs);
  if (blob.size() != expected)
    throw Error("snapshot: " + std::to_string(blob.size()) + " bytes, expected " + std::to_string(expected) +
                " for " + std::to_string(*N) + " positions of this model");
  return secs;
}

}  // namespace

std::vector<uint8_t> snapshot_state(const Model& m, const RequestState& st) {
  const int64_t N = st.n_tokens;
  std::vector<int64_t> n_rows;
  for (const AttentionState& a : st.layers) {
    if (a.kind.has_compressor()) n_rows.push_back(a.comp.n_rows);
    if (a.kind.has_indexer()) n_rows.push_back(a.indexer.comp.n_rows);
  }
  const std::vector<Section> secs = sections(m, N, n_rows);
  std::vector<uint8_t> blob(header_bytes(m.config) + payload_bytes(secs));
  std::memcpy(blob.data(), &N, sizeof N);
  std::memcpy(blob.data() + sizeof N, n_rows.data(), n_rows.size() * sizeof(int64_t));
  uint8_t* p = blob.data() + header_bytes(m.config);
  for (const Section& s : secs) {
    const PagedRows& rows = paged_rows(st.layers[s.layer], s);
    for (int64_t r = 0; r < s.rows; ++r, p += s.row_bytes) std::memcpy(p, rows.row(r), s.row_bytes);
  }
  return blob;
}

size_t snapshot_bytes(const Model& m, int64_t N) {
  std::vector<int64_t> n_rows;
  const ModelConfig& c = m.config;
  for (int l = 0; l < c.num_hidden_layers; ++l) {
    const AttentionWeights& aw = m.weights.layers[size_t(l)].attn;
    if (c.layer_kind(l).has_compressor()) n_rows.push_back(N / aw.compressor.ratio);
    if (c.layer_kind(l).has_indexer()) n_rows.push_back(N / aw.indexer.compressor.ratio);
  }
  return header_bytes(c) + payload_bytes(sections(m, N, n_rows));
}

int64_t snapshot_position(const Model& m, const std::vector<uint8_t>& blob) {
  int64_t N = 0;
  blob_sections(m, blob, &N);
  return N;
}

void restore_state(const Model& m, const std::vector<uint8_t>& blob, RequestState& st) {
  if (st.n_tokens != 0 || st.cache_bytes() != 0) throw Error("snapshot: restore needs an empty request state");
  int64_t N = 0;
  const std::vector<Section> secs = blob_sections(m, blob, &N);
  st.reserve(m, N);
  const uint8_t* p = blob.data() + header_bytes(m.config);
  for (const Section& s : secs) {
    const PagedRows& rows = paged_rows(st.layers[s.layer], s);
    for (int64_t r = 0; r < s.rows; ++r, p += s.row_bytes) std::memcpy(rows.row(r), p, s.row_bytes);
    if (s.part == Part::kRows) compressor(st.layers[s.layer], s.comp).n_rows = s.rows;
  }
  st.n_tokens = N;
}

size_t damage_snapshot(const Model& m, std::vector<uint8_t>& blob, SnapshotPart part) {
  int64_t N = 0;
  const std::vector<Section> secs = blob_sections(m, blob, &N);
  uint8_t* p = blob.data() + header_bytes(m.config);
  size_t zeroed = 0;
  auto zero_positions = [&](const Section& s, int64_t slots, int64_t from, int64_t to) {
    for (int64_t t = std::max<int64_t>(0, from); t < to; ++t) {
      std::memset(p + size_t(t % slots) * s.row_bytes, 0, s.row_bytes);
      zeroed += s.row_bytes;
    }
  };
  for (const Section& s : secs) {
    if (part == SnapshotPart::kWindow && s.part == Part::kWindow && N > 0) {
      const int64_t oldest = std::max<int64_t>(0, N - m.config.sliding_window + 1);
      zero_positions(s, m.config.sliding_window, oldest, oldest + 1);
    }
    if (s.part == Part::kRing) {
      const int64_t r = s.w->ratio, block = N / r * r;
      if (part == SnapshotPart::kPartialBlock) zero_positions(s, s.w->ring_slots(), block, N);
      if (part == SnapshotPart::kOverlap && s.w->coff == 2) zero_positions(s, s.w->ring_slots(), block - r, block);
    }
    p += size_t(s.rows) * s.row_bytes;
  }
  return zeroed;
}

}  // namespace dsv4
