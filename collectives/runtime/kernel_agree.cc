// What the ranks of a KernelCommunicator agree on at creation: the launch path's CTA cap, the
// hierarchical CTA roles and the rail exchange.
#include "collectives/runtime/kernel_communicator.h"

#ifdef MKERNEL_HAVE_DEVICE_CODE

namespace mkernel {
namespace coll {

// CTAs one launch-path op may use. Every rank's launch kernels wait for each other, so those of
// all ranks sharing a GPU must fit at once on the SMs that the persistent kernels (possibly
// resident) leave: (SMs left for persistent kernels + the ones kept free - this communicator's
// persistent CTAs on this GPU) x launch CTAs per SM, shared by the ranks on it. The minimum over
// ranks (an all-gather), so that every rank splits each op the same way. Direct-mode ops in their
// own kernel (MKERNEL_DIRECT_KERNEL=own) get the same count from that kernel's CTAs per SM.
Result KernelCommunicator::agreeLaunchCap(int smsLeft) {
  const int64_t asked = params::LAUNCH_CTAS();
  if (asked < 1 || asked > kLaunchMaxCtas)
    return MK_ERROR(Result::InvalidArgument, "MKERNEL_LAUNCH_CTAS=%lld outside 1..%d",
                    static_cast<long long>(asked), kLaunchMaxCtas);
  int perSm = 0, perSmDirect = 0;
  MK_CHECK(launchKernelCtasPerSm(&perSm));
  MK_CHECK(directKernelCtasPerSm(&perSmDirect));
  const int ranksHere = std::max(1, peers_.ranksOnMyDevice);
  // Ranks sharing a GPU in direct mode (MKERNEL_SHARED_CTAS) whose direct mode has no upper end
  // (auto, or MKERNEL_DIRECT_MAX_BYTES=0): no collective takes the doorbell (pathOf: eager ones are
  // LL, inbox or direct; captured ones the launch path, MKERNEL_GRAPH_LAUNCH being on), so the
  // persistent kernels never run and hold no SM. Otherwise every co-located rank's may be resident
  // (a stream's doorbell queued behind a launch-path op keeps it alive) and the launch-path
  // kernels must fit beside them. A communicator without one (CommOptions::persistentKernel)
  // holds none either.
  const bool doorbellUnused = (peers_.sharedDirect && directUnbounded()) || !opts_.persistentKernel;
  const int freeSms = smsLeft + kReservedSms - (doorbellUnused ? 0 : ranksHere * params_.nCtas);
  auto capFor = [&](int ctasPerSm, int64_t want) {
    return static_cast<int32_t>(std::max(
        1, std::min(static_cast<int>(want), freeSms * std::max(ctasPerSm, 1) / ranksHere)));
  };
  // Direct mode's CTAs, a power of two: one H200, AllReduce of 64 MiB to 1 GiB with 2
  // emulated ranks at 64 CTAs each 77-93% of the copy bandwidth, at 60 CTAs 69-78%; 4 ranks at 32
  // CTAs 78-93%, at 29 69-81% (every CTA's part then starts at a power-of-two fraction of the
  // range). With ranks sharing a GPU in direct mode (MKERNEL_SHARED_CTAS), as many as fit.
  const int64_t askedDirect = peers_.sharedDirect ? kLaunchMaxCtas : asked;
  std::vector<int32_t> caps(2 * static_cast<size_t>(opts_.nRanks), 0);
  caps[2 * static_cast<size_t>(opts_.rank)] = capFor(perSm, asked);
  caps[2 * static_cast<size_t>(opts_.rank) + 1] =
      (params_.ownKernels & kOwnKernelDirect) != 0 ? capFor(perSmDirect, askedDirect) : 0;
  MK_CHECK(bs_->allGather(caps.data(), 2 * sizeof(int32_t)));
  int32_t cap = caps[0], directCap = caps[1];
  for (int k = 0; k < opts_.nRanks; ++k) {
    cap = std::min(cap, caps[2 * static_cast<size_t>(k)]);
    directCap = std::min(directCap, caps[2 * static_cast<size_t>(k) + 1]);
  }
  // The most ranks on one GPU (direct mode's upper end, directTakes): the same on every rank.
  std::vector<int32_t> here(static_cast<size_t>(opts_.nRanks), 0);
  here[static_cast<size_t>(opts_.rank)] = ranksHere;
  MK_CHECK(bs_->allGather(here.data(), sizeof(int32_t)));
  directSharing_ = 1;
  for (int32_t h : here) directSharing_ = std::max(directSharing_, static_cast<int>(h));
  launchCap_ = std::max(1, static_cast<int>(cap));
  // A rank with MKERNEL_DIRECT_KERNEL=shared sent 0: then direct mode keeps launchKernel's count
  // everywhere (the kernel is each rank's own choice; the split must be the same on every rank).
  directCap_ = directCap > 0 ? static_cast<int>(directCap) : launchCap_;
  while ((directCap_ & (directCap_ - 1)) != 0)
    directCap_ &= directCap_ - 1;  // the power of two below
  // LL mode's limit (MKERNEL_LL_MAX_BYTES): the smallest any rank asked for, so that every rank
  // takes the same ops; off with the launch path.
  // auto: kLlAutoMaxBytes, or kLlSharedMaxBytes with more than two ranks on this GPU; never more
  // than the slots hold with this many ranks (llLimit, launch_path.h).
  uint64_t llWant = ~0ull;
  if (const std::optional<int64_t> v = params::LL_MAX_BYTES()) llWant = static_cast<uint64_t>(*v);
  const int64_t llAsked = static_cast<int64_t>(llLimit(llWant, opts_.nRanks, ranksHere));
  std::vector<int64_t> lls(static_cast<size_t>(opts_.nRanks), 0);
  // Off for emulated nodes (their collectives take the doorbell, pathOf), so that the statistics
  // report what runs.
  const bool hier = perNode_ > 0 && perNode_ < opts_.nRanks;
  lls[static_cast<size_t>(opts_.rank)] = launchMaxBytes_ > 0 && !hier ? llAsked : 0;
  MK_CHECK(bs_->allGather(lls.data(), sizeof(int64_t)));
  int64_t llMax = lls[0];
  for (int64_t v : lls) llMax = std::min(llMax, v);
  llMaxBytes_ = static_cast<uint64_t>(llMax);
  // At most kLaunchBytesPerCta per CTA: beyond that the doorbell path's CTAs move it faster.
  launchMaxBytes_ =
      std::min<uint64_t>(launchMaxBytes_, static_cast<uint64_t>(launchCap_) * kLaunchBytesPerCta);
  MK_INFO(
      kLogInit,
      "rank %d: launch path for eager collectives up to %llu bytes (LL mode up to %llu bytes per "
      "peer), at most %d CTAs x %d threads per op; direct mode at most %d CTAs x %d threads",
      opts_.rank, static_cast<unsigned long long>(launchMaxBytes_),
      static_cast<unsigned long long>(llMaxBytes_), launchCap_, kLaunchThreads, directCap_,
      (params_.ownKernels & kOwnKernelDirect) != 0 ? kDirectThreads : kLaunchThreads);
  return Result::Success;
}

// MKERNEL_HIER_ROLES: "off" (or 0), or "W,R": the hierarchical AllReduce runs each lane on one
// sender, W worker and R reducer CTAs (collectives/algo/hier_staged.h, "CTA roles"), pipelined, or
// in turn with MKERNEL_HIER_OVERLAP=0. Rank 0's value is every rank's: the CTAs' roles must match
// their peers'. Needs hierCtas_ x (1 + W + R) CTAs in the persistent kernel.
Result KernelCommunicator::agreeHierRoles() {
  const std::string& v = params::HIER_ROLES();
  int32_t wr[2] = {0, 0};
  if (!v.empty() && v != "off" && v != "0") {
    int w = 0, r = 0;
    char tail = 0;
    if (std::sscanf(v.c_str(), "%d,%d%c", &w, &r, &tail) != 2 || w < 1 || w > kMaxHierRoleCtas ||
        r < 1 || r > kMaxHierRoleCtas)
      return MK_ERROR(
          Result::InvalidArgument,
          "MKERNEL_HIER_ROLES=%s: want off, or W,R (workers and reducers per lane, 1..%d each)",
          v.c_str(), kMaxHierRoleCtas);
    wr[0] = w;
    wr[1] = r;
  }
  std::vector<int32_t> all(2 * static_cast<size_t>(opts_.nRanks), 0);
  std::memcpy(&all[2 * static_cast<size_t>(opts_.rank)], wr, sizeof(wr));
  MK_CHECK(bs_->allGather(all.data(), sizeof(wr)));
  hierWorkers_ = all[0];
  hierReducers_ = all[1];
  if (hierWorkers_ == 0) return Result::Success;
  const int need = hierRoleCtas(hierCtas_, hierWorkers_, hierReducers_);
  if (need > peers_.nCtas)
    return MK_ERROR(Result::InvalidArgument,
                    "rank %d: MKERNEL_HIER_ROLES=%d,%d with %d lane(s) (MKERNEL_HIER_CTAS) needs "
                    "%d CTAs; the persistent "
                    "kernel has %d (MKERNEL_CTAS)",
                    opts_.rank, hierWorkers_, hierReducers_, hierCtas_, need, peers_.nCtas);
  return Result::Success;
}

// MKERNEL_HIER_RAIL: direct, ring or rhd (collectives/algo/hier_staged.h, "The AllReduce's exchange
// among the rail"), and MKERNEL_HIER_AHEAD: 1 or 2 chunks (the pipelined direct AllReduce's
// look-ahead, hierAllReduce). Rank 0's values are every rank's: the steps of a chunk, and the
// order of the rounds, must match the peers'. rhd on a node count that is not a power of two runs
// ring. Every rail form runs in CTA roles too.
Result KernelCommunicator::agreeHierRail() {
  const int32_t asked = coll::hierRailByName(params::HIER_RAIL.text());
  if (asked < 0)
    return MK_ERROR(Result::InvalidArgument, "MKERNEL_HIER_RAIL=%s: want direct, ring or rhd",
                    params::HIER_RAIL.text());
  const int64_t ahead = params::HIER_AHEAD();
  std::vector<int32_t> all(2 * static_cast<size_t>(opts_.nRanks), 0);
  all[2 * static_cast<size_t>(opts_.rank)] = asked;
  all[2 * static_cast<size_t>(opts_.rank) + 1] = static_cast<int32_t>(ahead);
  MK_CHECK(bs_->allGather(all.data(), 2 * sizeof(int32_t)));
  const int N = opts_.nRanks / perNode_;
  hierRail_ = coll::hierRailFor(all[0], N);
  hierAhead_ = all[1];
  if (hierRail_ != all[0])
    MK_INFO(kLogInit,
            "rank %d: MKERNEL_HIER_RAIL=rhd needs a power-of-two node count; %d nodes exchange in "
            "a ring",
            opts_.rank, N);
  return Result::Success;
}

}  // namespace coll
}  // namespace mkernel

#endif  // MKERNEL_HAVE_DEVICE_CODE
