// The verbs backend of net::Net on a real verbs device (Soft-RoCE rxe0 inside the VM of
// scripts/rdma-vm/, run by scripts/verbs-tier.sh): the shared net::Net suite, plus what only
// verbs has (QP striping, inline data, the registration cache, flush, GPU registration,
// truncation reported on both sides).
#include "tests/catch.h"

#include <cstdio>
#include <numeric>

#include "common/param.h"
#include "tests/transport/net/net_suite.h"
#include "tests/transport/net/ib/verbs_util.h"
#include "transport/net/ib/cuda_dmabuf.h"

using namespace verbstest;
using mkernel::lastError;
using mkernel::nettest::ScopedEnv;

// The whole backend-neutral net::Net suite (receives posted before their sends, every send
// retried until its clear-to-send arrives). MKERNEL_NET_SUITE_EARLY_SENDS is not for verbs: a send
// with no receive posted is answered with a null request, as NCCL's IB transport does.
MKERNEL_NET_SUITE("verbs", ibNet)

TEST_CASE("verbs net: suite: two processes") {
  mkernel::nettest::checkTwoProcesses(ibNet);
}

TEST_CASE("verbs net: device properties (printed for docs/VERBS.md)") {
  auto n = ibNet();
  REQUIRE(n->deviceCount() >= 1);
  for (int d = 0; d < n->deviceCount(); ++d) {
    net::DeviceProps p;
    REQUIRE(n->getProperties(d, &p) == Result::Success);
    std::printf(
        "verbs device %d: name=%s pciPath=%s guid=0x%016llx speed=%d Mbps port=%d ptrSupport=0x%x "
        "regIsGlobal=%d forceFlush=%d maxRecvs=%d maxComms=%d maxP2pBytes=%zu\n",
        d, p.name.c_str(), p.pciPath.c_str(), static_cast<unsigned long long>(p.guid), p.speedMbps,
        p.port, p.ptrSupport, int(p.regIsGlobal), int(p.forceFlush), p.maxRecvs, p.maxComms,
        p.maxP2pBytes);
    CHECK(!p.name.empty());
    CHECK(!p.pciPath.empty());
    CHECK(p.speedMbps > 0);
    CHECK(p.maxRecvs == 8);
    CHECK(p.regIsGlobal);
    CHECK_FALSE(p.forceFlush);
    CHECK((p.ptrSupport & net::kPtrHost) != 0);
    if (!net::ib::cudaGpuSupport().gpuPresent)
      CHECK((p.ptrSupport & (net::kPtrCuda | net::kPtrDmaBuf)) == 0);
    CHECK(p.maxP2pBytes > 0);
    CHECK(p.maxP2pBytes <= (size_t(1) << 40));
  }
}

TEST_CASE("verbs net: sizes 0 B .. 4 MiB over 1, 2 and 4 QPs, registered and not") {
  const size_t sizes[] = {0,
                          1,
                          7,
                          8,
                          100,
                          255,
                          256,
                          257,
                          4095,
                          4096,
                          16384,
                          65537,
                          (size_t(1) << 20) + 3,
                          size_t(4) << 20};
  for (const char* qps : {"1", "2", "4"}) {
    ScopedEnv env("MKERNEL_IB_QPS_PER_CONN", qps);
    INFO("QPs per connection: " << qps);
    Pair p;
    connect(&p);
    uint32_t seed = 1;
    for (size_t size : sizes) {
      roundTrip(p, size, size + 64, 3, true, seed++);
      roundTrip(p, size, size, 4, false, seed++);
    }
  }
}

