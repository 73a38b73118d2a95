// CPU reference executor (see reference.h). Each algorithm mirrors what the persistent kernel
// does between its barriers; comments name the barrier points.
#include "tests/oracle/reference.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <vector>

#include "tests/oracle/reference_internal.h"
#include "collectives/algo/reduce_host.h"

namespace mkernel {
namespace coll {
namespace {

constexpr uint8_t kStagingPoison = 0xA5;

// Per-rank staging buffers of the simulated ranks (equal regions of regionElems elements), with
// the bookkeeping that proves the schedule never reads what a concurrent GPU could not yet have
// written.
class StagingSim {
 public:
  StagingSim(int nRanks, int regions, size_t regionElems, size_t elemSize)
      : nRanks_(nRanks),
        regions_(regions),
        regionBytes_(regionElems * elemSize),
        elemSize_(elemSize),
        data_(static_cast<size_t>(nRanks) * regions * regionBytes_),
        meta_(static_cast<size_t>(nRanks) * regions) {}

  void beginRound(size_t round) {
    round_ = round;
    if (!data_.empty()) std::memset(data_.data(), kStagingPoison, data_.size());
    for (Meta& m : meta_) m = Meta{};
  }
  void nextPhase() { ++phase_; }

  // Destination for `n` elements written into (rank, region) in the current phase.
  Result writable(int rank, int region, size_t n, void** dst) {
    if (!inRange(rank, region) || n * elemSize_ > regionBytes_)
      return MK_ERROR(Result::InternalError,
                      "reference: round %zu writes %zu elements to rank %d staging region %d "
                      "(regions %d of %zu B)",
                      round_, n, rank, region, regions_, regionBytes_);
    Meta& m = meta_[index(rank, region)];
    m.written = true;
    m.count = n;
    m.phase = phase_;
    *dst = data_.data() + index(rank, region) * regionBytes_;
    return Result::Success;
  }

  // Source of `n` elements of (rank, region): written, with n elements, in an earlier phase of
  // this round.
  Result readable(int rank, int region, size_t n, const void** src) const {
    if (!inRange(rank, region))
      return MK_ERROR(Result::InternalError, "reference: round %zu reads rank %d region %d of %d",
                      round_, rank, region, regions_);
    const Meta& m = meta_[index(rank, region)];
    if (!m.written || m.phase >= phase_)
      return MK_ERROR(Result::InternalError,
                      "reference: round %zu reads rank %d staging region %d before a barrier "
                      "made it visible (%s)",
                      round_, rank, region,
                      m.written ? "written in the same phase" : "never written this round");
    if (m.count != n)
      return MK_ERROR(Result::InternalError,
                      "reference: round %zu reads %zu elements of rank %d region %d, %zu written",
                      round_, n, rank, region, m.count);
    *src = data_.data() + index(rank, region) * regionBytes_;
    return Result::Success;
  }

 private:
  struct Meta {
    bool written = false;
    size_t count = 0;
    uint64_t phase = 0;
  };
  bool inRange(int rank, int region) const {
    return rank >= 0 && rank < nRanks_ && region >= 0 && region < regions_;
  }
  size_t index(int rank, int region) const {
    return static_cast<size_t>(rank) * regions_ + static_cast<size_t>(region);
  }

  int nRanks_;
  int regions_;
  size_t regionBytes_;
  size_t elemSize_;
  std::vector<uint8_t> data_;
  std::vector<Meta> meta_;
  size_t round_ = 0;
  uint64_t phase_ = 1;
};

class Executor : private ExecutorBase {
 public:
  Executor(const Plan& plan, const RankBuffers* bufs)
      : ExecutorBase(bufs, plan.elemSize, plan.describe()),
        p_(plan),
        a_(plan.args),
        n_(plan.args.nRanks),
        staging_(n_, a_.algo == Algo::Ring ? ringInboxRegions(a_.coll) : 1,
                 a_.algo == Algo::Ring ? plan.chunkElems : plan.stagingElems, plan.elemSize) {}

  Result run(ReferenceStats* stats) {
    for (size_t k = 0; k < p_.rounds; ++k) {
      staging_.beginRound(k);
      MK_CHECK(runRound(k));
    }
    fillStats(p_.rounds, stats);
    return Result::Success;
  }

