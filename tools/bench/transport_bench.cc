// `mkernel-bench transport`: the TCP net::Net backend over loopback, measured against the floor
// that any TCP transport has to beat: a plain blocking send/recv pair on one socket between the
// same two threads, in the same run, on the same address.
//
// Per size: the median round trip (ping-pong of `size` bytes each way, sizes up to --rtt-max) and
// the median one-way transfer time of `size` bytes, as bandwidth. Both sides are threads of this
// process; the receiver posts before each iteration starts, as NCCL's proxy does.
#include <netinet/in.h>
#include <sched.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <functional>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "common/param.h"
#include "common/result.h"
#include "tools/bench/bench.h"
#include "tools/cli.h"
#include "transport/net/net.h"
#include "transport/net/socket_iface.h"

namespace mkernel {
namespace bench {
namespace {

using Clock = std::chrono::steady_clock;

using Options = TransportOptions;

struct Row {
  size_t size;
  double floorRttUs = -1, netRttUs = -1;
  double floorGBs = 0, netGBs = 0;
};

// Two threads meet here before every iteration.
class SpinBarrier {
 public:
  void arrive() {
    int gen = generation_.load(std::memory_order_acquire);
    if (count_.fetch_add(1, std::memory_order_acq_rel) == 1) {
      count_.store(0, std::memory_order_relaxed);
      generation_.fetch_add(1, std::memory_order_acq_rel);
      return;
    }
    while (generation_.load(std::memory_order_acquire) == gen) sched_yield();
  }

