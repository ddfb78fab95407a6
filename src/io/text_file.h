// Whole small files (config.json, the shard index, token and request lists,
// tokenizer.json) read into memory, with errors that name the file and say
// what it was meant to be.
#pragma once
#include <string>

namespace dsv4 {

// Throws Error "PATH: is a directory, not a WHAT", "PATH: cannot open WHAT"
// or "PATH: cannot read WHAT".
std::string read_text_file(const std::string& path, const char* what);

}  // namespace dsv4
