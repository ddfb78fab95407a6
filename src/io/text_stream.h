// The text of a generation as it grows, one token at a time, for printing
// while tokens are produced (generate, chat, the server's streams).
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include "io/tokenizer.h"

namespace dsv4 {

// Tokens come in one by one; push() returns only text that can no longer
// change: whole UTF-8 characters (a token may end inside one), and nothing
// that could still turn out to be the start of a stop string. Once a stop
// string appears, the text ends just before it. Concatenating everything
// push() and finish() return gives utf8_lossy(decode(all tokens)), cut
// before the earliest stop string.
class TextStream {
 public:
  TextStream(const Tokenizer& tok, std::vector<std::string> stops);

  // Adds one token; returns the text that became final.
  std::string push(int32_t id);
  // The text held back at the end (a character cut short becomes U+FFFD).
  std::string finish();

  bool stopped() const { return stopped_; }
  // All final text so far plus what finish() would give.
  std::string text() const;

 private:
  std::string release(size_t end);

  const Tokenizer& tok_;
  std::vector<std::string> stops_;
  size_t longest_stop_ = 0;
  std::string bytes_;    // the decoded bytes of every token so far (cut at a stop)
  size_t released_ = 0;  // bytes_[0, released_) went out
  bool stopped_ = false;
};

// The number of bytes at the end of `s` that start a UTF-8 character it does
// not yet complete (0..3): what a stream holds back until the next token.
size_t utf8_incomplete_tail(const std::string& s);

}  // namespace dsv4
