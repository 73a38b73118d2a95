// The TCP backend between two processes (label proc): a forked child is the peer.
#include "tests/catch.h"

#include "tests/transport/net/net_suite.h"

TEST_CASE("tcp net: two processes ping-pong 8 B .. 16 MiB") {
  mkernel::nettest::checkTwoProcesses([] {
    std::string why;
    return mkernel::net::createTcpNet(&why);
  });
}
