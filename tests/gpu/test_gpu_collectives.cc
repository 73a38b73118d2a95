// GPU tier: every collective x dtype x op through the persistent kernel, with 2, 4 and 8
// emulated thread ranks on one GPU, against host references (tests/gpu/gpu_check.h). Outputs are
// poisoned (0xff bytes: NaN for floats) before every call; in-place and out-of-place, counts not
// divisible by the ranks, misaligned buffers (scalar path), counts large enough for two-shot and
// many CTAs, count 0.
#include "tests/catch.h"

#include <cuda_runtime_api.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <thread>
#include <vector>

#include "collectives/algo/hier_staged.h"
#include "collectives/route/launch_path.h"
#include "collectives/algo/staged_ring.h"
#include "collectives/stats.h"
#include "common/param.h"
#include "common/result.h"
#include "tests/gpu/gpu_cases.h"
#include "tests/gpu/gpu_check.h"
#include "tests/gpu/gpu_ranks.h"

using mkernel::Result;
using mkernel::coll::CollArgs;
using mkernel::coll::CollType;
using mkernel::coll::DataType;
using mkernel::coll::RedOp;

namespace {

using mkgpu::buildCases;
using mkgpu::buildDirectCases;
using mkgpu::Case;
using mkgpu::caseName;
using mkgpu::kScalar;
using mkgpu::reduces;

// One case on one rank: upload, enqueue, wait, check. Returns "" or the failure.
// roundings: the most partial results the algorithm rounds on an element's way to its output
// (mkgpu::tolerance; 1 for the flat algorithms).
std::string runCase(mkgpu::RankCtx& ctx, const Case& k, uint64_t seed, uint8_t* sendDev,
                    uint8_t* recvDev, void* scalarDev, int roundings = 1) {
  const int n = ctx.nRanks, r = ctx.rank;
  const size_t esz = mkernel::coll::dataTypeSize(k.dtype);
  const size_t sendCount =
      k.coll == CollType::ReduceScatter ? k.count * static_cast<size_t>(n) : k.count;
  const size_t recvCount =
      k.coll == CollType::AllGather ? k.count * static_cast<size_t>(n) : k.count;
  std::vector<std::vector<uint8_t>> in(static_cast<size_t>(n));
  for (int q = 0; q < n; ++q)
    in[static_cast<size_t>(q)] = mkgpu::makeInput(k.dtype, k.op, seed, q, sendCount);
  const std::vector<uint8_t>& mine = in[static_cast<size_t>(r)];

  uint8_t* send = sendDev + k.misalign * esz;
  uint8_t* recv = recvDev;
  if (cudaMemsetAsync(recvDev, 0xff, recvCount * esz + 64, ctx.stream) != cudaSuccess)
    return "memset";
  if (k.inPlace) {
    size_t off = 0;
    if (k.coll == CollType::AllGather) off = static_cast<size_t>(r) * k.count;
    if (k.coll == CollType::ReduceScatter) {
      send = recvDev;
      recv = recvDev + static_cast<size_t>(r) * k.count * esz;
    } else {
      send = recvDev + off * esz;
    }
  }
  ctx.hostReset();  // the stream is idle: the previous case synchronized it
  if (!ctx.toDevice(send, mine.data(), mine.size())) return "upload";
  CollArgs a;
  a.coll = k.coll;
  a.dtype = k.dtype;
  a.op = k.op;
  a.sendbuff = send;
  a.recvbuff = recv;
  a.count = k.count;
  a.root = k.root;
  a.scalar = kScalar;
  if (k.scalarOnDevice) {
    std::vector<uint8_t> sc(esz);
    mkernel::coll::storeFromDouble(k.dtype, sc.data(), 0, kScalar);
    if (!ctx.toDevice(scalarDev, sc.data(), esz)) return "scalar";
    a.scalarDevPtr = scalarDev;
    a.scalar = 0.0;  // must not be used
  }
  if (ctx.comm->enqueue(&a, 1, ctx.stream) != Result::Success)
    return std::string("enqueue: ") + mkernel::lastError();
  std::vector<uint8_t> out(recvCount * esz);
  const void* staged = ctx.fromDevice(recv, out.size());
  if (staged == nullptr) return "download";
  cudaError_t err = cudaStreamSynchronize(ctx.stream);
  if (err != cudaSuccess) return std::string("sync: ") + cudaGetErrorString(err);
  if (!out.empty()) std::memcpy(out.data(), staged, out.size());

  switch (k.coll) {
    case CollType::AllReduce:
      return mkgpu::checkReduced(k.dtype, k.op, kScalar, n, in, 0, out.data(), k.count, roundings);
    case CollType::ReduceScatter:
      return mkgpu::checkReduced(k.dtype, k.op, kScalar, n, in, static_cast<size_t>(r) * k.count,
                                 out.data(), k.count, roundings);
    case CollType::Reduce:
      if (r == k.root)
        return mkgpu::checkReduced(k.dtype, k.op, kScalar, n, in, 0, out.data(), k.count,
                                   roundings);
      if (k.inPlace) return out == mine ? "" : "non-root in-place buffer changed";
      for (uint8_t b : out)
        if (b != 0xff) return "non-root recvbuff written";
      return "";
    case CollType::AllGather:
      for (int q = 0; q < n; ++q)
        if (std::memcmp(out.data() + static_cast<size_t>(q) * k.count * esz,
                        in[static_cast<size_t>(q)].data(), k.count * esz) != 0)
          return "block " + std::to_string(q) + " differs";
      return "";
    case CollType::Broadcast:
      return out == in[static_cast<size_t>(k.root)] ? "" : "differs from the root's buffer";
  }
  return "unknown collective";
}

// One rank's part of a sweep: its buffers (freed after every rank's communicator is finalized,
// RankCtx::freeAfter: a rank that finished early must not cudaFree while a peer's kernel is still
// in a collective), allocated by every rank before any rank's first collective, then every case
// (at most 5 failures reported). False when the buffers could not be set up (reported).
bool runCases(mkgpu::RankCtx& ctx, const std::vector<Case>& cases, size_t maxBytes, int roundings,
              uint8_t** sendOut, uint8_t** recvOut) {
  uint8_t* sendDev = ctx.deviceAlloc<uint8_t>(maxBytes);
  uint8_t* recvDev = ctx.deviceAlloc<uint8_t>(maxBytes);
  void* scalarDev = ctx.deviceAlloc<void>(16);
  if (sendDev == nullptr || recvDev == nullptr || scalarDev == nullptr) {
    ctx.fail("cudaMalloc");
    return false;
  }
  if (ctx.bs->barrier() != Result::Success) {
    ctx.fail("bootstrap barrier after allocation");
    return false;
  }
  int bad = 0;
  for (size_t i = 0; i < cases.size() && bad < 5; ++i) {
    std::string why = runCase(ctx, cases[i], i + 1, sendDev, recvDev, scalarDev, roundings);
    if (!why.empty()) {
      ctx.fail(caseName(cases[i]) + ": " + why);
      ++bad;
    }
  }
  *sendOut = sendDev;
  *recvOut = recvDev;
  return true;
}

// expectHierCtas > 0: the CTAs each hierarchical collective must have been split over.
// direct: buildDirectCases' bulk instead of buildCases' sweep.
void runSweep(int nRanks, int ranksPerNode = 0, int expectHierCtas = 0, bool direct = false) {
  const std::vector<Case> cases = direct ? buildDirectCases(nRanks) : buildCases(nRanks);
  size_t maxBytes = 0;
  for (const Case& k : cases)
    maxBytes = std::max(
        maxBytes, k.count * static_cast<size_t>(nRanks) * mkernel::coll::dataTypeSize(k.dtype));
  maxBytes += 256;
  // The hierarchical path rounds each node's partial result, then each step that combines nodes:
  // one for the direct rail exchange, N - 1 for ring or rhd (MKERNEL_HIER_RAIL).
  const std::string rail = mkernel::params::HIER_RAIL.text();
  const int askedRail =
      std::max(0, mkernel::coll::hierRailByName(rail));  // the communicator rejects a bad name
  int roundings = 1;
  if (ranksPerNode > 0) {
    const int N = nRanks / ranksPerNode;
    roundings =
        N + (mkernel::coll::hierRailFor(askedRail, N) == mkernel::coll::kRailDirect ? 1 : N - 1);
  }
  auto failures = mkgpu::runRanks(
      nRanks,
      [&](mkgpu::RankCtx& ctx) {
        uint8_t *sendDev = nullptr, *recvDev = nullptr;
        if (!runCases(ctx, cases, maxBytes, roundings, &sendDev, &recvDev)) return;
        // Count 0 is a no-op that must not hang or touch the buffers.
        CollArgs zero;
        zero.sendbuff = sendDev;
        zero.recvbuff = recvDev;
        zero.count = 0;
        if (ctx.comm->enqueue(&zero, 1, ctx.stream) != Result::Success)
          ctx.fail("count 0 enqueue failed");
        // The kernel ran every case (its own completion counters).
        mkernel::coll::CollStats st;
        ctx.comm->stats(&st);
        // Unless the case sets it, MKERNEL_HIER_CTAS's default (params.def; the kernels have more
        // CTAs).
        const int wantHierCtas =
            expectHierCtas > 0 ? expectHierCtas : static_cast<int>(mkernel::params::HIER_CTAS());
        if (ranksPerNode > 0 && st.hierCtas != wantHierCtas)
          ctx.fail("hierarchical collectives split over " + std::to_string(st.hierCtas) +
                   " CTA(s), want " + std::to_string(wantHierCtas));
        // The rail NIC's speed the selection policy's cost model reads (agreed: the slowest rank's
        // proxy device; loopback here, whose /sys speed is absent: the TCP net's default): known
        // with several nodes, 0 with one.
        if ((ranksPerNode > 0) != (st.railMbps > 0))
          ctx.fail("rail NIC speed " + std::to_string(st.railMbps) + " Mb/s with " +
                   std::to_string(ranksPerNode) + " ranks per node");
        // MKERNEL_HIER_ROLES=W,R: the AllReduces ran in CTA roles.
        int wantWorkers = 0, wantReducers = 0;
        const std::string roles = mkernel::params::HIER_ROLES();
        if (ranksPerNode > 0 &&
            std::sscanf(roles.c_str(), "%d,%d", &wantWorkers, &wantReducers) == 2 &&
            (st.hierWorkers != wantWorkers || st.hierReducers != wantReducers))
          ctx.fail("AllReduce CTA roles " + std::to_string(st.hierWorkers) + "," +
                   std::to_string(st.hierReducers) + ", want " + roles);
        // MKERNEL_HIER_RAIL: the AllReduces' rail exchange in effect (rhd on a node count that is
        // not a power of two: ring).
        if (ranksPerNode > 0 && !rail.empty()) {
          const int want = mkernel::coll::hierRailFor(askedRail, nRanks / ranksPerNode);
          if (st.hierRail != want)
            ctx.fail("AllReduce rail exchange " + std::to_string(st.hierRail) + ", want " +
                     std::to_string(want) + " (" + rail + ")");
        }
        // Phase times (collectives/algo/hier_staged.h): CTA 0 times its AllReduce chunks in turn
        // (MKERNEL_HIER_OVERLAP=0), with both phases non-zero, and none pipelined.
        if (ranksPerNode > 0) {
          const bool inTurn = !mkernel::params::HIER_OVERLAP();
          if (inTurn &&
              (st.hierTurnChunks == 0 || st.hierTurnNodeNs == 0 || st.hierTurnRailNs == 0))
            ctx.fail("in turn, but CTA 0 timed " + std::to_string(st.hierTurnChunks) +
                     " AllReduce chunks (node " + std::to_string(st.hierTurnNodeNs) + " ns, rail " +
                     std::to_string(st.hierTurnRailNs) + " ns)");
          if (!inTurn && st.hierTurnChunks != 0)
            ctx.fail("pipelined, but CTA 0 timed " + std::to_string(st.hierTurnChunks) +
                     " chunks in turn");
          // CTA 0's waits (DeviceState::hierWait), in both modes: every case crossed the rail, each
          // wait a proxy round trip of microseconds.
          if (st.hierWaitRailNs == 0) ctx.fail("CTA 0 timed no wait for the rail");
          // ... and its own work (DeviceState::hierBusy): CTA 0 posts lane 0's rail steps, in CTA
          // roles (as its sender) and without.
          if (st.hierBusyNs[mkernel::coll::kBusyPost] == 0)
            ctx.fail("CTA 0 timed no post to the proxy");
          // In CTA roles the sender (CTA 0) waits for the workers' Ready before each chunk's rail.
          if (st.hierWorkers > 0 && st.hierWaitRoleNs == 0)
            ctx.fail("CTA roles, but CTA 0 timed no wait for the workers");
        }
        uint64_t total = 0;
        for (uint64_t v : st.kernelOps) total += v;
        if (total != cases.size())
          ctx.fail("kernel completed " + std::to_string(total) + " collectives, enqueued " +
                   std::to_string(cases.size()));
        // ... and the launch path those it should (collectives/route/launch_path.h): eager, single
        // node, inputs up to MKERNEL_LAUNCH_MAX_BYTES. The threshold in effect:
        // MKERNEL_LAUNCH_MAX_BYTES, capped by the CTAs all ranks can hold (none for emulated
        // nodes).
        const uint64_t asked = static_cast<uint64_t>(mkernel::params::LAUNCH_MAX_BYTES());
        if (st.launchMaxBytes > asked)
          ctx.fail("launch threshold " + std::to_string(st.launchMaxBytes) +
                   " above MKERNEL_LAUNCH_MAX_BYTES " + std::to_string(asked));
        // Above it, thread ranks take the launch path's direct mode unless MKERNEL_LAUNCH_DIRECT=0
        // (these ranks are threads: direct mode is on exactly when the threshold is).
        const bool wantDirect = nRanks > 1 && ranksPerNode == 0 && st.launchMaxBytes > 0 &&
                                mkernel::params::LAUNCH_DIRECT();
        if (st.launchDirect != wantDirect)
          ctx.fail(std::string("launch path direct mode ") + (st.launchDirect ? "on" : "off") +
                   ", want " + (wantDirect ? "on" : "off"));
        // Direct mode's kernel (MKERNEL_DIRECT_KERNEL): its own of 512 threads per CTA unless
        // shared.
        const int wantThreads = !wantDirect                                   ? 0
                                : mkernel::params::DIRECT_KERNEL.is("shared") ? 256
                                                                              : 512;
        if (st.directThreads != wantThreads)
          ctx.fail("direct mode runs " + std::to_string(st.directThreads) +
                   " threads per CTA, want " + std::to_string(wantThreads));
        // Ranks sharing the GPU keep small persistent kernels and run large ops in direct mode
        // (MKERNEL_SHARED_CTAS: auto for 2 to 4 ranks on a GPU, a number for any, 0 off).
        const std::optional<int64_t> sc = mkernel::params::SHARED_CTAS();
        const bool scAuto = !sc.has_value();
        // auto: more than four ranks per GPU only without an upper end to direct mode (auto or 0).
        const std::optional<int64_t> dmaxSet = mkernel::params::DIRECT_MAX_BYTES();
        const bool directUnbounded = !dmaxSet.has_value() || *dmaxSet == 0;
        const int autoCtas = mkernel::coll::sharedPersistentCtas(st.directSharing, directUnbounded);
        const bool wantShared = wantDirect && st.directSharing > 1 &&
                                mkernel::params::GRAPH_LAUNCH() &&
                                (scAuto ? autoCtas > 0 : *sc > 0);
        if (st.sharedDirect != wantShared)
          ctx.fail(std::string("ranks sharing the GPU in direct mode: ") +
                   (st.sharedDirect ? "yes" : "no") + ", want " + (wantShared ? "yes" : "no"));
        if (wantShared && scAuto && st.persistentCtas != autoCtas)
          ctx.fail("persistent kernel of " + std::to_string(st.persistentCtas) + " CTAs, want " +
                   std::to_string(autoCtas));
        if (st.directCtas & (st.directCtas - 1))
          ctx.fail("direct mode's CTAs " + std::to_string(st.directCtas) + ": not a power of two");
        // ... and with no upper end to direct mode (auto, or 0) the persistent kernels never run
        // (agreeLaunchCap): the direct-mode kernels (512 threads, one CTA per SM) share every SM.
        if (wantShared && st.directThreads == 512 && directUnbounded) {
          cudaDeviceProp prop{};
          cudaGetDeviceProperties(&prop, ctx.device);
          int want =
              std::min(mkernel::coll::kLaunchMaxCtas, prop.multiProcessorCount / st.directSharing);
          while (want & (want - 1)) want &= want - 1;
          if (st.directCtas != want)
            ctx.fail("direct mode's CTAs " + std::to_string(st.directCtas) + ", want " +
                     std::to_string(want) + " (" + std::to_string(prop.multiProcessorCount) +
                     " SMs, " + std::to_string(st.directSharing) + " ranks)");
        }
        if (ctx.rank == 0)
          std::printf(
              "%d ranks: direct mode in CTAs of %d threads, at most %d CTAs per op; persistent "
              "kernel %d CTAs%s\n",
              nRanks, st.directThreads, st.directCtas, st.persistentCtas,
              st.sharedDirect ? " (ranks sharing the GPU: direct mode at every size)" : "");
        // Direct mode ends at MKERNEL_DIRECT_MAX_BYTES (auto: launch_path.h's table).
        const uint64_t directMax =
            dmaxSet.has_value() ? static_cast<uint64_t>(*dmaxSet) : mkernel::coll::kDirectAuto;
        // LL mode (launch_path.h) takes what each rank sends each peer up to MKERNEL_LL_MAX_BYTES
        // (auto: kLlAutoMaxBytes, kLlSharedMaxBytes with more than two ranks on a GPU; never more
        // than the slots hold, llLimit), whatever the launch threshold; off with it and for
        // emulated nodes.
        const std::optional<int64_t> llm = mkernel::params::LL_MAX_BYTES();
        const uint64_t llAsked = mkernel::coll::llLimit(
            llm.has_value() ? static_cast<uint64_t>(*llm) : ~0ull, nRanks, st.directSharing);
        const uint64_t wantLl = ranksPerNode == 0 && st.launchMaxBytes > 0 ? llAsked : 0;
        if (st.llMaxBytes != wantLl)
          ctx.fail("LL mode up to " + std::to_string(st.llMaxBytes) + " bytes, want " +
                   std::to_string(wantLl));
        uint64_t expectLaunch = 0, expectLl = 0;
        if (ranksPerNode == 0)
          for (const Case& k : cases) {
            const uint64_t esz = mkernel::coll::dataTypeSize(k.dtype);
            // One rank: every eager op, any size (a copy, or the launch kernel with
            // MKERNEL_ONE_RANK=kernel).
            if (nRanks == 1) {
              if (st.launchMaxBytes > 0) ++expectLaunch;
            } else if (mkernel::coll::llTakes(mkernel::coll::llPayloadBytes(k.count, esz),
                                              st.llMaxBytes, nRanks)) {
              ++expectLaunch;
              ++expectLl;
            } else if (mkernel::coll::launchPublishElems(k.coll, k.count, nRanks) * esz <=
                           st.launchMaxBytes ||
                       (st.launchDirect &&
                        mkernel::coll::directTakes(
                            k.coll, mkernel::coll::directWholeBytes(k.coll, k.count, nRanks, esz),
                            directMax, st.directSharing, st.sharedDirect)))
              ++expectLaunch;
          }
        if (ctx.rank == 0)
          std::printf(
              "%d ranks: launch path up to %llu bytes%s: %llu of %zu cases, %llu of them in LL "
              "mode (up to %llu bytes)\n",
              nRanks, static_cast<unsigned long long>(st.launchMaxBytes),
              st.launchDirect ? " (direct mode above)" : "",
              static_cast<unsigned long long>(expectLaunch), cases.size(),
              static_cast<unsigned long long>(expectLl),
              static_cast<unsigned long long>(st.llMaxBytes));
        // One rank: every eager op but PreMulSum's reductions is a cudaMemcpyAsync, unless
        // MKERNEL_ONE_RANK=kernel sends them all to the launch kernel.
        if (nRanks == 1 && st.launchMaxBytes > 0) {
          uint64_t wantCopies = 0;
          if (!mkernel::params::ONE_RANK.is("kernel"))
            for (const Case& k : cases)
              wantCopies += reduces(k.coll) && k.op == RedOp::PreMulSum ? 0 : 1;
          if (st.oneRankCopies != wantCopies)
            ctx.fail("one rank: " + std::to_string(st.oneRankCopies) +
                     " ops as cudaMemcpyAsync, want " + std::to_string(wantCopies));
        }
        if (st.llOps != expectLl)
          ctx.fail("LL mode ran " + std::to_string(st.llOps) + " collectives, want " +
                   std::to_string(expectLl));
        uint64_t launched = 0;
        for (uint64_t v : st.launchOps) launched += v;
        if (launched != expectLaunch)
          ctx.fail("launch path ran " + std::to_string(launched) + " collectives, want " +
                   std::to_string(expectLaunch));
        // The persistent kernel runs exactly when some op took the doorbell (with direct mode on,
        // thread ranks never need it for eager ops).
        if ((launched < cases.size()) != (st.kernelLaunches > 0))
          ctx.fail("persistent kernel launched " + std::to_string(st.kernelLaunches) +
                   " times for " + std::to_string(cases.size() - launched) +
                   " doorbell collectives");
      },
      size_t(32) << 20, ranksPerNode);
  for (const auto& f : failures) FAIL_CHECK(f);
  CHECK(failures.empty());
}

// Rings (collectives/algo/staged_ring.h) with MKERNEL_ALGO=ring: every case through the staged
// regions of thread ranks (the communicator stages for it), each rank pushing only into the next
// one. Checked against the float64 reference with the ring's roundings (n - 1 partials and the
// result), and by the statistics: with MKERNEL_RING_MIN_BYTES=0 every op a ring on the persistent
// kernel, none on the launch path; with auto (the default) the ops the LL mode takes are LL
// pushes on the launch path, the rest rings.
void runRingSweep(int nRanks, bool direct = false) {
  const int64_t ringMin = mkernel::params::RING_MIN_BYTES().value_or(-1);
  const std::vector<Case> cases = direct ? buildDirectCases(nRanks) : buildCases(nRanks);
  size_t maxBytes = 0;
  for (const Case& k : cases)
    maxBytes = std::max(
        maxBytes, k.count * static_cast<size_t>(nRanks) * mkernel::coll::dataTypeSize(k.dtype));
  maxBytes += 256;
  auto failures = mkgpu::runRanks(
      nRanks,
      [&](mkgpu::RankCtx& ctx) {
        uint8_t *sendDev = nullptr, *recvDev = nullptr;
        if (!runCases(ctx, cases, maxBytes, nRanks, &sendDev, &recvDev)) return;
        mkernel::coll::CollStats st;
        ctx.comm->stats(&st);
        uint64_t total = 0, launched = 0;
        for (uint64_t v : st.kernelOps) total += v;
        for (uint64_t v : st.launchOps) launched += v;
        if (!st.staged) ctx.fail("MKERNEL_ALGO=ring, but the communicator is not staged");
        // The ring's order (MKERNEL_RING_ORDER): a list is taken as given; auto on one GPU is rank
        // order (every rank on the same GPU: together, in rank order).
        const std::string& ro = mkernel::params::RING_ORDER();
        std::vector<int> wantOrder;
        if (ro != "auto" && ro != "rank") {
          if (!mkernel::coll::parseRingOrder(ro.c_str(), nRanks, &wantOrder))
            ctx.fail("bad MKERNEL_RING_ORDER " + ro);
        }
        bool identity = true;
        for (size_t p = 0; p < wantOrder.size(); ++p)
          identity = identity && wantOrder[p] == static_cast<int>(p);
        if (st.ringOrdered != (!wantOrder.empty() && !identity))
          ctx.fail(std::string("ring order ") + (st.ringOrdered ? "set" : "unset") +
                   ", MKERNEL_RING_ORDER=" + ro);
        for (size_t p = 0; p < wantOrder.size() && st.ringOrdered; ++p)
          if (st.ringOrder[p] != wantOrder[p])
            ctx.fail("ring position " + std::to_string(p) + " holds rank " +
                     std::to_string(st.ringOrder[p]) + ", want " + std::to_string(wantOrder[p]));
        uint64_t wantRings = 0;
        for (const Case& k : cases) {
          const uint64_t esz = mkernel::coll::dataTypeSize(k.dtype);
          if (mkernel::coll::ringTakes(
                  ringMin,
                  mkernel::coll::llTakes(mkernel::coll::llPayloadBytes(k.count, esz), st.llMaxBytes,
                                         nRanks),
                  mkernel::coll::directWholeBytes(k.coll, k.count, nRanks, esz)))
            ++wantRings;
        }
        const uint64_t wantLl = cases.size() - wantRings;
        if (ringMin < 0 && (wantLl == 0 || wantRings == 0))
          ctx.fail("MKERNEL_RING_MIN_BYTES=auto: the cases should hold LL-sized and larger ones (" +
                   std::to_string(wantLl) + " and " + std::to_string(wantRings) + ")");
        if (total != cases.size() || st.ringOps != wantRings || launched != wantLl ||
            st.llOps != wantLl)
          ctx.fail("kernel completed " + std::to_string(total) + " collectives, " +
                   std::to_string(st.ringOps) + " posted as rings, " + std::to_string(launched) +
                   " on the launch path (" + std::to_string(st.llOps) + " LL); want " +
                   std::to_string(cases.size()) + ", " + std::to_string(wantRings) + ", " +
                   std::to_string(wantLl) + " (" + std::to_string(wantLl) + ")");
        if (ctx.rank == 0)
          std::printf(
              "%d ranks as a ring (MKERNEL_RING_MIN_BYTES=%s): %llu of %zu cases rings, %llu LL, "
              "persistent kernel %d "
              "CTAs, launched %llu times\n",
              nRanks, mkernel::params::RING_MIN_BYTES.text(),
              static_cast<unsigned long long>(st.ringOps), cases.size(),
              static_cast<unsigned long long>(st.llOps), st.persistentCtas,
              static_cast<unsigned long long>(st.kernelLaunches));
      },
      size_t(32) << 20);
  for (const auto& f : failures) FAIL_CHECK(f);
  CHECK(failures.empty());
}

}  // namespace