TEST_CASE("verbs net: grouped receives take sends in any tag order, oldest receive first") {
  Pair p;
  connect(&p);
  const int n = net::kMaxGroupedRecvs;
  const size_t kPosted = 70000;
  std::vector<std::vector<char>> bufs(2 * n, std::vector<char>(kPosted, 0));
  net::Request* recvs[2];
  for (int g = 0; g < 2; ++g) {
    void* d[n];
    size_t sz[n];
    int tg[n];
    for (int i = 0; i < n; ++i) {
      d[i] = bufs[size_t(g * n + i)].data();
      sz[i] = kPosted;
      tg[i] = 10 + i;
    }
    recvs[g] = postRecv(*p.net, p.recv, n, d, sz, tg);
  }
  std::vector<int> order;
  for (int i = 0; i < n; ++i) order.insert(order.end(), {i, i});
  std::mt19937 rng(7);
  std::shuffle(order.begin(), order.end(), rng);
  std::vector<int> seen(n, 0);
  std::vector<std::vector<char>> payload(2 * n);
  std::vector<net::Request*> sends;
  for (int idx : order) {
    int occurrence = seen[size_t(idx)]++;
    size_t size = 1 + rng() % (kPosted - 1);
    payload[size_t(occurrence * n + idx)] = pattern(size, uint32_t(occurrence * 100 + idx));
    std::vector<char>& pl = payload[size_t(occurrence * n + idx)];
    sends.push_back(postSend(*p.net, p.send, pl.data(), pl.size(), 10 + idx));
  }
  for (net::Request* s : sends) {
    bool done = false;
    size_t sz = 0;
    REQUIRE(wait(*p.net, s, &sz, 20, &done) == Result::Success);
    REQUIRE(done);
  }
  for (int g = 0; g < 2; ++g) {
    bool done = false;
    size_t got[n];
    REQUIRE(wait(*p.net, recvs[g], got, 20, &done) == Result::Success);
    REQUIRE(done);
    for (int i = 0; i < n; ++i) {
      const std::vector<char>& expect = payload[size_t(g * n + i)];
      REQUIRE(got[i] == expect.size());
      REQUIRE(std::memcmp(bufs[size_t(g * n + i)].data(), expect.data(), expect.size()) == 0);
    }
  }
}

TEST_CASE("verbs net: 32 receives in flight, the 33rd back-pressured; all complete in order") {
  Pair p;
  connect(&p);
  const size_t kMsg = 3000;
  std::vector<std::vector<char>> in(net::kMaxRequests + 1, std::vector<char>(kMsg, 0)), out;
  std::vector<net::Request*> recvs;
  for (int i = 0; i < net::kMaxRequests; ++i) {
    void* d[1] = {in[size_t(i)].data()};
    size_t sz[1] = {kMsg};
    int tags[1] = {0};
    recvs.push_back(postRecv(*p.net, p.recv, 1, d, sz, tags));
  }
  void* d[1] = {in.back().data()};
  size_t sz[1] = {kMsg};
  int tags[1] = {0};
  net::Request* extra = nullptr;
  REQUIRE(p.net->irecv(p.recv, 1, d, sz, tags, nullptr, &extra) == Result::Success);
  CHECK(extra == nullptr);
  std::vector<net::Request*> sends;
  for (int i = 0; i < net::kMaxRequests; ++i) {
    out.push_back(pattern(kMsg, uint32_t(i)));
    sends.push_back(postSend(*p.net, p.send, out.back().data(), kMsg, 0));
  }
  // Every CTS is consumed: one more send has nowhere to go.
  net::Request* none = nullptr;
  REQUIRE(p.net->isend(p.send, out[0].data(), kMsg, 0, nullptr, &none) == Result::Success);
  CHECK(none == nullptr);
  for (int i = 0; i < net::kMaxRequests; ++i) {
    bool done = false;
    size_t got[1];
    REQUIRE(wait(*p.net, recvs[size_t(i)], got, 10, &done) == Result::Success);
    REQUIRE(done);
    REQUIRE(got[0] == kMsg);
    REQUIRE(in[size_t(i)] == out[size_t(i)]);
    REQUIRE(wait(*p.net, sends[size_t(i)], got, 10, &done) == Result::Success);
    REQUIRE(done);
  }
  // Slots are free again.
  REQUIRE(p.net->irecv(p.recv, 1, d, sz, tags, nullptr, &extra) == Result::Success);
  CHECK(extra != nullptr);
}

