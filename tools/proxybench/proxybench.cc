// mkernel-proxybench: what the proxy costs per chunk (issue 6: "report the proxy's per-chunk
// overhead"; docs/PROXY.md, docs/PERFORMANCE.md). Two ranks in one process, each with a Proxy
// (transport/proxy) over the net backend MKERNEL_NET_BACKEND picks (TCP on loopback by default;
// verbs in the Soft-RoCE VM), and a thread per rank playing the GPU producer: it writes commands
// into the proxy ring and polls the completion counters, as a CTA of the persistent kernel does.
// The same transfers then run straight on net::Net from the two threads, with no proxy between.
//
// Per size:
//   - ping-pong: rank 0 sends a chunk, rank 1 sends it back; the median round trip over --iters
//     (after --warmup), through the proxies and straight on the net;
//   - stream: rank 0 sends --stream chunks back to back, all in flight at once (the pipelined
//     hierarchical algorithm's pattern); time per chunk until rank 1 has them all, median of
//     --reps runs.
// The proxy's per-chunk overhead is (proxy round trip - net round trip) / 2 one way, and the
// difference of the two streams' times per chunk. The GPU side (the CTA's host-mapped write
// across PCIe, the proxy's flag write back) is not in it: there is no GPU here.
//   mkernel-proxybench [--min-bytes 8] [--max-bytes 4M] [--step 4] [--iters 1000]
//                      [--warmup 100] [--stream 64 (at most 128)] [--reps 20] [--csv FILE]
// A progress line per size on stderr; the table on stdout. Exit status 0 when every transfer
// completed and the streamed bytes arrived intact (a failure names the step).
#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "common/log.h"
#include "common/result.h"
#include "tools/cli.h"
#include "transport/net/backend.h"
#include "transport/net/net.h"
#include "transport/proxy/proxy.h"
#include "transport/proxy/proxy_ring.h"

using mkernel::Result;
namespace net = mkernel::net;
namespace px = mkernel::proxy;

