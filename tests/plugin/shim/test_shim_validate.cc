// plugin/shim argument checks (shim_validate.cc) on a described communicator: the codes NCCL
// gives, with a message for ncclGetLastError, for every kind of bad argument. No GPU needed.
#include "tests/catch.h"

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <limits>
#include <string>
#include <vector>

#include "common/result.h"
#include "plugin/shim/shim_select.h"
#include "plugin/shim/shim_comm.h"
#include "plugin/shim/shim_validate.h"
#include "tests/plugin/shim/stand_in_comm.h"

using mkernel::Result;
using namespace mkernel::shim;

namespace {

Call makeCall(CallKind kind, const char* name, size_t count, ncclDataType_t dt, ncclRedOp_t op,
              int root) {
  Call c;
  c.kind = kind;
  c.name = name;
  c.count = count;
  c.dtype = dt;
  c.op = op;
  c.root = root;
  return c;
}

// Runs the check without buffers (checkPointers off) and returns the code and message.
Result check(const Call& c, const std::vector<CustomOp>& ops = {}, int nRanks = 4,
             ResolvedOp* resolved = nullptr) {
  mkernel::clearLastError();
  CommView view{1, nRanks, 0, false};
  ResolvedOp op;
  return validateCall(c, view, ops, resolved ? resolved : &op);
}

std::string last() {
  return mkernel::lastError();
}

}  // namespace

TEST_CASE("validate: good calls pass, for every collective and point-to-point kind") {
  const CallKind kinds[] = {CallKind::Broadcast,     CallKind::Reduce,    CallKind::AllGather,
                            CallKind::ReduceScatter, CallKind::AllReduce, CallKind::AlltoAll,
                            CallKind::Gather,        CallKind::Scatter,   CallKind::Send,
                            CallKind::Recv};
  for (CallKind k : kinds)
    for (int dt = 0; dt < ncclNumTypes; ++dt)
      CHECK(check(makeCall(k, "X", 1000, static_cast<ncclDataType_t>(dt), ncclMax, 3)) ==
            Result::Success);
}

TEST_CASE("validate: invalid datatype is ncclInvalidArgument with NCCL's message") {
  CHECK(check(makeCall(CallKind::AllReduce, "AllReduce", 8,
                       static_cast<ncclDataType_t>(ncclNumTypes), ncclSum, 0)) ==
        Result::InvalidArgument);
  CHECK(last() == "AllReduce : invalid type 12");
  CHECK(check(makeCall(CallKind::AllGather, "AllGather", 8, static_cast<ncclDataType_t>(-1),
                       ncclSum, 0)) == Result::InvalidArgument);
}

TEST_CASE("validate: invalid or unknown reduction op") {
  CHECK(check(makeCall(CallKind::AllReduce, "AllReduce", 8, ncclFloat, static_cast<ncclRedOp_t>(-1),
                       0)) == Result::InvalidArgument);
  CHECK(last().find("invalid reduction operation -1") != std::string::npos);
  // A custom-op number the comm never created.
  CHECK(check(makeCall(CallKind::ReduceScatter, "ReduceScatter", 8, ncclFloat,
                       static_cast<ncclRedOp_t>(ncclNumOps), 0)) == Result::InvalidArgument);
  CHECK(last().find("unknown to this communicator") != std::string::npos);
  // Ops are ignored by calls that do not reduce (NCCL ignores them too).
  CHECK(check(makeCall(CallKind::AllGather, "AllGather", 8, ncclFloat, static_cast<ncclRedOp_t>(-1),
                       0)) == Result::Success);
}

