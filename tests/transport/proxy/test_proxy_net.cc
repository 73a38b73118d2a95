// The proxy's net backend (collectives/runtime/proxy_net.h): MKERNEL_NET_BACKEND as for the net
// plugin, and the verbs device order taken from the topology placement (here a fixture topology:
// GPU 1's rail NICs are mlx5_1, then mlx5_0).
#include "tests/catch.h"

#include <cstdlib>
#include <string>
#include <vector>

#include "collectives/runtime/proxy_net.h"
#include "common/cpuset.h"
#include "tests/test_host.h"
#include "common/param.h"

using mkernel::Result;

TEST_CASE("proxy net: backend choice and the placement's NIC order") {
  // The node model is discovered once per process: the fixture must be set before the first use.
  setenv("MKERNEL_TOPO_XML", MKERNEL_TOPO_FIXTURES "/2socket-nics-on-0.xml", 1);
  setenv("MKERNEL_NVLINK_MATRIX", MKERNEL_TOPO_FIXTURES "/none.nvl", 1);
  setenv("MKERNEL_SOCKET_IFNAME", "lo", 1);
  mkernel::params::resetForTesting();

  mkernel::net::BackendChoice c;
  setenv("MKERNEL_NET_BACKEND", "tcp", 1);
  mkernel::params::resetForTesting();
  REQUIRE(mkernel::coll::createProxyNet(1, &c) == Result::Success);
  REQUIRE(c.net != nullptr);
  CHECK(c.setting == "tcp");
  CHECK(c.why.find("MKERNEL_NET_BACKEND=tcp: using TCP") != std::string::npos);
  CHECK(c.why.find("rail NICs of GPU 1 first: mlx5_1, mlx5_0") != std::string::npos);

  mkernel::net::BackendChoice none;
  REQUIRE(mkernel::coll::createProxyNet(7, &none) == Result::Success);  // the fixture has 4 GPUs
  CHECK(none.why.find("GPU 7 has no rail NIC") != std::string::npos);

  setenv("MKERNEL_NET_BACKEND", "bogus", 1);
  mkernel::params::resetForTesting();
  mkernel::net::BackendChoice bad;  // invalid: warned about, auto holds
  REQUIRE(mkernel::coll::createProxyNet(1, &bad) == Result::Success);
  CHECK(bad.setting == "auto");

  if (!mktest::hostHasRdmaDevices()) {  // this machine (CI's kind) has no RDMA device; the VM tier
                                        // covers verbs
    setenv("MKERNEL_NET_BACKEND", "ib", 1);
    mkernel::params::resetForTesting();
    mkernel::net::BackendChoice ib;
    CHECK(mkernel::coll::createProxyNet(1, &ib) == Result::SystemError);
    CHECK(std::string(mkernel::lastError()).find("MKERNEL_NET_BACKEND=ib but") !=
          std::string::npos);
    setenv("MKERNEL_NET_BACKEND", "auto", 1);
    mkernel::params::resetForTesting();
    mkernel::net::BackendChoice fallback;
    REQUIRE(mkernel::coll::createProxyNet(1, &fallback) == Result::Success);
    CHECK(fallback.why.find("using TCP") != std::string::npos);
  }
  unsetenv("MKERNEL_NET_BACKEND");
  mkernel::params::resetForTesting();
}