TEST_CASE("gpu: every collective x dtype x op as rings (MKERNEL_ALGO=ring), 2, 3, 4 and 8 ranks",
          "[gpu][ring]") {
  if (!mkgpu::haveGpu()) FAIL("no CUDA device: the gpu tier needs one");
  setenv("MKERNEL_ALGO", "ring", 1);
  setenv("MKERNEL_RING_MIN_BYTES", "0", 1);  // every collective a ring, the smallest too
  mkernel::params::resetForTesting();
  for (int n : {2, 3, 8}) {
    INFO(n << " ranks, 1 MiB regions");
    runRingSweep(n);
  }
  // Small regions: the larger cases take many rounds (4 KiB: 1,024 floats per chunk), and 4 MiB
  // per rank (PreMulSum's pre() at every step) takes several even with 64 KiB.
  setenv("MKERNEL_STAGED_CHUNK_BYTES", "4096", 1);
  mkernel::params::resetForTesting();
  {
    INFO("4 ranks, 4 KiB regions");
    runRingSweep(4);
  }
  setenv("MKERNEL_STAGED_CHUNK_BYTES", "65536", 1);
  mkernel::params::resetForTesting();
  {
    INFO("4 ranks, 64 KiB regions, 4 MiB per rank");
    runRingSweep(4, /*direct=*/true);
  }
  unsetenv("MKERNEL_STAGED_CHUNK_BYTES");
  unsetenv("MKERNEL_RING_MIN_BYTES");
  unsetenv("MKERNEL_ALGO");
  mkernel::params::resetForTesting();
}

