// JSON mode's constraint (json_constraint.h).
#include "serve/json_constraint.h"

#include <span>

#include "io/tokenizer.h"

namespace dsv4::serve {

namespace {

bool is_whitespace(unsigned char c) { return c == ' ' || c == '\t' || c == '\n' || c == '\r'; }

int hex_digit(unsigned char c) {
  if (c >= '0' && c <= '9') return c - '0';
  if (c >= 'a' && c <= 'f') return c - 'a' + 10;
  if (c >= 'A' && c <= 'F') return c - 'A' + 10;
  return -1;
}

bool is_digit(unsigned char c) { return c >= '0' && c <= '9'; }

}  // namespace

bool JsonPrefix::feed(std::string_view bytes) {
  for (const char c : bytes)
    if (!feed(static_cast<unsigned char>(c))) return false;
  return true;
}

bool JsonPrefix::feed(unsigned char c) {
  switch (state_) {
    case State::kString: return string_byte(c);
    case State::kEscape:
      if (c == 'u') {
        state_ = State::kHex;
        hex_ = 0;
        hex_left_ = 4;
        return true;
      }
      if (c != '"' && c != '\\' && c != '/' && c != 'b' && c != 'f' && c != 'n' && c != 'r' && c != 't') return false;
      state_ = State::kString;
      return true;
    case State::kHex: {
      const int v = hex_digit(c);
      if (v < 0) return false;
      hex_ = uint16_t(hex_ * 16 + v);
      return --hex_left_ > 0 || hex_done();
    }
    case State::kLowBackslash:
      state_ = State::kLowU;
      return c == '\\';
    case State::kLowU:
      state_ = State::kHex;
      hex_ = 0;
      hex_left_ = 4;
      return c == 'u';
    case State::kUtf8:
      if (c < utf8_lo_ || c > utf8_hi_) return false;
      utf8_lo_ = 0x80;
      utf8_hi_ = 0xBF;
      if (--utf8_left_ == 0) state_ = State::kString;
      return true;
    case State::kMinus: case State::kZero: case State::kInt: case State::kDot: case State::kFrac:
    case State::kExp: case State::kExpSign: case State::kExpDigits:
      return number_byte(c);
    case State::kLiteral:
      if (c != static_cast<unsigned char>(literal_[literal_at_])) return false;
      return literal_[++literal_at_] != 0 || after_value();
    case State::kDone: return false;
    default: break;
  }
  // Between tokens of the JSON grammar.
  if (is_whitespace(c)) return ++whitespace_ <= kMaxWhitespace;
  whitespace_ = 0;
  switch (state_) {
    case State::kTop:
      if (c != '{') return false;
      stack_.push_back('{');
      state_ = State::kFirstKeyOrEnd;
      return true;
    case State::kValue: return value_start(c);
    case State::kFirstValueOrEnd: return c == ']' ? close(c) : value_start(c);
    case State::kFirstKeyOrEnd:
      if (c == '}') return close(c);
      [[fallthrough]];
    case State::kKey:
      if (c != '"') return false;
      key_ = true;
      state_ = State::kString;
      return true;
    case State::kColon:
      state_ = State::kValue;
      return c == ':';
    case State::kAfterValue:
      if (c != ',') return close(c);
      state_ = stack_.back() == '{' ? State::kKey : State::kValue;
      return true;
    default: return false;
  }
}

bool JsonPrefix::value_start(unsigned char c) {
  switch (c) {
    case '{':
    case '[':
      if (stack_.size() >= kMaxDepth) return false;
      stack_.push_back(char(c));
      state_ = c == '{' ? State::kFirstKeyOrEnd : State::kFirstValueOrEnd;
      return true;
    case '"':
      key_ = false;
      state_ = State::kString;
      return true;
    case '-': state_ = State::kMinus; return true;
    case '0': state_ = State::kZero; return true;
    case 't': literal_ = "true"; break;
    case 'f': literal_ = "false"; break;
    case 'n': literal_ = "null"; break;
    default:
      if (c < '1' || c > '9') return false;
      state_ = State::kInt;
      return true;
  }
  literal_at_ = 1;
  state_ = State::kLiteral;
  return true;
}

bool JsonPrefix::after_value() {
  state_ = State::kAfterValue;
  return true;
}

// c closes the innermost container, if it is its closing bracket.
bool JsonPrefix::close(unsigned char c) {
  if (stack_.empty() || c != (stack_.back() == '{' ? '}' : ']')) return false;
  stack_.pop_back();
  state_ = stack_.empty() ? State::kDone : State::kAfterValue;
  return true;
}

// Inside a string: the closing quote, an escape, or well-formed UTF-8 (no
// overlong forms, no surrogates, nothing past U+10FFFF).
bool JsonPrefix::string_byte(unsigned char c) {
  if (c == '"') {
    state_ = key_ ? State::kColon : State::kAfterValue;
    return true;
  }
  if (c == '\\') {
    state_ = State::kEscape;
    return true;
  }
  if (c < 0x20) return false;
  if (c < 0x80) return true;
  if (c >= 0xC2 && c <= 0xDF) {
    utf8_left_ = 1;
  } else if (c >= 0xE0 && c <= 0xEF) {
    utf8_left_ = 2;
    if (c == 0xE0) utf8_lo_ = 0xA0;
    if (c == 0xED) utf8_hi_ = 0x9F;
  } else if (c >= 0xF0 && c <= 0xF4) {
    utf8_left_ = 3;
    if (c == 0xF0) utf8_lo_ = 0x90;
    if (c == 0xF4) utf8_hi_ = 0x8F;
  } else {
    return false;
  }
  state_ = State::kUtf8;
  return true;
}

// A \u escape's four digits are in: a high surrogate must be followed by
// a \u low one, a low one must follow a high one.
bool JsonPrefix::hex_done() {
  const bool high = hex_ >= 0xD800 && hex_ <= 0xDBFF, low = hex_ >= 0xDC00 && hex_ <= 0xDFFF;
  if (low_needed_ != low) return false;
  low_needed_ = high;
  state_ = high ? State::kLowBackslash : State::kString;
  return true;
}

// -?(0|[1-9][0-9]*)(\.[0-9]+)?([eE][+-]?[0-9]+)?; a byte that cannot extend
// a number that may end here ends it and is read as what follows a value.
bool JsonPrefix::number_byte(unsigned char c) {
  const bool digit = is_digit(c), exponent = c == 'e' || c == 'E';
  bool may_end = false;
  switch (state_) {
    case State::kMinus:
      if (!digit) return false;
      state_ = c == '0' ? State::kZero : State::kInt;
      return true;
    case State::kZero:
      if (c == '.') return state_ = State::kDot, true;
      if (exponent) return state_ = State::kExp, true;
      may_end = !digit;
      break;
    case State::kInt:
      if (digit) return true;
      if (c == '.') return state_ = State::kDot, true;
      if (exponent) return state_ = State::kExp, true;
      may_end = true;
      break;
    case State::kDot:
      state_ = State::kFrac;
      return digit;
    case State::kFrac:
      if (digit) return true;
      if (exponent) return state_ = State::kExp, true;
      may_end = true;
      break;
    case State::kExp:
      if (c == '+' || c == '-') return state_ = State::kExpSign, true;
      state_ = State::kExpDigits;
      return digit;
    case State::kExpSign:
      state_ = State::kExpDigits;
      return digit;
    default:  // kExpDigits
      if (digit) return true;
      may_end = true;
      break;
  }
  if (!may_end) return false;
  state_ = State::kAfterValue;
  return feed(c);
}

JsonVocabulary json_vocabulary(std::vector<std::string> bytes) {
  JsonVocabulary v;
  v.string_text.assign(bytes.size(), 0);
  JsonPrefix open_string;
  open_string.feed(std::string_view("{\""));
  for (size_t id = 0; id < bytes.size(); ++id) {
    if (bytes[id].empty() || bytes[id].find('"') != std::string::npos) continue;
    JsonPrefix p = open_string;
    v.string_text[id] = p.feed(bytes[id]) && p.in_string();
  }
  v.bytes = std::move(bytes);
  return v;
}

JsonVocabulary json_vocabulary(const Tokenizer& tokenizer) {
  std::vector<std::string> bytes(size_t(tokenizer.size()));
  for (int32_t id = 0; id < tokenizer.size(); ++id)
    if (tokenizer.is_vocab(id)) bytes[size_t(id)] = tokenizer.decode(std::span<const int32_t>(&id, 1));
  return json_vocabulary(std::move(bytes));
}

void allowed_tokens(const JsonPrefix& state, const JsonVocabulary& vocabulary, std::vector<uint8_t>* allowed) {
  const std::vector<std::string>& bytes = vocabulary.bytes;
  allowed->assign(bytes.size(), 0);
  const bool in_string = state.in_string();
  // The bytes that can come next: most tokens fail on their first byte,
  // without copying the state (a mask between values: 2.7 -> 1.6 ms over
  // the V4 vocabulary, one Zen 4 core).
  bool first[256];
  for (int c = 0; c < 256; ++c) first[c] = JsonPrefix(state).feed(static_cast<unsigned char>(c));
  for (size_t id = 0; id < bytes.size(); ++id) {
    if (bytes[id].empty() || !first[static_cast<unsigned char>(bytes[id][0])]) continue;
    if (in_string && vocabulary.string_text[id]) {
      (*allowed)[id] = 1;
      continue;
    }
    JsonPrefix next = state;
    (*allowed)[id] = next.feed(bytes[id]) ? 1 : 0;
  }
}

}  // namespace dsv4::serve
