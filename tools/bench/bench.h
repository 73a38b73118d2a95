// mkernel-bench: shared declarations of the subcommands (one file each) and the GPU probe.
#pragma once

#include <CLI/CLI.hpp>

#include <cstdint>
#include <string>
#include <vector>

namespace mkernel {
namespace bench {

// Whether a CUDA GPU is usable here: dlopen(libcuda) + cuInit + cuDeviceGetCount > 0. Nothing is
// linked, so the command runs on hosts without a driver. *why says what was found or missing.
bool gpuPresent(std::string* why);

// `mkernel-bench transport [...]`: net::Net (TCP) over loopback against a plain one-socket floor.
struct TransportOptions {
  std::vector<uint64_t> sizes{8,         64,      512,     4 << 10,  32 << 10,
                              256 << 10, 1 << 20, 4 << 20, 16 << 20, 64 << 20};
  int iters = 50;
  int warmup = 5;
  uint64_t rttMax = 64 << 10;
  std::string csv;
};
// The transport benchmark's options, on the subcommand and on the command itself (no subcommand).
void addTransportOptions(CLI::App* app, TransportOptions* o);
int runTransportBench(const TransportOptions& o);

std::string formatSize(size_t bytes);

}  // namespace bench
}  // namespace mkernel
