// Transport soak (label soak, docs/RELIABILITY.md): many connections of one TCP net::Net, many
// requests in flight, random sizes (0 .. 4 MiB), random tags and grouped receives, for
// MKERNEL_SOAK_SECONDS; every byte is verified. Afterwards everything is closed and the process
// must hold exactly the file descriptors and threads it held before the Net existed.
//
// One thread drives every comm (the net::Net calls never block), so a stuck transfer shows up as
// "no request completed for MKERNEL_TIMEOUT_S" instead of a hung test.
#include <dirent.h>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <memory>
#include <numeric>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "tests/catch.h"

#include "common/param.h"
#include "tests/sanitizer.h"
#include "transport/net/net.h"

namespace mkernel {
namespace {

using Clock = std::chrono::steady_clock;
constexpr int kPairs = 8;
constexpr int kSendsInFlight = 6;   // per send comm
constexpr int kGroupsInFlight = 4;  // per recv comm
constexpr size_t kMaxMessage = size_t(4) << 20;

double since(Clock::time_point t0) {
  return std::chrono::duration<double>(Clock::now() - t0).count();
}

int countEntries(const char* dir) {
  DIR* d = opendir(dir);
  if (d == nullptr) return -1;
  int n = 0;
  while (dirent* e = readdir(d))
    if (e->d_name[0] != '.') ++n;
  closedir(d);
  return n - (std::strcmp(dir, "/proc/self/fd") == 0 ? 1 : 0);  // opendir's own fd
}

// The byte at `offset` of message `seq` of pair `pair`: cheap, position dependent, and different
// for every message, so a misrouted, shifted or stale byte is caught.
inline uint8_t patternByte(uint32_t pair, uint64_t seq, size_t offset) {
  uint64_t x = (seq * 0x9E3779B97F4A7C15ull) ^ (uint64_t(pair) << 56) ^ (offset >> 3);
  x ^= x >> 29;
  x *= 0xBF58476D1CE4E5B9ull;
  return static_cast<uint8_t>((x >> 32) + offset);
}

size_t randomSize(std::mt19937_64& rng) {
  uint64_t r = rng() % 100;
  if (r < 10) return 0;
  if (r < 55) return rng() % 4097;
  if (r < 90) return rng() % (256 * 1024 + 1);
  return rng() % (kMaxMessage + 1);
}

// One planned grouped transfer: n messages, distinct tags, sent in a shuffled order.
struct Group {
  int n = 1;
  int tags[net::kMaxGroupedRecvs];
  size_t sizes[net::kMaxGroupedRecvs];
  size_t posted[net::kMaxGroupedRecvs];  // the receiver may post more than is sent
  uint64_t seq[net::kMaxGroupedRecvs];
  int sendOrder[net::kMaxGroupedRecvs];
};

struct PendingSend {
  net::Request* req;
  std::vector<uint8_t> buf;
};
struct PendingRecv {
  net::Request* req;
  Group group;
  std::vector<std::vector<uint8_t>> bufs;
};

struct Pair {
  uint32_t id = 0;
  net::SendComm* send = nullptr;
  net::RecvComm* recv = nullptr;
  std::mt19937_64 planRng;
  std::deque<Group> planned;      // planned, some sends or the receive not yet posted
  size_t sendCursor = 0;          // next message of planned.front()... counted across groups
  std::deque<PendingSend> sends;  // posted, in posting order
  std::deque<PendingRecv> recvs;
  std::deque<Group> toReceive;  // groups whose receive is not posted yet
  uint64_t nextSeq = 0;
  uint64_t bytesVerified = 0;
  uint64_t messages = 0;
};

Group planGroup(Pair& p, int maxRecvs) {
  Group g;
  g.n = maxRecvs > 1 ? 1 + static_cast<int>(p.planRng() % maxRecvs) : 1;
  int base = static_cast<int>(p.planRng() % 1000);
  for (int j = 0; j < g.n; ++j) {
    g.tags[j] = base + j;  // distinct within the group: each send has exactly one slot
    g.sizes[j] = randomSize(p.planRng);
    g.posted[j] = g.sizes[j] + (p.planRng() % 4 == 0 ? p.planRng() % 4096 : 0);
    g.seq[j] = p.nextSeq++;
    g.sendOrder[j] = j;
  }
  std::shuffle(g.sendOrder, g.sendOrder + g.n, p.planRng);
  return g;
}

void fill(std::vector<uint8_t>* buf, uint32_t pair, uint64_t seq) {
  for (size_t i = 0; i < buf->size(); ++i) (*buf)[i] = patternByte(pair, seq, i);
}

// First differing offset, or SIZE_MAX when the buffer holds message `seq` of `pair`.
size_t firstMismatch(const uint8_t* data, size_t size, uint32_t pair, uint64_t seq) {
  for (size_t i = 0; i < size; ++i)
    if (data[i] != patternByte(pair, seq, i)) return i;
  return SIZE_MAX;
}

void connectAll(net::Net& n, std::vector<Pair>* pairs) {
  double timeout = params::timeoutSeconds();
  for (Pair& p : *pairs) {
    char handle[net::kHandleSize];
    net::ListenComm* listen = nullptr;
    REQUIRE(n.listen(0, handle, &listen) == Result::Success);
    auto t0 = Clock::now();
    while (p.send == nullptr || p.recv == nullptr) {
      if (p.send == nullptr) REQUIRE(n.connect(0, handle, &p.send) == Result::Success);
      if (p.recv == nullptr) REQUIRE(n.accept(listen, &p.recv) == Result::Success);
      REQUIRE(since(t0) < timeout);
    }
    REQUIRE(n.closeListen(listen) == Result::Success);
  }
}

// Posts what the plan allows; returns whether anything was posted.
bool postMore(net::Net& n, Pair& p, int maxRecvs, bool planning) {
  bool progressed = false;
  while (planning && p.planned.size() < 2 * kGroupsInFlight) {
    p.planned.push_back(planGroup(p, maxRecvs));
    p.toReceive.push_back(p.planned.back());
  }
  while (!p.toReceive.empty() && p.recvs.size() < kGroupsInFlight) {
    PendingRecv r{nullptr, p.toReceive.front(), {}};
    void* data[net::kMaxGroupedRecvs];
    void* mh[net::kMaxGroupedRecvs] = {};
    for (int j = 0; j < r.group.n; ++j) {
      r.bufs.emplace_back(r.group.posted[j], uint8_t(0xEE));
      data[j] = r.bufs.back().data();
    }
    REQUIRE(n.irecv(p.recv, r.group.n, data, r.group.posted, r.group.tags, mh, &r.req) ==
            Result::Success);
    if (r.req == nullptr) break;  // back-pressure
    p.recvs.push_back(std::move(r));
    p.toReceive.pop_front();
    progressed = true;
  }
  while (!p.planned.empty() && p.sends.size() < kSendsInFlight) {
    Group& g = p.planned.front();
    int j = g.sendOrder[p.sendCursor];
    PendingSend s{nullptr, std::vector<uint8_t>(g.sizes[j])};
    fill(&s.buf, p.id, g.seq[j]);
    REQUIRE(n.isend(p.send, s.buf.data(), s.buf.size(), g.tags[j], nullptr, &s.req) ==
            Result::Success);
    if (s.req == nullptr) break;
    p.sends.push_back(std::move(s));
    if (++p.sendCursor == static_cast<size_t>(g.n)) {
      p.sendCursor = 0;
      p.planned.pop_front();
    }
    progressed = true;
  }
  return progressed;
}

// Tests the oldest requests (they complete in posting order); verifies finished receives.
bool reap(net::Net& n, Pair& p) {
  bool progressed = false;
  while (!p.sends.empty()) {
    bool done = false;
    size_t size = 0;
    Result r = n.test(p.sends.front().req, &done, &size);
    INFO("pair " << p.id << " send: " << resultString(r));
    REQUIRE(r == Result::Success);
    if (!done) break;
    REQUIRE(size == p.sends.front().buf.size());
    p.sends.pop_front();
    progressed = true;
  }
  while (!p.recvs.empty()) {
    PendingRecv& rv = p.recvs.front();
    bool done = false;
    size_t sizes[net::kMaxGroupedRecvs] = {};
    Result r = n.test(rv.req, &done, sizes);
    INFO("pair " << p.id << " recv: " << resultString(r));
    REQUIRE(r == Result::Success);
    if (!done) break;
    for (int j = 0; j < rv.group.n; ++j) {
      INFO("pair " << p.id << " message " << rv.group.seq[j] << " slot " << j << " of "
                   << rv.group.n);
      REQUIRE(sizes[j] == rv.group.sizes[j]);
      size_t bad = firstMismatch(rv.bufs[j].data(), sizes[j], p.id, rv.group.seq[j]);
      INFO("first wrong byte at offset " << bad);
      REQUIRE(bad == SIZE_MAX);
      p.bytesVerified += sizes[j];
      ++p.messages;
    }
    p.recvs.pop_front();
    progressed = true;
  }
  return progressed;
}

TEST_CASE("soak: TCP net, 8 connections, random sizes/tags/groups, every byte verified") {
  const double seconds = static_cast<double>(params::SOAK_SECONDS());
  const double stallLimit = params::timeoutSeconds();
  const int fdsBefore = countEntries("/proc/self/fd");
  // ThreadSanitizer's runtime starts a thread of its own with the process's first thread
  // (scripts/test.sh tsan): let that happen before the count.
  if (mktest::kThreadSanitizer) std::thread([] {}).join();
  const int threadsBefore = countEntries("/proc/self/task");
  uint64_t totalBytes = 0, totalMessages = 0;
  double elapsed = 0.0;
  {
    std::string why;
    std::unique_ptr<net::Net> n = net::createTcpNet(&why);
    INFO(why);
    REQUIRE(n != nullptr);
    net::DeviceProps props;
    REQUIRE(n->getProperties(0, &props) == Result::Success);
    const int maxRecvs = std::min(std::max(props.maxRecvs, 1), net::kMaxGroupedRecvs);

    std::vector<Pair> pairs(kPairs);
    for (int i = 0; i < kPairs; ++i) {
      pairs[i].id = static_cast<uint32_t>(i);
      pairs[i].planRng.seed(0x5eed0000u + i);
    }
    connectAll(*n, &pairs);

    auto t0 = Clock::now(), lastProgress = t0;
    for (;;) {
      bool planning = since(t0) < seconds;
      bool progressed = false, busy = false;
      for (Pair& p : pairs) {
        progressed |= postMore(*n, p, maxRecvs, planning);
        progressed |= reap(*n, p);
        busy |= !p.sends.empty() || !p.recvs.empty() || !p.planned.empty() || !p.toReceive.empty();
      }
      if (!planning && !busy) break;
      if (progressed) lastProgress = Clock::now();
      INFO("no request completed or was accepted for " << since(lastProgress) << " s");
      REQUIRE(since(lastProgress) < stallLimit);
    }
    elapsed = since(t0);
    for (Pair& p : pairs) {
      totalBytes += p.bytesVerified;
      totalMessages += p.messages;
      REQUIRE(p.messages > 0);
      REQUIRE(n->closeSend(p.send) == Result::Success);
      REQUIRE(n->closeRecv(p.recv) == Result::Success);
    }
    WARN("soak: " << totalMessages << " messages, " << totalBytes / (1 << 20) << " MiB verified in "
                  << elapsed << " s over " << kPairs << " connections (maxRecvs " << maxRecvs
                  << ")");
  }
  // The Net is gone: its sockets, epoll fds and progress threads must be too. Threads exit
  // asynchronously after join() returns only in theory; give the kernel a moment.
  int fdsAfter = countEntries("/proc/self/fd"), threadsAfter = countEntries("/proc/self/task");
  for (int i = 0; i < 50 && (fdsAfter != fdsBefore || threadsAfter != threadsBefore); ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
    fdsAfter = countEntries("/proc/self/fd");
    threadsAfter = countEntries("/proc/self/task");
  }
  CHECK(fdsAfter == fdsBefore);
  CHECK(threadsAfter == threadsBefore);
}

}  // namespace
}  // namespace mkernel
