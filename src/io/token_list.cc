#include "io/token_list.h"

#include <filesystem>
#include <fstream>
#include <sstream>

#include <nlohmann/json.hpp>

#include "core/error.h"
#include "io/text_file.h"

namespace dsv4 {

using nlohmann::json;

std::vector<int32_t> parse_token_list(std::string_view text, const std::string& origin) {
  const json j = parse_json(text, origin);
  if (!j.is_array()) throw Error(origin + ": expected a JSON array of token ids, got " + j.type_name());
  std::vector<int32_t> t;
  t.reserve(j.size());
  for (size_t i = 0; i < j.size(); ++i) {
    if (!j[i].is_number_integer()) throw Error(origin + ": element " + std::to_string(i) + " is not an integer");
    // An unsigned value above INT64_MAX would wrap to a negative int64.
    if (j[i].is_number_unsigned() && j[i].get<uint64_t>() > uint64_t(INT32_MAX))
      throw Error(origin + ": token " + std::to_string(i) + " = " + j[i].dump() + " is out of range");
    const int64_t v = j[i].get<int64_t>();
    if (v < 0 || v > INT32_MAX)
      throw Error(origin + ": token " + std::to_string(i) + " = " + std::to_string(v) + " is out of range");
    t.push_back(int32_t(v));
  }
  return t;
}

std::vector<int32_t> read_token_list(const std::string& path) {
  return parse_token_list(read_text_file(path, "token file"), input_name(path));
}

std::vector<RequestSpec> parse_request_list(std::string_view text, const std::string& origin) {
  const json j = parse_json(text, origin);
  if (!j.is_array())
    throw Error(origin + ": expected a JSON list of requests (token-id arrays or {\"tokens\"|\"prompt\"} objects)");
  std::vector<RequestSpec> out(j.size());
  for (size_t i = 0; i < j.size(); ++i) {
    const std::string where = origin + ": request " + std::to_string(i);
    const json& e = j[i];
    if (e.is_array()) {
      out[i].tokens = parse_token_list(e.dump(), where);
    } else if (e.is_object() && e.size() == 1 && e.contains("tokens")) {
      out[i].tokens = parse_token_list(e["tokens"].dump(), where + " \"tokens\"");
    } else if (e.is_object() && e.size() == 1 && e.contains("prompt") && e["prompt"].is_string()) {
      out[i].prompt = e["prompt"].get<std::string>();
      out[i].is_prompt = true;
    } else {
      throw Error(where + ": expected a token-id array or an object with exactly one of \"tokens\" (array) or "
                  "\"prompt\" (string)");
    }
  }
  return out;
}

std::vector<RequestSpec> read_request_list(const std::string& path) {
  return parse_request_list(read_text_file(path, "requests file"), input_name(path));
}

}  // namespace dsv4