TEST_CASE("validate: custom ops resolve by number, must be live and of the call's datatype") {
  std::vector<CustomOp> ops(2);
  ops[0].live = true;
  ops[0].dtype = ncclFloat;
  ops[0].scalar = 0.5;
  ops[1].live = false;
  ResolvedOp r;
  CHECK(check(makeCall(CallKind::AllReduce, "AllReduce", 8, ncclFloat,
                       static_cast<ncclRedOp_t>(ncclNumOps), 0),
              ops, 4, &r) == Result::Success);
  CHECK(r.custom);
  CHECK(r.customOp.scalar == 0.5);
  CHECK(check(makeCall(CallKind::AllReduce, "AllReduce", 8, ncclHalf,
                       static_cast<ncclRedOp_t>(ncclNumOps), 0),
              ops) == Result::InvalidArgument);
  CHECK(last().find("datatype") != std::string::npos);
  CHECK(check(makeCall(CallKind::Reduce, "Reduce", 8, ncclFloat,
                       static_cast<ncclRedOp_t>(ncclNumOps + 1), 0),
              ops) == Result::InvalidArgument);
}

TEST_CASE("validate: root and peer out of range") {
  CHECK(check(makeCall(CallKind::Broadcast, "Broadcast", 8, ncclFloat, ncclSum, 4)) ==
        Result::InvalidArgument);
  CHECK(last() == "Broadcast : invalid root 4 (root should be in the 0..3 range)");
  CHECK(check(makeCall(CallKind::Reduce, "Reduce", 8, ncclFloat, ncclSum, -1)) ==
        Result::InvalidArgument);
  CHECK(check(makeCall(CallKind::Gather, "Gather", 8, ncclFloat, ncclSum, 9)) ==
        Result::InvalidArgument);
  CHECK(check(makeCall(CallKind::Scatter, "Scatter", 8, ncclFloat, ncclSum, 9)) ==
        Result::InvalidArgument);
  CHECK(check(makeCall(CallKind::Send, "Send", 8, ncclFloat, ncclSum, 4)) ==
        Result::InvalidArgument);
  CHECK(last().find("invalid peer 4") != std::string::npos);
  CHECK(check(makeCall(CallKind::Recv, "Recv", 8, ncclFloat, ncclSum, -2)) ==
        Result::InvalidArgument);
  // Rootless collectives ignore the field.
  CHECK(check(makeCall(CallKind::AllReduce, "AllReduce", 8, ncclFloat, ncclSum, 99)) ==
        Result::Success);
}

TEST_CASE("validate: counts whose byte size overflows size_t") {
  const size_t max = std::numeric_limits<size_t>::max();
  CHECK(check(makeCall(CallKind::AllReduce, "AllReduce", max / 4 + 1, ncclFloat, ncclSum, 0)) ==
        Result::InvalidArgument);
  CHECK(last().find("overflows") != std::string::npos);
  CHECK(check(makeCall(CallKind::AllReduce, "AllReduce", max / 4, ncclFloat, ncclSum, 0)) ==
        Result::Success);
  CHECK(check(makeCall(CallKind::AllReduce, "AllReduce", max, ncclInt8, ncclSum, 0)) ==
        Result::Success);
  // AllGather's receive buffer holds nRanks x count: 4 ranks of max/16 floats overflow.
  CHECK(check(makeCall(CallKind::AllGather, "AllGather", max / 16 + 1, ncclFloat, ncclSum, 0)) ==
        Result::InvalidArgument);
  CHECK(check(makeCall(CallKind::AllGather, "AllGather", max / 16, ncclFloat, ncclSum, 0)) ==
        Result::Success);
  CHECK(check(makeCall(CallKind::AlltoAll, "AlltoAll", max / 8, ncclDouble, ncclSum, 0)) ==
        Result::InvalidArgument);
}