TEST_CASE("gpu: rings in a given order (MKERNEL_RING_ORDER), 4 and 8 ranks",
          "[gpu][ring][ringorder]") {
  if (!mkgpu::haveGpu()) FAIL("no CUDA device: the gpu tier needs one");
  setenv("MKERNEL_ALGO", "ring", 1);
  setenv("MKERNEL_RING_MIN_BYTES", "0", 1);
  setenv("MKERNEL_STAGED_CHUNK_BYTES", "65536", 1);  // several rounds per case
  mkernel::params::resetForTesting();
  for (const char* order : {"3,1,0,2", "0,2,1,3"}) {
    INFO("4 ranks, MKERNEL_RING_ORDER=" << order);
    setenv("MKERNEL_RING_ORDER", order, 1);
    mkernel::params::resetForTesting();
    runRingSweep(4);
  }
  {
    INFO("8 ranks, MKERNEL_RING_ORDER=5,2,7,0,3,6,1,4");
    setenv("MKERNEL_RING_ORDER", "5,2,7,0,3,6,1,4", 1);
    mkernel::params::resetForTesting();
    runRingSweep(8);
  }
  unsetenv("MKERNEL_RING_ORDER");
  unsetenv("MKERNEL_STAGED_CHUNK_BYTES");
  unsetenv("MKERNEL_RING_MIN_BYTES");
  unsetenv("MKERNEL_ALGO");
  mkernel::params::resetForTesting();
}

