// The command-line convention of mok's programs, in one place: `--help` prints the help and
// exits 0; a bad argument prints CLI11's message (which names the option) and exits 2, the
// project's code for bad input (CLI11's own codes are 100 and up, which CI scripts would read as
// crashes).
#pragma once

#include <CLI/CLI.hpp>

#include <optional>

namespace mok::cli {

inline constexpr int kExitBadInput = 2;

// Parses the command line. Returns the exit code when the program should stop here (after
// --help, or a bad argument), nothing when it should go on. Usage:
//   if (const auto rc = mok::cli::parse(app, argc, argv)) return *rc;
inline std::optional<int> parse(CLI::App& app, int argc, const char* const* argv) {
  try {
    app.parse(argc, argv);
  } catch (const CLI::Success& e) {
    return app.exit(e);
  } catch (const CLI::ParseError& e) {
    app.exit(e);
    return kExitBadInput;
  }
  return std::nullopt;
}

}  // namespace mok::cli