TEST_CASE("validate: buffers are checked only where this rank uses them, and only for count > 0") {
  // Host memory from malloc is not usable by the device: NCCL's "is not a valid pointer".
  std::vector<float> host(16);
  CommView view{1, 4, 0, true};
  ResolvedOp op;
  Call c = makeCall(CallKind::AllReduce, "AllReduce", 16, ncclFloat, ncclSum, 0);
  c.sendbuff = host.data();
  c.recvbuff = host.data();
  mkernel::clearLastError();
  CHECK(validateCall(c, view, {}, &op) == Result::InvalidArgument);
  CHECK(last().find("sendbuff") != std::string::npos);
  CHECK(last().find("not a valid pointer") != std::string::npos);
  c.count = 0;  // nothing moves: no buffer is looked at (NCCL allows NULL buffers here)
  c.sendbuff = nullptr;
  CHECK(validateCall(c, view, {}, &op) == Result::Success);
  // Reduce: only the root reads recvbuff; this rank (1) is not the root, so a NULL recvbuff is
  // fine but its sendbuff is still checked.
  Call r = makeCall(CallKind::Reduce, "Reduce", 16, ncclFloat, ncclSum, 0);
  r.sendbuff = host.data();
  CHECK(validateCall(r, view, {}, &op) == Result::InvalidArgument);
  CHECK(last().find("sendbuff") != std::string::npos);
  // Broadcast on a non-root rank: sendbuff is not read, recvbuff is.
  Call b = makeCall(CallKind::Broadcast, "Broadcast", 16, ncclFloat, ncclSum, 0);
  b.recvbuff = host.data();
  CHECK(validateCall(b, view, {}, &op) == Result::InvalidArgument);
  CHECK(last().find("recvbuff") != std::string::npos);
}

TEST_CASE("validate: premul-sum host scalars convert from every datatype") {
  double v = 0;
  int8_t i8 = -3;
  CHECK(scalarToDouble(&i8, ncclInt8, &v) == Result::Success);
  CHECK(v == -3.0);
  uint64_t u64 = 1ull << 40;
  CHECK(scalarToDouble(&u64, ncclUint64, &v) == Result::Success);
  CHECK(v == 1099511627776.0);
  uint16_t half = 0x3c00;  // 1.0 in fp16
  CHECK(scalarToDouble(&half, ncclFloat16, &v) == Result::Success);
  CHECK(v == 1.0);
  uint16_t bf = 0x4040;  // 3.0 in bf16
  CHECK(scalarToDouble(&bf, ncclBfloat16, &v) == Result::Success);
  CHECK(v == 3.0);
  uint8_t e4m3 = 0x40;  // 2.0 in fp8 e4m3 (bias 7)
  CHECK(scalarToDouble(&e4m3, ncclFloat8e4m3, &v) == Result::Success);
  CHECK(v == 2.0);
  uint8_t e5m2 = 0x3c;  // 1.0 in fp8 e5m2 (bias 15)
  CHECK(scalarToDouble(&e5m2, ncclFloat8e5m2, &v) == Result::Success);
  CHECK(v == 1.0);
  double d = 0.25;
  CHECK(scalarToDouble(&d, ncclFloat64, &v) == Result::Success);
  CHECK(v == 0.25);
  CHECK(scalarToDouble(nullptr, ncclFloat, &v) == Result::InvalidArgument);
  CHECK(scalarToDouble(&d, static_cast<ncclDataType_t>(42), &v) == Result::InvalidArgument);
}

TEST_CASE("select: collectives on the persistent kernel follow MKERNEL_GRAPH, captured or not") {
  using mkernel::shim::doorbellRoute;
  using mkernel::shim::GraphPath;
  using mkernel::shim::Route;
  GraphPath mode = GraphPath::Mkernel;
  REQUIRE(mkernel::shim::parseGraphPath("nccl", &mode) == mkernel::Result::Success);
  CHECK(mode == GraphPath::Nccl);
  REQUIRE(mkernel::shim::parseGraphPath("mkernel", &mode) == mkernel::Result::Success);
  CHECK(mode == GraphPath::Mkernel);
  REQUIRE(mkernel::shim::parseGraphPath("auto", &mode) == mkernel::Result::Success);
  CHECK(mode == GraphPath::Auto);
  CHECK(mkernel::shim::parseGraphPath("kernel", &mode) == mkernel::Result::InvalidArgument);
  CHECK(mkernel::shim::parseGraphPath("", &mode) == mkernel::Result::InvalidArgument);
  // auto: NCCL on one node, the hierarchical path (mkernel) across nodes.
  CHECK(doorbellRoute(GraphPath::Auto, true, 1) == Route::Forward);
  CHECK(doorbellRoute(GraphPath::Auto, true, 2) == Route::Kernel);
  // nccl: NCCL always; mkernel: the kernel always.
  CHECK(doorbellRoute(GraphPath::Nccl, true, 1) == Route::Forward);
  CHECK(doorbellRoute(GraphPath::Nccl, true, 4) == Route::Forward);
  CHECK(doorbellRoute(GraphPath::Mkernel, true, 1) == Route::Kernel);
  // No real NCCL (emulation): always the kernel.
  for (GraphPath m : {GraphPath::Auto, GraphPath::Nccl, GraphPath::Mkernel})
    for (int nodes : {1, 2}) CHECK(doorbellRoute(m, false, nodes) == Route::Kernel);
}

