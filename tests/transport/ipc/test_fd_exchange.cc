// ipc::exchangeFds (transport/ipc/fd_exchange.h): descriptors between the ranks of one host, as
// process ranks' cuMem memory travels (collectives/runtime/peer_memory.cc). Each rank passes memfds
// holding its own text; a receiver reads the text back through the descriptor it got.
#include "tests/catch.h"
#include <signal.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstddef>
#include <cstdio>
#include <condition_variable>
#include <cstring>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "common/log.h"
#include "transport/bootstrap/bootstrap.h"
#include "transport/ipc/fd_exchange.h"

using mkernel::Result;
using mkernel::ipc::exchangeFds;

namespace {

// An all-gather among threads (what Bootstrap::allGather does between processes).
class ThreadGather {
 public:
  explicit ThreadGather(int n) : n_(n) {}
  Result gather(int rank, void* data, size_t bytes) {
    std::unique_lock<std::mutex> lock(mu_);
    if (buf_.size() != bytes * static_cast<size_t>(n_))
      buf_.assign(bytes * static_cast<size_t>(n_), 0);
    std::memcpy(buf_.data() + bytes * static_cast<size_t>(rank),
                static_cast<char*>(data) + bytes * static_cast<size_t>(rank), bytes);
    wait(&lock);
    std::memcpy(data, buf_.data(), buf_.size());
    wait(&lock);  // everyone has read before the next gather writes
    return Result::Success;
  }

 private:
  void wait(std::unique_lock<std::mutex>* lock) {
    const uint64_t gen = gen_;
    if (++arrived_ == n_) {
      arrived_ = 0;
      ++gen_;
      cv_.notify_all();
    } else {
      cv_.wait(*lock, [&] { return gen_ != gen; });
    }
  }
  int n_;
  std::mutex mu_;
  std::condition_variable cv_;
  int arrived_ = 0;
  uint64_t gen_ = 0;
  std::vector<char> buf_;
};

int memfdWith(const std::string& text) {
  const int fd = memfd_create("mkernel-test", MFD_CLOEXEC);
  if (fd < 0) return -1;
  if (write(fd, text.data(), text.size()) != static_cast<ssize_t>(text.size())) {
    close(fd);
    return -1;
  }
  return fd;
}

std::string readAll(int fd) {
  char buf[128] = {};
  const ssize_t n = pread(fd, buf, sizeof(buf) - 1, 0);
  return n > 0 ? std::string(buf, static_cast<size_t>(n)) : std::string();
}

std::string textOf(int rank, int i) {
  return "rank " + std::to_string(rank) + " descriptor " + std::to_string(i);
}

// Runs exchangeFds on n threads with want(a, b); returns each rank's result and what it read
// through each descriptor it got ("" for -1).
struct ThreadRun {
  std::vector<Result> res;
  std::vector<std::vector<std::string>> read;  // [rank][r * nFds + i]
};

ThreadRun runThreads(int n, int nFds, bool (*want)(int, int), double timeoutS = 10.0) {
  ThreadGather g(n);
  ThreadRun out;
  out.res.assign(static_cast<size_t>(n), Result::Success);
  out.read.assign(static_cast<size_t>(n), {});
  std::vector<std::thread> ts;
  for (int r = 0; r < n; ++r) {
    ts.emplace_back([&, r] {
      std::vector<int> mine;
      for (int i = 0; i < nFds; ++i) mine.push_back(memfdWith(textOf(r, i)));
      std::vector<char> w(static_cast<size_t>(n), 0);
      for (int q = 0; q < n; ++q) w[static_cast<size_t>(q)] = q != r && want(r, q) ? 1 : 0;
      std::vector<int> got;
      out.res[static_cast<size_t>(r)] =
          exchangeFds([&](void* d, size_t b) { return g.gather(r, d, b); }, r, n, w, mine.data(),
                      nFds, timeoutS, &got);
      for (int fd : mine) close(fd);
      for (int fd : got) {
        out.read[static_cast<size_t>(r)].push_back(fd >= 0 ? readAll(fd) : std::string());
        if (fd >= 0) close(fd);
      }
    });
  }
  for (auto& t : ts) t.join();
  return out;
}

}  // namespace

