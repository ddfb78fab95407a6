// Whole small files (config.json, the shard index, token and request lists,
// tokenizer.json, .npy inputs) read into memory, and the checks of paths
// given on the command line, with errors that name the path and say what it
// was meant to be.
#pragma once
#include <string>
#include <string_view>

#include <nlohmann/json_fwd.hpp>

namespace dsv4 {

// The bytes of the file at `path`; "-" reads standard input to its end.
// Throws Error "PATH: is a directory, not a WHAT", "PATH: cannot open WHAT"
// or "PATH: cannot read WHAT".
std::string read_text_file(const std::string& path, const char* what);

// How errors name an input path: "standard input" for "-".
std::string input_name(const std::string& path);

// Throws Error "PATH: is a file, not a WHAT" or "PATH: no such WHAT" unless
// `path` is a directory.
void require_directory(const std::string& path, const char* what);

// Parses JSON text; a syntax error throws Error "ORIGIN: invalid JSON at line
// L, column C: REASON" (columns count bytes from 1).
nlohmann::json parse_json(std::string_view text, const std::string& origin);

}  // namespace dsv4
