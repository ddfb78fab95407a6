#include "io/text_file.h"

#include <cctype>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <sstream>

#include <nlohmann/json.hpp>

#include "core/error.h"

namespace dsv4 {

namespace fs = std::filesystem;

std::string read_text_file(const std::string& path, const char* what) {
  std::stringstream ss;
  if (path == "-") {
    ss << std::cin.rdbuf();
    if (std::cin.bad()) throw Error(std::string("standard input: cannot read ") + what);
    return ss.str();
  }
  std::error_code ec;
  if (fs::is_directory(path, ec)) throw Error(path + ": is a directory, not a " + what);
  std::ifstream f(path, std::ios::binary);
  if (!f) throw Error(path + ": cannot open " + what);
  ss << f.rdbuf();
  if (f.bad()) throw Error(path + ": cannot read " + what);
  return ss.str();
}

std::string input_name(const std::string& path) { return path == "-" ? "standard input" : path; }

void require_directory(const std::string& path, const char* what) {
  std::error_code ec;  // the throwing overloads would escape as filesystem_error
  const fs::file_status s = fs::status(path, ec);
  if (fs::is_directory(s)) return;
  if (fs::exists(s)) throw Error(path + ": is a file, not a " + what);
  throw Error(path + ": no such " + what);
}

nlohmann::json parse_json(std::string_view text, const std::string& origin) {
  try {
    return nlohmann::json::parse(text);
  } catch (const nlohmann::json::parse_error& e) {
    // e.byte is the 1-based offset of the byte where parsing stopped; for a
    // text cut short it is past the end, and the place to show is just
    // after its last visible character.
    size_t at = std::min(text.size(), e.byte > 0 ? size_t(e.byte - 1) : 0);
    if (at == text.size())
      while (at > 0 && std::isspace(static_cast<unsigned char>(text[at - 1]))) --at;
    size_t line = 1, column = 1;
    for (size_t i = 0; i < at; ++i) {
      if (text[i] == '\n') {
        ++line;
        column = 1;
      } else {
        ++column;
      }
    }
    // nlohmann's message reads "[json.exception.parse_error.101] parse error
    // at line 1, column 5: syntax error while parsing value - REASON".
    std::string reason = e.what();
    const size_t dash = reason.find(" - ");
    if (dash != std::string::npos) reason = reason.substr(dash + 3);
    throw Error(origin + ": invalid JSON at line " + std::to_string(line) + ", column " + std::to_string(column) +
                ": " + reason);
  }
}

}  // namespace dsv4