TEST_CASE("verbs net: the receiver closes mid-transfer: the send fails, naming the peer") {
  mkernel::nettest::ScopedEnv timeout("MKERNEL_TIMEOUT_S", "3");
  Pair p;
  connect(&p);
  // 64 MiB take seconds through Soft-RoCE under TCG: the close lands mid-transfer.
  std::vector<char> out(size_t(64) << 20, 1), in(out.size());
  void* d[1] = {in.data()};
  size_t sz[1] = {in.size()};
  int tags[1] = {0};
  postRecv(*p.net, p.recv, 1, d, sz, tags);
  net::Request* s = postSend(*p.net, p.send, out.data(), out.size(), 0);
  REQUIRE(p.net->closeRecv(p.recv) == Result::Success);
  p.recv = nullptr;
  bool done = false;
  size_t sent = 0;
  auto t0 = Clock::now();
  Result res = wait(*p.net, s, &sent, 8.0, &done);
  INFO(lastError());
  CHECK_FALSE(done);
  CHECK((res == Result::RemoteError || res == Result::SystemError));
  CHECK(secondsSince(t0) < 8.0);
  CHECK(std::string(lastError()).find("peer") != std::string::npos);
}

TEST_CASE("verbs net: a send waits (NULL request) until the receive is posted") {
  Pair p;
  connect(&p);
  char out[32] = "clear to send", in[32] = {};
  net::Request* s = nullptr;
  for (int i = 0; i < 1000; ++i) {
    REQUIRE(p.net->isend(p.send, out, sizeof(out), 1, nullptr, &s) == Result::Success);
    REQUIRE(s == nullptr);
  }
  void* d[1] = {in};
  size_t sz[1] = {sizeof(in)};
  int tags[1] = {1};
  net::Request* r = postRecv(*p.net, p.recv, 1, d, sz, tags);
  s = postSend(*p.net, p.send, out, sizeof(out), 1);
  bool done = false;
  size_t got[1];
  REQUIRE(wait(*p.net, r, got, 10, &done) == Result::Success);
  REQUIRE(done);
  REQUIRE(wait(*p.net, s, got, 10, &done) == Result::Success);
  REQUIRE(done);
  CHECK(std::string(in) == "clear to send");
}

TEST_CASE("verbs net: a message larger than the posted receive fails on both sides") {
  Pair p;
  connect(&p);
  std::vector<char> out(1000, 1), in(100, 0);
  void* d[1] = {in.data()};
  size_t sz[1] = {in.size()};
  int tags[1] = {1};
  net::Request* r = postRecv(*p.net, p.recv, 1, d, sz, tags);
  net::Request* s = nullptr;
  Result res = Result::Success;
  auto t0 = Clock::now();
  while (res == Result::Success && s == nullptr && secondsSince(t0) < 10)
    res = p.net->isend(p.send, out.data(), out.size(), 1, nullptr, &s);
  CHECK(res == Result::InvalidUsage);
  CHECK(std::string(lastError()).find("larger") != std::string::npos);
  bool done = false;
  size_t got[1];
  res = wait(*p.net, r, got, 10, &done);
  CHECK(res == Result::InvalidUsage);
  CHECK_FALSE(done);
  CHECK(std::string(lastError()).find("larger than the posted receive of 100 bytes") !=
        std::string::npos);
}

TEST_CASE("verbs net: a receive nobody sends to times out naming the peer") {
  ScopedEnv timeout("MKERNEL_TIMEOUT_S", "1");
  Pair p;
  connect(&p);
  char in[8];
  void* d[1] = {in};
  size_t sz[1] = {8};
  int tags[1] = {77};
  net::Request* r = postRecv(*p.net, p.recv, 1, d, sz, tags);
  bool done = false;
  size_t got[1];
  auto t0 = Clock::now();
  Result res = wait(*p.net, r, got, 6, &done);
  double waited = secondsSince(t0);
  INFO(lastError());
  CHECK(res == Result::RemoteError);
  CHECK(waited >= 0.9);
  CHECK(waited < 4.0);
  CHECK(std::string(lastError()).find("peer") != std::string::npos);
  CHECK(std::string(lastError()).find("MKERNEL_TIMEOUT_S") != std::string::npos);
}

TEST_CASE(
    "verbs net: connecting to a closed listener fails promptly; foreign handles are refused") {
  auto n = ibNet();
  char handle[net::kHandleSize];
  net::ListenComm* l = nullptr;
  REQUIRE(n->listen(0, handle, &l) == Result::Success);
  REQUIRE(n->closeListen(l) == Result::Success);
  net::SendComm* s = nullptr;
  Result res = Result::Success;
  auto t0 = Clock::now();
  while (res == Result::Success && s == nullptr && secondsSince(t0) < 10)
    res = n->connect(0, handle, &s);
  CHECK(res == Result::RemoteError);
  CHECK(s == nullptr);
  CHECK(secondsSince(t0) < 5);
  char junk[net::kHandleSize] = {1, 2, 3};
  CHECK(n->connect(0, junk, &s) == Result::InvalidArgument);
  CHECK(n->connect(7, handle, &s) == Result::InvalidArgument);
}

