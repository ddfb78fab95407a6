#include "io/tokenizer.h"

#define PCRE2_CODE_UNIT_WIDTH 8
#include <pcre2.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <mutex>
#include <sstream>
#include <unordered_map>

#include <nlohmann/json.hpp>

#include "core/error.h"
#include "io/chat_format.h"
#include "io/text_file.h"

namespace dsv4 {

namespace fs = std::filesystem;
using nlohmann::json;

// ---- Byte-level alphabet and UTF-8 -------------------------------------------

namespace {

void append_utf8(uint32_t cp, std::string* out) {
  if (cp < 0x80) {
    out->push_back(char(cp));
  } else if (cp < 0x800) {
    out->push_back(char(0xC0 | (cp >> 6)));
    out->push_back(char(0x80 | (cp & 0x3F)));
  } else if (cp < 0x10000) {
    out->push_back(char(0xE0 | (cp >> 12)));
    out->push_back(char(0x80 | ((cp >> 6) & 0x3F)));
    out->push_back(char(0x80 | (cp & 0x3F)));
  } else {
    out->push_back(char(0xF0 | (cp >> 18)));
    out->push_back(char(0x80 | ((cp >> 12) & 0x3F)));
    out->push_back(char(0x80 | ((cp >> 6) & 0x3F)));
    out->push_back(char(0x80 | (cp & 0x3F)));
  }
}

// GPT-2's bytes_to_unicode(): the printable bytes stand for themselves, the
// other 68 are moved to U+0100.. in byte order, so every byte has a visible,
// non-space character and no character is shared.
struct ByteLevel {
  std::array<uint32_t, 256> cp{};           // byte -> code point
  std::array<std::string, 256> utf8;        // byte -> its character, UTF-8
  std::array<int16_t, 324> byte_of;         // code point (< 324) -> byte, or -1
  ByteLevel() {
    byte_of.fill(-1);
    uint32_t next = 256;
    for (int b = 0; b < 256; ++b) {
      const bool printable = (b >= '!' && b <= '~') || (b >= 0xA1 && b <= 0xAC) || (b >= 0xAE && b <= 0xFF);
      cp[size_t(b)] = printable ? uint32_t(b) : next++;
      append_utf8(cp[size_t(b)], &utf8[size_t(b)]);
      byte_of[cp[size_t(b)]] = int16_t(b);
    }
  }
};

const ByteLevel& byte_level() {
  static const ByteLevel t;
  return t;
}

// Decodes the character at s[0] (length n = utf8_char_length(s) > 0).
uint32_t decode_utf8(const unsigned char* s, size_t n) {
  switch (n) {
    case 1: return s[0];
    case 2: return uint32_t(s[0] & 0x1F) << 6 | (s[1] & 0x3F);
    case 3: return uint32_t(s[0] & 0x0F) << 12 | uint32_t(s[1] & 0x3F) << 6 | (s[2] & 0x3F);
    default: return uint32_t(s[0] & 0x07) << 18 | uint32_t(s[1] & 0x3F) << 12 | uint32_t(s[2] & 0x3F) << 6 | (s[3] & 0x3F);
  }
}

// How many bytes of s, from a lead byte on, are a prefix of some valid
// character (the "maximal subpart" of the Unicode standard, §3.9): at least 1.
size_t invalid_subpart(std::string_view s) {
  const unsigned char b0 = (unsigned char)s[0];
  int need;
  unsigned char lo = 0x80, hi = 0xBF;  // the second byte's range
  if (b0 >= 0xC2 && b0 <= 0xDF) need = 1;
  else if (b0 == 0xE0) need = 2, lo = 0xA0;
  else if (b0 == 0xED) need = 2, hi = 0x9F;
  else if (b0 >= 0xE1 && b0 <= 0xEF) need = 2;
  else if (b0 == 0xF0) need = 3, lo = 0x90;
  else if (b0 == 0xF4) need = 3, hi = 0x8F;
  else if (b0 >= 0xF1 && b0 <= 0xF3) need = 3;
  else return 1;
  size_t k = 1;
  for (int i = 0; i < need && k < s.size(); ++i, ++k) {
    const unsigned char b = (unsigned char)s[k];
    if (b < (i == 0 ? lo : 0x80) || b > (i == 0 ? hi : 0xBF)) break;
  }
  return k;
}

}  // namespace

const std::array<std::string, 256>& byte_level_alphabet() { return byte_level().utf8; }

std::string byte_level_encode(std::string_view bytes) {
  const auto& t = byte_level().utf8;
  std::string out;
  out.reserve(bytes.size() * 2);
  for (unsigned char b : bytes) out += t[b];
  return out;
}

bool byte_level_decode(std::string_view text, std::string* bytes) {
  const ByteLevel& t = byte_level();
  bytes->clear();
  for (size_t i = 0; i < text.size();) {
    const size_t n = utf8_char_length(text.substr(i));
    if (n == 0) return false;
    const uint32_t cp = decode_utf8((const unsigned char*)text.data() + i, n);
    if (cp >= t.byte_of.size() || t.byte_of[cp] < 0) return false;
    bytes->push_back(char(t.byte_of[cp]));
    i += n;
  }
  return true;
}

size_t utf8_char_length(std::string_view s) {
  if (s.empty()) return 0;
  const unsigned char b0 = (unsigned char)s[0];
  if (b0 < 0x80) return 1;
  const size_t k = invalid_subpart(s);
  // A full character is a maximal subpart that reached its length.
  const size_t want = b0 >= 0xF0 ? 4 : b0 >= 0xE0 ? 3 : 2;
  return k == want && b0 >= 0xC2 && b0 <= 0xF4 ? k : 0;
}

std::string utf8_lossy(std::string_view bytes) {
  std::string out;
  out.reserve(bytes.size());
  for (size_t i = 0; i < bytes.size();) {
    const size_t n = utf8_char_length(bytes.substr(i));
    if (n) {
      out.append(bytes.data() + i, n);
      i += n;
    } else {
      out += "\xEF\xBF\xBD";  // U+FFFD
      i += invalid_subpart(bytes.substr(i));
    }
  }
  return out;
}

const char* const kV4BosToken = "<｜begin▁of▁sentence｜>";

std::string render_v4_chat(std::string_view system, std::string_view user, bool think) {
  nlohmann::ordered_json messages = nlohmann::ordered_json::array();
  messages.push_back({{"role", "system"}, {"content", std::string(system)}});
  messages.push_back({{"role", "user"}, {"content", std::string(user)}});
  EncodeOptions options;
  options.thinking_mode = think ? ThinkingMode::kThinking : ThinkingMode::kChat;
  return encode_messages(messages, options);
}

// ---- The tokenizer ---------------------------------------------------------------

namespace {

// Oniguruma (the regex engine of HF tokenizers) and PCRE2 agree on \p{..}
// classes but not quite on \s: PCRE2's UCP \s adds U+180E (MONGOLIAN VOWEL
// SEPARATOR, no longer White_Space since Unicode 6.3). Spell out Oniguruma's
// set, the Unicode White_Space property, so splits match HF on every input.
constexpr const char* kOnigSpace =
    "\\t-\\r\\x{20}\\x{85}\\x{A0}\\x{1680}\\x{2000}-\\x{200A}\\x{2028}\\x{2029}\\x{202F}\\x{205F}\\x{3000}";

std::string onig_to_pcre2(const std::string& p) {
  std::string out;
  bool in_class = false;
  for (size_t i = 0; i < p.size(); ++i) {
    const char ch = p[i];
    if (ch == '\\' && i + 1 < p.size()) {
      const char e = p[i + 1];
      if (e == 's') out += in_class ? std::string(kOnigSpace) : "[" + std::string(kOnigSpace) + "]";
      else if (e == 'S' && !in_class) out += "[^" + std::string(kOnigSpace) + "]";
      else out += p.substr(i, 2);
      ++i;
      continue;
    }
    if (ch == '[' && !in_class) {
      in_class = true;
      out += ch;
      // A ']' right after '[' or '[^' is a literal member.
      if (i + 1 < p.size() && p[i + 1] == '^') out += p[++i];
      if (i + 1 < p.size() && p[i + 1] == ']') out += p[++i];
      continue;
    }
    if (ch == ']' && in_class) in_class = false;
    out += ch;
  }
  return out;
}

// One compiled Split step.
struct SplitStep {
  pcre2_code* code = nullptr;
  bool remove = false;  // behavior "Removed" (else "Isolated")
};

// A byte trie of added tokens for leftmost-longest literal matching.
struct Trie {
  struct Node {
    int32_t token = -1;  // id of the token ending here
  };
  std::vector<Node> nodes{Node{}};
  std::unordered_map<uint64_t, int32_t> edges;  // (node << 8 | byte) -> child
  std::array<bool, 256> first{};                 // bytes a token can start with