TEST_CASE(
    "exchangeFds: every rank gets every other rank's descriptors (threads, 1-6 ranks, 1-3 "
    "descriptors)") {
  for (int n : {1, 2, 3, 6}) {
    for (int nFds : {1, 3}) {
      CAPTURE(n, nFds);
      ThreadRun run = runThreads(n, nFds, [](int, int) { return true; });
      for (int r = 0; r < n; ++r) {
        CAPTURE(r);
        REQUIRE(run.res[static_cast<size_t>(r)] == Result::Success);
        REQUIRE(run.read[static_cast<size_t>(r)].size() == static_cast<size_t>(n * nFds));
        for (int q = 0; q < n; ++q)
          for (int i = 0; i < nFds; ++i)
            CHECK(run.read[static_cast<size_t>(r)][static_cast<size_t>(q * nFds + i)] ==
                  (q == r ? std::string() : textOf(q, i)));
      }
    }
  }
}

TEST_CASE("exchangeFds: only the ranks wanted (ranks of other 'processes': different parity)") {
  const int n = 5;
  ThreadRun run = runThreads(n, 2, [](int a, int b) { return (a % 2) != (b % 2); });
  for (int r = 0; r < n; ++r) {
    REQUIRE(run.res[static_cast<size_t>(r)] == Result::Success);
    for (int q = 0; q < n; ++q)
      for (int i = 0; i < 2; ++i)
        CHECK(run.read[static_cast<size_t>(r)][static_cast<size_t>(q * 2 + i)] ==
              ((q % 2) != (r % 2) ? textOf(q, i) : std::string()));
  }
  // Nobody wanted by anybody: every rank only takes part in the gather.
  ThreadRun none = runThreads(3, 1, [](int, int) { return false; });
  for (Result r : none.res) CHECK(r == Result::Success);
}

TEST_CASE(
    "exchangeFds: a rank whose descriptor count differs is an error on its peers, within the "
    "timeout") {
  const int n = 3;
  ThreadGather g(n);
  std::vector<Result> res(static_cast<size_t>(n), Result::Success);
  std::vector<std::string> err(static_cast<size_t>(n));
  std::vector<std::thread> ts;
  const auto t0 = std::chrono::steady_clock::now();
  for (int r = 0; r < n; ++r) {
    ts.emplace_back([&, r] {
      const int nFds = r == 2 ? 2 : 1;
      std::vector<int> mine;
      for (int i = 0; i < nFds; ++i) mine.push_back(memfdWith(textOf(r, i)));
      std::vector<char> w(static_cast<size_t>(n), 1);
      w[static_cast<size_t>(r)] = 0;
      std::vector<int> got;
      res[static_cast<size_t>(r)] =
          exchangeFds([&](void* d, size_t b) { return g.gather(r, d, b); }, r, n, w, mine.data(),
                      nFds, 5.0, &got);
      err[static_cast<size_t>(r)] = mkernel::lastError();
      for (int fd : mine) close(fd);
      for (int fd : got)
        if (fd >= 0) close(fd);
    });
  }
  for (auto& t : ts) t.join();
  const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  for (int r = 0; r < 2; ++r) {
    CAPTURE(r, err[static_cast<size_t>(r)]);
    CHECK(res[static_cast<size_t>(r)] == Result::RemoteError);
    CHECK(err[static_cast<size_t>(r)].find("rank 2 passes a different number") !=
          std::string::npos);
  }
  CHECK(res[2] != Result::Success);  // it sees ranks 0 and 1 pass another number
  CHECK(s < 5.0);                    // from the gather, not from the timeout
}