namespace {

struct Options {
  size_t minBytes = 8, maxBytes = size_t(4) << 20, step = 4;
  int iters = 1000, warmup = 100, stream = 64, reps = 20;
  std::string csv;
};

constexpr uint64_t kTimeoutNs = 30ull * 1000000000ull;

double nowUs() {
  return std::chrono::duration<double, std::micro>(
             std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

double median(std::vector<double> v) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

[[noreturn]] void die(const std::string& what) {
  std::fprintf(stderr, "mkernel-proxybench: %s: %s\n", what.c_str(), mkernel::lastError());
  std::exit(1);
}

// Runs f(0) and f(1) on two threads and joins them.
void both(const std::function<void(int)>& f) {
  std::thread t1([&] { f(1); });
  f(0);
  t1.join();
}

// One rank's proxy side: its ring, flags, buffers and proxy (2 ranks).
struct ProxySide {
  px::ProxyRing ring{};
  px::ProxyFlags flags{};
  std::vector<uint8_t> send, recv;
  std::unique_ptr<px::Proxy> proxy;
  uint64_t posted[2] = {0, 0};  // commands posted per flag (0: sends, 1: receives)
};

struct ProxyPair {
  ProxySide s[2];
  ProxyPair(net::Net* n, size_t bytes, int streamChunks) {
    for (int r = 0; r < 2; ++r) {
      std::memset(&s[r].ring, 0, sizeof(s[r].ring));
      std::memset(&s[r].flags, 0, sizeof(s[r].flags));
      s[r].send.assign(bytes * static_cast<size_t>(streamChunks), static_cast<uint8_t>(r + 1));
      s[r].recv.assign(bytes * static_cast<size_t>(streamChunks), 0);
      s[r].proxy.reset(new px::Proxy(n, 0, r, 2, &s[r].ring, &s[r].flags));
    }
    std::vector<px::Handle> h[2];
    for (int r = 0; r < 2; ++r)
      if (s[r].proxy->listenHandles(&h[r]) != Result::Success) die("proxy listen");
    Result res[2];
    both([&](int r) {
      std::vector<px::Handle> from(2);
      from[static_cast<size_t>(1 - r)] = h[1 - r][static_cast<size_t>(r)];
      res[r] = s[r].proxy->connectAll(from);
    });
    for (int r = 0; r < 2; ++r) {
      if (res[r] != Result::Success) die("proxy connect");
      if (s[r].proxy->registerRegion(s[r].send.data(), s[r].send.size(), net::kPtrHost) !=
              Result::Success ||
          s[r].proxy->registerRegion(s[r].recv.data(), s[r].recv.size(), net::kPtrHost) !=
              Result::Success)
        die("proxy register");
      if (s[r].proxy->start({}) != Result::Success) die("proxy start");
    }
  }
  ~ProxyPair() {
    for (auto& x : s) (void)x.proxy->stop();
  }
  void post(int r, uint32_t op, const void* addr, uint64_t bytes, int tag) {
    ProxySide& x = s[r];
    px::ProxyCmd c{};
    c.op = op;
    c.peer = 1 - r;
    c.addr = reinterpret_cast<uint64_t>(addr);
    c.bytes = bytes;
    c.tag = tag;
    c.flag = op == px::kOpSend ? 0 : 1;
    if (px::proxyPost(&x.ring, &x.flags, c, kTimeoutNs) != px::PostStatus::kPosted)
      die("rank " + std::to_string(r) + ": posting to the proxy ring: " + x.proxy->error());
    ++x.posted[c.flag];
  }
  void wait(int r, uint32_t flag) {  // every command posted on `flag` so far has completed
    ProxySide& x = s[r];
    if (px::proxyWaitFlag(&x.flags, flag, x.posted[flag], kTimeoutNs) != px::WaitStatus::kReached)
      die("rank " + std::to_string(r) + ": waiting for the proxy: " + x.proxy->error());
  }
};

// The same two ranks straight on net::Net: rank r sends on send[r] and receives on recv[r].
struct NetPair {
  net::Net* n;
  net::SendComm* send[2] = {nullptr, nullptr};
  net::RecvComm* recv[2] = {nullptr, nullptr};
  void* sendMr[2] = {nullptr, nullptr};
  void* recvMr[2] = {nullptr, nullptr};
  std::vector<uint8_t> sbuf[2], rbuf[2];
  NetPair(net::Net* net_, size_t bytes, int streamChunks) : n(net_) {
    uint8_t handle[2][net::kHandleSize];
    net::ListenComm* listen[2] = {nullptr, nullptr};
    for (int r = 0; r < 2; ++r)
      if (n->listen(0, handle[r], &listen[r]) != Result::Success) die("net listen");
    // Rank r connects to the other's listener and accepts the other's connection: both at once.
    const double deadline = nowUs() + 30e6;
    while (send[0] == nullptr || send[1] == nullptr || recv[0] == nullptr || recv[1] == nullptr) {
      for (int r = 0; r < 2; ++r) {
        if (send[r] == nullptr && n->connect(0, handle[1 - r], &send[r]) != Result::Success)
          die("net connect");
        if (recv[r] == nullptr && n->accept(listen[r], &recv[r]) != Result::Success)
          die("net accept");
      }
      if (nowUs() > deadline) die("net connect: timed out");
    }
    for (int r = 0; r < 2; ++r) {
      (void)n->closeListen(listen[r]);
      sbuf[r].assign(bytes * static_cast<size_t>(streamChunks), static_cast<uint8_t>(r + 1));
      rbuf[r].assign(bytes * static_cast<size_t>(streamChunks), 0);
      if (n->regMr(send[r], sbuf[r].data(), sbuf[r].size(), net::kPtrHost, &sendMr[r]) !=
              Result::Success ||
          n->regMr(recv[r], rbuf[r].data(), rbuf[r].size(), net::kPtrHost, &recvMr[r]) !=
              Result::Success)
        die("net register");
    }
  }
  ~NetPair() {
    for (int r = 0; r < 2; ++r) {
      (void)n->deregMr(send[r], sendMr[r]);
      (void)n->deregMr(recv[r], recvMr[r]);
      (void)n->closeSend(send[r]);
      (void)n->closeRecv(recv[r]);
    }
  }
  // One try: null on back-pressure (the transport holds as many requests per comm as it allows).
  net::Request* trySend(int r, const void* p, size_t bytes, int tag) {
    net::Request* q = nullptr;
    if (n->isend(send[r], const_cast<void*>(p), bytes, tag, sendMr[r], &q) != Result::Success)
      die("net isend");
    return q;
  }
  net::Request* tryRecv(int r, void* p, size_t bytes, int tag) {
    net::Request* q = nullptr;
    if (n->irecv(recv[r], 1, &p, &bytes, &tag, &recvMr[r], &q) != Result::Success) die("net irecv");
    return q;
  }
  net::Request* isend(int r, const void* p, size_t bytes, int tag) {
    net::Request* q = nullptr;
    while (q == nullptr) q = trySend(r, p, bytes, tag);
    return q;
  }
  net::Request* irecv(int r, void* p, size_t bytes, int tag) {
    net::Request* q = nullptr;
    while (q == nullptr) q = tryRecv(r, p, bytes, tag);
    return q;
  }
  // Posts `count` transfers (post(i) makes the i-th, or null on back-pressure) and completes them
  // all, testing the ones in flight while the transport pushes back, as the proxy does.
  void stream(int count, const std::function<net::Request*(int)>& post) {
    std::vector<net::Request*> q;
    int posted = 0;
    size_t left = 0;
    while (posted < count || left > 0) {
      if (posted < count) {
        if (net::Request* r = post(posted)) {
          q.push_back(r);
          ++posted;
          ++left;
          continue;
        }
      }
      left -= progress(q);
    }
  }
  // Tests every request still in `qs` once; a completed one becomes null. Returns how many
  // completed.
  size_t progress(std::vector<net::Request*>& qs) {
    size_t completed = 0;
    for (auto& q : qs) {
      if (q == nullptr) continue;
      bool done = false;
      size_t sizes[1] = {0};
      if (n->test(q, &done, sizes) != Result::Success) die("net test");
      if (done) {
        q = nullptr;
        ++completed;
      }
    }
    return completed;
  }
  void waitAll(std::vector<net::Request*>& qs) {
    size_t left = std::count_if(qs.begin(), qs.end(), [](net::Request* q) { return q != nullptr; });
    while (left > 0) left -= progress(qs);
  }
};

// A two-thread start line, so that both sides begin a timed step together.
struct StartLine {
  std::atomic<int> arrived{0};
  void pass(int gen) {  // gen: 1, 2, ... (each step's own)
    arrived.fetch_add(1);
    while (arrived.load() < 2 * gen) std::this_thread::yield();
  }
};

// Median time per chunk over o.reps streams of o.stream chunks: `send` runs on rank 0 from a
// start line both ranks pass, `receive` on rank 1 until it has every chunk.
double streamTime(const Options& o, const std::function<void()>& send,
                  const std::function<void()>& receive) {
  std::vector<double> per;
  StartLine line;
  for (int rep = 0; rep < o.reps; ++rep) {
    double t0 = 0, t1 = 0;
    both([&](int r) {
      line.pass(rep + 1);
      if (r == 0) {
        t0 = nowUs();
        send();
      } else {
        receive();
        t1 = nowUs();
      }
    });
    per.push_back((t1 - t0) / o.stream);
  }
  return median(per);
}

struct Row {
  size_t bytes = 0;
  double netRtt = 0, proxyRtt = 0, netStream = 0, proxyStream = 0;
};

Row measure(net::Net* n, size_t bytes, const Options& o) {
  Row row;
  row.bytes = bytes;
  const int total = o.warmup + o.iters;
  {  // straight on the net
    NetPair p(n, bytes, o.stream);
    std::vector<double> rtt;
    both([&](int r) {
      for (int i = 0; i < total; ++i) {
        if (r == 0) {
          const double t0 = nowUs();
          std::vector<net::Request*> q = {p.irecv(0, p.rbuf[0].data(), bytes, 1),
                                          p.isend(0, p.sbuf[0].data(), bytes, 0)};
          p.waitAll(q);
          if (i >= o.warmup) rtt.push_back(nowUs() - t0);
        } else {
          std::vector<net::Request*> q = {p.irecv(1, p.rbuf[1].data(), bytes, 0)};
          p.waitAll(q);
          q = {p.isend(1, p.sbuf[1].data(), bytes, 1)};
          p.waitAll(q);
        }
      }
    });
    row.netRtt = median(rtt);
    row.netStream = streamTime(
        o,
        [&] {
          p.stream(o.stream,
                   [&](int c) { return p.trySend(0, p.sbuf[0].data() + c * bytes, bytes, 2); });
        },
        [&] {
          p.stream(o.stream,
                   [&](int c) { return p.tryRecv(1, p.rbuf[1].data() + c * bytes, bytes, 2); });
        });
    // Rank 0's buffer holds 1s: every chunk rank 1 received must too.
    if (std::any_of(p.rbuf[1].begin(), p.rbuf[1].end(), [](uint8_t v) { return v != 1; }))
      die("net stream of " + std::to_string(bytes) +
          "-byte chunks: received bytes differ from those sent");
  }
  {  // through the proxies
    ProxyPair p(n, bytes, o.stream);
    std::vector<double> rtt;
    both([&](int r) {
      ProxySide& x = p.s[r];
      for (int i = 0; i < total; ++i) {
        if (r == 0) {
          const double t0 = nowUs();
          p.post(0, px::kOpRecv, x.recv.data(), bytes, 1);
          p.post(0, px::kOpSend, x.send.data(), bytes, 0);
          p.wait(0, 1);
          if (i >= o.warmup) rtt.push_back(nowUs() - t0);
          p.wait(0, 0);
        } else {
          p.post(1, px::kOpRecv, x.recv.data(), bytes, 0);
          p.wait(1, 1);
          p.post(1, px::kOpSend, x.send.data(), bytes, 1);
          p.wait(1, 0);
        }
      }
    });
    row.proxyRtt = median(rtt);
    row.proxyStream = streamTime(
        o,
        [&] {
          for (int c = 0; c < o.stream; ++c)
            p.post(0, px::kOpSend, p.s[0].send.data() + c * bytes, bytes, 2);
          p.wait(0, 0);
        },
        [&] {
          for (int c = 0; c < o.stream; ++c)
            p.post(1, px::kOpRecv, p.s[1].recv.data() + c * bytes, bytes, 2);
          p.wait(1, 1);
        });
    if (std::any_of(p.s[1].recv.begin(), p.s[1].recv.end(), [](uint8_t v) { return v != 1; }))
      die("proxy stream of " + std::to_string(bytes) +
          "-byte chunks: received bytes differ from those sent");
  }
  return row;
}

// The command line into *o. -1: run; otherwise the exit status (tools/cli.h).
int parse(int argc, char** argv, Options* o) {
  CLI::App app(
      "The proxy's per-chunk overhead against the bare net::Net: two ranks in one process over the "
      "net\n"
      "backend MKERNEL_NET_BACKEND picks, a thread per rank playing the GPU producer "
      "(docs/PROXY.md).",
      "mkernel-proxybench");
  mktools::setupApp(app);
  app.add_option("--min-bytes", o->minBytes, "smallest chunk (K, M, G accepted)")
      ->transform(mktools::kSize)
      ->check(mktools::kPositive)
      ->capture_default_str();
  app.add_option("--max-bytes", o->maxBytes, "largest chunk")
      ->transform(mktools::kSize)
      ->capture_default_str();
  app.add_option("--step", o->step, "size multiplier from one row to the next")
      ->check(CLI::Range(2, 1 << 20))
      ->capture_default_str();
  app.add_option("--iters", o->iters, "ping-pong round trips per size")
      ->check(mktools::kPositive)
      ->capture_default_str();
  app.add_option("--warmup", o->warmup, "untimed round trips first")
      ->check(mktools::kNonNegative)
      ->capture_default_str();
  app.add_option("--stream", o->stream, "chunks in flight per stream run")
      ->check(CLI::Range(1, static_cast<int>(px::kRingSlots) / 2))
      ->capture_default_str();
  app.add_option("--reps", o->reps, "stream runs per size (median)")
      ->check(mktools::kPositive)
      ->capture_default_str();
  app.add_option("--csv", o->csv, "also write the table as CSV")->type_name("FILE");
  const int rc = mktools::parseArgs(app, argc, argv);
  if (rc >= 0) return rc;
  if (o->maxBytes < o->minBytes)
    return mktools::usageError(app, "--max-bytes is below --min-bytes");
  return -1;
}

}  // namespace

int main(int argc, char** argv) {
  Options o;
  const int rc = parse(argc, argv, &o);
  if (rc >= 0) return rc;
  net::BackendChoice choice;
  if (net::createNetBackend({}, &choice) != Result::Success) die("net backend");
  std::printf("# proxy per-chunk overhead: 2 ranks in one process over %s (%s)\n",
              choice.net->name(), choice.why.c_str());
  std::printf(
      "# ping-pong: median round trip of %d (after %d warm-up); stream: %d chunks posted back to "
      "back (as many in flight as the transport takes), time per chunk, "
      "median of %d runs; overhead = proxy - net (one way: half the round trip)\n",
      o.iters, o.warmup, o.stream, o.reps);
  std::printf("%12s %12s %12s %14s %14s %14s %14s\n", "bytes", "net_rtt_us", "proxy_rtt_us",
              "overhead_1way", "net_stream_us", "proxy_stream", "overhead_chunk");
  std::vector<Row> rows;
  for (size_t b = o.minBytes; b <= o.maxBytes; b *= o.step) {
    std::fprintf(stderr, "mkernel-proxybench: %zu bytes ...\n", b);
    Row r = measure(choice.net.get(), b, o);
    rows.push_back(r);
    std::printf("%12zu %12.2f %12.2f %14.2f %14.2f %14.2f %14.2f\n", r.bytes, r.netRtt, r.proxyRtt,
                (r.proxyRtt - r.netRtt) / 2, r.netStream, r.proxyStream,
                r.proxyStream - r.netStream);
    std::fflush(stdout);
  }
  if (!o.csv.empty()) {
    FILE* f = std::fopen(o.csv.c_str(), "w");
    if (f == nullptr) {
      std::fprintf(stderr, "mkernel-proxybench: cannot write %s\n", o.csv.c_str());
      return 1;
    }
    std::fprintf(f,
                 "bytes,net_rtt_us,proxy_rtt_us,overhead_1way_us,net_stream_us,proxy_stream_us,"
                 "overhead_chunk_us\n");
    for (const Row& r : rows)
      std::fprintf(f, "%zu,%.3f,%.3f,%.3f,%.3f,%.3f,%.3f\n", r.bytes, r.netRtt, r.proxyRtt,
                   (r.proxyRtt - r.netRtt) / 2, r.netStream, r.proxyStream,
                   r.proxyStream - r.netStream);
    std::fclose(f);
  }
  return 0;
}
