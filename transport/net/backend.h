// Which net::Net backend a process uses (MKERNEL_NET_BACKEND: auto, ib or tcp), created: verbs
// when requested or (auto) when it has a usable device, else TCP. Shared by the NCCL net plugin
// and mkernel's own proxy (collectives/runtime/proxy_net.h, which passes the topology placement's
// rail NICs of its GPU so that the verbs backend numbers them first).
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "common/result.h"
#include "transport/net/net.h"

namespace mkernel {
namespace net {

struct BackendChoice {
  std::unique_ptr<Net> net;
  std::string setting;  // MKERNEL_NET_BACKEND as understood: "auto", "ib" or "tcp"
  std::string why;      // one line for the log: what was chosen and why
};

// preferredNics: verbs device names to number first, in that order (empty: discovery order).
// Errors: InvalidArgument for a bad MKERNEL_NET_BACKEND; SystemError when ib is required and
// unusable, or when no backend can run (the message names both reasons).
Result createNetBackend(const std::vector<std::string>& preferredNics, BackendChoice* out);

}  // namespace net
}  // namespace mkernel
