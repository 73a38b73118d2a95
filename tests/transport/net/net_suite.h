// A backend-neutral test suite for net::Net (docs/TRANSPORT.md). Every check here is a property
// NCCL's net-plugin semantics promise, so each backend (TCP, verbs) instantiates the same suite:
//
//   #include "tests/transport/net/net_suite.h"
//   MKERNEL_NET_SUITE("tcp", [] { std::string why; return mkernel::net::createTcpNet(&why); })
//
// Order of operations. NCCL lets isend answer a null request ("call again") for as long as the
// peer has not posted the matching receive: a clear-to-send backend (verbs, like NCCL's IB
// transport) does exactly that, a buffering backend (TCP) accepts the send at once. So every check
// of MKERNEL_NET_SUITE posts a receive before the send meant for it and retries the isend (bounded)
// until it is accepted; it relies on irecv making the receive visible to the sender by itself
// (true of both backends, and of NCCL's IB and socket transports), not on a later test() of it.
// The few properties that only exist when a send is accepted before its receive is posted (a send
// that no receive will ever match stalls or meets a closed receiver; data that arrived before its
// receive) are in MKERNEL_NET_SUITE_EARLY_SENDS, for buffering backends only.
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

// Where a check posts its sends relative to the matching receives.
enum class SendOrder {
  kAfterReceive,   // the receive first, then the send: valid on every backend
  kBeforeReceive,  // the send first, accepted before any receive exists: buffering backends only
};

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
void checkSizes(const NetFactory& factory,  // 0 B .. 64 MiB, every byte verified
                SendOrder order = SendOrder::kAfterReceive);
void checkManyInFlightAndBackPressure(const NetFactory& factory);
void checkGroupedReceives(const NetFactory& factory);
// The receive fails naming the size (the send may fail too: a clear-to-send backend sees the
// posted size before it sends).
void checkPostedSmallerThanSentFails(const NetFactory& factory,
                                     SendOrder order = SendOrder::kAfterReceive);
void checkPostingOrderCompletion(const NetFactory& factory);
void checkCloseWithRequestsOutstanding(const NetFactory& factory);
// The sender closes while 64 MiB into a posted receive are on their way: the receive fails, naming
// the peer. Should the whole message have arrived before the close (a fast receiver), the next
// receive must fail instead.
void checkSenderClosesMidTransfer(const NetFactory& factory);
// kAfterReceive: the receiver closes while a 64 MiB message into its posted receive is on its way:
// the send fails (or, should all its bytes have left before the close, one of the next sends).
// kBeforeReceive: while 64 MiB are on their way with no receive posted for them at all: the send
// fails, deterministically.
void checkReceiverClosesMidTransfer(const NetFactory& factory,
                                    SendOrder order = SendOrder::kAfterReceive);
// Sets MKERNEL_TIMEOUT_S=1 meanwhile. kAfterReceive: a receive nobody sends to fails after 1 s.
// kBeforeReceive: a 64 MiB send nobody receives fails too (only a buffering backend accepts it).
void checkStalledPeerTimesOut(const NetFactory& factory,
                              SendOrder order = SendOrder::kAfterReceive);
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

// Instantiates the in-process part of the suite for one backend: every check valid on any backend.
#define MKERNEL_NET_SUITE(BACKEND, FACTORY) MKERNEL_NET_SUITE_TAGGED(BACKEND, FACTORY, "")

// The same, with Catch2 tags for the posting-order check: "[!shouldfail]" for a backend known to
// break net.h's rule that requests of one comm complete in posting order (verbs today,
// docs/VERBS.md). The check still runs in full, and turns red once the backend keeps the rule,
// so that the tag is removed.
#define MKERNEL_NET_SUITE_TAGGED(BACKEND, FACTORY, POSTING_ORDER_TAGS)         \
  TEST_CASE(BACKEND " net: device properties") {                               \
    ::mkernel::nettest::checkProperties(FACTORY);                              \
  }                                                                            \
  TEST_CASE(BACKEND " net: handshake") {                                       \
    ::mkernel::nettest::checkHandshake(FACTORY);                               \
  }                                                                            \
  TEST_CASE(BACKEND " net: sizes 0 B .. 64 MiB") {                             \
    ::mkernel::nettest::checkSizes(FACTORY);                                   \
  }                                                                            \
  TEST_CASE(BACKEND " net: 32 in flight and back-pressure") {                  \
    ::mkernel::nettest::checkManyInFlightAndBackPressure(FACTORY);             \
  }                                                                            \
  TEST_CASE(BACKEND " net: grouped receives") {                                \
    ::mkernel::nettest::checkGroupedReceives(FACTORY);                         \
  }                                                                            \
  TEST_CASE(BACKEND " net: posted size smaller than sent is an error") {       \
    ::mkernel::nettest::checkPostedSmallerThanSentFails(FACTORY);              \
  }                                                                            \
  TEST_CASE(BACKEND " net: completion in posting order", POSTING_ORDER_TAGS) { \
    ::mkernel::nettest::checkPostingOrderCompletion(FACTORY);                  \
  }                                                                            \
  TEST_CASE(BACKEND " net: close with requests outstanding") {                 \
    ::mkernel::nettest::checkCloseWithRequestsOutstanding(FACTORY);            \
  }                                                                            \
  TEST_CASE(BACKEND " net: sender closes mid-transfer") {                      \
    ::mkernel::nettest::checkSenderClosesMidTransfer(FACTORY);                 \
  }                                                                            \
  TEST_CASE(BACKEND " net: receiver closes mid-transfer") {                    \
    ::mkernel::nettest::checkReceiverClosesMidTransfer(FACTORY);               \
  }                                                                            \
  TEST_CASE(BACKEND " net: stalled peer times out") {                          \
    ::mkernel::nettest::checkStalledPeerTimesOut(FACTORY);                     \
  }                                                                            \
  TEST_CASE(BACKEND " net: idle progress threads do not spin") {               \
    ::mkernel::nettest::checkIdleCpu(FACTORY);                                 \
  }

// The checks that need a send accepted before its matching receive is posted: only for backends
// that buffer such a send (TCP). A clear-to-send backend answers a null request until the receive
// is posted, which NCCL allows, so it must not instantiate these.
#define MKERNEL_NET_SUITE_EARLY_SENDS(BACKEND, FACTORY)                                          \
  TEST_CASE(BACKEND " net: early sends: sizes 0 B .. 64 MiB, each sent before its receive") {    \
    ::mkernel::nettest::checkSizes(FACTORY, ::mkernel::nettest::SendOrder::kBeforeReceive);      \
  }                                                                                              \
  TEST_CASE(BACKEND " net: early sends: sent before a smaller receive is posted is an error") {  \
    ::mkernel::nettest::checkPostedSmallerThanSentFails(                                         \
        FACTORY, ::mkernel::nettest::SendOrder::kBeforeReceive);                                 \
  }                                                                                              \
  TEST_CASE(BACKEND " net: early sends: receiver closes with no receive posted for a send") {    \
    ::mkernel::nettest::checkReceiverClosesMidTransfer(                                          \
        FACTORY, ::mkernel::nettest::SendOrder::kBeforeReceive);                                 \
  }                                                                                              \
  TEST_CASE(BACKEND " net: early sends: a send nobody receives times out") {                     \
    ::mkernel::nettest::checkStalledPeerTimesOut(FACTORY,                                        \
                                                 ::mkernel::nettest::SendOrder::kBeforeReceive); \
  }