namespace {
// A stand-in mkernel communicator that says which collectives need the doorbell: AllReduces of
// more than `doorbellFrom` elements.
class DoorbellComm final : public StandInComm {
 public:
  explicit DoorbellComm(size_t doorbellFrom) : from_(doorbellFrom) {}
  bool needsDoorbell(const mkernel::coll::CollArgs& op) const override { return op.count > from_; }

 private:
  size_t from_;
};
}  // namespace

TEST_CASE(
    "select: chooseRoute sends what needs the doorbell to NCCL (auto, one node), the rest to "
    "mkernel") {
  using mkernel::shim::GraphPath;
  using mkernel::shim::Route;
  mkernel::coll::PolicyConfig pc;
  REQUIRE(mkernel::coll::loadPolicyConfig(&pc) == mkernel::Result::Success);
  pc.ncclCrossover = false;
  pc.kernelMultiNode = true;  // MKERNEL_MULTI_NODE=1: the policy lets two nodes run in mkernel
  mkernel::shim::ShimComm c;
  c.nRanks = 4;
  c.nNodes = 1;
  c.policy.reset(new mkernel::coll::SelectionPolicy(pc));
  c.mk.reset(new DoorbellComm(1000));
  c.real = reinterpret_cast<ncclComm_t>(&c);  // a real NCCL is there (never called here)
  mkernel::shim::Call call;
  call.kind = mkernel::shim::CallKind::AllReduce;
  call.name = "AllReduce";
  call.dtype = ncclFloat;
  call.op = ncclSum;
  struct Case {
    GraphPath mode;
    int nodes;
    bool haveReal;
    size_t count;
    Route want;
    bool doorbell;
  };
  const Case cases[] = {
      {GraphPath::Auto, 1, true, 1000, Route::Kernel, false},
      {GraphPath::Auto, 1, true, 1001, Route::Forward, true},
      {GraphPath::Auto, 2, true, 1001, Route::Kernel, true},
      {GraphPath::Nccl, 2, true, 1001, Route::Forward, true},
      {GraphPath::Nccl, 1, true, 10, Route::Kernel, false},
      {GraphPath::Mkernel, 1, true, 1001, Route::Kernel, true},
      {GraphPath::Auto, 1, false, 1001, Route::Kernel, true},
  };
  for (const Case& k : cases) {
    c.graphPath = k.mode;
    c.nNodes = k.nodes;
    c.real = k.haveReal ? reinterpret_cast<ncclComm_t>(&c) : nullptr;
    c.emulate = !k.haveReal;
    mkernel::coll::CollArgs args;
    args.coll = mkernel::coll::CollType::AllReduce;
    args.dtype = mkernel::coll::DataType::Float32;
    args.op = mkernel::coll::RedOp::Sum;
    args.count = k.count;
    call.count = k.count;
    Route route = Route::Forward;
    bool doorbell = false;
    INFO("mode " << static_cast<int>(k.mode) << ", " << k.nodes << " node(s), real " << k.haveReal
                 << ", count " << k.count);
    REQUIRE(mkernel::shim::chooseRoute(c, c.mk.get(), call, &args, &route, &doorbell) ==
            mkernel::Result::Success);
    CHECK(route == k.want);
    CHECK(doorbell == k.doorbell);
  }
  c.real = nullptr;
  c.mk.reset();
}

