// mkernel-bench: a table of subcommands, so that collective benchmarks can join the transport
// one. With no subcommand it picks what this host can run and says why.
#include <cstdio>
#include <cstring>
#include <string>
#include <vector>

#include "tools/bench/bench.h"

namespace {

struct Subcommand {
  const char* name;
  const char* summary;
  int (*run)(const std::vector<std::string>& args);
  void (*usage)();
};

const Subcommand kSubcommands[] = {
    {"transport", "net::Net (TCP) over loopback: round-trip latency and bandwidth against a plain one-socket floor",
     mkernel::bench::runTransportBench, mkernel::bench::printTransportUsage},
};

void usage() {
  std::printf("usage: mkernel-bench [<subcommand>] [options]\n\nsubcommands:\n");
  for (const Subcommand& s : kSubcommands) std::printf("  %-10s %s\n", s.name, s.summary);
  std::printf("\nWith no subcommand: the transport benchmark (the only one that runs without a GPU).\n"
              "mkernel-bench <subcommand> --help shows the subcommand's options.\n");
}

}  // namespace

int main(int argc, char** argv) {
  std::vector<std::string> args(argv + 1, argv + argc);
  if (!args.empty() && (args[0] == "-h" || args[0] == "--help" || args[0] == "help")) {
    usage();
    return 0;
  }
  const Subcommand* chosen = nullptr;
  if (!args.empty() && args[0][0] != '-') {
    for (const Subcommand& s : kSubcommands)
      if (args[0] == s.name) chosen = &s;
    if (chosen == nullptr) {
      std::fprintf(stderr, "mkernel-bench: unknown subcommand '%s'\n\n", args[0].c_str());
      usage();
      return 2;
    }
    args.erase(args.begin());
  } else {
    std::string why;
    bool gpu = mkernel::bench::gpuPresent(&why);
    chosen = &kSubcommands[0];
    std::printf("# %s: %s\n", gpu ? "GPU found" : "no GPU found", why.c_str());
    std::printf("# running the transport benchmark%s\n",
                gpu ? " (the only subcommand built so far)" : " only");
  }
  for (const std::string& a : args) {
    if (a == "-h" || a == "--help") {
      chosen->usage();
      return 0;
    }
  }
  return chosen->run(args);
}
