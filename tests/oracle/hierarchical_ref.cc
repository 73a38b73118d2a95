// CPU reference executor of the hierarchical collectives (hierarchical_ref.h). Each function runs
// the phases listed in collectives/algo/hierarchical.h; "rank (k,l)" is node k, local index l.
#include "tests/oracle/hierarchical_ref.h"

#include <cstring>
#include <string>
#include <vector>

#include "tests/oracle/reference_internal.h"
#include "collectives/algo/reduce_host.h"

namespace mkernel {
namespace coll {
namespace {

std::string describe(const HierArgs& a) {
  return std::string(collName(a.coll)) + "/hierarchical " + dataTypeName(a.dtype) + " " +
         redOpName(a.op) + " count=" + std::to_string(a.count) + " " +
         std::to_string(a.layout.nNodes) + "x" + std::to_string(a.layout.perNode);
}

class HierExecutor : private ExecutorBase {
 public:
  HierExecutor(const HierArgs& a, const DevRedOp& op, const RankBuffers* bufs)
      : ExecutorBase(bufs, dataTypeSize(a.dtype), describe(a)),
        a_(a),
        L_(a.layout),
        n_(a.layout.nRanks()),
        align_(sliceAlignElems(es_)),
        op_(op),
        combine_(op),
        partial_(static_cast<size_t>(n_)),
        partialPhase_(static_cast<size_t>(n_), 0) {
    // Partials already went through pre() (and post() comes once at the end): combining them is
    // the plain operation.
    if (combine_.kind == DevRedOpKind::PreMulSum || combine_.kind == DevRedOpKind::SumPostDiv)
      combine_.kind = DevRedOpKind::Sum;
    const size_t elems = hierPartialElems(a.coll, L_, a.count, align_);
    for (auto& p : partial_) p.assign(elems * es_, 0);
  }

  Result run(ReferenceStats* stats) {
    if (a_.count != 0) {
      switch (a_.coll) {
        case CollType::AllReduce:
          MK_CHECK(allReduce());
          break;
        case CollType::ReduceScatter:
          MK_CHECK(reduceScatter());
          break;
        case CollType::AllGather:
          MK_CHECK(allGather());
          break;
        case CollType::Broadcast:
          MK_CHECK(broadcast());
          break;
        case CollType::Reduce:
          MK_CHECK(reduce());
          break;
      }
    }
    fillStats(a_.count != 0 ? 1 : 0, stats);
    return Result::Success;
  }

 private:
  // Rank r's partial buffer, written in this phase.
  uint8_t* partialWrite(int r, size_t off, size_t n) {
    partialPhase_[static_cast<size_t>(r)] = phase_;
    written_ += n;
    return partial_[static_cast<size_t>(r)].data() + off * es_;
  }
  // Rank r's partial buffer, which must have been written before the last barrier.
  Result partialRead(int actor, int r, size_t off, size_t n, const void** p) {
    if (n ==
        0) {  // an empty slice (count smaller than the ranks): nothing was written, nothing read
      *p = partial_[static_cast<size_t>(r)].data();
      return Result::Success;
    }
    const uint64_t w = partialPhase_[static_cast<size_t>(r)];
    if (w == 0 || w >= phase_)
      return MK_ERROR(
          Result::InternalError, "reference: %s: rank %d reads rank %d's partial %s", desc_.c_str(),
          actor, r,
          w == 0 ? "that was never written" : "written in the same phase (no barrier between)");
    if ((off + n) * es_ > partial_[static_cast<size_t>(r)].size())
      return MK_ERROR(Result::InternalError,
                      "reference: %s: partial read past the end (%zu + %zu elements)",
                      desc_.c_str(), off, n);
    read_ += n;
    *p = partial_[static_cast<size_t>(r)].data() + off * es_;
    return Result::Success;
  }
  Result barrier() {
    ++phase_;
    return endPhase();
  }
  // acc = pre(x_0) OP pre(x_1) ... over `count` inputs (phase 1: every input enters once).
  template <typename Src>
  Result reduceInputs(size_t n, int count, Src src) {
    uint8_t* out = acc(n);
    for (int i = 0; i < count; ++i) {
      const void* x = nullptr;
      MK_CHECK(src(i, &x));
      if (i == 0)
        hostPreOp(op_, a_.dtype, out, x, n);
      else
        hostReduce(op_, a_.dtype, out, x, n);
    }
    return Result::Success;
  }
  // acc = p_0 OP p_1 ... over partials (already through pre()), then post() once.
  template <typename Src>
  Result combinePartials(size_t n, int count, Src src) {
    uint8_t* out = acc(n);
    for (int i = 0; i < count; ++i) {
      const void* x = nullptr;
      MK_CHECK(src(i, &x));
      if (i == 0) {
        if (n != 0) std::memcpy(out, x, n * es_);
      } else {
        hostReduce(combine_, a_.dtype, out, x, n);
      }
    }
    hostPostOp(op_, a_.dtype, out, n);
    return Result::Success;
  }