TEST_CASE("destroy: ncclCommDestroy waits for its release only when no co-member here is live") {
  using mkernel::shim::CommState;
  using mkernel::shim::destroyWaitsForRelease;
  CHECK(destroyWaitsForRelease({}));  // the only member in this process (one rank per process)
  CHECK(destroyWaitsForRelease({CommState::Destroyed, CommState::Aborted, CommState::InitFailed}));
  // Members this process will still destroy (perhaps from this same thread): return at once.
  CHECK_FALSE(destroyWaitsForRelease({CommState::Destroyed, CommState::Ready}));
  CHECK_FALSE(destroyWaitsForRelease({CommState::Finalized}));
  CHECK_FALSE(destroyWaitsForRelease({CommState::Revoked}));
  CHECK_FALSE(destroyWaitsForRelease({CommState::Initializing}));
}

namespace {

// NCCL_COLLCONFIG_INITIALIZER's values (nccl.h of 2.32.3).
ncclCollConfig_t collDefaults() {
  ncclCollConfig_t c;
  std::memset(&c, 0, sizeof(c));
  c.size = sizeof(ncclCollConfig_t);
  c.magic = 0xcafebeef;
  c.version = 23203;
  c.ext = nullptr;
  c.minCTAs = c.maxCTAs = c.nvlsCTAs = c.cgaClusterSize = NCCL_CONFIG_UNDEF_INT;
  c.algSelection = nullptr;
  c.forceAlgSelection = 1;
  c.CTAPolicy = NCCL_CONFIG_UNDEF_INT;
  c.userProfilerTag = 0;
  c.launchCompletionEvent = nullptr;
  return c;
}

}  // namespace

TEST_CASE(
    "select: a per-call config of defaults is the plain call; any field set, or no initializer, is "
    "NCCL's") {
  CHECK(collConfigIsDefault(nullptr));
  ncclCollConfig_t c = collDefaults();
  CHECK(collConfigIsDefault(&c));
  c.algSelection = "";      // automatic, as NULL
  c.forceAlgSelection = 0;  // means nothing without a selection
  CHECK(collConfigIsDefault(&c));
  ncclConfigExt_t ext{};
  const struct {
    const char* what;
    void (*set)(ncclCollConfig_t*, ncclConfigExt_t*);
  } fields[] = {
      {"ext", [](ncclCollConfig_t* x, ncclConfigExt_t* e) { x->ext = e; }},
      {"minCTAs", [](ncclCollConfig_t* x, ncclConfigExt_t*) { x->minCTAs = 2; }},
      {"maxCTAs", [](ncclCollConfig_t* x, ncclConfigExt_t*) { x->maxCTAs = 8; }},
      {"nvlsCTAs", [](ncclCollConfig_t* x, ncclConfigExt_t*) { x->nvlsCTAs = 4; }},
      {"cgaClusterSize", [](ncclCollConfig_t* x, ncclConfigExt_t*) { x->cgaClusterSize = 2; }},
      {"algSelection", [](ncclCollConfig_t* x, ncclConfigExt_t*) { x->algSelection = "ring"; }},
      {"CTAPolicy", [](ncclCollConfig_t* x, ncclConfigExt_t*) { x->CTAPolicy = 1; }},
      {"userProfilerTag", [](ncclCollConfig_t* x, ncclConfigExt_t*) { x->userProfilerTag = 7; }},
      {"launchCompletionEvent",
       [](ncclCollConfig_t* x, ncclConfigExt_t*) {
         x->launchCompletionEvent = reinterpret_cast<cudaEvent_t>(0x10);
       }},
      {"magic", [](ncclCollConfig_t* x, ncclConfigExt_t*) { x->magic = 0; }},
  };
  for (const auto& f : fields) {
    INFO(f.what);
    ncclCollConfig_t x = collDefaults();
    f.set(&x, &ext);
    CHECK_FALSE(collConfigIsDefault(&x));
  }
  // A caller with a shorter struct (an older nccl.h): only what its size covers is read.
  ncclCollConfig_t shorter = collDefaults();
  shorter.size = offsetof(ncclCollConfig_t, userProfilerTag);
  shorter.userProfilerTag = 99;
  shorter.launchCompletionEvent = reinterpret_cast<cudaEvent_t>(0x10);
  CHECK(collConfigIsDefault(&shorter));
  shorter.size = 8;  // not even its magic
  CHECK_FALSE(collConfigIsDefault(&shorter));
}