TEST_CASE(
    "gpu: rings from MKERNEL_RING_MIN_BYTES=auto: what the LL mode takes is an LL push, the rest a "
    "ring, 2 and 4 ranks",
    "[gpu][ring][ringmin]") {
  if (!mkgpu::haveGpu()) FAIL("no CUDA device: the gpu tier needs one");
  setenv("MKERNEL_ALGO", "ring", 1);
  mkernel::params::resetForTesting();
  for (int n : {2, 4}) {
    INFO(n << " ranks, MKERNEL_RING_MIN_BYTES unset (auto)");
    runRingSweep(n);
  }
  unsetenv("MKERNEL_ALGO");
  mkernel::params::resetForTesting();
}

TEST_CASE("gpu: every collective x dtype x op, 1 rank", "[gpu][r1]") {
  if (!mkgpu::haveGpu()) FAIL("no CUDA device: the gpu tier needs one");
  runSweep(1);
}
TEST_CASE("gpu: every collective x dtype x op, 2 ranks", "[gpu][r2]") {
  if (!mkgpu::haveGpu()) FAIL("no CUDA device: the gpu tier needs one");
  runSweep(2);
}
TEST_CASE("gpu: every collective x dtype x op, 4 ranks", "[gpu]") {
  if (!mkgpu::haveGpu()) FAIL("no CUDA device: the gpu tier needs one");
  runSweep(4);
}
TEST_CASE("gpu: every collective x dtype x op, 8 ranks", "[gpu][r8]") {
  if (!mkgpu::haveGpu()) FAIL("no CUDA device: the gpu tier needs one");
  runSweep(8);
}
// Direct mode's large ops, its own kernel or launchKernel (MKERNEL_DIRECT_KERNEL): ctest runs these
// with MKERNEL_DIRECT_MAX_BYTES=0 (test_gpu_direct, test_gpu_direct_shared), and the sweep checks
// that every op above the launch threshold took the launch path.
TEST_CASE("gpu: direct mode, every collective, 4 MiB per rank, 2 ranks", "[gpu][direct]") {
  if (!mkgpu::haveGpu()) FAIL("no CUDA device: the gpu tier needs one");
  runSweep(2, 0, 0, true);
}
TEST_CASE("gpu: direct mode, every collective, 4 MiB per rank, 4 ranks", "[gpu][direct]") {
  if (!mkgpu::haveGpu()) FAIL("no CUDA device: the gpu tier needs one");
  runSweep(4, 0, 0, true);
}

