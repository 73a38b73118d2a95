// The two-host verbs test: two QEMU VMs joined by a socket netdev (scripts/rdma-vm/pair.sh), rxe0
// on each. Run by scripts/verbs-tier.sh as
//   verbs_pair server <shared dir>     (VM 1, 198.51.100.1)
//   verbs_pair client <shared dir>     (VM 2, 198.51.100.2)
// Each side listens and publishes its handle as a file in the shared directory (both VMs see the
// host folder the tier runs in), connects to the other's, then: the client sends messages of
// 0 B .. 4 MiB, the server checks every byte and echoes each back, the client checks the echo.
// Prints the device properties and a bandwidth figure (TCG: correctness, not performance).
// Exit status 0 only if every byte arrived intact.
#include <sys/stat.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <string>
#include <thread>
#include <vector>

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

Result waitDone(net::Net& n, net::Request* r, size_t* sizes) {
  bool done = false;
  auto t0 = Clock::now();
  while (!done) {
    Result res = n.test(r, &done, sizes);
    if (res != Result::Success) return res;
    if (since(t0) > 60)
      return MK_ERROR(Result::RemoteError, "verbs_pair: request not done after 60 s");
  }
  return Result::Success;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc != 3 || (std::strcmp(argv[1], "server") != 0 && std::strcmp(argv[1], "client") != 0)) {
    std::fprintf(stderr, "usage: verbs_pair server|client <shared dir>\n");
    return 2;
  }
  bool server = std::strcmp(argv[1], "server") == 0;
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
  if (!publish(dir + (server ? "/handle.server" : "/handle.client"), mine))
    return die("publish handle");
  if (!fetch(dir + (server ? "/handle.client" : "/handle.server"), theirs, 120)) {
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
  std::printf("[%s] connected in %.2f s\n", argv[1], since(t0));

  const size_t sizes[] = {0, 1, 8, 4096, 65537, (size_t(1) << 20) + 3, size_t(4) << 20};
  const size_t kMax = size_t(4) << 20;
  std::vector<char> out(kMax), in(kMax);
  void *outMh = nullptr, *inMh = nullptr;
  if (n->regMr(sc, out.data(), kMax, net::kPtrHost, &outMh) != Result::Success) return die("regMr");
  if (n->regMr(rc, in.data(), kMax, net::kPtrHost, &inMh) != Result::Success) return die("regMr");
  uint32_t seed = 1;
  double bytes = 0;
  auto tData = Clock::now();
  for (int round = 0; round < 2; ++round) {
    for (size_t size : sizes) {
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
  std::printf("[%s] %d messages verified both ways, %.1f MB in %.2f s = %.1f MB/s (TCG VM)\n",
              argv[1], int(2 * sizeof(sizes) / sizeof(sizes[0])), bytes / 1e6, secs,
              bytes / 1e6 / secs);
  n->deregMr(sc, outMh);
  n->deregMr(rc, inMh);
  n->closeSend(sc);
  n->closeRecv(rc);
  std::printf("[%s] OK\n", argv[1]);
  return 0;
}