TEST_CASE("verbs net: registering a sub-range of a registered range is a cache hit") {
  Pair p;
  connect(&p);
  net::ib::IbNet& ib = asIb(*p.net);
  const size_t kBig = size_t(64) << 20;
  std::vector<char> buf(kBig, 1);
  auto before = ib.regCacheStats(0);
  void* whole = nullptr;
  auto t0 = Clock::now();
  REQUIRE(p.net->regMr(p.send, buf.data(), kBig, net::kPtrHost, &whole) == Result::Success);
  double firstUs = secondsSince(t0) * 1e6;
  const int kSub = 1000;
  std::vector<void*> subs(kSub);
  t0 = Clock::now();
  for (int i = 0; i < kSub; ++i) {
    size_t off = size_t(i) * 4099 % (kBig - 8192);
    // The recv comm of the same device: regIsGlobal means one cache serves every comm.
    net::Comm* comm = i % 2 ? static_cast<net::Comm*>(p.recv) : static_cast<net::Comm*>(p.send);
    REQUIRE(p.net->regMr(comm, buf.data() + off, 8192, net::kPtrHost, &subs[size_t(i)]) ==
            Result::Success);
  }
  double subUs = secondsSince(t0) * 1e6 / kSub;
  auto after = ib.regCacheStats(0);
  std::printf("registration: 64 MiB first %.0f us, sub-range %.2f us each (%d hits)\n", firstUs,
              subUs, kSub);
  CHECK(after.registrations - before.registrations == 1);
  CHECK(after.hits - before.hits == uint64_t(kSub));
  CHECK(subUs * 20 < firstUs);
  for (int i = 0; i < kSub; ++i)
    REQUIRE(p.net->deregMr(p.send, subs[size_t(i)]) == Result::Success);
  CHECK(ib.regCacheStats(0).live == before.live + 1);
  // Data moves through a sub-range handle of the big registration.
  void* rmh = nullptr;
  std::vector<char> in(4096, 0);
  REQUIRE(p.net->regMr(p.recv, in.data(), in.size(), net::kPtrHost, &rmh) == Result::Success);
  void* smh = nullptr;
  REQUIRE(p.net->regMr(p.send, buf.data() + 12345, 4096, net::kPtrHost, &smh) == Result::Success);
  std::memcpy(buf.data() + 12345, "sub-range", 10);
  void* d[1] = {in.data()};
  size_t sz[1] = {in.size()};
  int tags[1] = {0};
  void* mhs[1] = {rmh};
  net::Request* r = postRecv(*p.net, p.recv, 1, d, sz, tags, mhs);
  net::Request* s = postSend(*p.net, p.send, buf.data() + 12345, 4096, 0, smh);
  bool done = false;
  size_t got[1];
  REQUIRE(wait(*p.net, s, got, 10, &done) == Result::Success);
  REQUIRE(done);
  REQUIRE(wait(*p.net, r, got, 10, &done) == Result::Success);
  REQUIRE(done);
  CHECK(std::string(in.data()) == "sub-range");
  CHECK(p.net->deregMr(p.send, smh) == Result::Success);
  CHECK(p.net->deregMr(p.send, whole) == Result::Success);
  CHECK(p.net->deregMr(p.recv, rmh) == Result::Success);
  CHECK(ib.regCacheStats(0).live == before.live);
  CHECK(p.net->deregMr(p.recv, rmh) == Result::InvalidArgument);  // already gone
}