TEST_CASE(
    "exchangeFds: a rank that gathers but never answers is a timeout naming the step, not a hang") {
  // Rank 1 takes part in the gather with the endpoint of a socket that listens and never accepts.
  // Its slot mirrors fd_exchange.cc's private layout: a 64-byte name, pid, descriptor count, nonce.
  struct Endpoint {
    char name[64];
    int32_t pid;
    int32_t nFds;
    uint64_t nonce;
  };
  ThreadGather g(2);
  std::string err;
  Result res = Result::Success;
  const auto t0 = std::chrono::steady_clock::now();
  std::thread rank0([&] {
    const int fd = memfdWith("x");
    std::vector<char> w{0, 1};
    std::vector<int> got;
    res = exchangeFds([&](void* d, size_t b) { return g.gather(0, d, b); }, 0, 2, w, &fd, 1, 1.5,
                      &got);
    err = mkernel::lastError();
    close(fd);
  });
  std::thread rank1([&] {
    Endpoint eps[2] = {};
    std::snprintf(eps[1].name, sizeof(eps[1].name), "mkernel-fd-test-silent-%d",
                  static_cast<int>(getpid()));
    eps[1].pid = static_cast<int32_t>(getpid());
    eps[1].nFds = 1;
    const int s = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
    sockaddr_un a{};
    a.sun_family = AF_UNIX;
    const size_t len = std::strlen(eps[1].name);
    std::memcpy(a.sun_path + 1, eps[1].name, len);
    const bool listening =
        s >= 0 &&
        bind(s, reinterpret_cast<sockaddr*>(&a),
             static_cast<socklen_t>(offsetof(sockaddr_un, sun_path) + 1 + len)) == 0 &&
        listen(s, 4) == 0;
    g.gather(1, eps, sizeof(Endpoint));
    int32_t connected[2] = {0, 1};  // "connected to everyone it wants" (nobody)
    g.gather(1, connected, sizeof(int32_t));
    rank0.join();  // never accepts, never answers
    if (s >= 0) close(s);
    CHECK(listening);
  });
  rank1.join();
  const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  CAPTURE(err);
  CHECK(res == Result::RemoteError);
  CHECK(err.find("nothing within the timeout") != std::string::npos);
  CHECK(s >= 1.4);
  CHECK(s < 5.0);
}

TEST_CASE("exchangeFds: a rank that cannot reach a peer's socket makes every rank fail at once") {
  // Rank 0 wants rank 1's descriptors, rank 1 wants none (so it listens on nothing): rank 0's
  // connect is refused, as between network namespaces. Every rank must fail from the gather, long
  // before the 20 s deadline.
  ThreadGather g(3);
  Result res[3] = {Result::Success, Result::Success, Result::Success};
  std::string err[3];
  const auto t0 = std::chrono::steady_clock::now();
  std::vector<std::thread> ts;
  for (int r = 0; r < 3; ++r)
    ts.emplace_back([&, r] {
      const int fd = memfdWith(textOf(r, 0));
      // Only 0 wants anything (rank 1's), so ranks 1 and 2 listen on nothing.
      std::vector<char> w(3, 0);
      if (r == 0) w[1] = 1;
      std::vector<int> got;
      res[r] = exchangeFds([&](void* d, size_t b) { return g.gather(r, d, b); }, r, 3, w, &fd, 1,
                           20.0, &got);
      err[r] = mkernel::lastError();
      close(fd);
      for (int f : got)
        if (f >= 0) close(f);
    });
  for (auto& t : ts) t.join();
  const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  CAPTURE(err[0], err[1], err[2]);
  CHECK(res[0] == Result::RemoteError);
  CHECK(err[0].find("connecting to rank 1") != std::string::npos);
  CHECK(res[1] == Result::RemoteError);
  CHECK(err[1].find("rank 0 could not reach") != std::string::npos);
  CHECK(res[2] == Result::RemoteError);
  CHECK(s < 5.0);
}

