// The two-host verbs test: two QEMU VMs joined by a socket netdev (scripts/rdma-vm/pair.sh), rxe0
// on each. Run by scripts/verbs-tier.sh as
//   verbs_pair server <shared dir> [verify|lossy|cut]     (VM 1, 198.51.100.1)
//   verbs_pair client <shared dir> [verify|lossy|cut]     (VM 2, 198.51.100.2)
// Each side listens and publishes its handle as a file in the shared directory (both VMs see the
// host folder the tier runs in), connects to the other's, then: the client sends messages of
// 0 B .. 4 MiB, the server checks every byte and echoes each back, the client checks the echo.
// Prints the device properties and a bandwidth figure (TCG: correctness, not performance).
// Modes (docs/RELIABILITY.md, "Network faults"):
//   verify  (default) the exchange above; exit 0 only if every byte arrived intact.
//   lossy   the same exchange while the tier's netem qdisc drops and delays packets on eth0 of both
//           VMs: RC retransmission must deliver every byte. Afterwards each side reads the qdisc's
//           drop count and rxe0's retransmission counters and fails if nothing was dropped (a
//           fault that was never injected proves nothing).
//   cut     a few verified messages, then the client makes its eth0 drop every packet (netem loss
//           100%, as a cable pulled between switches: the link stays up) and both sides keep
//           going: each must get an error, not a hang, within MKERNEL_TIMEOUT_S plus slack, and
//           closing the broken comms must return. With MKERNEL_IB_RETRY_CNT below 7 the client's
//           error must be its write's verbs completion status (retry exceeded); with 7, which
//           Soft-RoCE treats as infinite, it must be the MKERNEL_TIMEOUT_S error.
// Env: VP_IFACE (default eth0), VP_CUT_BOUND_S (default MKERNEL_TIMEOUT_S + 10).
#include <sys/stat.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <string>
#include <thread>
#include <vector>

#include "common/param.h"
#include "common/result.h"
#include "transport/net/net.h"

namespace net = mkernel::net;
using mkernel::Result;
using Clock = std::chrono::steady_clock;

