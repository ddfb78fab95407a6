// The layering rule of docs/ARCHITECTURE.md: front ends (tools/) see the
// engine API and io/core utilities only. A header reached from tools/, by
// any chain of project includes, must not be under src/model/ or
// src/kernels/.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <regex>
#include <set>
#include <string>
#include <vector>

#include "test_util.h"

namespace dsv4 {
namespace {

namespace fs = std::filesystem;

// The project headers a file includes with "...", resolved against the
// file's own folder, then src/.
std::vector<fs::path> project_includes(const fs::path& file, const fs::path& root) {
  std::ifstream in(file);
  static const std::regex kInclude(R"re(^\s*#\s*include\s*"([^"]+)")re");
  std::vector<fs::path> out;
  std::string line;
  std::smatch m;
  while (std::getline(in, line)) {
    if (!std::regex_search(line, m, kInclude)) continue;
    for (const fs::path& base : {file.parent_path(), root / "src"})
      if (fs::exists(base / m[1].str())) {
        out.push_back(fs::weakly_canonical(base / m[1].str()));
        break;
      }
  }
  return out;
}

// "FRONT-END-FILE -> ... -> FORBIDDEN-HEADER" for every chain that reaches
// src/model/ or src/kernels/ from a file under root/tools.
std::vector<std::string> layering_violations(const fs::path& root) {
  const fs::path model = fs::weakly_canonical(root / "src/model"), kernels = fs::weakly_canonical(root / "src/kernels");
  auto forbidden = [&](const fs::path& p) {
    const std::string s = p.string();
    return s.rfind(model.string() + "/", 0) == 0 || s.rfind(kernels.string() + "/", 0) == 0;
  };
  std::vector<std::string> bad;
  for (const auto& entry : fs::directory_iterator(root / "tools")) {
    std::set<fs::path> seen;
    std::vector<std::pair<fs::path, std::string>> todo = {{entry.path(), entry.path().filename().string()}};
    while (!todo.empty()) {
      auto [file, chain] = todo.back();
      todo.pop_back();
      for (const fs::path& inc : project_includes(file, root)) {
        const std::string next = chain + " -> " + fs::relative(inc, root).string();
        if (forbidden(inc)) bad.push_back(next);
        if (seen.insert(inc).second) todo.emplace_back(inc, next);
      }
    }
  }
  return bad;
}

TEST(Layering, FrontEndsSeeNoModelOrKernelHeaders) {
  const std::vector<std::string> bad = layering_violations(DSV4_SOURCE_DIR);
  for (const std::string& chain : bad) ADD_FAILURE() << chain;
}

// The check itself: a front end that includes a kernel header through an
// engine header is caught, one that includes io/ only is not.
TEST(Layering, CatchesIndirectIncludes) {
  testing::TempDir tmp;
  const fs::path root = tmp.path;
  for (const char* d : {"tools", "src/engine", "src/io", "src/kernels"}) fs::create_directories(root / d);
  std::ofstream(root / "src/kernels/gemm.h") << "#pragma once\n";
  std::ofstream(root / "src/io/npy.h") << "#pragma once\n";
  std::ofstream(root / "src/engine/engine.h") << "#include \"io/npy.h\"\n";
  std::ofstream(root / "tools/good.cc") << "#include \"engine/engine.h\"\n";
  EXPECT_TRUE(layering_violations(root).empty());
  std::ofstream(root / "src/engine/engine.h") << "#include \"kernels/gemm.h\"\n";
  const std::vector<std::string> bad = layering_violations(root);
  ASSERT_EQ(bad.size(), 1u);
  EXPECT_EQ(bad[0], "good.cc -> src/engine/engine.h -> src/kernels/gemm.h");
}

}  // namespace
}  // namespace dsv4