TEST_CASE(
    "exchangeFds: callers that are not ranks (silent, closing, or of another process claiming a "
    "rank) get nothing; the exchange completes") {
  // Rank 1's gather of the endpoints forks an impostor (another pid) that connects to rank 0's
  // socket first and greets as rank 1, with the right nonce. Rank 0 must refuse it (SO_PEERCRED:
  // not rank 1's pid) without counting it, then serve the real rank 1. The layouts mirror
  // fd_exchange.cc's private ones: Endpoint {char name[64]; int32 pid, nFds; uint64 nonce} and
  // Hello {uint32 magic; int32 rank; uint64 nonce}.
  struct Endpoint {
    char name[64];
    int32_t pid;
    int32_t nFds;
    uint64_t nonce;
  };
  struct Hello {
    uint32_t magic;
    int32_t rank;
    uint64_t nonce;
  };
  ThreadGather g(2);
  Result res[2] = {Result::InternalError, Result::InternalError};
  std::string read[2];
  pid_t impostor = -1;
  int silent = -1;
  int gathers = 0;
  std::vector<std::thread> ts;
  for (int r = 0; r < 2; ++r)
    ts.emplace_back([&, r] {
      const int fd = memfdWith(textOf(r, 0));
      std::vector<char> w{static_cast<char>(r != 0), static_cast<char>(r != 1)};
      std::vector<int> got;
      auto gather = [&](void* d, size_t b) {
        Result gr = g.gather(r, d, b);
        if (r == 1 && gathers++ == 0 && b == sizeof(Endpoint)) {
          const Endpoint e0 = static_cast<Endpoint*>(d)[0];
          int sig[2];
          if (pipe(sig) != 0) return Result::SystemError;
          // First a caller that connects and says nothing, and one that connects and closes: both
          // dropped (neither may stop the exchange); then the impostor.
          auto connectTo = [&](const char* name) {
            const int s = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
            sockaddr_un a{};
            a.sun_family = AF_UNIX;
            const size_t len = strnlen(name, sizeof(e0.name));
            std::memcpy(a.sun_path + 1, name, len);
            if (connect(s, reinterpret_cast<sockaddr*>(&a),
                        static_cast<socklen_t>(offsetof(sockaddr_un, sun_path) + 1 + len)) != 0) {
              close(s);
              return -1;
            }
            return s;
          };
          silent = connectTo(e0.name);
          const int closer = connectTo(e0.name);
          if (closer >= 0) close(closer);
          impostor = fork();
          if (impostor == 0) {
            close(sig[0]);
            const int s = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
            sockaddr_un a{};
            a.sun_family = AF_UNIX;
            const size_t len = strnlen(e0.name, sizeof(e0.name));
            std::memcpy(a.sun_path + 1, e0.name, len);
            int rc = 1;
            if (connect(s, reinterpret_cast<sockaddr*>(&a),
                        static_cast<socklen_t>(offsetof(sockaddr_un, sun_path) + 1 + len)) == 0) {
              const Hello h{0x6d6b6664u, 1, e0.nonce};
              if (write(s, &h, sizeof(h)) == static_cast<ssize_t>(sizeof(h))) {
                (void)!write(sig[1], "x", 1);
                // The refusal closes the connection: nothing, above all no descriptor, comes back.
                char buf[64];
                char ctl[CMSG_SPACE(4 * sizeof(int))];
                iovec iov{buf, sizeof(buf)};
                msghdr msg{};
                msg.msg_iov = &iov;
                msg.msg_iovlen = 1;
                msg.msg_control = ctl;
                msg.msg_controllen = sizeof(ctl);
                const ssize_t n = recvmsg(s, &msg, 0);
                rc = n == 0 && msg.msg_controllen == 0 ? 0 : 2;
              }
            }
            _exit(rc);
          }
          close(sig[1]);
          char c = 0;
          (void)!::read(sig[0], &c, 1);  // the impostor's greeting is queued ahead of ours
          close(sig[0]);
        }
        return gr;
      };
      res[r] = exchangeFds(gather, r, 2, w, &fd, 1, 10.0, &got);
      close(fd);
      const int peer = 1 - r;
      if (got[static_cast<size_t>(peer)] >= 0) {
        read[r] = readAll(got[static_cast<size_t>(peer)]);
        close(got[static_cast<size_t>(peer)]);
      }
    });
  for (auto& t : ts) t.join();
  CHECK(silent >= 0);
  if (silent >= 0) close(silent);
  REQUIRE(impostor > 0);
  int status = -1;
  REQUIRE(waitpid(impostor, &status, 0) == impostor);
  CHECK(WIFEXITED(status));
  CHECK(WEXITSTATUS(status) == 0);  // refused, no descriptor
  CHECK(res[0] == Result::Success);
  CHECK(res[1] == Result::Success);
  CHECK(read[0] == textOf(1, 0));
  CHECK(read[1] == textOf(0, 0));
}

