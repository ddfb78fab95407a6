#include "io/text_file.h"

#include <filesystem>
#include <fstream>
#include <sstream>

#include "core/error.h"

namespace dsv4 {

std::string read_text_file(const std::string& path, const char* what) {
  std::error_code ec;
  if (std::filesystem::is_directory(path, ec)) throw Error(path + ": is a directory, not a " + what);
  std::ifstream f(path, std::ios::binary);
  if (!f) throw Error(path + ": cannot open " + what);
  std::stringstream ss;
  ss << f.rdbuf();
  if (f.bad()) throw Error(path + ": cannot read " + what);
  return ss.str();
}

}  // namespace dsv4
