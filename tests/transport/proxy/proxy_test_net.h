// The transport the proxy tests run on: TCP on loopback, or verbs with MKERNEL_NET_BACKEND=ib
// (the Soft-RoCE VM tier runs the proxy tests so). Catch2 test code only.
#pragma once

#include "tests/catch.h"

#include <cstdlib>
#include <memory>
#include <string>

#include "transport/net/net.h"
#include "common/param.h"

inline std::unique_ptr<mkernel::net::Net> testNet() {
  std::string why;
  const char* backend = std::getenv("MKERNEL_NET_BACKEND");
  if (backend != nullptr && std::string(backend) == "ib") {
    auto net = mkernel::net::createIbNet(&why);
    INFO(why);
    REQUIRE(net != nullptr);
    return net;
  }
  setenv("MKERNEL_SOCKET_IFNAME", "lo", 1);
  mkernel::params::resetForTesting();
  auto net = mkernel::net::createTcpNet(&why);
  INFO(why);
  REQUIRE(net != nullptr);
  return net;
}