  void add(std::string_view s, int32_t id) {
    int32_t n = 0;
    for (unsigned char b : s) {
      auto [it, fresh] = edges.try_emplace(uint64_t(n) << 8 | b, int32_t(nodes.size()));
      if (fresh) nodes.push_back({});
      n = it->second;
    }
    nodes[size_t(n)].token = id;
    first[(unsigned char)s[0]] = true;
  }
  bool empty() const { return nodes.size() == 1; }
  // The longest token starting at s[0]: (id, length) or (-1, 0).
  std::pair<int32_t, size_t> longest(std::string_view s) const {
    std::pair<int32_t, size_t> best{-1, 0};
    if (!first[(unsigned char)s[0]]) return best;
    int32_t n = 0;
    for (size_t i = 0; i < s.size(); ++i) {
      auto it = edges.find(uint64_t(n) << 8 | (unsigned char)s[i]);
      if (it == edges.end()) break;
      n = it->second;
      if (nodes[size_t(n)].token >= 0) best = {nodes[size_t(n)].token, i + 1};
    }
    return best;
  }
};

// A piece of the input: [begin, end) and, for an added token, its id.
struct Segment {
  size_t begin, end;
  int32_t added;  // -1: plain text
};

// Hash map keyed by std::string that can be probed with a string_view.
struct StringHash {
  using is_transparent = void;
  size_t operator()(std::string_view s) const { return std::hash<std::string_view>{}(s); }
};
using PieceCache = std::unordered_map<std::string, std::vector<int32_t>, StringHash, std::equal_to<>>;

// An entry of tokenizer.json's added_tokens.
struct AddedToken {
  int32_t id;
  std::string content;
  bool special, normalized;
};

}  // namespace

struct Tokenizer::Impl {
  std::string origin;
  // Vocabulary.
  std::unordered_map<std::string, int32_t> vocab;  // byte-level token text -> id
  std::vector<std::string> token_bytes;            // id -> the bytes it decodes to
  std::vector<uint8_t> kind;                       // id -> 0 none, 1 vocab, 2 added, 3 added special
  std::unordered_map<std::string, int32_t> added;  // content -> id
  std::array<int32_t, 256> byte_id{};              // byte -> id of its one-character token
  // Merges: (left id, right id) -> (rank, merged id).
  std::unordered_map<uint64_t, std::pair<int32_t, int32_t>> merges;
  bool ignore_merges = false;
  Trie raw_tokens, normalized_tokens;  // HF matches `normalized: false` tokens first
  std::vector<SplitStep> splits;

