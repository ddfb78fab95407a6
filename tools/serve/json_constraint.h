// response_format json_object / json_schema: the answer's content is made a
// JSON object by masking, before each draw, every token whose bytes could
// not continue one (OpenAI's "JSON mode"; the schema itself is only in the
// prompt). The mask depends only on the request's own tokens, so a request
// still gets the same tokens whatever shares its batch.
#pragma once
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

namespace dsv4 {
class Tokenizer;
}

namespace dsv4::serve {

// A JSON object text (RFC 8259, one object at the top, no leading or
// trailing bytes but whitespace before it) read one byte at a time: feed()
// says whether the bytes so far can still be the start of one. Strings
// must be well-formed UTF-8 and their \u escapes pair surrogates, as strict
// parsers demand. Runs of whitespace are capped (kMaxWhitespace) and
// nesting too (kMaxDepth), so that a constrained answer cannot spin on
// either forever.
class JsonPrefix {
 public:
  static constexpr int kMaxWhitespace = 16;
  static constexpr size_t kMaxDepth = 32;

  // False: `c` cannot follow; the state is then spent (copy before trying).
  bool feed(unsigned char c);
  bool feed(std::string_view bytes);
  // The object is whole: nothing more may follow.
  bool complete() const { return state_ == State::kDone; }
  // Inside a string, between characters.
  bool in_string() const { return state_ == State::kString; }

 private:
  enum class State : uint8_t {
    kTop, kValue, kFirstValueOrEnd, kFirstKeyOrEnd, kKey, kColon, kAfterValue,
    kString, kEscape, kHex, kLowBackslash, kLowU, kUtf8,
    kMinus, kZero, kInt, kDot, kFrac, kExp, kExpSign, kExpDigits,
    kLiteral, kDone,
  };
  bool value_start(unsigned char c);
  bool after_value();
  bool close(unsigned char c);
  bool string_byte(unsigned char c);
  bool hex_done();
  bool number_byte(unsigned char c);

  State state_ = State::kTop;
  std::string stack_;       // '{' and '[' of the open containers
  bool key_ = false;        // the string being read is an object key
  int whitespace_ = 0;      // whitespace bytes in a row
  uint16_t hex_ = 0;        // a \u escape's value so far
  uint8_t hex_left_ = 0;    // its hex digits still to come
  bool low_needed_ = false; // the escape being read must be a low surrogate
  uint8_t utf8_left_ = 0;   // continuation bytes still to come
  uint8_t utf8_lo_ = 0x80, utf8_hi_ = 0xBF;  // the next continuation byte's range
  const char* literal_ = nullptr;  // true, false or null, and how much is read
  uint8_t literal_at_ = 0;
};

// What the mask needs of the vocabulary, made once per tokenizer.
struct JsonVocabulary {
  // Every token's bytes; empty for added tokens (special or not), which
  // JSON text never holds.
  std::vector<std::string> bytes;
  // 1: the bytes are whole characters a string may hold, no quote among
  // them, so the token keeps any string open: allowed wherever in_string(),
  // without reading its bytes (most of a vocabulary: a mask inside a
  // string over the V4 vocabulary took 5.5 ms without it, 0.3 with it).
  std::vector<uint8_t> string_text;
};
JsonVocabulary json_vocabulary(const Tokenizer& tokenizer);
JsonVocabulary json_vocabulary(std::vector<std::string> bytes);

// allowed[id] = 1 when token id's bytes can follow `state`.
void allowed_tokens(const JsonPrefix& state, const JsonVocabulary& vocabulary, std::vector<uint8_t>* allowed);

}  // namespace dsv4::serve
