// The dsv4 option parser and help printer (options.h).
#include "options.h"

#include <algorithm>
#include <cerrno>
#include <cstdlib>
#include <sstream>

#include "core/error.h"

namespace dsv4::cli {

namespace {

constexpr size_t kWidth = 80;        // help lines wrap here
constexpr size_t kMaxLeftWidth = 28;  // a longer option spelling puts its help on the next line

// Columns a UTF-8 string takes (one per code point).
size_t columns(const std::string& s) {
  size_t n = 0;
  for (unsigned char c : s) n += (c & 0xC0) != 0x80;
  return n;
}

// Optimal string alignment distance: insertions, deletions, substitutions
// and swaps of neighbours cost one each.
size_t edit_distance(const std::string& a, const std::string& b) {
  std::vector<std::vector<size_t>> d(a.size() + 1, std::vector<size_t>(b.size() + 1));
  for (size_t i = 0; i <= a.size(); ++i) d[i][0] = i;
  for (size_t j = 0; j <= b.size(); ++j) d[0][j] = j;
  for (size_t i = 1; i <= a.size(); ++i)
    for (size_t j = 1; j <= b.size(); ++j) {
      d[i][j] = std::min({d[i - 1][j] + 1, d[i][j - 1] + 1, d[i - 1][j - 1] + (a[i - 1] != b[j - 1])});
      if (i > 1 && j > 1 && a[i - 1] == b[j - 2] && a[i - 2] == b[j - 1]) d[i][j] = std::min(d[i][j], d[i - 2][j - 2] + 1);
    }
  return d[a.size()][b.size()];
}

// The declaration `word` names (long name or alias), or null.
const OptionSpec* find_long(const CommandSpec& spec, const std::string& word) {
  for (const OptionSpec& o : spec.options)
    if (o.name == word || std::find(o.aliases.begin(), o.aliases.end(), word) != o.aliases.end()) return &o;
  return nullptr;
}

const OptionSpec* find_short(const CommandSpec& spec, char c) {
  for (const OptionSpec& o : spec.options)
    if (o.short_name && o.short_name == c) return &o;
  return nullptr;
}

std::string unknown_option(const CommandSpec& spec, const std::string& word) {
  std::string msg = "unknown option " + word + " for '" + spec.name + "'";
  if (word.rfind("--", 0) == 0) {
    std::vector<std::string> names = {"help"};
    for (const OptionSpec& o : spec.options) {
      names.push_back(o.name);
      names.insert(names.end(), o.aliases.begin(), o.aliases.end());
    }
    const std::string near = closest(word.substr(2), names);
    if (!near.empty()) return msg + " (did you mean --" + near + "?)";
  }
  return msg + " (see dsv4 " + spec.name + " --help)";
}

// Parse state: the words, where the reader is, and the first error.
struct Reader {
  const CommandSpec& spec;
  const std::vector<std::string>& args;
  Options out;
  std::string error;
  size_t i = 0;