 private:
  Result barrier() {
    staging_.nextPhase();
    return endPhase();
  }
  // acc = pre(src_0) OP pre(src_1) ... in reductionPeer() order; src(q) gives rank q's input.
  template <typename SrcFn>
  Result reduceInto(size_t n, int slice, SrcFn src) {
    uint8_t* out = acc(n);
    for (int i = 0; i < n_; ++i) {
      const void* x = nullptr;
      MK_CHECK(src(reductionPeer(a_.algo, i, slice, n_), &x));
      if (i == 0) {
        hostPreOp(p_.redOp, a_.dtype, out, x, n);
      } else {
        hostReduce(p_.redOp, a_.dtype, out, x, n);
      }
    }
    hostPostOp(p_.redOp, a_.dtype, out, n);
    return Result::Success;
  }

  Result runRound(size_t k) {
    switch (a_.algo) {
      case Algo::OneShot:
        return allReduceOneShot();
      case Algo::TwoShot:
        return allReduceTwoShot();
      case Algo::Direct:
        return direct();
      case Algo::Ring:
        return ring(k);
    }
    return MK_ERROR(Result::InternalError, "reference: no executor for %s", desc_.c_str());
  }

  // ---- direct algorithms: start barrier, one phase, end barrier ---------------------------------
  Result allReduceOneShot() {
    const size_t n = a_.count;
    std::vector<bool> staged(n_);
    for (int r = 0; r < n_; ++r) {  // in-place ranks copy their input aside first
      staged[r] = bufs_[r].send == bufs_[r].recv;
      if (!staged[r]) continue;
      void* dst = nullptr;
      MK_CHECK(staging_.writable(r, 0, n, &dst));
      const void* src = userRead(r, sendAt(r, 0), n);
      if (n != 0) std::memcpy(dst, src, n * es_);
      written_ += n;
    }
    MK_CHECK(barrier());  // start: every input (or its staged copy) is ready
    for (int r = 0; r < n_; ++r) {
      MK_CHECK(reduceInto(n, 0, [&](int q, const void** x) {
        if (staged[q]) {
          read_ += n;
          return staging_.readable(q, 0, n, x);
        }
        *x = userRead(r, sendAt(q, 0), n);
        return Result::Success;
      }));
      userWrite(r, recvAt(r, 0), acc_.data(), n);
    }
    return barrier();  // end: nobody reads our buffers any more
  }

  Result allReduceTwoShot() {
    MK_CHECK(barrier());
    for (int r = 0; r < n_; ++r) {
      Slice s = rankSlice(a_.count, n_, r, p_.alignElems);
      MK_CHECK(reduceInto(s.count, r, [&](int q, const void** x) {
        *x = userRead(r, sendAt(q, s.offset), s.count);
        return Result::Success;
      }));
      for (int q = 0; q < n_; ++q) userWrite(r, recvAt(q, s.offset), acc_.data(), s.count);
    }
    return barrier();
  }

  Result direct() {
    MK_CHECK(barrier());
    const size_t count = a_.count;
    for (int r = 0; r < n_; ++r) {
      switch (a_.coll) {
        case CollType::ReduceScatter: {
          Slice b = blockSlice(count, r);
          MK_CHECK(reduceInto(count, r, [&](int q, const void** x) {
            *x = userRead(r, sendAt(q, b.offset), count);
            return Result::Success;
          }));
          userWrite(r, recvAt(r, 0), acc_.data(), count);
          break;
        }
        case CollType::AllGather: {
          if (count != 0) std::memcpy(acc(count), userRead(r, sendAt(r, 0), count), count * es_);
          for (int q = 0; q < n_; ++q)
            userWrite(r, recvAt(q, blockSlice(count, r).offset), acc_.data(), count);
          break;
        }
        case CollType::Broadcast: {
          Slice s = rankSlice(count, n_, r, p_.alignElems);
          if (s.count != 0)
            std::memcpy(acc(s.count), userRead(r, sendAt(a_.root, s.offset), s.count),
                        s.count * es_);
          for (int q = 0; q < n_; ++q) userWrite(r, recvAt(q, s.offset), acc_.data(), s.count);
          break;
        }
        case CollType::Reduce: {
          Slice s = rankSlice(count, n_, r, p_.alignElems);
          MK_CHECK(reduceInto(s.count, r, [&](int q, const void** x) {
            *x = userRead(r, sendAt(q, s.offset), s.count);
            return Result::Success;
          }));
          userWrite(r, recvAt(a_.root, s.offset), acc_.data(), s.count);
          break;
        }
        case CollType::AllReduce:
          return MK_ERROR(Result::InternalError, "reference: %s is not direct", desc_.c_str());
      }
    }
    return barrier();
  }

