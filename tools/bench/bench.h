// mkernel-bench: shared declarations of the subcommands (one file each) and the GPU probe.
#pragma once

#include <string>
#include <vector>

namespace mkernel {
namespace bench {

// Whether a CUDA GPU is usable here: dlopen(libcuda) + cuInit + cuDeviceGetCount > 0. Nothing is
// linked, so the command runs on hosts without a driver. *why says what was found or missing.
bool gpuPresent(std::string* why);

// `mkernel-bench transport [...]`: net::Net (TCP) over loopback against a plain one-socket floor.
int runTransportBench(const std::vector<std::string>& args);
void printTransportUsage();

// "64M" -> 67108864; false on a malformed size.
bool parseSize(const std::string& text, size_t* out);
std::string formatSize(size_t bytes);

}  // namespace bench
}  // namespace mkernel