  // ---- the five collectives ------------------------------------------------------------------
  Result allReduce() {
    for (int r = 0; r < n_; ++r) {  // 1 intra: node slice l over the node's inputs
      const int k = L_.nodeOf(r), l = L_.localOf(r);
      const Slice s = hierNodeSlice(L_, a_.count, l, align_);
      MK_CHECK(reduceInputs(s.count, L_.perNode, [&](int i, const void** x) {
        *x = userRead(r, sendAt(L_.rankOf(k, i), s.offset), s.count);
        return Result::Success;
      }));
      if (s.count != 0) std::memcpy(partialWrite(r, 0, s.count), acc_.data(), s.count * es_);
    }
    MK_CHECK(barrier());
    for (int r = 0; r < n_;
         ++r) {  // 2 inter: rail sub-slice k over the rail's partials, to every rail peer
      const int k = L_.nodeOf(r), l = L_.localOf(r);
      const Slice s = hierNodeSlice(L_, a_.count, l, align_);
      const Slice t = hierRailSlice(L_, s, k, align_);
      MK_CHECK(combinePartials(t.count, L_.nNodes, [&](int j, const void** x) {
        return partialRead(r, L_.rankOf(j, l), t.offset - s.offset, t.count, x);
      }));
      for (int j = 0; j < L_.nNodes; ++j)
        userWrite(r, recvAt(L_.rankOf(j, l), t.offset), acc_.data(), t.count);
    }
    MK_CHECK(barrier());
    for (int r = 0; r < n_; ++r) {  // 3 intra: the finished node slice to every local peer
      const int k = L_.nodeOf(r), l = L_.localOf(r);
      const Slice s = hierNodeSlice(L_, a_.count, l, align_);
      const void* mine = userRead(r, recvAt(r, s.offset), s.count);
      for (int i = 0; i < L_.perNode; ++i)
        if (i != l) userWrite(r, recvAt(L_.rankOf(k, i), s.offset), mine, s.count);
    }
    return barrier();
  }

  Result reduceScatter() {
    const size_t c = a_.count;
    for (int r = 0; r < n_; ++r) {  // 1 intra: for every node j, block (j,l) over the node's inputs
      const int k = L_.nodeOf(r), l = L_.localOf(r);
      for (int j = 0; j < L_.nNodes; ++j) {
        const Slice b = blockSlice(c, L_.rankOf(j, l));
        MK_CHECK(reduceInputs(c, L_.perNode, [&](int i, const void** x) {
          *x = userRead(r, sendAt(L_.rankOf(k, i), b.offset), c);
          return Result::Success;
        }));
        std::memcpy(partialWrite(r, static_cast<size_t>(j) * c, c), acc_.data(), c * es_);
      }
    }
    MK_CHECK(barrier());
    for (int r = 0; r < n_; ++r) {  // 2 inter: partial k over the rail -> own recvbuff
      const int k = L_.nodeOf(r), l = L_.localOf(r);
      MK_CHECK(combinePartials(c, L_.nNodes, [&](int j, const void** x) {
        return partialRead(r, L_.rankOf(j, l), static_cast<size_t>(k) * c, c, x);
      }));
      userWrite(r, recvAt(r, 0), acc_.data(), c);
    }
    return barrier();
  }