TEST_CASE("verbs net: iflush reads back through the NIC; host memory needs no flush") {
  Pair p;
  connect(&p);
  std::vector<char> out(5000, 3), in(5000, 0);
  void* rmh = nullptr;
  REQUIRE(p.net->regMr(p.recv, in.data(), in.size(), net::kPtrHost, &rmh) == Result::Success);
  void* d[1] = {in.data()};
  size_t sz[1] = {in.size()};
  int tags[1] = {0};
  void* mhs[1] = {rmh};
  net::Request* r = postRecv(*p.net, p.recv, 1, d, sz, tags, mhs);
  net::Request* s = postSend(*p.net, p.send, out.data(), out.size(), 0);
  bool done = false;
  size_t got[1];
  REQUIRE(wait(*p.net, r, got, 10, &done) == Result::Success);
  REQUIRE(done);
  REQUIRE(wait(*p.net, s, got, 10, &done) == Result::Success);
  int isz[1] = {int(in.size())};
  net::Request* f = reinterpret_cast<net::Request*>(0x1);
  REQUIRE(p.net->iflush(p.recv, 1, d, isz, mhs, &f) == Result::Success);
  CHECK(f == nullptr);  // host memory: nothing to flush
  asIb(*p.net).setFlushHostMemoryForTesting(true);
  REQUIRE(p.net->iflush(p.recv, 1, d, isz, mhs, &f) == Result::Success);
  REQUIRE(f != nullptr);
  REQUIRE(wait(*p.net, f, got, 10, &done) == Result::Success);
  CHECK(done);
  CHECK(p.net->deregMr(p.recv, rmh) == Result::Success);
}

TEST_CASE("verbs net: GPU memory registration (DMA-BUF, else nvidia-peermem)") {
  std::string why;
  const auto& gpu = net::ib::cudaGpuSupport(&why);
  Pair p;
  connect(&p);
  if (!gpu.gpuPresent) {
    // Compiled in, not runnable here: the VM has no GPU. Registering "GPU" memory must then be a
    // clear error, not a crash or a silent host registration.
    WARN("skipped: GPU memory registration needs a GPU (" << why << ")");
    char host[64];
    void* mh = nullptr;
    CHECK(p.net->regMr(p.send, host, sizeof(host), net::kPtrCuda, &mh) == Result::InvalidUsage);
    CHECK(mh == nullptr);
    CHECK(std::string(lastError()).find("GPUDirect") != std::string::npos);
    return;
  }
  net::DeviceProps props;
  REQUIRE(p.net->getProperties(0, &props) == Result::Success);
  if (!(props.ptrSupport & net::kPtrCuda)) {
    WARN("skipped: a GPU but neither DMA-BUF nor nvidia-peermem");
    return;
  }
  FAIL(
      "GPU + verbs has no test environment yet (docs/VERBS.md): run on a GPU node with an RDMA "
      "NIC");
}

TEST_CASE("verbs net: MKERNEL_IB_HCA and MKERNEL_IB_GID_INDEX select devices and addresses") {
  net::DeviceProps props;
  {
    auto n = ibNet();
    REQUIRE(n->getProperties(0, &props) == Result::Success);
  }
  const std::string dev = props.name;
  {
    ScopedEnv hca("MKERNEL_IB_HCA", ("=" + dev).c_str());
    auto n = ibNet();
    CHECK(n->deviceCount() == 1);
  }
  {
    ScopedEnv hca("MKERNEL_IB_HCA", (dev + ":1").c_str());
    CHECK(ibNet()->deviceCount() == 1);
  }
  for (const std::string& spec :
       std::vector<std::string>{"^" + dev, dev + ":2", "=" + dev.substr(0, dev.size() - 1)}) {
    ScopedEnv hca("MKERNEL_IB_HCA", spec.c_str());
    std::string why;
    CHECK(net::createIbNet(&why) == nullptr);
    INFO(why);
    CHECK(why.find("no RDMA device") != std::string::npos);
    CHECK(why.find("MKERNEL_IB_HCA=" + spec) != std::string::npos);
  }
  {
    // A GID index past the table: the port has no usable address, so no device.
    ScopedEnv gid("MKERNEL_IB_GID_INDEX", "100000");
    std::string why;
    CHECK(net::createIbNet(&why) == nullptr);
    CHECK(why.find("no GID") != std::string::npos);
  }
  {
    // The index the automatic choice takes on rxe (the IPv4-mapped RoCE v2 GID is index 1 there),
    // forced: data still moves.
    ScopedEnv gid("MKERNEL_IB_GID_INDEX", "1");
    Pair p;
    connect(&p);
    roundTrip(p, 5000, 5000, 0, true, 99);
  }
}
