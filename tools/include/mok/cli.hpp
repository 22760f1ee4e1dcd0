// The command-line convention of mok's programs, in one place: `--help` prints the help and
// exits 0; a bad argument prints CLI11's message (which names the option) and exits 2, the
// project's code for bad input (CLI11's own codes are 100 and up, which CI scripts would read as
// crashes).
#pragma once

#include "mok/spec/config.hpp"

#include <CLI/CLI.hpp>

#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <initializer_list>
#include <iostream>
#include <optional>
#include <string>

namespace mok::cli {

inline constexpr int kExitBadInput = 2;

// Whether everything written to standard output (iostream and stdio) reached it: flushes both
// and reports a failed write (a full disk, a closed pipe). Programs check it after their report.
// A closed pipe gets here only where SIGPIPE is ignored, which each program's main does for
// itself (mok-verify, mok-sim, mok-bench, mok-refbench), not parse: an ignored signal stays
// ignored across exec, and mok-launch's ranks would inherit it.
inline bool stdout_ok() {
  std::cout.flush();
  return static_cast<bool>(std::cout) && std::fflush(stdout) == 0 && !std::ferror(stdout);
}

// Parses the command line. Returns the exit code when the program should stop here (after
// --help, or a bad argument), nothing when it should go on. Usage:
//   if (const auto rc = mok::cli::parse(app, argc, argv)) return *rc;
// The help goes to standard output and is checked like any output: one that cannot be written
// (a full disk, a closed pipe) exits 2 with a message, not 0. Where a subcommand is missing, the
// message names the word given in its place (CLI11 says only "A subcommand is required").
inline std::optional<int> parse(CLI::App& app, int argc, const char* const* argv) {
  try {
    app.parse(argc, argv);
  } catch (const CLI::Success& e) {
    const int rc = app.exit(e);
    if (!stdout_ok()) {
      std::cerr << app.get_name() << ": error: cannot write the help to standard output; check where it goes\n";
      return kExitBadInput;
    }
    return rc;
  } catch (const CLI::ParseError& e) {
    app.exit(e);
    if (dynamic_cast<const CLI::RequiredError*>(&e) != nullptr &&
        std::string(e.what()).find("subcommand") != std::string::npos) {
      // the innermost subcommand that parsed, and the first argument after its name
      const CLI::App* at = &app;
      int first = 1;
      for (bool deeper = true; deeper;) {
        deeper = false;
        for (const CLI::App* sub : at->get_subcommands())
          for (int i = first; i < argc; ++i)
            if (sub->get_name() == argv[i]) {
              at = sub, first = i + 1, deeper = true;
              break;
            }
      }
      std::string names;
      for (const CLI::App* sub : at->get_subcommands({}))
        names += (names.empty() ? "" : ", ") + sub->get_name();
      if (first < argc)
        std::cerr << "'" << argv[first] << "' is not a subcommand of " << at->get_name() << "; give one of: " << names
                  << "\n";
      else
        std::cerr << "give one of: " << names << "\n";
    }
    return kExitBadInput;
  }
  return std::nullopt;
}

// CLI11 splits a comma-separated list option and drops empty items ("1,,2" reads as 1,2), so a
// typo would pass unseen. Returns the message for the first of `flags` given (as "--f V" or
// "--f=V") with an empty item, nothing when there is none. Usage, before parse():
//   if (auto bad = mok::cli::empty_list_item(argc, argv, {"--ranks"})) { print *bad; return 2; }
inline std::optional<std::string> empty_list_item(int argc, const char* const* argv,
                                                  std::initializer_list<const char*> flags) {
  for (int i = 1; i < argc; ++i) {
    const std::string arg = argv[i];
    for (const char* f : flags) {
      const std::string flag = f;
      std::string value;
      if (arg == flag && i + 1 < argc) value = argv[i + 1];
      else if (arg.rfind(flag + "=", 0) == 0) value = arg.substr(flag.size() + 1);
      else continue;
      if (value.empty() || value.find(",,") != std::string::npos || value.front() == ',' || value.back() == ',')
        return flag + " '" + value + "' has an empty item; give the values comma-separated, e.g. " + flag + " 1,2";
    }
  }
  return std::nullopt;
}

// The ranges of the layer-size options --H --I --Is --E --K --R --T, as spec::LayerConfig::validate()
// states them (include/mok/spec/config.hpp; the multiples of 16 and E % R, K <= E are its own
// checks): so that --help shows the real limits rather than [1 - 2^40].
inline CLI::Range layer_size_range(char field) {
  using namespace mok::spec;
  switch (field) {
    case 'H':
    case 'I': return CLI::Range(int64_t{kMmaK}, kMaxDim);
    case 's': return CLI::Range(int64_t{0}, kMaxDim);  // Is: 0 = no shared expert
    case 'E': return CLI::Range(int64_t{1}, kMaxExperts);
    case 'K': return CLI::Range(int64_t{1}, kMaxTopK);
    case 'R': return CLI::Range(int64_t{1}, kMaxRanks);
    default: return CLI::Range(int64_t{1}, kMaxDim);  // T
  }
}

// Validators CLI11 lacks. A seed: digits only, at most 2^64 - 1 ("-1" or an overflowing number
// would otherwise wrap or clamp to another seed).
inline CLI::Validator seed() {
  return CLI::Validator(
      [](std::string& text) -> std::string {
        if (text.empty() || text.find_first_not_of("0123456789") != std::string::npos)
          return "'" + text + "' is not a seed (a whole number from 0 to 18446744073709551615)";
        errno = 0;
        std::strtoull(text.c_str(), nullptr, 10);
        if (errno == ERANGE) return "'" + text + "' is above 18446744073709551615, the largest seed";
        return {};
      },
      "UINT64");
}

// A finite number in [lo, hi] (CLI::Range lets NaN through: every comparison with it is false).
inline CLI::Validator finite_range(double lo, double hi, const std::string& what) {
  return CLI::Validator(
      [lo, hi, what](std::string& text) -> std::string {
        char* end = nullptr;
        const double x = std::strtod(text.c_str(), &end);
        if (end == text.c_str() || *end != '\0' || !(x >= lo && x <= hi))
          return "'" + text + "' is not " + what;
        return {};
      },
      "FLOAT");
}

}  // namespace mok::cli
