// Errors the engine reports to its user. Every user-facing failure (bad file,
// bad config, bad prompt, full cache pool) is a dsv4::Error; the CLI prints its
// one-line message and exits with code 2. Anything else is a bug.
#pragma once
#include <stdexcept>
#include <string>

namespace dsv4 {

class Error : public std::runtime_error {
 public:
  explicit Error(const std::string& what) : std::runtime_error(what) {}
};

}  // namespace dsv4