  // Mutable encode state, guarded by mu: the piece cache and PCRE2 buffers.
  mutable std::mutex mu;
  mutable PieceCache cache;
  pcre2_match_data* md = nullptr;
  pcre2_match_context* mctx = nullptr;
  pcre2_jit_stack* jit_stack = nullptr;

  ~Impl() {
    for (auto& s : splits) pcre2_code_free(s.code);
    pcre2_match_data_free(md);
    pcre2_match_context_free(mctx);
    pcre2_jit_stack_free(jit_stack);
  }

  [[noreturn]] void fail(const std::string& msg) const { throw Error(origin + ": " + msg); }

  // load reads tokenizer.json in these steps, each failing with the field's
  // name on what this tokenizer does not support.
  void load(const json& j);
  void check_normalizer(const json& j) const;
  void check_model(const json& m);
  int32_t load_vocab(const json& v);  // returns the largest id
  std::vector<AddedToken> read_added_tokens(const json& j, int32_t* max_id) const;
  void build_id_tables(const std::vector<AddedToken>& adds, int32_t max_id);
  void find_byte_tokens();
  void load_merges(const json& ms);
  void load_pre_tokenizer(const json& p);
  void create_matcher();
  void add_split(const json& step, size_t index);

  void split_added(std::string_view text, const Trie& trie, std::vector<Segment>* segs) const;
  void encode_plain(std::string_view text, std::vector<int32_t>* out) const;
  void pre_tokenize(std::string_view text, std::vector<std::pair<size_t, size_t>>* pieces) const;
  void bpe(std::string_view piece, std::vector<int32_t>* out) const;
};

// Ids index dense tables (one entry per id up to the largest): a larger id
// in a small file would allocate gigabytes (found by fuzz/tokenizer_json).
// Real vocabularies are far below (V4: 129,280).
constexpr int64_t kMaxTokenId = (int64_t(1) << 22) - 1;

void Tokenizer::Impl::load(const json& j) {
  check_normalizer(j);
  if (!j.contains("model") || !j["model"].is_object()) fail("no 'model' object");
  const json& m = j["model"];
  check_model(m);
  int32_t max_id = load_vocab(m["vocab"]);
  const std::vector<AddedToken> adds = read_added_tokens(j, &max_id);
  build_id_tables(adds, max_id);
  find_byte_tokens();
  load_merges(m["merges"]);

  if (!j.contains("pre_tokenizer") || j["pre_tokenizer"].is_null()) fail("no pre_tokenizer: a byte-level one is needed");
  load_pre_tokenizer(j["pre_tokenizer"]);

  if (!j.contains("decoder") || !j["decoder"].is_object() || j["decoder"].value("type", "") != "ByteLevel")
    fail("decoder must be ByteLevel");

  create_matcher();
}

void Tokenizer::Impl::check_normalizer(const json& j) const {
  // Normalizer: none, or an empty Sequence (the DeepSeek files).
  if (j.contains("normalizer") && !j["normalizer"].is_null()) {
    const json& n = j["normalizer"];
    if (!(n.value("type", "") == "Sequence" && n.contains("normalizers") && n["normalizers"].empty()))
      fail("normalizer " + n.dump().substr(0, 80) + " is not supported (only none or an empty Sequence)");
  }
}

void Tokenizer::Impl::check_model(const json& m) {
  // Model: byte-level BPE without dropout, unk, prefixes or byte fallback.
  if (m.value("type", "BPE") != "BPE") fail("model.type '" + m.value("type", "") + "' is not supported (only BPE)");
  auto must_be_null = [&](const char* k) {
    if (m.contains(k) && !m[k].is_null() && !(m[k].is_string() && m[k].get<std::string>().empty()))
      fail(std::string("model.") + k + " = " + m[k].dump() + " is not supported");
  };
  must_be_null("dropout");
  must_be_null("continuing_subword_prefix");
  must_be_null("end_of_word_suffix");
  if (m.value("byte_fallback", false)) fail("model.byte_fallback = true is not supported");
  // unk_token only matters for characters outside the vocabulary, and a
  // byte-level vocabulary has all 256 (checked by find_byte_tokens).
  ignore_merges = m.value("ignore_merges", false);
  if (!m.contains("vocab") || !m["vocab"].is_object()) fail("model.vocab is not an object");
  if (!m.contains("merges") || !m["merges"].is_array()) fail("model.merges is not an array");
}

int32_t Tokenizer::Impl::load_vocab(const json& v) {
  int32_t max_id = -1;
  vocab.reserve(v.size());
  for (auto it = v.begin(); it != v.end(); ++it) {
    if (!it.value().is_number_integer() || it.value().get<int64_t>() < 0 || it.value().get<int64_t>() > kMaxTokenId)
      fail("model.vocab['" + it.key() + "'] is not a valid id (0 to " + std::to_string(kMaxTokenId) + ")");
    const int32_t id = it.value().get<int32_t>();
    vocab.emplace(it.key(), id);
    max_id = std::max(max_id, id);
  }
  return max_id;
}

std::vector<AddedToken> Tokenizer::Impl::read_added_tokens(const json& j, int32_t* max_id) const {
  std::vector<AddedToken> adds;
  if (!j.contains("added_tokens") || j["added_tokens"].is_null()) return adds;
  if (!j["added_tokens"].is_array()) fail("added_tokens is not an array");
  for (const json& a : j["added_tokens"]) {
    if (!a.is_object() || !a.contains("id") || !a["id"].is_number_integer() || !a.contains("content") ||
        !a["content"].is_string())
      fail("added_tokens entry " + a.dump().substr(0, 80) + " needs an integer id and a string content");
    if (a["id"].is_number_unsigned() ? a["id"].get<uint64_t>() > uint64_t(kMaxTokenId)
                                     : (a["id"].get<int64_t>() < 0 || a["id"].get<int64_t>() > kMaxTokenId))
      fail("added token id " + a["id"].dump() + " is not in [0, " + std::to_string(kMaxTokenId) + "]");
    AddedToken t{a["id"].get<int32_t>(), a["content"].get<std::string>(), a.value("special", false),
                 a.value("normalized", !a.value("special", false))};
    if (t.id < 0) fail("added token '" + t.content + "' has a negative id");
    if (t.content.empty()) fail("added token " + std::to_string(t.id) + " is empty");
    for (const char* k : {"lstrip", "rstrip", "single_word"})
      if (a.value(k, false)) fail("added token '" + t.content + "': " + k + " = true is not supported");
    *max_id = std::max(*max_id, t.id);
    adds.push_back(std::move(t));
  }
  return adds;
}

void Tokenizer::Impl::build_id_tables(const std::vector<AddedToken>& adds, int32_t max_id) {
  // id -> bytes. A vocab token decodes through the byte-level alphabet; one
  // with a character outside it decodes to its own UTF-8 text (HF's ByteLevel
  // decoder does the same). Added tokens decode to their content.
  token_bytes.assign(size_t(max_id) + 1, {});
  kind.assign(size_t(max_id) + 1, 0);
  for (const auto& [text, id] : vocab) {
    if (!byte_level_decode(text, &token_bytes[size_t(id)])) token_bytes[size_t(id)] = text;
    kind[size_t(id)] = 1;
  }
  for (const AddedToken& a : adds) {
    token_bytes[size_t(a.id)] = a.content;
    kind[size_t(a.id)] = a.special ? 3 : 2;
    added[a.content] = a.id;
    (a.normalized ? normalized_tokens : raw_tokens).add(a.content, a.id);
  }
}

void Tokenizer::Impl::find_byte_tokens() {
  const auto& alpha = byte_level_alphabet();
  for (int b = 0; b < 256; ++b) {
    auto it = vocab.find(alpha[size_t(b)]);
    if (it == vocab.end()) {
      char hex[8];
      std::snprintf(hex, sizeof hex, "0x%02X", b);
      fail(std::string("model.vocab has no token for byte ") + hex + " ('" + alpha[size_t(b)] +
           "'): not a byte-level vocabulary");
    }
    byte_id[size_t(b)] = it->second;
  }
}

void Tokenizer::Impl::load_merges(const json& ms) {
  // Merges, "left right" strings (older files) or [left, right] pairs.
  merges.reserve(ms.size());
  for (size_t r = 0; r < ms.size(); ++r) {
    std::string left, right;
    if (ms[r].is_string()) {
      const std::string& s = ms[r].get_ref<const std::string&>();
      const size_t sp = s.find(' ');
      if (sp == std::string::npos || s.find(' ', sp + 1) != std::string::npos)
        fail("model.merges[" + std::to_string(r) + "] = '" + s + "' is not two tokens");
      left = s.substr(0, sp);
      right = s.substr(sp + 1);
    } else if (ms[r].is_array() && ms[r].size() == 2 && ms[r][0].is_string() && ms[r][1].is_string()) {
      left = ms[r][0].get<std::string>();
      right = ms[r][1].get<std::string>();
    } else {
      fail("model.merges[" + std::to_string(r) + "] is not a pair of tokens");
    }
    auto a = vocab.find(left), b = vocab.find(right), ab = vocab.find(left + right);
    if (a == vocab.end() || b == vocab.end() || ab == vocab.end())
      fail("model.merges[" + std::to_string(r) + "] ('" + left + "', '" + right + "') uses a token not in the vocab");
    // On a repeated pair the first (lowest) rank wins, as in HF.
    merges.try_emplace(uint64_t(uint32_t(a->second)) << 32 | uint32_t(b->second), int32_t(r), ab->second);
  }
}

void Tokenizer::Impl::create_matcher() {
  md = pcre2_match_data_create(2, nullptr);
  mctx = pcre2_match_context_create(nullptr);
  // JIT code runs on its own stack; 32 KiB is the default, grown on demand
  // for long runs of one class (a megabyte of spaces is still one piece).
  jit_stack = pcre2_jit_stack_create(32 * 1024, 64 * 1024 * 1024, nullptr);
  if (!md || !mctx || !jit_stack) throw std::bad_alloc();
  pcre2_jit_stack_assign(mctx, nullptr, jit_stack);
}

void Tokenizer::Impl::load_pre_tokenizer(const json& p) {
  // Split steps, then exactly one ByteLevel step at the end.
  std::vector<json> steps;
  if (p.value("type", "") == "Sequence") {
    if (!p.contains("pretokenizers") || !p["pretokenizers"].is_array()) fail("pre_tokenizer.pretokenizers is not an array");
    for (const json& s : p["pretokenizers"]) steps.push_back(s);
  } else {
    steps.push_back(p);
  }
  if (steps.empty() || steps.back().value("type", "") != "ByteLevel")
    fail("pre_tokenizer must end with a ByteLevel step (a byte-level BPE)");
  const json& bl = steps.back();
  if (bl.value("add_prefix_space", false)) fail("pre_tokenizer ByteLevel add_prefix_space = true is not supported");
  if (bl.value("use_regex", true)) fail("pre_tokenizer ByteLevel use_regex = true is not supported");
  for (size_t i = 0; i + 1 < steps.size(); ++i) add_split(steps[i], i);
}

void Tokenizer::Impl::add_split(const json& s, size_t index) {
  const std::string where = "pre_tokenizer step " + std::to_string(index);
  if (s.value("type", "") != "Split") fail(where + ": type '" + s.value("type", "") + "' is not supported (only Split)");
  if (s.value("invert", false)) fail(where + ": invert = true is not supported");
  const std::string behavior = s.value("behavior", "");
  if (behavior != "Isolated" && behavior != "Removed")
    fail(where + ": behavior '" + behavior + "' is not supported (only Isolated and Removed)");
  if (!s.contains("pattern") || !s["pattern"].is_object()) fail(where + ": no pattern");
  const json& pat = s["pattern"];
  std::string pattern;
  uint32_t options = PCRE2_UTF | PCRE2_UCP;
  if (pat.contains("Regex") && pat["Regex"].is_string()) {
    pattern = onig_to_pcre2(pat["Regex"].get<std::string>());
  } else if (pat.contains("String") && pat["String"].is_string()) {
    pattern = pat["String"].get<std::string>();
    options |= PCRE2_LITERAL;
  } else {
    fail(where + ": pattern needs a Regex or String");
  }
  int err = 0;
  PCRE2_SIZE at = 0;
  pcre2_code* code = pcre2_compile((PCRE2_SPTR)pattern.data(), pattern.size(), options, &err, &at, nullptr);
  if (!code) {
    PCRE2_UCHAR msg[256];
    pcre2_get_error_message(err, msg, sizeof msg);
    fail(where + ": regex does not compile at offset " + std::to_string(at) + ": " + (const char*)msg);
  }
  // JIT is a speed-up only: without it (an unsupported CPU) matching still works.
  pcre2_jit_compile(code, PCRE2_JIT_COMPLETE);
  splits.push_back({code, behavior == "Removed"});
}

// Cuts `text` at the leftmost-longest occurrences of the trie's tokens; plain
// segments keep added = -1.
void Tokenizer::Impl::split_added(std::string_view text, const Trie& trie, std::vector<Segment>* segs) const {
  size_t plain = 0;
  for (size_t i = 0; i < text.size();) {
    auto [id, len] = trie.longest(text.substr(i));
    if (id < 0) {
      ++i;
      continue;
    }
    if (i > plain) segs->push_back({plain, i, -1});
    segs->push_back({i, i + len, id});
    i += len;
    plain = i;
  }
  if (plain < text.size()) segs->push_back({plain, text.size(), -1});
}

// Pre-tokenizes and encodes text that holds no added token.
void Tokenizer::Impl::encode_plain(std::string_view text, std::vector<int32_t>* out) const {
  std::vector<std::pair<size_t, size_t>> pieces;
  size_t i = 0;
  while (i < text.size()) {
    // The longest valid UTF-8 run from i.
    size_t j = i;
    while (j < text.size()) {
      if ((unsigned char)text[j] < 0x80) {
        ++j;
        continue;
      }
      const size_t n = utf8_char_length(text.substr(j));
      if (!n) break;
      j += n;
    }
    if (j > i) {
      const std::string_view run = text.substr(i, j - i);
      pieces.clear();
      pre_tokenize(run, &pieces);
      for (auto [b, e] : pieces) bpe(run.substr(b, e - b), out);
    }
    if (j < text.size()) out->push_back(byte_id[(unsigned char)text[j++]]);  // an invalid byte: its own token
    i = j;
  }
}

void Tokenizer::Impl::pre_tokenize(std::string_view text, std::vector<std::pair<size_t, size_t>>* pieces) const {
  pieces->push_back({0, text.size()});
  std::vector<std::pair<size_t, size_t>> next;
  for (const SplitStep& step : splits) {
    next.clear();
    for (auto [b, e] : *pieces) {
      // Each piece is matched on its own, as HF does: a lookahead such as
      // \s+(?!\S) sees the end of the piece, not the text after it.
      const auto* subject = (PCRE2_SPTR)(text.data() + b);
      const size_t len = e - b;
      size_t start = 0, last = 0;
      while (start <= len) {
        const int rc = pcre2_match(step.code, subject, len, start, PCRE2_NO_UTF_CHECK, md, mctx);
        if (rc == PCRE2_ERROR_NOMATCH) break;
        if (rc < 0) {
          PCRE2_UCHAR msg[256];
          pcre2_get_error_message(rc, msg, sizeof msg);
          throw Error(origin + ": pre-tokenizer regex failed: " + (const char*)msg);
        }
        const PCRE2_SIZE* ov = pcre2_get_ovector_pointer(md);
        const size_t m0 = ov[0], m1 = ov[1];
        if (m1 == m0) {  // an empty match splits nothing; step over one character
          if (m0 >= len) break;
          start = m0 + std::max<size_t>(1, utf8_char_length(text.substr(b + m0, len - m0)));
          continue;
        }
        if (m0 > last) next.push_back({b + last, b + m0});
        if (!step.remove) next.push_back({b + m0, b + m1});
        last = start = m1;
      }
      if (last < len) next.push_back({b + last, e});
    }
    pieces->swap(next);
  }
}

// Byte-level BPE of one piece, exactly as HF's Word::merge_all: a heap of
// candidate merges ordered by (rank, position); an entry whose pair changed
// since it was pushed is stale and skipped.
void Tokenizer::Impl::bpe(std::string_view piece, std::vector<int32_t>* out) const {
  if (auto it = cache.find(piece); it != cache.end()) {
    out->insert(out->end(), it->second.begin(), it->second.end());
    return;
  }
  std::vector<int32_t> ids;
  const std::string chars = ignore_merges ? byte_level_encode(piece) : std::string();
  if (auto v = ignore_merges ? vocab.find(chars) : vocab.end(); v != vocab.end()) {
    ids.push_back(v->second);
  } else {
    struct Sym {
      int32_t id, prev, next, len;
    };
    struct Cand {
      int32_t rank, pos, id;
      bool operator>(const Cand& o) const { return rank != o.rank ? rank > o.rank : pos > o.pos; }
    };
    const int32_t n = int32_t(piece.size());
    std::vector<Sym> s(static_cast<size_t>(n));
    for (int32_t i = 0; i < n; ++i) s[size_t(i)] = {byte_id[(unsigned char)piece[size_t(i)]], i - 1, i + 1 < n ? i + 1 : -1, 1};
    std::vector<Cand> heap;
    auto push = [&](int32_t pos) {
      const int32_t nx = s[size_t(pos)].next;
      auto it = merges.find(uint64_t(uint32_t(s[size_t(pos)].id)) << 32 | uint32_t(s[size_t(nx)].id));
      if (it == merges.end()) return;
      heap.push_back({it->second.first, pos, it->second.second});
      std::push_heap(heap.begin(), heap.end(), std::greater<>());
    };
    for (int32_t i = 0; i + 1 < n; ++i) push(i);
    while (!heap.empty()) {
      std::pop_heap(heap.begin(), heap.end(), std::greater<>());
      const Cand c = heap.back();
      heap.pop_back();
      Sym& a = s[size_t(c.pos)];
      if (a.len == 0 || a.next < 0) continue;
      Sym& b = s[size_t(a.next)];
      auto it = merges.find(uint64_t(uint32_t(a.id)) << 32 | uint32_t(b.id));
      if (it == merges.end() || it->second.second != c.id) continue;
      a.id = c.id;
      a.len += b.len;
      b.len = 0;
      a.next = b.next;
      if (a.next >= 0) s[size_t(a.next)].prev = c.pos;
      if (a.prev >= 0) push(a.prev);
      if (a.next >= 0) push(c.pos);
    }
    for (int32_t i = 0; i >= 0; i = s[size_t(i)].next) ids.push_back(s[size_t(i)].id);
  }
  out->insert(out->end(), ids.begin(), ids.end());
  // The cache is bounded: long pieces are rare and not worth keeping, and a
  // full cache starts over rather than growing without limit.
  if (piece.size() <= 256) {
    if (cache.size() >= (1u << 20)) cache.clear();
    cache.emplace(std::string(piece), std::move(ids));
  }
}

Tokenizer::Tokenizer() : impl_(std::make_unique<Impl>()) {}
Tokenizer::~Tokenizer() = default;

bool Tokenizer::present_in(const std::string& dir) { return fs::is_regular_file(fs::path(dir) / "tokenizer.json"); }

std::unique_ptr<Tokenizer> Tokenizer::load(const std::string& path) {
  std::error_code ec;
  if (!fs::exists(path, ec)) throw Error(path + ": no such tokenizer file or model directory");
  const std::string file = fs::is_directory(path, ec) ? (fs::path(path) / "tokenizer.json").string() : path;
  return from_json(read_text_file(file, "tokenizer file"), file);
}

std::unique_ptr<Tokenizer> Tokenizer::from_json(std::string_view text, const std::string& origin) {
  const json j = parse_json(text, origin);
  if (!j.is_object()) throw Error(origin + ": not a JSON object");
  std::unique_ptr<Tokenizer> t(new Tokenizer());
  t->impl_->origin = origin;
  try {
    t->impl_->load(j);
  } catch (const json::exception& e) {  // a field of the wrong JSON type
    throw Error(origin + ": " + e.what());
  }
  return t;
}

std::vector<int32_t> Tokenizer::encode(std::string_view text) const {
  const Impl& m = *impl_;
  std::lock_guard<std::mutex> lock(m.mu);
  // Added tokens first: the `normalized: false` ones over the whole text, then
  // the others over what is left, as HF's AddedVocabulary does.
  std::vector<Segment> first, segs;
  m.split_added(text, m.raw_tokens, &first);
  for (const Segment& s : first) {
    if (s.added >= 0 || m.normalized_tokens.empty()) {
      segs.push_back(s);
      continue;
    }
    const size_t at = segs.size();
    m.split_added(text.substr(s.begin, s.end - s.begin), m.normalized_tokens, &segs);
    for (size_t k = at; k < segs.size(); ++k) segs[k].begin += s.begin, segs[k].end += s.begin;
  }
  std::vector<int32_t> ids;
  ids.reserve(text.size() / 3 + 8);
  for (const Segment& s : segs) {
    if (s.added >= 0) ids.push_back(s.added);
    else m.encode_plain(text.substr(s.begin, s.end - s.begin), &ids);
  }
  return ids;
}

std::string Tokenizer::decode(std::span<const int32_t> ids, bool skip_special) const {
  const Impl& m = *impl_;
  std::string out;
  for (int32_t id : ids) {
    if (id < 0 || size_t(id) >= m.kind.size() || m.kind[size_t(id)] == 0)
      throw Error("token id " + std::to_string(id) + " is not in the tokenizer (" + m.origin + ")");
    if (skip_special && m.kind[size_t(id)] == 3) continue;
    out += m.token_bytes[size_t(id)];
  }
  return out;
}

int32_t Tokenizer::token_id(std::string_view token) const {
  const std::string t(token);
  if (auto it = impl_->added.find(t); it != impl_->added.end()) return it->second;
  if (auto it = impl_->vocab.find(t); it != impl_->vocab.end()) return it->second;
  return -1;
}

int32_t Tokenizer::size() const { return int32_t(impl_->kind.size()); }
bool Tokenizer::is_special(int32_t id) const {
  return id >= 0 && size_t(id) < impl_->kind.size() && impl_->kind[size_t(id)] == 3;
}
bool Tokenizer::is_vocab(int32_t id) const {
  return id >= 0 && size_t(id) < impl_->kind.size() && impl_->kind[size_t(id)] == 1;
}
size_t Tokenizer::added_tokens() const { return impl_->added.size(); }
void Tokenizer::clear_cache() const {
  std::lock_guard<std::mutex> lock(impl_->mu);
  impl_->cache.clear();
}

}  // namespace dsv4
