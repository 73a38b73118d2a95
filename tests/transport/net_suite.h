// A backend-neutral test suite for net::Net (DESIGN.md §5). Every check here is a property NCCL's
// net-plugin semantics promise, so each backend (TCP now, verbs later) instantiates the same
// suite:
//
//   #include "tests/transport/net_suite.h"
//   MKERNEL_NET_SUITE("tcp", [] { std::string why; return mkernel::net::createTcpNet(&why); })
//
// The suite functions can also be called one by one from a backend's own TEST_CASEs.
#pragma once

#include <functional>
#include <memory>
#include <string>

#include "transport/net/net.h"

namespace mkernel {
namespace nettest {

using NetFactory = std::function<std::unique_ptr<net::Net>()>;

// A connected send/recv comm pair on device 0 of one Net, closed by the destructor.
struct CommPair {
  std::unique_ptr<net::Net> net;
  net::SendComm* send = nullptr;
  net::RecvComm* recv = nullptr;
  ~CommPair();
};
// Drives listen/connect/accept (never blocking calls) until both comms exist; REQUIREs success
// within `timeoutS`.
void connectPair(const NetFactory& factory, CommPair* pair, double timeoutS = 10.0);

// Polls test() until done or error or `timeoutS`; returns test()'s last result (and *done).
Result waitRequest(net::Net& net, net::Request* req, size_t* sizes, double timeoutS, bool* done);
// Completes a send and a receive together (a single thread drives both).
void completeBoth(net::Net& net, net::Request* sendReq, net::Request* recvReq, size_t* recvSizes,
                  double timeoutS = 20.0);

void checkProperties(const NetFactory& factory);
void checkHandshake(const NetFactory& factory);
void checkSizes(const NetFactory& factory);  // 0 B .. 64 MiB, every byte verified
void checkManyInFlightAndBackPressure(const NetFactory& factory);
void checkGroupedReceives(const NetFactory& factory);
void checkPostedSmallerThanSentFails(const NetFactory& factory);
void checkPostingOrderCompletion(const NetFactory& factory);
void checkCloseWithRequestsOutstanding(const NetFactory& factory);
void checkSenderClosesMidTransfer(const NetFactory& factory);
void checkReceiverClosesMidTransfer(const NetFactory& factory);
void checkStalledPeerTimesOut(const NetFactory& factory);  // sets MKERNEL_TIMEOUT_S=1 meanwhile
void checkIdleCpu(const NetFactory& factory);
// Parent listens, a forked child connects with the handle read from a pipe; they ping-pong
// messages of 8 B .. 16 MiB and verify them. Label such instantiations `proc`.
void checkTwoProcesses(const NetFactory& factory);

// Sets an environment variable for the lifetime of the object, restoring the old value.
class ScopedEnv {
 public:
  ScopedEnv(const char* name, const char* value);
  ~ScopedEnv();

 private:
  std::string name_;
  std::string old_;
  bool had_;
};

}  // namespace nettest
}  // namespace mkernel

// Instantiates the in-process part of the suite for one backend.
#define MKERNEL_NET_SUITE(BACKEND, FACTORY)                                                            \
  TEST_CASE(BACKEND " net: device properties") { ::mkernel::nettest::checkProperties(FACTORY); }      \
  TEST_CASE(BACKEND " net: handshake") { ::mkernel::nettest::checkHandshake(FACTORY); }               \
  TEST_CASE(BACKEND " net: sizes 0 B .. 64 MiB") { ::mkernel::nettest::checkSizes(FACTORY); }         \
  TEST_CASE(BACKEND " net: 32 in flight and back-pressure") {                                         \
    ::mkernel::nettest::checkManyInFlightAndBackPressure(FACTORY);                                    \
  }                                                                                                   \
  TEST_CASE(BACKEND " net: grouped receives") { ::mkernel::nettest::checkGroupedReceives(FACTORY); }  \
  TEST_CASE(BACKEND " net: posted size smaller than sent is an error") {                              \
    ::mkernel::nettest::checkPostedSmallerThanSentFails(FACTORY);                                     \
  }                                                                                                   \
  TEST_CASE(BACKEND " net: completion in posting order") {                                            \
    ::mkernel::nettest::checkPostingOrderCompletion(FACTORY);                                         \
  }                                                                                                   \
  TEST_CASE(BACKEND " net: close with requests outstanding") {                                        \
    ::mkernel::nettest::checkCloseWithRequestsOutstanding(FACTORY);                                   \
  }                                                                                                   \
  TEST_CASE(BACKEND " net: sender closes mid-transfer") {                                             \
    ::mkernel::nettest::checkSenderClosesMidTransfer(FACTORY);                                        \
  }                                                                                                   \
  TEST_CASE(BACKEND " net: receiver closes mid-transfer") {                                           \
    ::mkernel::nettest::checkReceiverClosesMidTransfer(FACTORY);                                      \
  }                                                                                                   \
  TEST_CASE(BACKEND " net: stalled peer times out") {                                                 \
    ::mkernel::nettest::checkStalledPeerTimesOut(FACTORY);                                            \
  }                                                                                                   \
  TEST_CASE(BACKEND " net: idle progress threads do not spin") { ::mkernel::nettest::checkIdleCpu(FACTORY); }