// Emulated nodes (MKERNEL_RANKS_PER_NODE): every collective runs hierarchically
// (collectives/algo/hier_staged.h): node phases through the staging buffers, the rail rounds
// through each rank's proxy over TCP on loopback, 2 x 2 here.
TEST_CASE(
    "gpu: every collective x dtype x op, 4 ranks as 2 emulated nodes of 2 (hierarchical, proxies)",
    "[gpu][hier]") {
  if (!mkgpu::haveGpu()) FAIL("no CUDA device: the gpu tier needs one");
  runSweep(4, 2);
}
// The next two have tags of their own: ctest runs each in a fresh process (test_gpu_hier_ctas,
// test_gpu_hier8), so that the streams of earlier cases do not share hardware queues with theirs.
TEST_CASE(
    "gpu: every collective x dtype x op, 4 ranks as 2 emulated nodes of 2, split over 3 CTAs "
    "(MKERNEL_HIER_CTAS)",
    "[gpu][hierctas]") {
  if (!mkgpu::haveGpu()) FAIL("no CUDA device: the gpu tier needs one");
  setenv("MKERNEL_HIER_CTAS", "3", 1);             // each CTA its slice and proxy channel
  setenv("MKERNEL_HIER_SPLIT_MIN_BYTES", "0", 1);  // every collective split, the small ones too
  mkernel::params::resetForTesting();
  runSweep(4, 2, 3);
  unsetenv("MKERNEL_HIER_CTAS");
  unsetenv("MKERNEL_HIER_SPLIT_MIN_BYTES");
  mkernel::params::resetForTesting();
}
// CTA roles (MKERNEL_HIER_ROLES, collectives/algo/hier_staged.h): the AllReduces on a sender, W
// workers and R reducers per lane, the other collectives data-parallel between them. Two lanes of 1
// + 2 + 2 CTAs with every collective split (every AllReduce in roles); then the default lanes
// (MKERNEL_HIER_CTAS) of 1 + 1 + 1 from 16 KiB (hierRolesFor: the AllReduces of 4099 elements of
// 4 bytes and more in roles, the smaller ones data-parallel on CTA 0 between them).
TEST_CASE(
    "gpu: every collective x dtype x op, 4 ranks as 2 emulated nodes of 2, AllReduce in CTA roles",
    "[gpu][hierroles]") {
  if (!mkgpu::haveGpu()) FAIL("no CUDA device: the gpu tier needs one");
  setenv("MKERNEL_HIER_ROLES", "2,2", 1);
  setenv("MKERNEL_HIER_CTAS", "2", 1);
  setenv("MKERNEL_HIER_SPLIT_MIN_BYTES", "0", 1);
  mkernel::params::resetForTesting();
  runSweep(4, 2, 2);
  unsetenv("MKERNEL_HIER_CTAS");
  unsetenv("MKERNEL_HIER_SPLIT_MIN_BYTES");
  setenv("MKERNEL_HIER_ROLES", "1,1", 1);
  setenv("MKERNEL_HIER_SPLIT_MIN_BYTES", "16384", 1);
  mkernel::params::resetForTesting();
  runSweep(4, 2);
  unsetenv("MKERNEL_HIER_SPLIT_MIN_BYTES");
  unsetenv("MKERNEL_HIER_ROLES");
  mkernel::params::resetForTesting();
}
// MKERNEL_HIER_RAIL (collectives/algo/hier_staged.h, "The AllReduce's exchange among the rail"):
// the rail exchange of the AllReduces, ReduceScatters and AllGathers as a ring over 3 and 4
// emulated nodes and by recursive halving and doubling over 4 (2 + 2 steps per AllReduce chunk);
// Broadcast and Reduce on the binomial tree among the nodes.
TEST_CASE(
    "gpu: every collective x dtype x op, 6-8 ranks as 3-4 emulated nodes of 2, AllReduce rail ring "
    "and rhd",
    "[gpu][hierrail]") {
  if (!mkgpu::haveGpu()) FAIL("no CUDA device: the gpu tier needs one");
  for (const char* rail : {"ring", "rhd"}) {
    INFO("MKERNEL_HIER_RAIL=" << rail);
    setenv("MKERNEL_HIER_RAIL", rail, 1);
    mkernel::params::resetForTesting();
    runSweep(8, 2);
  }
  setenv("MKERNEL_HIER_RAIL", "ring", 1);
  mkernel::params::resetForTesting();
  runSweep(6, 2);
  unsetenv("MKERNEL_HIER_RAIL");
  mkernel::params::resetForTesting();
}
// CTA roles with the ring and rhd exchanges: the sender posts each chunk's N - 1 (log2 N) reduce-
// scatter steps, each reduced by the reducers before the next, and its all-gather steps woven with
// the next chunk's. Ring over 4 nodes in two lanes of 1 + 2 + 2 CTAs with every AllReduce in roles;
// rhd over 4 in one lane of 1 + 1 + 2 from 16 KiB; ring over 3 in the default lanes of 1 + 1 + 1
// from 16 KiB (the smaller AllReduces data-parallel between).
TEST_CASE(
    "gpu: every collective x dtype x op, 6-8 ranks as 3-4 emulated nodes of 2, AllReduce in CTA "
    "roles with rail ring and rhd",
    "[gpu][hierrailroles]") {
  if (!mkgpu::haveGpu()) FAIL("no CUDA device: the gpu tier needs one");
  struct Run {
    const char* rail;
    int ranks;
    const char* roles;
    int lanes;  // 0: MKERNEL_HIER_CTAS's default
    const char* splitMin;
  };
  for (const Run& r : {Run{"ring", 8, "2,2", 2, "0"}, Run{"rhd", 8, "1,2", 1, "16384"},
                       Run{"ring", 6, "1,1", 0, "16384"}}) {
    INFO("MKERNEL_HIER_RAIL=" << r.rail << ", " << r.ranks << " ranks, MKERNEL_HIER_ROLES="
                              << r.roles << ", lanes " << r.lanes << ", split from " << r.splitMin);
    setenv("MKERNEL_HIER_RAIL", r.rail, 1);
    setenv("MKERNEL_HIER_ROLES", r.roles, 1);
    setenv("MKERNEL_HIER_SPLIT_MIN_BYTES", r.splitMin, 1);
    if (r.lanes > 0) setenv("MKERNEL_HIER_CTAS", std::to_string(r.lanes).c_str(), 1);
    mkernel::params::resetForTesting();
    runSweep(r.ranks, 2, r.lanes);
    unsetenv("MKERNEL_HIER_CTAS");
    mkernel::params::resetForTesting();
  }
  unsetenv("MKERNEL_HIER_SPLIT_MIN_BYTES");
  unsetenv("MKERNEL_HIER_ROLES");
  unsetenv("MKERNEL_HIER_RAIL");
  mkernel::params::resetForTesting();
}
TEST_CASE(
    "gpu: every collective x dtype x op, 8 ranks as 2 emulated nodes of 4 (hierarchical, proxies)",
    "[gpu][hier8]") {
  if (!mkgpu::haveGpu()) FAIL("no CUDA device: the gpu tier needs one");
  runSweep(8, 4);
}

