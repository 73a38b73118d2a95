// tools/cli.h: nccl-tests' sizes (parseSize and the CLI11 transform every tool's size options
// use), the integer and real checks, and the --version / bad-value conventions.
#include "tests/catch.h"

#include <algorithm>
#include <cstdint>
#include <string>
#include <vector>

#include "tools/cli.h"

namespace {

uint64_t sizeOf(const std::string& text) {
  uint64_t v = 0;
  std::string why;
  REQUIRE(mktools::parseSize(text, &v, &why));
  return v;
}

bool refused(const std::string& text) {
  uint64_t v = 12345;
  std::string why;
  const bool ok = mktools::parseSize(text, &v, &why);
  if (!ok) {
    CHECK(v == 12345);  // untouched
    CHECK(why.find(text.empty() ? "''" : text) != std::string::npos);
  }
  return !ok;
}

// Parses `args` (without the program name) into a one-option app; the ParseError escapes.
struct OneSize {
  CLI::App app{"test", "test"};
  uint64_t size = 0;
  std::vector<uint64_t> sizes;
  OneSize() {
    app.add_option("--size", size)->transform(mktools::kSize);
    app.add_option("--sizes", sizes)->delimiter(',')->transform(mktools::kSize);
  }
  void parse(std::vector<std::string> args) {
    std::reverse(args.begin(), args.end());  // CLI11's vector form takes them last to first
    app.parse(args);
  }
};

}  // namespace

TEST_CASE("parseSize: plain numbers and K/M/G as KiB multiples (nccl-tests' -b/-e)") {
  CHECK(sizeOf("64M") == 67108864);
  CHECK(sizeOf("0") == 0);
  CHECK(sizeOf("8") == 8);
  CHECK(sizeOf("4K") == 4096);
  CHECK(sizeOf("4k") == 4096);
  CHECK(sizeOf("1m") == 1048576);
  CHECK(sizeOf("1G") == 1073741824);
  CHECK(sizeOf("16G") == (uint64_t(16) << 30));
  CHECK(sizeOf("18446744073709551615") == UINT64_MAX);
}

TEST_CASE("parseSize: anything else is refused with the text in the reason") {
  CHECK(refused("64Q"));
  CHECK(refused(""));
  CHECK(refused("-1"));
  CHECK(refused("-5"));
  CHECK(refused("+5"));
  CHECK(refused("1.5M"));
  CHECK(refused("M"));
  CHECK(refused(" 5"));
  CHECK(refused("5 "));
  CHECK(refused("64MB"));
  CHECK(refused("64KiB"));
  CHECK(refused("0x10"));
  CHECK(refused("18446744073709551616"));  // 2^64
  CHECK(refused("17179869184G"));          // 2^34 GiB = 2^64
}

TEST_CASE("kSize: a CLI11 option takes 64M as 67108864, on lists each item") {
  OneSize t;
  t.parse({"--size", "64M", "--sizes", "8,4K,1G"});
  CHECK(t.size == 67108864);
  CHECK(t.sizes == std::vector<uint64_t>{8, 4096, 1073741824});
  OneSize eq;
  eq.parse({"--size=2K"});
  CHECK(eq.size == 2048);
}

TEST_CASE("kSize: a bad size is a CLI11 validation error naming the option") {
  for (const char* bad : {"64Q", "-5", "1.5M", ""}) {
    OneSize t;
    try {
      t.parse({"--size", bad});
      FAIL("no error for '" << bad << "'");
    } catch (const CLI::ValidationError& e) {
      CHECK(std::string(e.what()).find("--size") != std::string::npos);
      CHECK(std::string(e.what()).find("not a size") != std::string::npos);
    }
  }
  OneSize list;
  CHECK_THROWS_AS(list.parse({"--sizes", "8,64Q"}), CLI::ValidationError);
}

TEST_CASE("kPositive, kNonNegative, kPositiveReal") {
  CLI::App app{"test", "test"};
  int pos = 0, nonneg = -1;
  double real = 0;
  std::vector<int> list;
  app.add_option("--pos", pos)->check(mktools::kPositive);
  app.add_option("--nonneg", nonneg)->check(mktools::kNonNegative);
  app.add_option("--real", real)->check(mktools::kPositiveReal);
  app.add_option("--list", list)->delimiter(',')->check(mktools::kPositive);
  auto parse = [&](std::vector<std::string> args) {
    std::reverse(args.begin(), args.end());
    app.parse(args);
  };
  parse({"--pos", "3", "--nonneg", "0", "--real", "0.5", "--list", "1,2,8"});
  CHECK(pos == 3);
  CHECK(nonneg == 0);
  CHECK(real == 0.5);
  CHECK(list == std::vector<int>{1, 2, 8});
  CHECK_THROWS_AS(parse({"--pos", "0"}), CLI::ValidationError);
  CHECK_THROWS_AS(parse({"--pos", "x"}), CLI::ValidationError);
  CHECK_THROWS_AS(parse({"--nonneg", "-1"}), CLI::ValidationError);
  CHECK_THROWS_AS(parse({"--real", "0"}), CLI::ValidationError);
  CHECK_THROWS_AS(parse({"--real", "nan"}), CLI::ValidationError);
  CHECK_THROWS_AS(parse({"--list", "1,x"}), CLI::ParseError);
  CHECK_THROWS_AS(parse({"--list", "1,0"}), CLI::ValidationError);
}

TEST_CASE("parseArgs: --version, --help, a bad option") {
  auto run = [](std::vector<std::string> args) {
    CLI::App app("a tool", "mkernel-test");
    mktools::setupApp(app);
    uint64_t size = 0;
    app.add_option("--size", size)->transform(mktools::kSize);
    std::vector<char*> argv{const_cast<char*>("mkernel-test")};
    for (std::string& a : args) argv.push_back(&a[0]);
    return mktools::parseArgs(app, static_cast<int>(argv.size()), argv.data());
  };
  CHECK(run({}) == -1);
  CHECK(run({"--size", "64M"}) == -1);
  CHECK(run({"--version"}) == 0);
  CHECK(run({"--help"}) == 0);
  CHECK(run({"--size", "64Q"}) == 2);
  CHECK(run({"--bogus"}) == 2);
  CHECK(run({"--size"}) == 2);
}

TEST_CASE("setupApp: an option given twice takes its last value; a list its last list") {
  CLI::App app("a tool", "mkernel-test");
  mktools::setupApp(app);
  int n = 0;
  std::vector<int> ranks{2, 4, 8};
  std::vector<uint64_t> sizes;
  mktools::listOf(app.add_option("--ranks", ranks))->check(mktools::kPositive);
  mktools::listOf(app.add_option("--sizes", sizes))->transform(mktools::kSize);
  app.add_option("--n", n);
  std::vector<std::string> args{"--n", "1", "--ranks", "1,2", "--sizes", "4K,1M",
                                "--n", "2", "--ranks", "8",   "--sizes", "64M"};
  std::reverse(args.begin(), args.end());
  app.parse(args);
  CHECK(n == 2);
  CHECK(ranks == std::vector<int>{8});
  CHECK(sizes == std::vector<uint64_t>{67108864});
}
