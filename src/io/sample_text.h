// A deterministic mixed text for timing the tokenizer (`dsv4
// bench-tokenizer`): English prose, code, Chinese, Japanese, Korean,
// Cyrillic, digits, emoji and odd whitespace. The CJK and Hangul runs are
// random, so most pieces miss the tokenizer's piece cache.
#pragma once
#include <cstddef>
#include <string>

namespace dsv4 {

// About n characters (code points); the same n gives the same text.
std::string mixed_text(size_t n);

}  // namespace dsv4