TEST_CASE("exchangeFds: between processes over the bootstrap (4 processes, two 'hosts' of two)") {
  const int n = 4;
  // Rank r wants the descriptors of the ranks of its own pair that are not itself, and of rank
  // (r + 2) % 4: symmetric.
  auto want = [](int a, int b) { return a != b && ((a / 2) == (b / 2) || (a + 2) % 4 == b); };
  auto body = [&](int r, const mkernel::bootstrap::UniqueId& id) -> int {
    std::unique_ptr<mkernel::bootstrap::Bootstrap> bs;
    if (mkernel::bootstrap::Bootstrap::create(id, r, n, &bs) != Result::Success) return 10;
    int mine[2] = {memfdWith(textOf(r, 0)), memfdWith(textOf(r, 1))};
    std::vector<char> w(static_cast<size_t>(n), 0);
    for (int q = 0; q < n; ++q) w[static_cast<size_t>(q)] = want(r, q) ? 1 : 0;
    std::vector<int> got;
    if (exchangeFds([&](void* d, size_t b) { return bs->allGather(d, b); }, r, n, w, mine, 2, 20.0,
                    &got) != Result::Success)
      return 11;
    close(mine[0]);
    close(mine[1]);
    int bad = 0;
    for (int q = 0; q < n; ++q)
      for (int i = 0; i < 2; ++i) {
        const int fd = got[static_cast<size_t>(q * 2 + i)];
        const std::string expect = want(r, q) ? textOf(q, i) : std::string();
        if ((fd >= 0 ? readAll(fd) : std::string()) != expect) ++bad;
        if (fd >= 0) close(fd);
      }
    return bs->barrier() == Result::Success && bad == 0 ? 0 : 12;
  };
  // Every rank is a child, forked before this process starts the case's first thread (the
  // bootstrap root's, in createUniqueId), and reads the id from a pipe: a child of a process with
  // threads may not start threads of its own under ThreadSanitizer (scripts/test.sh tsan), and
  // the bootstrap does. This process only reaps, with a deadline: a rank that dies fails the case
  // at once, the others killed, instead of leaving its peers in the bootstrap until
  // MKERNEL_TIMEOUT_S (300 s, past ctest's timeout).
  std::vector<pid_t> kids;
  std::vector<int> idPipes;
  for (int r = 0; r < n; ++r) {
    int p[2];
    REQUIRE(pipe(p) == 0);
    const pid_t pid = fork();
    REQUIRE(pid >= 0);
    if (pid == 0) {
      close(p[1]);
      mkernel::bootstrap::UniqueId id{};
      size_t have = 0;
      while (have < sizeof(id)) {
        const ssize_t k = ::read(p[0], id.bytes + have, sizeof(id) - have);
        if (k <= 0) _exit(9);  // the test process went away
        have += static_cast<size_t>(k);
      }
      _exit(body(r, id));
    }
    close(p[0]);
    kids.push_back(pid);
    idPipes.push_back(p[1]);
  }
  mkernel::bootstrap::UniqueId id;
  const bool created = mkernel::bootstrap::createUniqueId(&id) == Result::Success;
  CHECK(created);
  for (int fd : idPipes) {
    if (created) CHECK(write(fd, id.bytes, sizeof(id)) == static_cast<ssize_t>(sizeof(id)));
    close(fd);  // without an id the children exit 9
  }
  // Exit codes: 0 ok; 9 no id; 10 bootstrap; 11 exchange; 12 a descriptor's text or the final
  // barrier; -SIG killed by a signal (-9: by this loop, after the first failure or the deadline).
  std::vector<int> rc(kids.size(), 1000);
  const auto t0 = std::chrono::steady_clock::now();
  size_t left = kids.size();
  bool killAll = false;
  while (left > 0) {
    for (size_t i = 0; i < kids.size(); ++i) {
      if (rc[i] != 1000) continue;
      int status = 0;
      const pid_t w = waitpid(kids[i], &status, killAll ? 0 : WNOHANG);
      if (w != kids[i]) continue;
      rc[i] = WIFEXITED(status) ? WEXITSTATUS(status) : -WTERMSIG(status);
      --left;
      if (rc[i] != 0 && !killAll) {
        killAll = true;
        for (size_t j = 0; j < kids.size(); ++j)
          if (rc[j] == 1000) kill(kids[j], SIGKILL);
      }
    }
    if (!killAll && std::chrono::steady_clock::now() - t0 > std::chrono::seconds(60)) {
      killAll = true;
      for (size_t j = 0; j < kids.size(); ++j)
        if (rc[j] == 1000) kill(kids[j], SIGKILL);
    }
    if (left > 0 && !killAll) std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  for (size_t r = 0; r < kids.size(); ++r) {
    INFO("rank " << r << " exit code " << rc[r]);
    CHECK(rc[r] == 0);
  }
}
