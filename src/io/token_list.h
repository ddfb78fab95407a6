// The prompt as a JSON array of token ids (`dsv4 prefill --tokens FILE`).
#pragma once
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

namespace dsv4 {

// Parses `text`, which must be a JSON array of integers in [0, 2^31); throws
// dsv4::Error naming `origin` and the element otherwise. (Ids against the
// vocabulary and the prompt length are checked later, by validate_prompt.)
std::vector<int32_t> parse_token_list(std::string_view text, const std::string& origin);
// Reads and parses the file at `path`.
std::vector<int32_t> read_token_list(const std::string& path);

// One entry of a requests file: token ids, or a text prompt to tokenize.
struct RequestSpec {
  std::vector<int32_t> tokens;
  std::string prompt;
  bool is_prompt = false;
};

// A JSON list whose elements are token-id arrays or objects with exactly one
// of "tokens" (array) or "prompt" (string) (`dsv4 prefill --requests FILE`);
// throws dsv4::Error naming `origin` and the element otherwise.
std::vector<RequestSpec> parse_request_list(std::string_view text, const std::string& origin);
std::vector<RequestSpec> read_request_list(const std::string& path);

}  // namespace dsv4
