// Facts about the host a test runs on, shared by the test binaries.
#pragma once

#include <dirent.h>

namespace mktest {

// Whether this host has RDMA devices (/sys/class/infiniband lists any): tests that expect the
// "no RDMA device" fallback skip themselves there (the Soft-RoCE VM tier covers that case).
inline bool hostHasRdmaDevices() {
  DIR* d = opendir("/sys/class/infiniband");
  if (d == nullptr) return false;
  bool any = false;
  while (dirent* e = readdir(d))
    if (e->d_name[0] != '.') any = true;
  closedir(d);
  return any;
}

}  // namespace mktest