  // ---- ring: steps of one round, a barrier (flag wait) after each -------------------------------
  Slice ringChunk(int slice, size_t k) const {
    return chunkOf(ringSlice(a_.coll, a_.count, n_, slice, p_.alignElems), p_.chunkElems, k);
  }
  // acc = pre(own input), or inbox(region) OP pre(own input) when not first.
  Result ringAccumulate(int r, bool first, int region, const void* input, size_t n) {
    uint8_t* out = acc(n);
    const void* x = userRead(r, input, n);
    if (first) {
      hostPreOp(p_.redOp, a_.dtype, out, x, n);
      return Result::Success;
    }
    const void* inbox = nullptr;
    MK_CHECK(staging_.readable(r, region, n, &inbox));
    if (n != 0) std::memcpy(out, inbox, n * es_);
    read_ += n;
    hostReduce(p_.redOp, a_.dtype, out, x, n);
    return Result::Success;
  }
  Result loadInbox(int r, int region, size_t n) {
    const void* inbox = nullptr;
    MK_CHECK(staging_.readable(r, region, n, &inbox));
    if (n != 0) std::memcpy(acc(n), inbox, n * es_);
    read_ += n;
    return Result::Success;
  }
  void loadUser(int r, const void* src, size_t n) {
    if (n != 0) std::memmove(acc(n), userRead(r, src, n), n * es_);
  }
  Result push(int toRank, int region, size_t n) {
    void* dst = nullptr;
    MK_CHECK(staging_.writable(toRank, region, n, &dst));
    if (n != 0) std::memcpy(dst, acc_.data(), n * es_);
    written_ += n;
    return Result::Success;
  }

  Result ring(size_t k) {
    switch (a_.coll) {
      case CollType::AllReduce:
        return ringAllReduce(k);
      case CollType::ReduceScatter:
        return ringReduceScatter(k);
      case CollType::AllGather:
        return ringAllGather(k);
      case CollType::Broadcast:
      case CollType::Reduce:
        return ringChain(k);
    }
    return MK_ERROR(Result::InternalError, "reference: no ring for %s", desc_.c_str());
  }

  Result ringAllReduce(size_t k) {
    const int last = 2 * n_ - 2;
    for (int t = 0; t <= last; ++t) {
      for (int r = 0; r < n_; ++r) {
        const int inbox = ringInboxRegion(t - 1);
        if (t < n_ - 1) {  // reduce-scatter step
          Slice c = ringChunk(ringRsSendSlice(r, t, n_), k);
          MK_CHECK(ringAccumulate(r, t == 0, inbox, sendAt(r, c.offset), c.count));
          MK_CHECK(push(ringNext(r, n_), ringInboxRegion(t), c.count));
        } else if (t == n_ - 1) {  // own slice complete: finish, store, start the all-gather
          Slice c = ringChunk(r, k);
          MK_CHECK(ringAccumulate(r, n_ == 1, inbox, sendAt(r, c.offset), c.count));
          hostPostOp(p_.redOp, a_.dtype, acc_.data(), c.count);
          userWrite(r, recvAt(r, c.offset), acc_.data(), c.count);
          if (t < last) MK_CHECK(push(ringNext(r, n_), ringInboxRegion(t), c.count));
        } else {  // all-gather: store what arrived at step t-1 and pass it on
          Slice c = ringChunk(ringAgRecvSlice(r, t - n_, n_), k);
          MK_CHECK(loadInbox(r, inbox, c.count));
          userWrite(r, recvAt(r, c.offset), acc_.data(), c.count);
          if (t < last) MK_CHECK(push(ringNext(r, n_), ringInboxRegion(t), c.count));
        }
      }
      MK_CHECK(barrier());
    }
    return Result::Success;
  }

  Result ringReduceScatter(size_t k) {
    const Slice mine = chunkOf(Slice{0, a_.count}, p_.chunkElems, k);
    for (int t = 0; t < n_; ++t) {
      for (int r = 0; r < n_; ++r) {
        const int block = t < n_ - 1 ? ringRsSendSlice(r, t, n_) : r;
        Slice c = ringChunk(block, k);
        MK_CHECK(ringAccumulate(r, t == 0, ringInboxRegion(t - 1), sendAt(r, c.offset), c.count));
        if (t < n_ - 1) {
          MK_CHECK(push(ringNext(r, n_), ringInboxRegion(t), c.count));
        } else {
          hostPostOp(p_.redOp, a_.dtype, acc_.data(), c.count);
          userWrite(r, recvAt(r, mine.offset), acc_.data(), c.count);
        }
      }
      MK_CHECK(barrier());
    }
    return Result::Success;
  }