 private:
  std::atomic<int> count_{0};
  std::atomic<int> generation_{0};
};

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v.empty() ? 0.0 : v[v.size() / 2];
}

double usSince(Clock::time_point t) {
  return std::chrono::duration<double, std::micro>(Clock::now() - t).count();
}

// ----- the floor: one blocking TCP socket ------------------------------------------------------

bool sendAll(int fd, const char* p, size_t n) {
  while (n > 0) {
    ssize_t w = send(fd, p, n, MSG_NOSIGNAL);
    if (w <= 0) return false;
    p += w;
    n -= static_cast<size_t>(w);
  }
  return true;
}
bool recvAll(int fd, char* p, size_t n) {
  while (n > 0) {
    ssize_t r = recv(fd, p, n, 0);
    if (r <= 0) return false;
    p += r;
    n -= static_cast<size_t>(r);
  }
  return true;
}

// A connected pair of blocking sockets on `addr` (port 0 = any).
bool socketPair(net::SocketAddr addr, int* a, int* b) {
  addr.sin.sin_port = 0;
  int l = socket(addr.sa.sa_family, SOCK_STREAM, 0);
  socklen_t len = net::socketAddrLen(addr);
  if (l < 0 || bind(l, &addr.sa, len) != 0 || listen(l, 1) != 0) return false;
  socklen_t got = sizeof(addr);
  getsockname(l, &addr.sa, &got);
  *a = socket(addr.sa.sa_family, SOCK_STREAM, 0);
  if (connect(*a, &addr.sa, len) != 0) return false;
  *b = accept(l, nullptr, nullptr);
  close(l);
  net::setNoDelay(*a);
  net::setNoDelay(*b);
  return *b >= 0;
}

// ----- net::Net helpers -------------------------------------------------------------------------

bool waitNet(net::Net& n, net::Request* req) {
  // Spin for a few microseconds (latency), then yield between polls so that progress threads
  // and the peer get a core on a small host.
  constexpr double kSpinUs = 10.0;
  auto t0 = Clock::now();
  bool done = false;
  size_t sizes[net::kMaxGroupedRecvs];
  while (!done) {
    if (n.test(req, &done, sizes) != Result::Success) {
      std::fprintf(stderr, "mkernel-bench: test failed: %s\n", lastError());
      return false;
    }
    if (!done && usSince(t0) > kSpinUs) sched_yield();
  }
  return true;
}
bool netSend(net::Net& n, net::SendComm* c, char* p, size_t size, net::Request** req) {
  *req = nullptr;
  while (*req == nullptr)
    if (n.isend(c, p, size, 0, nullptr, req) != Result::Success) return false;
  return true;
}
bool netRecv(net::Net& n, net::RecvComm* c, char* p, size_t size, net::Request** req) {
  *req = nullptr;
  void* d[1] = {p};
  size_t sz[1] = {size};
  int tags[1] = {0};
  while (*req == nullptr)
    if (n.irecv(c, 1, d, sz, tags, nullptr, req) != Result::Success) return false;
  return true;
}

bool connectNet(net::Net& n, net::SendComm** s, net::RecvComm** r) {
  char handle[net::kHandleSize];
  net::ListenComm* l = nullptr;
  if (n.listen(0, handle, &l) != Result::Success) return false;
  auto t0 = Clock::now();
  *s = nullptr;
  *r = nullptr;
  while (*s == nullptr || *r == nullptr) {
    if (*s == nullptr && n.connect(0, handle, s) != Result::Success) return false;
    if (*r == nullptr && n.accept(l, r) != Result::Success) return false;
    if (usSince(t0) > 30e6) return false;
  }
  return n.closeListen(l) == Result::Success;
}

// Runs `iters` paired iterations: `sender(i)` and `receiver(i)` on two threads after a barrier;
// returns per-iteration microseconds from the barrier to the receiver's finish.
bool timedPairs(int iters, const std::function<bool()>& prepareRecv,
                const std::function<bool()>& sender, const std::function<bool()>& receiver,
                std::vector<double>* us) {
  SpinBarrier barrier;
  std::atomic<int64_t> startNs{0};
  std::atomic<bool> ok{true};
  us->assign(static_cast<size_t>(iters), 0.0);
  std::thread recvThread([&] {
    for (int i = 0; i < iters; ++i) {
      if (ok && !prepareRecv()) ok = false;
      barrier.arrive();
      if (ok && !receiver()) ok = false;
      int64_t end = Clock::now().time_since_epoch().count();
      (*us)[static_cast<size_t>(i)] = static_cast<double>(end - startNs.load()) / 1e3;
      barrier.arrive();
    }
  });
  for (int i = 0; i < iters; ++i) {
    barrier.arrive();
    startNs.store(Clock::now().time_since_epoch().count());
    if (ok && !sender()) ok = false;
    barrier.arrive();
  }
  recvThread.join();
  return ok;
}

// Ping-pong: thread A sends and waits for the echo; returns per-round-trip microseconds.
bool timedRoundTrips(int iters, const std::function<bool()>& aSend,
                     const std::function<bool()>& aRecv, const std::function<bool()>& bRecv,
                     const std::function<bool()>& bSend, std::vector<double>* us) {
  std::atomic<bool> ok{true};
  us->assign(static_cast<size_t>(iters), 0.0);
  std::thread b([&] {
    for (int i = 0; i < iters && ok; ++i)
      if (!bRecv() || !bSend()) ok = false;
  });
  for (int i = 0; i < iters && ok; ++i) {
    auto t0 = Clock::now();
    if (!aSend() || !aRecv()) ok = false;
    (*us)[static_cast<size_t>(i)] = usSince(t0);
  }
  b.join();
  return ok;
}

}  // namespace

std::string formatSize(size_t b) {
  if (b >= (size_t(1) << 20) && b % (size_t(1) << 20) == 0) return std::to_string(b >> 20) + " MiB";
  if (b >= 1024 && b % 1024 == 0) return std::to_string(b >> 10) + " KiB";
  return std::to_string(b) + " B";
}

void addTransportOptions(CLI::App* app, TransportOptions* o) {
  mktools::listOf(app->add_option("--sizes", o->sizes, "sizes to measure (K, M, G accepted)"))
      ->transform(mktools::kSize)
      ->check(CLI::Range(uint64_t(1), uint64_t(1) << 40).description(""))
      ->default_str("8,64,512,4K,32K,256K,1M,4M,16M,64M");
  app->add_option("--iters", o->iters,
                  "timed blocks per size; a block is one one-way transfer and, for small sizes, 10 "
                  "round trips, "
                  "first the floor's, then the net's (median reported)")
      ->check(mktools::kPositive)
      ->capture_default_str();
  app->add_option("--warmup", o->warmup, "untimed blocks first")
      ->check(mktools::kNonNegative)
      ->capture_default_str();
  app->add_option("--rtt-max", o->rttMax, "largest size whose round trip is measured")
      ->transform(mktools::kSize)
      ->default_str("64K");
  app->add_option("--csv", o->csv, "also write the table as CSV")->type_name("FILE");
}

int runTransportBench(const TransportOptions& o) {
  std::string why;
  std::unique_ptr<net::Net> n = net::createTcpNet(&why);
  if (!n) {
    std::fprintf(stderr, "mkernel-bench: no TCP net: %s\n", why.c_str());
    return 1;
  }
  net::DeviceProps props;
  n->getProperties(0, &props);
  std::vector<net::NetInterface> ifs;
  bool fallback = false;
  findNetInterfaces(paramString("SOCKET_IFNAME"), &ifs, &fallback, &why);
  if (ifs.empty() || ifs[0].name != props.name) {
    std::fprintf(stderr, "mkernel-bench: cannot find the address of %s\n", props.name.c_str());
    return 1;
  }
  int fa = -1, fb = -1;
  if (!socketPair(ifs[0].addr, &fa, &fb)) {
    std::fprintf(stderr, "mkernel-bench: cannot make the floor's socket pair: %s\n",
                 strerror(errno));
    return 1;
  }
  net::SendComm *ab = nullptr, *ba = nullptr;
  net::RecvComm *abR = nullptr, *baR = nullptr;
  if (!connectNet(*n, &ab, &abR) || !connectNet(*n, &ba, &baR)) {
    std::fprintf(stderr, "mkernel-bench: cannot connect the TCP net: %s\n", lastError());
    return 1;
  }
  size_t maxSize = *std::max_element(o.sizes.begin(), o.sizes.end());
  std::vector<char> src(maxSize), dst(maxSize), echo(maxSize);
  std::mt19937 rng(7);
  for (auto& c : src) c = static_cast<char>(rng());

  std::printf(
      "# mkernel-bench transport: TCP net on %s (%s), %s socket(s)/connection, chunk %s, inline "
      "progress %s\n",
      props.name.c_str(), net::socketAddrToString(ifs[0].addr).c_str(),
      paramString("NET_SOCKETS").c_str(),
      formatSize(static_cast<size_t>(paramInt("NET_CHUNK_BYTES"))).c_str(),
      paramString("NET_INLINE_PROGRESS").c_str());
  std::printf(
      "# floor = blocking send/recv on one TCP socket, same address, same run, interleaved with "
      "the net; median of %d blocks after %d warm-up\n",
      o.iters, o.warmup);
  std::printf("# %12s %14s %12s %12s %10s %10s\n", "size", "floor rtt us", "net rtt us",
              "floor GB/s", "net GB/s", "net/floor");
  std::vector<Row> rows;
  int total = o.iters + o.warmup;
  for (size_t size : o.sizes) {
    Row row{size};
    std::fprintf(stderr, "[mkernel-bench] %s:", formatSize(size).c_str());
    std::memset(dst.data(), 0, size);
    // Floor and net take turns block by block, so that both see the same load on a shared host.
    std::vector<double> floorRtt, netRtt, floorOneWay, netOneWay, us;
    net::Request *aReq = nullptr, *bReq = nullptr, *posted = nullptr;
    bool ok = true;
    for (int block = 0; block < total && ok; ++block) {
      bool keep = block >= o.warmup;
      if (size <= o.rttMax) {
        ok = ok && timedRoundTrips(
                       10, [&] { return sendAll(fa, src.data(), size); },
                       [&] { return recvAll(fa, dst.data(), size); },
                       [&] { return recvAll(fb, echo.data(), size); },
                       [&] { return sendAll(fb, echo.data(), size); }, &us);
        if (keep) floorRtt.insert(floorRtt.end(), us.begin(), us.end());
        ok = ok &&
             timedRoundTrips(
                 10, [&] { return netSend(*n, ab, src.data(), size, &aReq) && waitNet(*n, aReq); },
                 [&] { return netRecv(*n, baR, dst.data(), size, &aReq) && waitNet(*n, aReq); },
                 [&] { return netRecv(*n, abR, echo.data(), size, &bReq) && waitNet(*n, bReq); },
                 [&] { return netSend(*n, ba, echo.data(), size, &bReq) && waitNet(*n, bReq); },
                 &us);
        if (keep) netRtt.insert(netRtt.end(), us.begin(), us.end());
      }
      ok = ok && timedPairs(
                     1, [] { return true; }, [&] { return sendAll(fa, src.data(), size); },
                     [&] { return recvAll(fb, dst.data(), size); }, &us);
      if (keep) floorOneWay.push_back(us[0]);
      ok = ok && timedPairs(
                     1, [&] { return netRecv(*n, abR, dst.data(), size, &posted); },
                     [&] { return netSend(*n, ab, src.data(), size, &aReq) && waitNet(*n, aReq); },
                     [&] { return waitNet(*n, posted); }, &us);
      if (keep) netOneWay.push_back(us[0]);
      if (block % 10 == 9) std::fprintf(stderr, " %d", block + 1);
    }
    if (!floorRtt.empty()) row.floorRttUs = median(floorRtt);
    if (!netRtt.empty()) row.netRttUs = median(netRtt);
    row.floorGBs = size / (median(floorOneWay) * 1e3);
    row.netGBs = size / (median(netOneWay) * 1e3);
    if (!ok) {
      std::fprintf(stderr, "\nmkernel-bench: a transfer failed at size %zu\n", size);
      return 1;
    }
    if (std::memcmp(dst.data(), src.data(), size) != 0) {
      std::fprintf(stderr, "\nmkernel-bench: data mismatch at size %zu\n", size);
      return 1;
    }
    std::fprintf(stderr, " done (floor %.3f GB/s, net %.3f GB/s)\n", row.floorGBs, row.netGBs);
    char rtt[2][32];
    std::snprintf(rtt[0], sizeof(rtt[0]), row.floorRttUs < 0 ? "-" : "%.1f", row.floorRttUs);
    std::snprintf(rtt[1], sizeof(rtt[1]), row.netRttUs < 0 ? "-" : "%.1f", row.netRttUs);
    std::printf("  %12s %14s %12s %12.3f %10.3f %10.2f\n", formatSize(size).c_str(), rtt[0], rtt[1],
                row.floorGBs, row.netGBs, row.netGBs / row.floorGBs);
    std::fflush(stdout);
    rows.push_back(row);
  }
  n->closeSend(ab);
  n->closeSend(ba);
  n->closeRecv(abR);
  n->closeRecv(baR);
  close(fa);
  close(fb);
  if (!o.csv.empty()) {
    FILE* f = std::fopen(o.csv.c_str(), "w");
    if (f == nullptr) {
      std::fprintf(stderr, "mkernel-bench: cannot write %s: %s\n", o.csv.c_str(), strerror(errno));
      return 1;
    }
    std::fprintf(f, "size_bytes,floor_rtt_us,net_rtt_us,floor_GBps,net_GBps,net_over_floor\n");
    for (const Row& r : rows)
      std::fprintf(f, "%zu,%.2f,%.2f,%.4f,%.4f,%.4f\n", r.size, r.floorRttUs, r.netRttUs,
                   r.floorGBs, r.netGBs, r.netGBs / r.floorGBs);
    std::fclose(f);
  }
  return 0;
}

}  // namespace bench
}  // namespace mkernel
