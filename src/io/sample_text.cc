#include "io/sample_text.h"

#include <cstdint>

namespace dsv4 {

std::string mixed_text(size_t n) {
  uint64_t st = 0x9e3779b97f4a7c15ull;
  auto rnd = [&](uint64_t k) {
    st = st * 6364136223846793005ull + 1442695040888963407ull;
    return (st >> 33) % k;
  };
  auto put = [](uint32_t cp, std::string* s) {  // one code point as UTF-8
    if (cp < 0x80) {
      *s += char(cp);
    } else if (cp < 0x800) {
      *s += {char(0xC0 | (cp >> 6)), char(0x80 | (cp & 0x3F))};
    } else if (cp < 0x10000) {
      *s += {char(0xE0 | (cp >> 12)), char(0x80 | ((cp >> 6) & 0x3F)), char(0x80 | (cp & 0x3F))};
    } else {
      *s += {char(0xF0 | (cp >> 18)), char(0x80 | ((cp >> 12) & 0x3F)), char(0x80 | ((cp >> 6) & 0x3F)),
             char(0x80 | (cp & 0x3F))};
    }
  };
  static const char* words[] = {"the", "model", "reads", "a", "long", "prompt", "and", "every", "layer", "keeps",
                                "its", "cache", "small", "while", "tiles", "walk", "through", "attention", "of",
                                "DeepSeek", "tokenizer", "Hello", "world", "isn't", "we've", "they're", "quickly"};
  static const char* code[] = {"for (int i = 0; i < n; ++i) {\n    sum += a[i] * 3.14159;\n}\n",
                               "def f(x):\n\treturn {'k': x ** 2, \"v\": [1, 2, 3]}\n",
                               "if (ptr != nullptr && ptr->size() >= 0x7fff) return -EINVAL;\n",
                               "<div class=\"row\">&nbsp;</div>  // TODO: fix #42\n"};
  std::string s;
  size_t chars = 0;
  auto count = [&](const std::string& x) {
    for (unsigned char ch : x) chars += (ch & 0xC0) != 0x80;
  };
  while (chars < n) {
    std::string part;
    switch (rnd(8)) {
      case 0: case 1:  // English
        for (uint64_t w = 0, k = 5 + rnd(12); w < k; ++w) part += std::string(w ? " " : "") + words[rnd(27)];
        part += rnd(2) ? ". " : ", ";
        break;
      case 2: part = code[rnd(4)]; break;
      case 3:  // Chinese, with full-width punctuation
        for (uint64_t k = 4 + rnd(20); k--;) put(0x4E00 + uint32_t(rnd(0x9FA5 - 0x4E00)), &part);
        part += rnd(2) ? "，" : "。";
        break;
      case 4:  // Japanese kana, some kanji
        for (uint64_t k = 3 + rnd(12); k--;) put(rnd(3) ? 0x3041 + uint32_t(rnd(0x56)) : 0x30A1 + uint32_t(rnd(0x5A)), &part);
        put(0x4E00 + uint32_t(rnd(2000)), &part);
        part += "、";
        break;
      case 5:  // Korean words, Cyrillic words
        for (uint64_t w = 0, k = 2 + rnd(4); w < k; ++w) {
          part += ' ';
          for (uint64_t c = 2 + rnd(3); c--;) put(rnd(2) ? 0xAC00 + uint32_t(rnd(11172)) : 0x430 + uint32_t(rnd(32)), &part);
        }
        break;
      case 6:  // digits, dates, amounts
        part = " " + std::to_string(rnd(100000)) + "." + std::to_string(rnd(1000)) + " on 2024-0" +
               std::to_string(1 + rnd(9)) + "-1" + std::to_string(rnd(10)) + " ($" + std::to_string(rnd(1u << 30)) + ")";
        break;
      default:  // emoji and whitespace
        put(0x1F600 + uint32_t(rnd(0x50)), &part);
        part += rnd(2) ? "\n\n" : "\t  \r\n   ";
        break;
    }
    count(part);
    s += part;
  }
  return s;
}

}  // namespace dsv4