namespace {

double since(Clock::time_point t) {
  return std::chrono::duration<double>(Clock::now() - t).count();
}

int die(const char* what) {
  std::fprintf(stderr, "verbs_pair: %s: %s\n", what, mkernel::lastError());
  return 1;
}

bool publish(const std::string& path, const char* handle) {
  std::string tmp = path + ".tmp";
  std::ofstream f(tmp, std::ios::binary);
  f.write(handle, net::kHandleSize);
  f.close();
  return f.good() && std::rename(tmp.c_str(), path.c_str()) == 0;
}

bool fetch(const std::string& path, char* handle, double timeoutS) {
  auto t0 = Clock::now();
  while (since(t0) < timeoutS) {
    std::ifstream f(path, std::ios::binary);
    if (f.read(handle, net::kHandleSize) && f.gcount() == net::kHandleSize) return true;
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  return false;
}

void fill(std::vector<char>& v, size_t n, uint32_t seed) {
  uint32_t x = seed * 2654435761u + 1;
  for (size_t i = 0; i < n; ++i) {
    x = x * 1664525u + 1013904223u;
    v[i] = char(x >> 24);
  }
}

// A request that is neither done nor failed after 60 s is a hang: the test's own bound, far
// above MKERNEL_TIMEOUT_S in every mode.
constexpr double kHangS = 60;
bool gHung = false;

Result waitDone(net::Net& n, net::Request* r, size_t* sizes) {
  bool done = false;
  auto t0 = Clock::now();
  while (!done) {
    Result res = n.test(r, &done, sizes);
    if (res != Result::Success) return res;
    if (since(t0) > kHangS) {
      gHung = true;
      return MK_ERROR(Result::RemoteError, "verbs_pair: request not done after %.0f s", kHangS);
    }
  }
  return Result::Success;
}

// The first line of a command's output that contains `key`, or "".
std::string commandLine(const std::string& cmd, const char* key) {
  std::string found;
  FILE* f = popen((cmd + " 2>&1").c_str(), "r");
  if (f == nullptr) return found;
  char line[512];
  while (fgets(line, sizeof(line), f) != nullptr)
    if (found.empty() && std::strstr(line, key) != nullptr) found = line;
  pclose(f);
  while (!found.empty() && (found.back() == '\n' || found.back() == ' ')) found.pop_back();
  return found;
}

long long counterAfter(const std::string& text, const char* word) {
  size_t at = text.find(word);
  return at == std::string::npos ? -1 : std::atoll(text.c_str() + at + std::strlen(word));
}

long long rxeCounter(const char* name) {
  std::ifstream f(std::string("/sys/class/infiniband/rxe0/ports/1/hw_counters/") + name);
  long long v = -1;
  f >> v;
  return f ? v : -1;
}

const char* iface() {
  const char* v = std::getenv("VP_IFACE");
  return v != nullptr && *v != 0 ? v : "eth0";
}

// lossy mode: what the qdisc dropped and what rxe retransmitted; false if netem dropped nothing.
bool reportFaults(const char* role) {
  std::string qdisc = commandLine(std::string("tc -s qdisc show dev ") + iface(), "dropped");
  long long dropped = counterAfter(qdisc, "dropped ");
  std::printf("[%s] netem on %s: %s\n", role, iface(),
              qdisc.empty() ? "(no statistics)" : qdisc.c_str());
  std::printf(
      "[%s] rxe0: completer_retry_err %lld, rcvd_seq_err %lld, out_of_seq_request %lld, "
      "duplicate_request %lld\n",
      role, rxeCounter("completer_retry_err"), rxeCounter("rcvd_seq_err"),
      rxeCounter("out_of_seq_request"), rxeCounter("duplicate_request"));
  if (dropped <= 0) {
    std::fprintf(stderr,
                 "verbs_pair: %s: lossy mode, but netem on %s dropped no packet: the fault was not "
                 "injected\n",
                 role, iface());
    return false;
  }
  return true;
}

int retryCount() {
  return static_cast<int>(mkernel::params::IB_RETRY_CNT());
}

double cutBoundSeconds() {
  if (const char* v = std::getenv("VP_CUT_BOUND_S")) return std::atof(v);
  return mkernel::params::timeoutSeconds() + 10.0;
}

// cut mode, after the verified messages: the client cuts its side, then both sides move data
// until the backend fails a request. Exit status 0 only if that happened within the bound.
int cutPhase(net::Net& n, bool server, net::SendComm* sc, net::RecvComm* rc, std::vector<char>& out,
             std::vector<char>& in, void* outMh, void* inMh) {
  const char* role = server ? "server" : "client";
  // The client cuts first, then keeps posting: its next RDMA write goes into the dead link (the
  // server's clear-to-send still reaches it: only the client's egress drops), so its QP retries
  // until IB_RETRY_CNT runs out (IBV_WC_RETRY_EXC_ERR) and the error must carry that verbs
  // status. Soft-RoCE treats a retry count of 7 (NCCL's and our default) as infinite, unlike the IB
  // spec and real NICs, so with the default it is MKERNEL_TIMEOUT_S that must end the wait; the
  // tier runs both. The server, waiting for data, can only time out.
  const bool expectRetryExceeded = !server && retryCount() < 7;
  if (!server) {
    std::string cmd = std::string("tc qdisc replace dev ") + iface() + " root netem loss 100%";
    if (std::system(cmd.c_str()) != 0) {
      std::fprintf(stderr, "verbs_pair: client: '%s' failed\n", cmd.c_str());
      return 1;
    }
    std::printf("[client] %s: every packet out of %s is now dropped\n", cmd.c_str(), iface());
  }
  auto tCut = Clock::now();
  const size_t kMsg = size_t(4) << 20;
  std::string error;
  int moved = 0;
  while (error.empty() && since(tCut) < kHangS) {
    void* d[1] = {in.data()};
    size_t posted[1] = {kMsg};
    int tags[1] = {server ? 1 : 2};
    void* mhs[1] = {inMh};
    net::Request* r = nullptr;
    while (r == nullptr && error.empty())
      if (n.irecv(rc, 1, d, posted, tags, mhs, &r) != Result::Success) error = mkernel::lastError();
    net::Request* s = nullptr;
    while (s == nullptr && error.empty() && since(tCut) < kHangS) {
      if (n.isend(sc, out.data(), kMsg, server ? 2 : 1, outMh, &s) != Result::Success)
        error = mkernel::lastError();
      // The peer's clear-to-send never comes: the posted receive's own test is what times out.
      size_t got[1];
      bool done = false;
      if (s == nullptr && error.empty() && r != nullptr && n.test(r, &done, got) != Result::Success)
        error = mkernel::lastError();
    }
    size_t sz[1];
    if (error.empty() && s != nullptr && waitDone(n, s, sz) != Result::Success)
      error = mkernel::lastError();
    if (error.empty() && r != nullptr && waitDone(n, r, sz) != Result::Success)
      error = mkernel::lastError();
    if (error.empty()) ++moved;
  }
  double failedAfter = since(tCut);
  if (error.empty()) {
    std::fprintf(
        stderr,
        "verbs_pair: %s: link cut, but no request failed in %.0f s (%d messages still moved)\n",
        role, failedAfter, moved);
    return 1;
  }
  std::printf("[%s] link cut: error after %.2f s (%d messages moved after the cut): %s\n", role,
              failedAfter, moved, error.c_str());
  auto tClose = Clock::now();
  n.deregMr(sc, outMh);
  n.deregMr(rc, inMh);
  n.closeSend(sc);
  n.closeRecv(rc);
  std::printf("[%s] closed the broken comms in %.2f s\n", role, since(tClose));
  const double bound = cutBoundSeconds();
  // ibv_wc_status_str(IBV_WC_RETRY_EXC_ERR), and the status number the backend prints beside it.
  const bool retryExceeded = error.find("retry counter exceeded") != std::string::npos &&
                             error.find("(status 12,") != std::string::npos;
  if (expectRetryExceeded && !retryExceeded) {
    std::fprintf(
        stderr,
        "verbs_pair: client: with MKERNEL_IB_RETRY_CNT=%d the write into the cut link should "
        "fail with its verbs completion status (retry exceeded), not: %s\n",
        retryCount(), error.c_str());
    return 1;
  }
  if (!expectRetryExceeded && error.find("MKERNEL_TIMEOUT_S") == std::string::npos) {
    std::fprintf(stderr, "verbs_pair: %s: expected the MKERNEL_TIMEOUT_S error, got: %s\n", role,
                 error.c_str());
    return 1;
  }
  if (gHung || failedAfter > bound) {
    std::fprintf(stderr, "verbs_pair: %s: the error came after %.2f s, over the bound of %.0f s\n",
                 role, failedAfter, bound);
    return 1;
  }
  if (since(tClose) > 10) {
    std::fprintf(stderr, "verbs_pair: %s: closing the broken comms took %.2f s\n", role,
                 since(tClose));
    return 1;
  }
  std::printf("[%s] OK (cut)\n", role);
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  const std::string mode = argc == 4 ? argv[3] : "verify";
  if (argc < 3 || argc > 4 ||
      (std::strcmp(argv[1], "server") != 0 && std::strcmp(argv[1], "client") != 0) ||
      (mode != "verify" && mode != "lossy" && mode != "cut")) {
    std::fprintf(stderr, "usage: verbs_pair server|client <shared dir> [verify|lossy|cut]\n");
    return 2;
  }
  bool server = std::strcmp(argv[1], "server") == 0;
  const bool cut = mode == "cut";
  std::string dir = argv[2];
  std::string why;
  auto n = net::createIbNet(&why);
  if (!n) {
    std::fprintf(stderr, "verbs_pair: %s\n", why.c_str());
    return 1;
  }
  net::DeviceProps props;
  if (n->getProperties(0, &props) != Result::Success) return die("getProperties");
  std::printf("[%s] device %s speed %d Mbps guid 0x%llx pciPath %s\n", argv[1], props.name.c_str(),
              props.speedMbps, static_cast<unsigned long long>(props.guid), props.pciPath.c_str());

  char mine[net::kHandleSize], theirs[net::kHandleSize];
  net::ListenComm* l = nullptr;
  if (n->listen(0, mine, &l) != Result::Success) return die("listen");
  // One pair of handle files per mode: the modes run one after another in the same VMs.
  const std::string tag = mode + ".rc" + std::to_string(retryCount());
  if (!publish(dir + (server ? "/handle.server." : "/handle.client.") + tag, mine))
    return die("publish handle");
  if (!fetch(dir + (server ? "/handle.client." : "/handle.server.") + tag, theirs, 120)) {
    std::fprintf(stderr, "verbs_pair: the peer's handle never appeared\n");
    return 1;
  }
  net::SendComm* sc = nullptr;
  net::RecvComm* rc = nullptr;
  auto t0 = Clock::now();
  while (sc == nullptr || rc == nullptr) {
    if (sc == nullptr && n->connect(0, theirs, &sc) != Result::Success) return die("connect");
    if (rc == nullptr && n->accept(l, &rc) != Result::Success) return die("accept");
    if (since(t0) > 60) return die("connection not established after 60 s");
  }
  n->closeListen(l);
  std::printf("[%s] %s: connected in %.2f s\n", argv[1], mode.c_str(), since(t0));

  const size_t sizes[] = {0, 1, 8, 4096, 65537, (size_t(1) << 20) + 3, size_t(4) << 20};
  const int nSizes = cut ? 5 : int(sizeof(sizes) / sizeof(sizes[0]));  // cut: a few, before the cut
  const int rounds = cut ? 1 : 2;
  const size_t kMax = size_t(4) << 20;
  std::vector<char> out(kMax), in(kMax);
  void *outMh = nullptr, *inMh = nullptr;
  if (n->regMr(sc, out.data(), kMax, net::kPtrHost, &outMh) != Result::Success) return die("regMr");
  if (n->regMr(rc, in.data(), kMax, net::kPtrHost, &inMh) != Result::Success) return die("regMr");
  uint32_t seed = 1;
  double bytes = 0;
  auto tData = Clock::now();
  for (int round = 0; round < rounds; ++round) {
    for (int k = 0; k < nSizes; ++k) {
      const size_t size = sizes[k];
      void* d[1] = {in.data()};
      size_t posted[1] = {kMax};
      int tags[1] = {server ? 1 : 2};
      void* mhs[1] = {inMh};
      // Both sides post their receive first (the echo's, on the client), so neither send waits.
      net::Request* r = nullptr;
      while (r == nullptr)
        if (n->irecv(rc, 1, d, posted, tags, mhs, &r) != Result::Success) return die("irecv");
      if (!server) fill(out, size, seed);
      if (server) {
        size_t got[1];
        if (waitDone(*n, r, got) != Result::Success) return die("receive");
        std::vector<char> expect(size);
        fill(expect, size, seed);
        if (got[0] != size || std::memcmp(in.data(), expect.data(), size) != 0) {
          std::fprintf(stderr, "verbs_pair: server: message %zu B (round %d) corrupt (got %zu B)\n",
                       size, round, got[0]);
          return 1;
        }
        std::memcpy(out.data(), in.data(), size);
      }
      net::Request* s = nullptr;
      while (s == nullptr)
        if (n->isend(sc, out.data(), size, server ? 2 : 1, outMh, &s) != Result::Success)
          return die("isend");
      size_t sent;
      if (waitDone(*n, s, &sent) != Result::Success) return die("send");
      if (!server) {
        size_t got[1];
        if (waitDone(*n, r, got) != Result::Success) return die("echo");
        if (got[0] != size || std::memcmp(in.data(), out.data(), size) != 0) {
          std::fprintf(stderr, "verbs_pair: client: echo of %zu B (round %d) corrupt\n", size,
                       round);
          return 1;
        }
      }
      bytes += 2.0 * double(size);
      ++seed;
    }
  }
  double secs = since(tData);
  std::printf("[%s] %s: %d messages verified both ways, %.1f MB in %.2f s = %.1f MB/s (TCG VM)\n",
              argv[1], mode.c_str(), rounds * nSizes, bytes / 1e6, secs, bytes / 1e6 / secs);
  if (cut) return cutPhase(*n, server, sc, rc, out, in, outMh, inMh);
  if (mode == "lossy" && !reportFaults(argv[1])) return 1;
  n->deregMr(sc, outMh);
  n->deregMr(rc, inMh);
  n->closeSend(sc);
  n->closeRecv(rc);
  std::printf("[%s] OK (%s)\n", argv[1], mode.c_str());
  return 0;
}
