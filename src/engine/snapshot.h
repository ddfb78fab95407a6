// A request's whole state as one byte blob in host memory (the prefix cache
// and the state files keep these): the position, and per layer the raw
// window slots, each compressor's emitted rows and its ring of source rows
// (the unfinished block and, at ratio 4, the previous block that the next
// row overlaps), in the logical order of cache_contents. Restoring a blob
// into a fresh state gives one that continues bitwise as the original:
// every byte a later tile can read is in it. The token ids are kept beside
// the blob by its owner, not in it.
#pragma once
#include <cstdint>
#include <vector>

#include "engine/prefill.h"

namespace dsv4 {

// The blob of `st` (its n_tokens positions).
std::vector<uint8_t> snapshot_state(const Model& model, const RequestState& st);

// Bytes of the blob of a state at n_tokens positions (independent of the
// state: every part's size follows from the config and the position).
size_t snapshot_bytes(const Model& model, int64_t n_tokens);

// The position of the state in `blob`, after checking that the blob fits
// this model; throws dsv4::Error saying how it does not.
int64_t snapshot_position(const Model& model, const std::vector<uint8_t>& blob);

// `st` (initialised with this model, pages from its pool) becomes the state
// in `blob`. Throws dsv4::Error when the blob does not fit the model ("the
// snapshot has N bytes, expected M") before taking any page, or when the
// pool is full (then `st` holds whatever pages it held before).
void restore_state(const Model& model, const std::vector<uint8_t>& blob, RequestState& st);

// Tests only: the parts of a blob whose loss must break the bitwise
// continuation, zeroed in every layer that has them. kWindow: the oldest
// window row the next token still attends to (position N − window + 1);
// kPartialBlock: the ring slots of the unfinished block's positions;
// kOverlap: the ring slots of the previous block (ratio-4 compressors).
// Returns the number of bytes zeroed.
enum class SnapshotPart { kWindow, kPartialBlock, kOverlap };
size_t damage_snapshot(const Model& model, std::vector<uint8_t>& blob, SnapshotPart part);

}  // namespace dsv4