// Ranks sharing the GPU that reach their collectives far apart, each queueing three back to back
// (launch path, launch path, persistent kernel): a rank's second collective, which waits for its
// first, must not sit in a hardware queue ahead of a late peer's first. The communicator fences
// each start (collectives/runtime/post_fence.h). ctest runs this with one hardware queue for every
// stream (test_gpu_hol), and once more with the fence off (test_gpu_hol_nofence,
// MKERNEL_POST_FENCE=0, MKERNEL_TIMEOUT_S=3), which must fail: that is the stall of
// docs/RELIABILITY.md.
TEST_CASE("gpu: ranks sharing the GPU arrive 5 ms apart and queue 3 collectives each",
          "[gpu][hol]") {
  if (!mkgpu::haveGpu()) FAIL("no CUDA device: the gpu tier needs one");
  // The third collective must take the doorbell: no small persistent kernels for direct mode.
  setenv("MKERNEL_SHARED_CTAS", "0", 1);
  mkernel::params::resetForTesting();
  for (int nRanks : {4, 8}) {
    INFO(nRanks << " ranks");
    const size_t small = 1000, large = size_t(1)
                                       << 20;  // 4 KiB each, 4 MiB (above the launch path)
    auto failures = mkgpu::runRanks(nRanks, [&](mkgpu::RankCtx& ctx) {
      const int r = ctx.rank;
      auto* a = ctx.deviceAlloc<int32_t>(small * sizeof(int32_t));
      auto* b = ctx.deviceAlloc<int32_t>(small * sizeof(int32_t));
      auto* c = ctx.deviceAlloc<int32_t>(large * sizeof(int32_t));
      if (a == nullptr || b == nullptr || c == nullptr) return ctx.fail("cudaMalloc");
      std::vector<int32_t> va(small, r + 1), vb(small, r == 1 ? 77 : -1), vc(large, 10 * (r + 1));
      if (!ctx.toDevice(a, va.data(), small * 4) || !ctx.toDevice(b, vb.data(), small * 4) ||
          !ctx.toDevice(c, vc.data(), large * 4) ||
          cudaStreamSynchronize(ctx.stream) != cudaSuccess)
        return ctx.fail("upload");
      ctx.hostReset();
      ctx.bs->barrier();
      std::this_thread::sleep_for(std::chrono::milliseconds(5 * r));
      const CollArgs ar =
          mkgpu::collArgs(CollType::AllReduce, DataType::Int32, RedOp::Sum, a, a, small);
      const CollArgs bc = mkgpu::collArgs(CollType::Broadcast, DataType::Int32, RedOp::Sum, b, b,
                                          small, /*root=*/1);
      const CollArgs big =
          mkgpu::collArgs(CollType::AllReduce, DataType::Int32, RedOp::Sum, c, c, large);
      for (const CollArgs* op : {&ar, &bc, &big})
        if (ctx.comm->enqueue(op, 1, ctx.stream) != Result::Success)
          return ctx.fail(std::string("enqueue: ") + mkernel::lastError());
      auto* ga = static_cast<const int32_t*>(ctx.fromDevice(a, small * 4));
      auto* gb = static_cast<const int32_t*>(ctx.fromDevice(b, small * 4));
      auto* gc = static_cast<const int32_t*>(ctx.fromDevice(c, large * 4));
      if (ga == nullptr || gb == nullptr || gc == nullptr) return ctx.fail("download");
      if (cudaStreamSynchronize(ctx.stream) != cudaSuccess) return ctx.fail("stream sync");
      if (ctx.comm->asyncError() != Result::Success)
        return ctx.fail(std::string("async: ") + mkernel::lastError());
      const int32_t sum = nRanks * (nRanks + 1) / 2;
      for (size_t i = 0; i < small; ++i)
        if (ga[i] != sum || gb[i] != 77)
          return ctx.fail("wrong small result at " + std::to_string(i));
      for (size_t i = 0; i < large; ++i)
        if (gc[i] != 10 * sum) return ctx.fail("wrong large result at " + std::to_string(i));
      mkernel::coll::CollStats st;
      ctx.comm->stats(&st);
      if (st.kernelLaunches == 0)
        ctx.fail("the 4 MiB AllReduce did not take the persistent kernel");
    });
    for (const auto& f : failures) FAIL_CHECK(f);
    CHECK(failures.empty());
  }
  unsetenv("MKERNEL_SHARED_CTAS");
  mkernel::params::resetForTesting();
}
