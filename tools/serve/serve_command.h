// `dsv4 serve`: its options (docs/SERVER.md, "Options") and how they become
// the server's settings.
#pragma once
#include <string>

#include "options.h"

namespace dsv4::serve {

const cli::CommandSpec& serve_command();
// Runs the server; `version` is dsv4's (the responses' system_fingerprint).
int run_serve(const cli::Options& a, const std::string& version);

}  // namespace dsv4::serve
