// mkernel-bench: the project's benchmark command, one CLI11 subcommand per benchmark, so that
// collective benchmarks can join the transport one. With no subcommand it picks what this host
// can run and says why.
#include <cstdio>
#include <string>

#include "tools/bench/bench.h"
#include "tools/cli.h"

int main(int argc, char** argv) {
  CLI::App app(
      "The mkernel benchmark. With no subcommand: the transport benchmark (the only one that runs "
      "without\n"
      "a GPU), with the transport options below. `mkernel-bench <subcommand> --help` shows a "
      "subcommand's\n"
      "options.",
      "mkernel-bench");
  mktools::setupApp(app);
  app.require_subcommand(0, 1);
  mkernel::bench::TransportOptions topts;
  CLI::App* transport = app.add_subcommand("transport",
                                           "net::Net (TCP) over loopback: round-trip latency and "
                                           "bandwidth against a plain one-socket floor");
  transport->footer(
      "Measures the TCP net::Net between two threads over device 0 (MKERNEL_SOCKET_IFNAME picks "
      "it) against a\n"
      "blocking send/recv pair on one TCP socket over the same address. MKERNEL_NET_SOCKETS,\n"
      "MKERNEL_NET_CHUNK_BYTES, MKERNEL_NET_INLINE_PROGRESS apply as usual.");
  mkernel::bench::addTransportOptions(transport, &topts);
  mkernel::bench::addTransportOptions(&app, &topts);
  const int rc = mktools::parseArgs(app, argc, argv);
  if (rc >= 0) return rc;
  if (app.got_subcommand(transport)) return mkernel::bench::runTransportBench(topts);
  std::string why;
  const bool gpu = mkernel::bench::gpuPresent(&why);
  std::printf("# %s: %s\n", gpu ? "GPU found" : "no GPU found", why.c_str());
  std::printf("# running the transport benchmark%s\n",
              gpu ? " (the only subcommand built so far)" : " only");
  return mkernel::bench::runTransportBench(topts);
}
