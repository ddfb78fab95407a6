// The tokenizer of a model directory: a HuggingFace `tokenizer.json` with a
// byte-level BPE model (the DeepSeek-V3/V4 family; see
// shared/data/tokenizer/README.md).
//
// encode(text) follows the `tokenizers` library step by step:
//   1. added tokens are cut out of the text literally, leftmost-longest (the
//      tokens with `normalized: false` first, then the others, as HF does);
//   2. the normalizer (the DeepSeek files have an empty one);
//   3. the pre-tokenizer: the `Split` regexes of the file, applied in order,
//      each to every piece the previous one produced (PCRE2, UTF + UCP), then
//      the GPT-2 byte-level mapping;
//   4. BPE on every piece: merges applied lowest rank first (leftmost on a
//      tie), with a cache of piece -> ids.
// It equals `encode(text, add_special_tokens=False).ids` of HF.
//
// Invalid UTF-8 (HF never sees it: its input is a Rust &str): each byte that
// is not part of a valid UTF-8 character ends the piece before it and becomes
// its own one-byte token. So decode(encode(b)) == b for any bytes b, and valid
// text is tokenized exactly as HF does.
#pragma once
#include <array>
#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <vector>

namespace dsv4 {

// The GPT-2 byte-level alphabet: byte b <-> one printable character (UTF-8).
const std::array<std::string, 256>& byte_level_alphabet();
// Each byte replaced by its character.
std::string byte_level_encode(std::string_view bytes);
// The inverse; false when `text` has a character outside the alphabet.
bool byte_level_decode(std::string_view text, std::string* bytes);

// Length of the valid UTF-8 character at s[0] (1..4), or 0 when s does not
// start with one (a stray continuation byte, an overlong form, a surrogate, a
// code point above U+10FFFF, a truncated sequence).
size_t utf8_char_length(std::string_view s);
// `bytes` with every invalid sequence replaced by U+FFFD, one per maximal
// invalid subpart (as Rust's String::from_utf8_lossy, which HF's decoders use).
std::string utf8_lossy(std::string_view bytes);

// The DeepSeek-V4 chat prompt of one user turn (shared/data/tokenizer/README.md):
//   <｜begin▁of▁sentence｜>{system}<｜User｜>{user}<｜Assistant｜></think>
// or with <think> instead of </think> in thinking mode: encode_messages()
// (io/chat_format.h) of a system and a user message.
std::string render_v4_chat(std::string_view system, std::string_view user, bool think);
extern const char* const kV4BosToken;  // <｜begin▁of▁sentence｜>

class Tokenizer {
 public:
  // Loads `path`, a tokenizer.json or a directory holding one. Throws
  // dsv4::Error naming the file and the field on anything it cannot honour
  // (an unsupported normalizer, pre-tokenizer, model option or decoder is an
  // error, never silently ignored).
  static std::unique_ptr<Tokenizer> load(const std::string& path);
  // True when `dir` has a tokenizer.json.
  static bool present_in(const std::string& dir);
  // Parses tokenizer.json text; `origin` names it in messages.
  static std::unique_ptr<Tokenizer> from_json(std::string_view json_text, const std::string& origin);
  ~Tokenizer();

  // Token ids of `text` (any bytes; see the note on invalid UTF-8 above).
  // Thread-safe.
  std::vector<int32_t> encode(std::string_view text) const;
  // The bytes the ids stand for (HF's ByteLevel decoder before its lossy
  // UTF-8 conversion: wrap the result in utf8_lossy() to get HF's string).
  // skip_special drops the added tokens marked special. An id the tokenizer
  // does not have is a dsv4::Error (HF would drop it silently).
  std::string decode(std::span<const int32_t> ids, bool skip_special = false) const;

  // The id of a token given by its text (an added token's content or a vocab
  // entry in byte-level form), or -1.
  int32_t token_id(std::string_view token) const;
  // 1 + the largest id.
  int32_t size() const;
  bool is_special(int32_t id) const;
  // A token of the base vocabulary (not an added token, not a hole).
  bool is_vocab(int32_t id) const;
  size_t added_tokens() const;
  // Drops the piece -> ids cache (for cold-cache benchmarks).
  void clear_cache() const;

 private:
  Tokenizer();
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace dsv4