  Result allGather() {
    const size_t c = a_.count;
    for (int r = 0; r < n_; ++r) {  // 1 inter: own block into block r of every rail peer
      const int l = L_.localOf(r);
      std::memcpy(acc(c), userRead(r, sendAt(r, 0), c), c * es_);
      for (int j = 0; j < L_.nNodes; ++j)
        userWrite(r, recvAt(L_.rankOf(j, l), blockSlice(c, r).offset), acc_.data(), c);
    }
    MK_CHECK(barrier());
    for (int r = 0; r < n_; ++r) {  // 2 intra: the rail's blocks to every local peer
      const int k = L_.nodeOf(r), l = L_.localOf(r);
      for (int j = 0; j < L_.nNodes; ++j) {
        const size_t off = blockSlice(c, L_.rankOf(j, l)).offset;
        const void* blk = userRead(r, recvAt(r, off), c);
        for (int i = 0; i < L_.perNode; ++i)
          if (i != l) userWrite(r, recvAt(L_.rankOf(k, i), off), blk, c);
      }
    }
    return barrier();
  }

  Result broadcast() {
    const size_t c = a_.count;
    const int lr = L_.localOf(a_.root);
    std::memcpy(acc(c), userRead(a_.root, sendAt(a_.root, 0), c),
                c * es_);  // 1 inter: root -> its rail
    for (int j = 0; j < L_.nNodes; ++j)
      userWrite(a_.root, recvAt(L_.rankOf(j, lr), 0), acc_.data(), c);
    MK_CHECK(barrier());
    for (int j = 0; j < L_.nNodes; ++j) {  // 2 intra: each rail member -> its local peers
      const int r = L_.rankOf(j, lr);
      const void* data = userRead(r, recvAt(r, 0), c);
      for (int i = 0; i < L_.perNode; ++i)
        if (i != lr) userWrite(r, recvAt(L_.rankOf(j, i), 0), data, c);
    }
    return barrier();
  }

  Result reduce() {
    const size_t c = a_.count;
    const int lr = L_.localOf(a_.root);
    for (int j = 0; j < L_.nNodes; ++j) {  // 1 intra: rank (j,lr) reduces its node's inputs
      const int r = L_.rankOf(j, lr);
      MK_CHECK(reduceInputs(c, L_.perNode, [&](int i, const void** x) {
        *x = userRead(r, sendAt(L_.rankOf(j, i), 0), c);
        return Result::Success;
      }));
      std::memcpy(partialWrite(r, 0, c), acc_.data(), c * es_);
    }
    MK_CHECK(barrier());
    MK_CHECK(
        combinePartials(c, L_.nNodes, [&](int j, const void** x) {  // 2 inter: the root combines
          return partialRead(a_.root, L_.rankOf(j, lr), 0, c, x);
        }));
    userWrite(a_.root, recvAt(a_.root, 0), acc_.data(), c);
    return barrier();
  }

  const HierArgs a_;
  const NodeLayout L_;
  const int n_;
  const size_t align_;
  const DevRedOp op_;
  DevRedOp combine_;
  std::vector<std::vector<uint8_t>> partial_;
  std::vector<uint64_t> partialPhase_;  // phase in which each rank's partial was written (0: never)
  uint64_t phase_ = 1;
};

}  // namespace

Result runHierarchicalReference(const HierArgs& args, const RankBuffers* bufs,
                                ReferenceStats* stats) {
  const NodeLayout& L = args.layout;
  if (L.nNodes < 1 || L.perNode < 1 || L.nRanks() > (1 << 16))
    return MK_ERROR(Result::InvalidArgument, "hierarchical: bad layout %d nodes x %d ranks",
                    L.nNodes, L.perNode);
  if (dataTypeSize(args.dtype) == 0)
    return MK_ERROR(Result::InvalidArgument, "hierarchical: bad datatype %d",
                    static_cast<int>(args.dtype));
  if ((args.coll == CollType::Broadcast || args.coll == CollType::Reduce) &&
      (args.root < 0 || args.root >= L.nRanks()))
    return MK_ERROR(Result::InvalidArgument, "hierarchical: root %d outside 0..%d", args.root,
                    L.nRanks() - 1);
  if (bufs == nullptr) return MK_ERROR(Result::InvalidArgument, "hierarchical: no buffers");
  DevRedOp op{};
  const bool reduces = args.coll == CollType::AllReduce || args.coll == CollType::ReduceScatter ||
                       args.coll == CollType::Reduce;
  if (reduces) MK_CHECK(makeDevRedOp(args.op, args.dtype, L.nRanks(), args.scalar, &op));
  HierExecutor ex(args, op, bufs);
  return ex.run(stats);
}

}  // namespace coll
}  // namespace mkernel