  Result ringAllGather(size_t k) {
    const Slice mine = chunkOf(Slice{0, a_.count}, p_.chunkElems, k);
    for (int t = 0; t < n_; ++t) {
      for (int r = 0; r < n_; ++r) {
        const int block = t == 0 ? r : ringAgRecvSlice(r, t - 1, n_);
        Slice c = ringChunk(block, k);
        if (t == 0) {
          loadUser(r, sendAt(r, mine.offset), mine.count);  // may alias recv in place
        } else {
          MK_CHECK(loadInbox(r, ringInboxRegion(t - 1), c.count));
        }
        userWrite(r, recvAt(r, c.offset), acc_.data(), c.count);
        if (t < n_ - 1) MK_CHECK(push(ringNext(r, n_), ringInboxRegion(t), c.count));
      }
      MK_CHECK(barrier());
    }
    return Result::Success;
  }

  // Broadcast: position t stores and passes on; Reduce: position t adds its input, the root
  // (last) post()s and stores.
  Result ringChain(size_t k) {
    const bool isReduce = a_.coll == CollType::Reduce;
    Slice c = ringChunk(0, k);
    for (int t = 0; t < n_; ++t) {
      const int r = chainRank(a_.coll, t, a_.root, n_);
      if (isReduce) {
        MK_CHECK(ringAccumulate(r, t == 0, 0, sendAt(r, c.offset), c.count));
        if (t == n_ - 1) hostPostOp(p_.redOp, a_.dtype, acc_.data(), c.count);
      } else if (t == 0) {
        loadUser(r, sendAt(r, c.offset), c.count);
      } else {
        MK_CHECK(loadInbox(r, 0, c.count));
      }
      if (!isReduce || t == n_ - 1) userWrite(r, recvAt(r, c.offset), acc_.data(), c.count);
      if (t < n_ - 1) MK_CHECK(push(ringNext(r, n_), 0, c.count));
      MK_CHECK(barrier());
    }
    return Result::Success;
  }

  const Plan& p_;
  const PlanArgs& a_;
  const int n_;
  StagingSim staging_;
};

}  // namespace

Result runReference(const Plan& plan, const RankBuffers* bufs, ReferenceStats* stats) {
  if (bufs == nullptr) return MK_ERROR(Result::InvalidArgument, "reference: no buffers");
  const PlanArgs& a = plan.args;
  if (a.count != 0) {
    for (int r = 0; r < a.nRanks; ++r) {
      bool needSend = a.coll != CollType::Broadcast || r == a.root;
      bool needRecv = a.coll != CollType::Reduce || r == a.root;
      if ((needSend && bufs[r].send == nullptr) || (needRecv && bufs[r].recv == nullptr))
        return MK_ERROR(Result::InvalidArgument, "reference: %s: rank %d lacks a %s buffer",
                        plan.describe().c_str(), r,
                        needSend && bufs[r].send == nullptr ? "send" : "recv");
    }
  }
  Executor ex(plan, bufs);
  return ex.run(stats);
}

double normwiseTolerance(DataType dtype) {
  switch (dtype) {
    case DataType::Float64:
      return 1e-12;
    case DataType::Float32:
      return 1e-5;
    case DataType::Float16:
    case DataType::Bfloat16:
      return 1e-2;
    case DataType::Fp8E4M3:
    case DataType::Fp8E5M2:
      return 1e-1;
    default:
      return 0.0;
  }
}

bool checkNormwise(DataType dtype, const void* got, const double* expected, size_t n,
                   std::string* why, double* relErr) {
  double errSq = 0.0, refSq = 0.0, worst = -1.0;
  size_t worstAt = 0;
  for (size_t i = 0; i < n; ++i) {
    double g = loadAsDouble(dtype, got, i);
    double d = g - expected[i];
    if (std::isnan(g) || std::isnan(d)) {
      if (why) *why = "element " + std::to_string(i) + " is NaN";
      if (relErr) *relErr = NAN;
      return false;
    }
    errSq += d * d;
    refSq += expected[i] * expected[i];
    if (std::fabs(d) > worst) {
      worst = std::fabs(d);
      worstAt = i;
    }
  }
  double err = refSq > 0.0 ? std::sqrt(errSq / refSq) : std::sqrt(errSq);
  if (relErr) *relErr = err;
  double tol = normwiseTolerance(dtype);
  if (err <= tol) return true;
  if (why) {
    char buf[256];
    std::snprintf(buf, sizeof(buf),
                  "%s: norm-wise relative error %.3g > %.3g; worst element %zu: got %.17g, "
                  "expected %.17g",
                  dataTypeName(dtype), err, tol, worstAt,
                  n ? loadAsDouble(dtype, got, worstAt) : 0.0, n ? expected[worstAt] : 0.0);
    *why = buf;
  }
  return false;
}

}  // namespace coll
}  // namespace mkernel