  void fail(const std::string& msg) {
    if (error.empty()) error = msg;
  }
  void put(const OptionSpec& o, const std::string& value) {
    if (o.repeatable) out.add(o.name, value);
    else out.set(o.name, value);
  }
  // One option word (args[i]); takes its value from the next word if need be.
  void option(const std::string& word) {
    const bool is_long = word.rfind("--", 0) == 0;
    const size_t eq = is_long ? word.find('=') : std::string::npos;
    const std::string key = is_long ? word.substr(2, eq == std::string::npos ? eq : eq - 2) : word.substr(1);
    if ((is_long && key == "help") || word == "-h") return out.set_help();
    const OptionSpec* o = is_long ? find_long(spec, key) : key.size() == 1 ? find_short(spec, key[0]) : nullptr;
    if (!o) return fail(unknown_option(spec, is_long ? "--" + key : word));
    const std::string shown = is_long ? "--" + key : word;
    if (o->value_name.empty()) {
      if (eq != std::string::npos) return fail("option " + shown + " takes no value");
      return out.set(o->name, "1");
    }
    if (eq != std::string::npos) return put(*o, word.substr(eq + 1));
    if (i + 1 >= args.size()) return fail("option " + shown + " needs a value (" + o->value_name + ")");
    put(*o, args[++i]);
  }
  void run() {
    bool options_ended = false;
    for (; i < args.size(); ++i) {
      const std::string& w = args[i];
      if (!options_ended && w == "--") {
        options_ended = true;
      } else if (!options_ended && w.size() > 1 && w[0] == '-') {
        option(w);
      } else {
        fail("unexpected argument '" + w + "'");
      }
    }
  }
};

void check_rules(const CommandSpec& spec, const Options& o) {
  for (const RuleSpec& r : spec.rules) {
    if (!o.has(r.option)) continue;
    if (r.kind == RuleSpec::kNeeds && !o.has(r.other)) throw Error("--" + r.option + " needs --" + r.other);
    if (r.kind == RuleSpec::kConflicts && o.has(r.other))
      throw Error("--" + r.option + " cannot be combined with --" + r.other);
  }
}

// "-m, --model DIR" or "    --json".
std::string spelling(const OptionSpec& o) {
  std::string s = o.short_name ? std::string("-") + o.short_name + ", " : "    ";
  s += "--" + o.name;
  for (const std::string& a : o.aliases) s += ", --" + a;
  if (!o.value_name.empty()) s += " " + o.value_name;
  return s;
}

}  // namespace

std::string Options::get(const std::string& name, const std::string& fallback) const {
  auto it = values_.find(name);
  return it == values_.end() ? fallback : it->second;
}

std::vector<std::string> Options::get_all(const std::string& name) const {
  auto it = lists_.find(name);
  if (it != lists_.end()) return it->second;
  return has(name) ? std::vector<std::string>{get(name)} : std::vector<std::string>{};
}

int64_t Options::get_int(const std::string& name, int64_t fallback) const {
  if (!has(name)) return fallback;
  const std::string& v = values_.at(name);
  char* end = nullptr;
  errno = 0;
  const long long x = std::strtoll(v.c_str(), &end, 10);
  if (v.empty() || *end || errno == ERANGE) throw Error("option --" + name + " needs an integer, got '" + v + "'");
  return x;
}

int64_t Options::get_int_in(const std::string& name, int64_t fallback, int64_t lo, int64_t hi,
                            const std::string& hi_text) const {
  const int64_t v = get_int(name, fallback);
  if (v < lo || v > hi)
    throw Error("--" + name + " must be in [" + std::to_string(lo) + ", " + (hi_text.empty() ? std::to_string(hi) : hi_text) +
                "], got " + std::to_string(v));
  return v;
}

double Options::get_number(const std::string& name, double fallback) const {
  if (!has(name)) return fallback;
  const std::string& v = values_.at(name);
  char* end = nullptr;
  const double x = std::strtod(v.c_str(), &end);
  if (v.empty() || *end) throw Error("option --" + name + " needs a number, got '" + v + "'");
  return x;
}

Options parse_options(const CommandSpec& spec, const std::vector<std::string>& args) {
  Reader r{spec, args, Options(spec.name), "", 0};
  r.run();
  if (r.out.help()) return r.out;
  if (!r.error.empty()) throw Error(r.error);
  check_rules(spec, r.out);
  return r.out;
}

std::string closest(const std::string& word, const std::vector<std::string>& candidates) {
  std::string best;
  size_t best_d = std::max<size_t>(1, std::min<size_t>(2, word.size() / 3)) + 1;
  for (const std::string& c : candidates) {
    const size_t d = edit_distance(word, c);
    if (d < best_d) best = c, best_d = d;
  }
  if (!best.empty() || word.size() < 3) return best;
  std::vector<std::string> prefixed;
  for (const std::string& c : candidates)
    if (c.rfind(word, 0) == 0) prefixed.push_back(c);
  return prefixed.size() == 1 ? prefixed[0] : "";
}

std::string wrap(const std::string& text, size_t indent, size_t width, size_t first_column) {
  std::string out;
  size_t col = first_column;
  std::istringstream lines(text);
  bool first_line = true;
  for (std::string line; std::getline(lines, line); first_line = false) {
    if (!first_line) out += "\n" + std::string(indent, ' '), col = indent;
    std::istringstream words(line);
    bool line_start = true;
    for (std::string w; words >> w; line_start = false) {
      if (!line_start && col + 1 + columns(w) > width) out += "\n" + std::string(indent, ' '), col = indent, line_start = true;
      if (!line_start) out += " ", col += 1;
      out += w, col += columns(w);
    }
  }
  return out + "\n";
}

std::string command_help(const CommandSpec& spec) {
  const std::string head = "usage: dsv4 " + spec.name + " ";
  std::string out = head + wrap(spec.usage, head.size(), kWidth, head.size()) + "\n";
  out += wrap(spec.summary + (spec.description.empty() ? "" : ". " + spec.description), 0, kWidth, 0);
  std::vector<OptionSpec> all = spec.options;
  all.push_back({"help", 'h', "", "print this help and exit"});
  size_t left = 0;
  for (const OptionSpec& o : all)
    if (columns(spelling(o)) <= kMaxLeftWidth) left = std::max(left, columns(spelling(o)));
  out += "\noptions:\n";
  for (const OptionSpec& o : all) {
    const std::string s = "  " + spelling(o);
    const size_t indent = left + 4;
    if (columns(s) + 2 > indent) out += s + "\n" + std::string(indent, ' ') + wrap(o.help, indent, kWidth, indent);
    else out += s + std::string(indent - columns(s), ' ') + wrap(o.help, indent, kWidth, indent);
  }
  return out;
}

}  // namespace dsv4::cli
