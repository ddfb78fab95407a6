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

}  // namespace dsv4
