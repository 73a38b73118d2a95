// Helpers for the verbs tests (run inside the Soft-RoCE VM, scripts/verbs-tier.sh). Unlike the
// TCP backend, a verbs send cannot start before the matching receive is posted (clear-to-send),
// so these helpers post receives first and drive both sides from one thread.
#pragma once

#include "tests/catch.h"

#include <chrono>
#include <cstring>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "common/result.h"
#include "transport/net/ib/ib_net.h"
#include "transport/net/net.h"

namespace verbstest {

using mkernel::Result;
namespace net = mkernel::net;
using Clock = std::chrono::steady_clock;

inline double secondsSince(Clock::time_point t) {
  return std::chrono::duration<double>(Clock::now() - t).count();
}

inline std::unique_ptr<net::Net> ibNet() {
  std::string why;
  auto n = net::createIbNet(&why);
  INFO("createIbNet: " << why);
  REQUIRE(n != nullptr);
  return n;
}

inline net::ib::IbNet& asIb(net::Net& n) {
  return dynamic_cast<net::ib::IbNet&>(n);
}

inline std::vector<char> pattern(size_t n, uint32_t seed) {
  std::vector<char> v(n);
  std::mt19937 rng(seed);
  for (size_t i = 0; i < n; ++i) v[i] = static_cast<char>(rng());
  return v;
}

struct Pair {
  std::unique_ptr<net::Net> net;
  net::SendComm* send = nullptr;
  net::RecvComm* recv = nullptr;
  ~Pair() {
    if (net && send) net->closeSend(send);
    if (net && recv) net->closeRecv(recv);
  }
};

inline void connect(Pair* p, std::unique_ptr<net::Net> n = nullptr) {
  p->net = n ? std::move(n) : ibNet();
  char handle[net::kHandleSize];
  net::ListenComm* l = nullptr;
  REQUIRE(p->net->listen(0, handle, &l) == Result::Success);
  auto t0 = Clock::now();
  while (p->send == nullptr || p->recv == nullptr) {
    if (p->send == nullptr) REQUIRE(p->net->connect(0, handle, &p->send) == Result::Success);
    if (p->recv == nullptr) REQUIRE(p->net->accept(l, &p->recv) == Result::Success);
    REQUIRE(secondsSince(t0) < 20.0);
  }
  REQUIRE(p->net->closeListen(l) == Result::Success);
}

// Polls test() until done, an error, or `timeoutS`.
inline Result wait(net::Net& n, net::Request* r, size_t* sizes, double timeoutS, bool* done) {
  *done = false;
  auto t0 = Clock::now();
  while (!*done) {
    Result res = n.test(r, done, sizes);
    if (res != Result::Success) return res;
    if (secondsSince(t0) > timeoutS) break;
  }
  return Result::Success;
}

inline net::Request* postRecv(net::Net& n, net::RecvComm* rc, int count, void** data, size_t* sizes,
                              int* tags, void** mh = nullptr) {
  net::Request* r = nullptr;
  void* none[net::kMaxGroupedRecvs] = {};
  auto t0 = Clock::now();
  while (r == nullptr) {
    REQUIRE(n.irecv(rc, count, data, sizes, tags, mh ? mh : none, &r) == Result::Success);
    REQUIRE(secondsSince(t0) < 10.0);
  }
  return r;
}

inline net::Request* postSend(net::Net& n, net::SendComm* sc, void* data, size_t size, int tag,
                              void* mh = nullptr) {
  net::Request* r = nullptr;
  auto t0 = Clock::now();
  while (r == nullptr) {
    REQUIRE(n.isend(sc, data, size, tag, mh, &r) == Result::Success);
    REQUIRE(secondsSince(t0) < 10.0);
  }
  return r;
}

// One message: receive posted first, then the send; both completed; data verified.
inline void roundTrip(Pair& p, size_t size, size_t posted, int tag, bool registered,
                      uint32_t seed) {
  INFO("size " << size << " posted " << posted);
  std::vector<char> src = pattern(size, seed), dst(posted, 0x5a);
  void* smh = nullptr;
  void* rmh = nullptr;
  if (registered) {
    REQUIRE(p.net->regMr(p.send, src.data(), size, net::kPtrHost, &smh) == Result::Success);
    REQUIRE(p.net->regMr(p.recv, dst.data(), posted, net::kPtrHost, &rmh) == Result::Success);
  }
  void* d[1] = {dst.data()};
  size_t sz[1] = {posted};
  int tags[1] = {tag};
  void* mhs[1] = {rmh};
  net::Request* r = postRecv(*p.net, p.recv, 1, d, sz, tags, mhs);
  net::Request* s = postSend(*p.net, p.send, src.data(), size, tag, smh);
  bool sDone = false, rDone = false;
  size_t got[1] = {0}, sent = 0;
  auto t0 = Clock::now();
  while (!sDone || !rDone) {
    if (!sDone) REQUIRE(p.net->test(s, &sDone, &sent) == Result::Success);
    if (!rDone) REQUIRE(p.net->test(r, &rDone, got) == Result::Success);
    REQUIRE(secondsSince(t0) < 30.0);
  }
  CHECK(sent == size);
  REQUIRE(got[0] == size);
  REQUIRE(std::memcmp(dst.data(), src.data(), size) == 0);
  for (size_t i = size; i < posted; ++i)
    if (dst[i] != 0x5a) FAIL("byte " << i << " past the message was written");
  if (registered) {
    CHECK(p.net->deregMr(p.send, smh) == Result::Success);
    CHECK(p.net->deregMr(p.recv, rmh) == Result::Success);
  }
}

}  // namespace verbstest
