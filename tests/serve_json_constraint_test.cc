// JSON mode's byte-level recogniser (tools/serve/json_constraint.h) against
// nlohmann::json's strict parser: every prefix of a valid object is
// accepted and only the whole is complete; random byte strings are
// accepted whole exactly when the parser takes them as an object.
#include "serve/json_constraint.h"

#include <gtest/gtest.h>

#include <nlohmann/json.hpp>
#include <random>
#include <string>

namespace dsv4::serve {
namespace {

// Feeds `text`; -1 when all of it is accepted, else the byte refused.
long refused_at(std::string_view text, JsonPrefix* p) {
  for (size_t i = 0; i < text.size(); ++i)
    if (!p->feed(static_cast<unsigned char>(text[i]))) return long(i);
  return -1;
}

bool whole_object(std::string_view text) {
  JsonPrefix p;
  return refused_at(text, &p) < 0 && p.complete();
}

TEST(JsonConstraint, ValidObjectsAndEveryPrefix) {
  for (const std::string text :
       {R"({})", R"( {"a": 1})", R"({"a":[1,-2.5e+3,0,0.25,1E9,true,false,null,{"b":[]},[]],"c":"x\"\\\/\b\f\n\r\t\u00e9"})",
        "{\"k\": \"\xc3\xa9\xe2\x82\xac\xf0\x9f\x98\x80\"}", R"({"s": "\ud83d\ude00"})", R"({"n": -0.0e-0})",
        "{\n\t\"deep\": [[[[{}]]]]\r\n}"}) {
    EXPECT_TRUE(nlohmann::json::accept(text)) << text;
    JsonPrefix p;
    for (size_t i = 0; i < text.size(); ++i) {
      ASSERT_TRUE(p.feed(static_cast<unsigned char>(text[i]))) << text << " at " << i;
      EXPECT_EQ(p.complete(), i + 1 == text.size()) << text << " at " << i;
    }
    EXPECT_FALSE(JsonPrefix(p).feed(' ')) << "nothing follows the object";
  }
}

TEST(JsonConstraint, RefusesWhatIsNotAnObject) {
  for (const std::string text :
       {R"([1])", R"("s")", R"(1)", R"({"a" 1})", R"({"a":01})", R"({"a":1.})", R"({"a":.5})", R"({"a":1e})",
        R"({"a":tru})", R"({"a":1,})", R"({,})", R"({"a":[1,]})", R"({"a":"\x"})", R"({"a":"\ude00"})",
        R"({"a":"\ud83d"})", R"({"a":"\ud83dx"})", "{\"a\":\"\x01\"}", "{\"a\":\"\xc0\xaf\"}",
        "{\"a\":\"\xed\xa0\x80\"}", "{\"a\":\"\xf4\x90\x80\x80\"}", "{\"a\":\"\xe2\x82\"}", R"({"a":1}})", R"({}{})",
        R"({"a":-})", R"({'a':1})", R"({a:1})"}) {
    EXPECT_FALSE(whole_object(text)) << text;
    EXPECT_FALSE(nlohmann::json::accept(text) && nlohmann::json::parse(text).is_object()) << text;
  }
}

TEST(JsonConstraint, CapsWhitespaceAndDepth) {
  EXPECT_TRUE(whole_object("{" + std::string(JsonPrefix::kMaxWhitespace, ' ') + "}"));
  EXPECT_FALSE(whole_object("{" + std::string(JsonPrefix::kMaxWhitespace + 1, ' ') + "}"));
  const size_t d = JsonPrefix::kMaxDepth;
  EXPECT_TRUE(whole_object("{\"a\":" + std::string(d - 1, '[') + std::string(d - 1, ']') + "}"));
  EXPECT_FALSE(whole_object("{\"a\":" + std::string(d, '[') + std::string(d, ']') + "}"));
}

// Random texts over JSON's own bytes and a few others: accepted whole
// exactly when nlohmann takes the text as an object and nothing follows it
// (the parser allows trailing whitespace; the constrained answer ends with
// the object). The texts are too short to reach the caps.
TEST(JsonConstraint, AgreesWithAStrictParserOnRandomTexts) {
  std::mt19937 rng(11);
  const std::string alphabet = "{}[]:,\"\\ \n0123456789-+.eEtruefalsnl/bu\xc3\xa9\x80";
  int objects = 0;
  for (int n = 0; n < 200000; ++n) {
    std::string text = "{";
    const int len = int(rng() % 14);
    for (int i = 0; i < len; ++i) text += alphabet[rng() % alphabet.size()];
    if (rng() % 2) text += '}';
    const bool parser = nlohmann::json::accept(text) && nlohmann::json::parse(text).is_object() &&
                        text.back() != ' ' && text.back() != '\n';
    objects += parser;
    ASSERT_EQ(whole_object(text), parser) << text;
  }
  EXPECT_GT(objects, 100);
}

// allowed_tokens: a token is allowed when all its bytes can follow; the
// string-text shortcut gives what reading the bytes gives.
TEST(JsonConstraint, AllowedTokens) {
  const JsonVocabulary v = json_vocabulary({"", "{", "{\"", "}", "\"a\":", " ", "[", "x", "\xc3\xa9 \\n", "\xc3", "\\", "a\"", "\t"});
  EXPECT_EQ(v.string_text, (std::vector<uint8_t>{0, 1, 0, 1, 0, 1, 1, 1, 1, 0, 0, 0, 0}));
  std::vector<uint8_t> allowed;
  allowed_tokens(JsonPrefix(), v, &allowed);
  EXPECT_EQ(allowed, (std::vector<uint8_t>{0, 1, 1, 0, 0, 1, 0, 0, 0, 0, 0, 0, 1}));
  JsonPrefix open;
  ASSERT_TRUE(open.feed("{"));
  allowed_tokens(open, v, &allowed);
  EXPECT_EQ(allowed, (std::vector<uint8_t>{0, 0, 0, 1, 1, 1, 0, 0, 0, 0, 0, 0, 1}));
  for (const char* prefix : {"{\"", "{\"a\":\"x", "{\"a\":[\"", "{\"a\":\"\xc3"}) {
    JsonPrefix p;
    ASSERT_TRUE(p.feed(std::string_view(prefix)));
    allowed_tokens(p, v, &allowed);
    for (size_t id = 0; id < v.bytes.size(); ++id) {
      JsonPrefix q = p;
      EXPECT_EQ(allowed[id], !v.bytes[id].empty() && q.feed(v.bytes[id])) << prefix << " + token " << id;
    }
  }
}

}  // namespace
}  // namespace dsv4::serve
