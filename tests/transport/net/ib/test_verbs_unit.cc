// Verbs backend pieces that need no RDMA device: the MKERNEL_IB_HCA filter, port speeds, and what
// happens on a host without RDMA (this CI machine): createIbNet says "no RDMA device" and the net
// plugin falls back to TCP with one INFO line.
#include "tests/catch.h"

#include <string>

#include "tests/plugin/net_plugin_harness.h"
#include "tests/test_host.h"
#include "transport/net/ib/ib_device.h"
#include "transport/net/net.h"
#include "common/param.h"

namespace ib = mkernel::net::ib;

TEST_CASE("verbs: MKERNEL_IB_HCA selects like NCCL_IB_HCA") {
  ib::HcaFilter all("");
  CHECK(all.selects("mlx5_0", 1));
  CHECK(all.empty());

  ib::HcaFilter prefix("mlx5_1,rxe");
  CHECK(prefix.selects("mlx5_1", 1));
  CHECK(prefix.selects("mlx5_10", 2));  // prefix match
  CHECK(prefix.selects("rxe0", 1));
  CHECK_FALSE(prefix.selects("mlx5_0", 1));

  ib::HcaFilter ports("mlx5_0:1,mlx5_1:2");
  CHECK(ports.selects("mlx5_0", 1));
  CHECK_FALSE(ports.selects("mlx5_0", 2));
  CHECK(ports.selects("mlx5_1", 2));
  CHECK_FALSE(ports.selects("mlx5_1", 1));

  ib::HcaFilter exact("=mlx5_1");
  CHECK(exact.selects("mlx5_1", 1));
  CHECK_FALSE(exact.selects("mlx5_10", 1));

  ib::HcaFilter exclude("^mlx5_0");
  CHECK_FALSE(exclude.selects("mlx5_0", 1));
  CHECK_FALSE(exclude.selects("mlx5_01", 1));
  CHECK(exclude.selects("mlx5_1", 1));

  ib::HcaFilter excludeExact("^=mlx5_0:1");
  CHECK_FALSE(excludeExact.selects("mlx5_0", 1));
  CHECK(excludeExact.selects("mlx5_0", 2));
  CHECK(excludeExact.selects("mlx5_01", 1));

  ib::HcaFilter sloppy(",,rxe0,");
  CHECK(sloppy.selects("rxe0", 1));
  CHECK_FALSE(sloppy.selects("mlx5_0", 1));
}

TEST_CASE("verbs: port speed from active_speed x active_width, in Mbps") {
  CHECK(mkernel::verbs::portSpeedMbps(1, 1) == 2500);       // SDR 1x
  CHECK(mkernel::verbs::portSpeedMbps(32, 2) == 100000);    // EDR 4x
  CHECK(mkernel::verbs::portSpeedMbps(64, 2) == 200000);    // HDR 4x
  CHECK(mkernel::verbs::portSpeedMbps(128, 2) == 400000);   // NDR 4x
  CHECK(mkernel::verbs::portSpeedMbps(128, 16) == 200000);  // NDR 2x
  CHECK(mkernel::verbs::portSpeedMbps(0, 0) == 2500);       // nothing reported: the lowest, never 0
}

TEST_CASE("verbs: without an RDMA device createIbNet says so and returns nothing") {
  if (mktest::hostHasRdmaDevices()) {
    WARN("skipped: this host has RDMA devices (/sys/class/infiniband); the verbs tier covers it");
    return;
  }
  std::string why;
  auto n = mkernel::net::createIbNet(&why);
  CHECK(n == nullptr);
  INFO(why);
  CHECK(why.find("no RDMA device") != std::string::npos);
  // A second call (the plugin's init runs once per communicator) answers the same, quickly.
  std::string again;
  CHECK(mkernel::net::createIbNet(&again) == nullptr);
  CHECK(again == why);
}

TEST_CASE("verbs: the net plugin falls back to TCP with one INFO line naming the reason") {
  if (mktest::hostHasRdmaDevices()) {
    WARN("skipped: this host has RDMA devices");
    return;
  }
  mktest::prepareTestEnvironment();
  unsetenv("MKERNEL_NET_BACKEND");
  mkernel::params::resetForTesting();
  mktest::clearCapturedLog();
  mktest::NetPlugin p(11);
  REQUIRE(p.init() == ncclSuccess);
  int ndev = 0;
  CHECK(p.devices(&ndev) == ncclSuccess);
  CHECK(ndev > 0);
  int fallbackLines = 0;
  for (const mktest::CapturedLog& l : mktest::capturedLog()) {
    UNSCOPED_INFO("log: " << l.text);
    if (l.text.find("no RDMA device") != std::string::npos &&
        l.text.find("TCP") != std::string::npos) {
      ++fallbackLines;
      CHECK(l.level == 3);  // INFO, not WARN: a host without RDMA is a normal host
    }
  }
  CHECK(fallbackLines == 1);
  CHECK(p.finalize() == ncclSuccess);
}
