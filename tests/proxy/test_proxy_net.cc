// The proxy's net backend (collectives/proxy_net.h): MKERNEL_NET_BACKEND as for the net plugin,
// and the verbs device order taken from the topology placement (here a fixture topology: GPU 1's
// rail NICs are mlx5_1, then mlx5_0).
#include <catch2/catch.hpp>

#include <cstdlib>
#include <string>

#include "collectives/proxy_net.h"
#include "tests/test_host.h"

using mkernel::Result;


TEST_CASE("proxy net: backend choice and the placement's NIC order") {
  // The node model is discovered once per process: the fixture must be set before the first use.
  setenv("MKERNEL_TOPO_XML", MKERNEL_TOPO_FIXTURES "/2socket-nics-on-0.xml", 1);
  setenv("MKERNEL_NVLINK_MATRIX", MKERNEL_TOPO_FIXTURES "/none.nvl", 1);
  setenv("MKERNEL_SOCKET_IFNAME", "lo", 1);

  mkernel::net::BackendChoice c;
  setenv("MKERNEL_NET_BACKEND", "tcp", 1);
  REQUIRE(mkernel::coll::createProxyNet(1, &c) == Result::Success);
  REQUIRE(c.net != nullptr);
  CHECK(c.setting == "tcp");
  CHECK(c.why.find("MKERNEL_NET_BACKEND=tcp: using TCP") != std::string::npos);
  CHECK(c.why.find("rail NICs of GPU 1 first: mlx5_1, mlx5_0") != std::string::npos);

  mkernel::net::BackendChoice none;
  REQUIRE(mkernel::coll::createProxyNet(7, &none) == Result::Success);  // the fixture has 4 GPUs
  CHECK(none.why.find("GPU 7 has no rail NIC") != std::string::npos);

  setenv("MKERNEL_NET_BACKEND", "bogus", 1);
  mkernel::net::BackendChoice bad;
  CHECK(mkernel::coll::createProxyNet(1, &bad) == Result::InvalidArgument);
  CHECK(std::string(mkernel::lastError()).find("expected auto, ib or tcp") != std::string::npos);

  if (!mktest::hostHasRdmaDevices()) {  // this machine (CI's kind) has no RDMA device; the VM tier covers verbs
    setenv("MKERNEL_NET_BACKEND", "ib", 1);
    mkernel::net::BackendChoice ib;
    CHECK(mkernel::coll::createProxyNet(1, &ib) == Result::SystemError);
    CHECK(std::string(mkernel::lastError()).find("MKERNEL_NET_BACKEND=ib but") != std::string::npos);
    setenv("MKERNEL_NET_BACKEND", "auto", 1);
    mkernel::net::BackendChoice fallback;
    REQUIRE(mkernel::coll::createProxyNet(1, &fallback) == Result::Success);
    CHECK(fallback.why.find("using TCP") != std::string::npos);
  }
  unsetenv("MKERNEL_NET_BACKEND");
}
