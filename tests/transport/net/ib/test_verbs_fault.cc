// Fault tests of the verbs backend, inside the Soft-RoCE VM: a peer process killed (SIGKILL)
// mid-transfer must surface as an error on the survivor within a bounded time, in both
// directions, never as a hang.
#include "tests/catch.h"

#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <thread>

#include "tests/transport/net/ib/verbs_util.h"

using namespace verbstest;

namespace {

constexpr size_t kMsg = size_t(1) << 20;

// Child: the other end of the connection, moving 1 MiB messages until it is killed.
// childSends: connect to the parent's handle read from inFd and send; else listen, write our handle
// to outFd, accept, and receive.
[[noreturn]] void childLoop(int inFd, int outFd, bool childSends) {
  std::string why;
  auto n = net::createIbNet(&why);
  if (!n) _exit(10);
  char handle[net::kHandleSize];
  if (childSends && read(inFd, handle, sizeof(handle)) != ssize_t(sizeof(handle))) _exit(11);
  net::SendComm* sc = nullptr;
  net::RecvComm* rc = nullptr;
  net::ListenComm* l = nullptr;
  char mine[net::kHandleSize];
  if (!childSends) {
    // The parent connects to us: our handle goes back through the same pipe pair (see below).
    if (n->listen(0, mine, &l) != Result::Success) _exit(12);
  }
  std::vector<char> buf(kMsg, 7);
  void* mh = nullptr;
  if (childSends) {
    while (sc == nullptr)
      if (n->connect(0, handle, &sc) != Result::Success) _exit(13);
    n->regMr(sc, buf.data(), buf.size(), net::kPtrHost, &mh);
    for (;;) {
      net::Request* r = nullptr;
      while (r == nullptr)
        if (n->isend(sc, buf.data(), kMsg, 0, mh, &r) != Result::Success) _exit(14);
      bool done = false;
      size_t sz;
      while (!done)
        if (n->test(r, &done, &sz) != Result::Success) _exit(15);
    }
  }
  if (write(outFd, mine, sizeof(mine)) != ssize_t(sizeof(mine))) _exit(16);
  while (rc == nullptr)
    if (n->accept(l, &rc) != Result::Success) _exit(17);
  n->regMr(rc, buf.data(), buf.size(), net::kPtrHost, &mh);
  for (;;) {
    net::Request* r = nullptr;
    void* d[1] = {buf.data()};
    size_t sz[1] = {kMsg};
    int tags[1] = {0};
    void* mhs[1] = {mh};
    while (r == nullptr)
      if (n->irecv(rc, 1, d, sz, tags, mhs, &r) != Result::Success) _exit(18);
    bool done = false;
    while (!done)
      if (n->test(r, &done, sz) != Result::Success) _exit(19);
  }
}

int reap(pid_t child) {
  int status = 0;
  waitpid(child, &status, 0);
  return status;
}

}  // namespace

TEST_CASE(
    "verbs fault: the sender is killed mid-transfer: the receiver gets an error, not a hang") {
  int toChild[2];
  REQUIRE(pipe(toChild) == 0);
  pid_t child = fork();
  REQUIRE(child >= 0);
  if (child == 0) {
    close(toChild[1]);
    childLoop(toChild[0], -1, true);
  }
  close(toChild[0]);
  auto n = ibNet();
  char handle[net::kHandleSize];
  net::ListenComm* l = nullptr;
  REQUIRE(n->listen(0, handle, &l) == Result::Success);
  REQUIRE(write(toChild[1], handle, sizeof(handle)) == ssize_t(sizeof(handle)));
  net::RecvComm* rc = nullptr;
  auto t0 = Clock::now();
  while (rc == nullptr) {
    REQUIRE(n->accept(l, &rc) == Result::Success);
    if (secondsSince(t0) > 20) {
      kill(child, SIGKILL);
      reap(child);
      FAIL("the child never connected");
    }
  }
  std::vector<char> buf(kMsg);
  void* mh = nullptr;
  REQUIRE(n->regMr(rc, buf.data(), buf.size(), net::kPtrHost, &mh) == Result::Success);
  int received = 0;
  Result res = Result::Success;
  Clock::time_point killedAt{};
  bool killed = false;
  t0 = Clock::now();
  while (res == Result::Success && secondsSince(t0) < 60) {
    net::Request* r = nullptr;
    void* d[1] = {buf.data()};
    size_t sz[1] = {kMsg};
    int tags[1] = {0};
    void* mhs[1] = {mh};
    while (r == nullptr && res == Result::Success) res = n->irecv(rc, 1, d, sz, tags, mhs, &r);
    bool done = false;
    while (!done && res == Result::Success && secondsSince(t0) < 60) res = n->test(r, &done, sz);
    if (done && ++received == 3) {
      kill(child, SIGKILL);  // the next receive is in flight or about to be
      killed = true;
      killedAt = Clock::now();
    }
  }
  reap(child);
  INFO(mkernel::lastError());
  REQUIRE(killed);
  CHECK((res == Result::RemoteError || res == Result::SystemError));
  double after = secondsSince(killedAt);
  std::printf("fault (sender killed): receiver error %.2f s after the kill: %s\n", after,
              mkernel::lastError());
  CHECK(after < 10.0);
  CHECK(std::string(mkernel::lastError()).find("peer") != std::string::npos);
  n->closeRecv(rc);
  n->closeListen(l);
  close(toChild[1]);
}

TEST_CASE(
    "verbs fault: the receiver is killed mid-transfer: the sender gets an error, not a hang") {
  int fromChild[2];
  REQUIRE(pipe(fromChild) == 0);
  pid_t child = fork();
  REQUIRE(child >= 0);
  if (child == 0) {
    close(fromChild[0]);
    childLoop(-1, fromChild[1], false);
  }
  close(fromChild[1]);
  auto n = ibNet();
  char handle[net::kHandleSize];
  REQUIRE(read(fromChild[0], handle, sizeof(handle)) == ssize_t(sizeof(handle)));
  net::SendComm* sc = nullptr;
  auto t0 = Clock::now();
  while (sc == nullptr) {
    REQUIRE(n->connect(0, handle, &sc) == Result::Success);
    REQUIRE(secondsSince(t0) < 20);
  }
  std::vector<char> buf(kMsg, 5);
  void* mh = nullptr;
  REQUIRE(n->regMr(sc, buf.data(), buf.size(), net::kPtrHost, &mh) == Result::Success);
  int sent = 0;
  Result res = Result::Success;
  Clock::time_point killedAt{};
  bool killed = false;
  t0 = Clock::now();
  while (res == Result::Success && secondsSince(t0) < 60) {
    net::Request* r = nullptr;
    while (r == nullptr && res == Result::Success && secondsSince(t0) < 60)
      res = n->isend(sc, buf.data(), kMsg, 0, mh, &r);
    bool done = false;
    while (r != nullptr && !done && res == Result::Success && secondsSince(t0) < 60)
      res = n->test(r, &done, nullptr);
    if (done && ++sent == 3) {
      kill(child, SIGKILL);
      killed = true;
      killedAt = Clock::now();
    }
  }
  reap(child);
  INFO(mkernel::lastError());
  REQUIRE(killed);
  CHECK((res == Result::RemoteError || res == Result::SystemError));
  double after = secondsSince(killedAt);
  std::printf("fault (receiver killed): sender error %.2f s after the kill: %s\n", after,
              mkernel::lastError());
  CHECK(after < 10.0);
  n->closeSend(sc);
  close(fromChild[0]);
}
