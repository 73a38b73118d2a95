// CPU sets as lists of CPU numbers (Linux): what the proxy's pinning (coll::proxyCpusFor,
// proxy::Proxy::start) works with, and what its tests read back.
#pragma once

#include <sched.h>

#include <vector>

namespace mkernel {

// The CPUs in `set`, ascending.
inline std::vector<int> cpuList(const cpu_set_t& set) {
  std::vector<int> out;
  for (int c = 0; c < CPU_SETSIZE; ++c)
    if (CPU_ISSET(c, &set)) out.push_back(c);
  return out;
}

// The CPUs this process may run on (its affinity); empty if the OS does not say.
inline std::vector<int> processCpus() {
  cpu_set_t set;
  CPU_ZERO(&set);
  if (sched_getaffinity(0, sizeof(set), &set) != 0) return {};
  return cpuList(set);
}

}  // namespace mkernel