// The proxy thread's CPUs (docs/TOPOLOGY.md): the placement's set within the process's affinity.
TEST_CASE("proxy net: the proxy's CPUs come from the placement, within the process's affinity") {
  using mkernel::coll::proxyPinCpus;
  CHECK(proxyPinCpus({0, 1, 2, 3}, {2, 3, 4}) == std::vector<int>{2, 3});
  CHECK(proxyPinCpus({8, 9}, {0, 1}).empty());  // do not meet: not pinned
  CHECK(proxyPinCpus({3, 1, 3}, {1, 3}) == std::vector<int>{1, 3});
  CHECK(proxyPinCpus({}, {0, 1}).empty());

  // The fixture topology (set by the case above, or here when run alone): its NICs sit on
  // socket 0, CPUs 0-7, so every GPU's proxy belongs there.
  setenv("MKERNEL_TOPO_XML", MKERNEL_TOPO_FIXTURES "/2socket-nics-on-0.xml", 1);
  setenv("MKERNEL_NVLINK_MATRIX", MKERNEL_TOPO_FIXTURES "/none.nvl", 1);
  mkernel::params::resetForTesting();
  const std::vector<int> allowed = mkernel::processCpus();
  const std::vector<int> want = proxyPinCpus({0, 1, 2, 3, 4, 5, 6, 7}, allowed);
  std::string why;
  const std::vector<int> got = mkernel::coll::proxyCpusFor(1, &why);
  INFO(why);
  CHECK(got == want);
  if (!want.empty()) {
    CHECK(why.find("pinned to CPUs") == 0);
    CHECK(why.find("NUMA node 0") != std::string::npos);
    CHECK(why.find("rail NIC mlx5_1") != std::string::npos);
  } else {
    CHECK(why.find("outside this process's affinity") != std::string::npos);
  }
  CHECK(mkernel::coll::proxyCpusFor(7, &why).empty());
  CHECK(why.find("GPU 7 is not in the topology") != std::string::npos);
  setenv("MKERNEL_PROXY_PIN", "0", 1);
  mkernel::params::resetForTesting();
  CHECK(mkernel::coll::proxyCpusFor(1, &why).empty());
  CHECK(why == "not pinned (MKERNEL_PROXY_PIN=0)");
  unsetenv("MKERNEL_PROXY_PIN");
  mkernel::params::resetForTesting();
}

// MKERNEL_PROXY_GDR: the proxy's net buffers in GPU memory only where the backend registers GPU
// memory, flushed where the GPU does not order the NIC's writes; host memory otherwise.
TEST_CASE(
    "proxy net: the net buffers' memory follows the backend's pointer support and "
    "MKERNEL_PROXY_GDR") {
  using mkernel::coll::ProxyMemory;
  using mkernel::coll::proxyMemoryFor;
  namespace net = mkernel::net;
  const int tcp = net::kPtrHost, ibGpu = net::kPtrHost | net::kPtrCuda | net::kPtrDmaBuf;
  ProxyMemory m;
  // TCP: host memory, whatever the GPU.
  REQUIRE(proxyMemoryFor("auto", tcp, "TCP", 100, &m) == Result::Success);
  CHECK(!m.gpu);
  CHECK(!m.flush);
  CHECK(m.why == "host memory (TCP cannot register GPU memory)");
  // Verbs with DMA-BUF: GPU memory; no flush on a GPU that orders the NIC's writes (owner, 100;
  // all devices, 200), a flush below (none, 0).
  REQUIRE(proxyMemoryFor("auto", ibGpu, "IB", 100, &m) == Result::Success);
  CHECK((m.gpu && !m.flush));
  REQUIRE(proxyMemoryFor("auto", ibGpu, "IB", 200, &m) == Result::Success);
  CHECK((m.gpu && !m.flush));
  REQUIRE(proxyMemoryFor("auto", ibGpu, "IB", 0, &m) == Result::Success);
  CHECK((m.gpu && m.flush));
  CHECK(m.why.find("GPU memory registered with IB (each receive flushed") == 0);
  // 0: host memory even where GPU memory would do; 1: GPU memory, or an error naming the way out.
  REQUIRE(proxyMemoryFor("0", ibGpu, "IB", 0, &m) == Result::Success);
  CHECK((!m.gpu && !m.flush));
  CHECK(m.why == "host memory (MKERNEL_PROXY_GDR=0)");
  REQUIRE(proxyMemoryFor("1", ibGpu, "IB", 100, &m) == Result::Success);
  CHECK(m.gpu);
  CHECK(proxyMemoryFor("1", tcp, "TCP", 100, &m) == Result::InvalidArgument);
  CHECK(std::string(mkernel::lastError())
            .find("MKERNEL_PROXY_GDR=auto keeps its buffers in host memory") != std::string::npos);
  CHECK(!m.gpu);
  CHECK(proxyMemoryFor("yes", ibGpu, "IB", 100, &m) == Result::InvalidArgument);
  CHECK(std::string(mkernel::lastError()).find("want auto, 0 or 1") != std::string::npos);
}
