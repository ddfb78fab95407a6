// The dsv4 command line: each command declares its options and the rules
// between them; one parser reads them all and one printer makes each
// command's --help from the same declarations.
#pragma once
#include <cstdint>
#include <map>
#include <string>
#include <vector>

namespace dsv4::cli {

// One option: --name (or -s), a flag when value_name is empty.
struct OptionSpec {
  std::string name;        // long name, without the dashes
  char short_name = 0;     // one-letter form (-m), 0 for none
  std::string value_name;  // "DIR", "N"; empty: a flag that takes no value
  std::string help;        // wrapped by the help printer; '\n' breaks a line
  std::vector<std::string> aliases = {};  // other long names for the same option
  bool repeatable = false;  // each use adds a value (read with get_all); otherwise the last wins
};

// "--option needs --other" or "--option cannot be combined with --other".
struct RuleSpec {
  enum Kind { kNeeds, kConflicts };
  Kind kind;
  std::string option, other;
};

struct CommandSpec {
  std::string name;
  std::string summary;      // one line, for the list of commands
  std::string usage;        // after "dsv4 NAME", e.g. "--model DIR [options]"
  std::string description;  // more about the command (wrapped), may be empty
  std::vector<OptionSpec> options;
  std::vector<RuleSpec> rules = {};
};

// The options one command line gave, by long name (flags hold "1").
class Options {
 public:
  Options() = default;
  explicit Options(std::string command) : command_(std::move(command)) {}

  const std::string& command() const { return command_; }
  bool help() const { return help_; }
  bool has(const std::string& name) const { return values_.count(name) != 0; }
  bool flag(const std::string& name) const { return has(name); }
  std::string get(const std::string& name, const std::string& fallback = "") const;
  // An integer (fallback when absent); "option --k needs an integer, got 'x'".
  int64_t get_int(const std::string& name, int64_t fallback) const;
  // An integer in [lo, hi]; `hi_text` spells hi in the message (e.g. "2^30").
  int64_t get_int_in(const std::string& name, int64_t fallback, int64_t lo, int64_t hi,
                     const std::string& hi_text = "") const;
  // A decimal number; "option --k needs a number, got 'x'".
  double get_number(const std::string& name, double fallback) const;

  // Every value a repeatable option was given, in order (one value for
  // another option, none when absent).
  std::vector<std::string> get_all(const std::string& name) const;

  void set(const std::string& name, const std::string& value) { values_[name] = value; }
  void add(const std::string& name, const std::string& value) { values_[name] = value, lists_[name].push_back(value); }
  void erase(const std::string& name) { values_.erase(name), lists_.erase(name); }
  void set_help() { help_ = true; }

 private:
  std::string command_;
  std::map<std::string, std::string> values_;
  std::map<std::string, std::vector<std::string>> lists_;  // repeatable options
  bool help_ = false;
};

// Reads args[0..] (the words after the command) against `spec`: --name value,
// --name=value, -s value, flags, and -- to end the options. -h/--help sets
// help() and wins over any error; otherwise the first error throws
// dsv4::Error, and then the rules are checked.
Options parse_options(const CommandSpec& spec, const std::vector<std::string>& args);

// The command's usage, description and options, aligned and wrapped.
std::string command_help(const CommandSpec& spec);

// The candidate closest to `word` (edit distance, transpositions counted as
// one, or `word` a prefix of exactly one candidate); empty when none is close.
std::string closest(const std::string& word, const std::vector<std::string>& candidates);

// `text` wrapped to `width` columns, its first line starting at column
// `first_column` and the others indented by `indent` spaces; '\n' in the
// text starts a line. Ends with a newline.
std::string wrap(const std::string& text, size_t indent, size_t width, size_t first_column);

}  // namespace dsv4::cli
