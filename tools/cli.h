// The tools' command lines: CLI11 with the conventions every mkernel tool follows, and the sizes
// nccl-tests takes.
//   --help      usage on stdout, exit 0
//   --version   "<tool> (mkernel X.Y.Z)" on stdout, exit 0
//   a bad option or value: "<tool>: <what is wrong>" on stderr, exit 2
// A size is a plain number of bytes or one followed by K, M or G (KiB, MiB, GiB multiples, as
// nccl-tests' -b / -e: 64M = 67108864); anything else ("64Q", "", "-1", "1.5M") is refused.
#pragma once

#include <CLI/CLI.hpp>

#include <cmath>
#include <cstdint>
#include <cstdio>
#include <exception>
#include <limits>
#include <string>

#include "common/version.h"

namespace mktools {

// "64M" -> 67108864. False, with *why, on anything that is not digits with an optional K, M or G
// (either case) or that does not fit in 64 bits.
inline bool parseSize(const std::string& text, uint64_t* out, std::string* why) {
  size_t digits = 0;
  while (digits < text.size() && text[digits] >= '0' && text[digits] <= '9') ++digits;
  const std::string unit = text.substr(digits);
  int shift = -1;
  if (unit.empty())
    shift = 0;
  else if (unit == "K" || unit == "k")
    shift = 10;
  else if (unit == "M" || unit == "m")
    shift = 20;
  else if (unit == "G" || unit == "g")
    shift = 30;
  if (digits == 0 || shift < 0) {
    if (why != nullptr)
      *why =
          "'" + text +
          "' is not a size (a number of bytes, optionally followed by K, M or G: 64M = 67108864)";
    return false;
  }
  uint64_t v = 0;
  for (size_t i = 0; i < digits; ++i) {
    const uint64_t d = static_cast<uint64_t>(text[i] - '0');
    if (v > (std::numeric_limits<uint64_t>::max() - d) / 10) {
      if (why != nullptr) *why = "'" + text + "' is too large";
      return false;
    }
    v = v * 10 + d;
  }
  if (shift > 0 && v > (std::numeric_limits<uint64_t>::max() >> shift)) {
    if (why != nullptr) *why = "'" + text + "' is too large";
    return false;
  }
  *out = v << shift;
  return true;
}

// A CLI11 transform for size options: rewrites "64M" as "67108864" before CLI11 converts it to
// the option's integer, and refuses what parseSize refuses. On a list option (delimiter(',')) it
// applies to each item.
class SizeValidator : public CLI::Validator {
 public:
  SizeValidator() : CLI::Validator("SIZE") {
    func_ = [](std::string& value) {
      uint64_t bytes = 0;
      std::string why;
      if (!parseSize(value, &bytes, &why)) return why;
      value = std::to_string(bytes);
      return std::string();
    };
  }
};
const SizeValidator kSize;

// Integer checks with a plain message ("Value 0 not in range 1 to 2147483647"); on a list option
// (delimiter(',')) they apply to each item.
const CLI::Validator kPositive =
    CLI::Range(1, std::numeric_limits<int>::max()).description("POSITIVE");
const CLI::Validator kNonNegative =
    CLI::Range(0, std::numeric_limits<int>::max()).description("NONNEGATIVE");
// A real number above 0 (seconds, milliseconds).
const CLI::Validator kPositiveReal(
    [](std::string& value) {
      double v = 0;
      if (!CLI::detail::lexical_cast(value, v) || !(v > 0) || !std::isfinite(v))
        return "'" + value + "' is not a number above 0";
      return std::string();
    },
    "POSITIVE");

// The tool's app: --version as above; an option given twice takes its last value, as scripts
// that append an override to a command line expect (list options: listOf below).
inline void setupApp(CLI::App& app) {
  app.option_defaults()->multi_option_policy(CLI::MultiOptionPolicy::TakeLast);
  app.set_version_flag("--version", app.get_name() + " (mkernel " MKERNEL_VERSION_STRING ")");
  app.get_formatter()->column_width(32);
}

// A comma-separated list option ("--ranks 2,4,8"): each item converted and checked on its own, and,
// given twice, the last list wins (not the two joined).
inline CLI::Option* listOf(CLI::Option* opt) {
  return opt->delimiter(',')->trigger_on_parse();
}

// Prints "<tool>: why" on stderr and returns 2 (the exit status of a bad command line).
inline int usageError(const CLI::App& app, const std::string& why) {
  std::fprintf(stderr, "%s: %s\nRun with --help for more information.\n", app.get_name().c_str(),
               why.c_str());
  return 2;
}

// Parses the command line. Returns -1 when the tool is to run; otherwise the status to exit
// with: 0 after --help or --version, 2 after a bad option or value (its message on stderr).
inline int parseArgs(CLI::App& app, int argc, char** argv) {
  try {
    app.parse(argc, argv);
  } catch (const CLI::CallForHelp& e) {
    return app.exit(e);
  } catch (const CLI::CallForAllHelp& e) {
    return app.exit(e);
  } catch (const CLI::CallForVersion& e) {
    return app.exit(e);
  } catch (const CLI::ParseError& e) {
    return usageError(app, e.what());
  }
  return -1;
}

}  // namespace mktools
