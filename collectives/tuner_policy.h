// The tuner's policy: how mkernel's topology model adjusts NCCL's algorithm x protocol cost
// table (docs/TUNER.md gives the reasons). plugin/tuner/ only converts NCCL's tuner ABI to these
// calls.
//
// The decision depends only on facts every rank shares (collective, byte count, nRanks, nNodes,
// the node's NVLink/NVSwitch layout, MKERNEL_* settings, the rules file), so every rank makes the
// same choice; NCCL requires that, as a mismatch deadlocks.
//
// The cost table is NCCL's float[numAlgo][numProto] (7 x 3 in NCCL 2.28): -1 marks an entry NCCL
// cannot use, lower is preferred, and 0 forces a choice. The policy only ever writes 0 into an
// entry that is not -1, so it never enables what NCCL excluded; when none of its candidates is
// usable it leaves the table untouched.
#pragma once

#include <cstddef>
#include <string>
#include <vector>

#include "collectives/types.h"
#include "common/result.h"

namespace mkernel {
namespace coll {

// NCCL's algorithm and protocol indexes (nccl_tuner.h).
enum TunerAlgo : int {
  kAlgoTree = 0,
  kAlgoRing = 1,
  kAlgoCollnetDirect = 2,
  kAlgoCollnetChain = 3,
  kAlgoNvls = 4,
  kAlgoNvlsTree = 5,
  kAlgoPat = 6,
  kTunerNumAlgos = 7,
};
enum TunerProto : int { kProtoLL = 0, kProtoLL128 = 1, kProtoSimple = 2, kTunerNumProtos = 3 };
constexpr int kTunerAny = -1;  // a rule field that matches anything / keeps the policy's pick
constexpr int kTunerMaxChannels = 64;  // NCCL's MAXCHANNELS: rules are clamped to [1, 64]

const char* tunerAlgoName(int algo);    // "TREE", ...; "?" when out of range
const char* tunerProtoName(int proto);  // "LL", "LL128", "SIMPLE"

// What the policy knows of the job. Filled once per communicator by the tuner's init.
struct TunerSystem {
  int nRanks = 1;
  int nNodes = 1;
  int ranksPerNode = 1;        // most ranks on one node (NVLink domain size when NCCL tells us)
  bool topologyKnown = false;  // false: discovery failed; NVLink facts below are guesses
  bool nvlink = false;         // the node's GPUs reach each other over NVLink (all pairs)
  bool nvswitch = false;       // ... through NVSwitches
  bool nvlsAllowed = false;    // MKERNEL_NVLS=1: NVLink SHARP (multicast) may be preferred
};

// Message size classes, from nBytes as NCCL passes it to getCollInfo. The bounds depend on the
// system (docs/TUNER.md): one NVLink node uses the crossovers measured on 2 x H200 (NVSwitch,
// ring all-reduce: LL fastest up to 2 MiB, LL128 at 4 MiB, LL128 = SIMPLE at 8 MiB,
// SIMPLE from 16 MiB); PCIe-only and multi-node bounds are not calibrated.
enum class SizeClass : int { Small = 0, Medium = 1, Large = 2 };
struct SizeBounds {
  size_t smallMax;   // <= : Small
  size_t mediumMax;  // <= : Medium; above: Large
};
constexpr SizeBounds kBoundsOneNodeNvlink = {2u << 20, 8u << 20};
constexpr SizeBounds kBoundsOneNodePcie = {64u << 10, 1u << 20};
constexpr SizeBounds kBoundsMultiNodeNvlink = {64u << 10, 16u << 20};
constexpr SizeBounds kBoundsMultiNodePcie = {64u << 10, 1u << 20};
SizeBounds tunerSizeBounds(const TunerSystem& sys);
SizeClass tunerSizeClass(const TunerSystem& sys, size_t nBytes);
const char* sizeClassName(SizeClass c);

// One line of MKERNEL_TUNER_CONFIG: coll,minBytes,maxBytes,algo,proto,nChannels[,nNodes[,nRanks]]
struct TunerRule {
  int coll = kTunerAny;          // CollType value or kTunerAny
  size_t minBytes = 0;           // inclusive
  size_t maxBytes = ~size_t(0);  // inclusive
  int algo = kTunerAny;
  int proto = kTunerAny;
  int nChannels = 0;  // 0: keep NCCL's
  int nNodes = kTunerAny;
  int nRanks = kTunerAny;
  int line = 0;  // where it came from, for messages
};

// Parses the rules text. Bad lines are skipped with a message in *warnings (a typo in the file
// must not fail the job); returns InvalidArgument only when no line at all could be used and the
// text had non-comment content.
Result parseTunerRules(const std::string& text, std::vector<TunerRule>* rules,
                       std::vector<std::string>* warnings);
Result loadTunerRulesFile(const std::string& path, std::vector<TunerRule>* rules,
                          std::vector<std::string>* warnings);

struct TunerDecision {
  bool changed = false;  // the table or nChannels was modified
  int algo = kTunerAny;  // the entry set to 0 (kTunerAny: none)
  int proto = kTunerAny;
  int nChannels = 0;        // what was written to *nChannels (0: untouched)
  int ruleLine = 0;         // the rule that decided, 0 = built-in policy
  const char* reason = "";  // static text
};

// The built-in policy's candidates, best first (at most kMaxTunerCandidates).
constexpr int kMaxTunerCandidates = 12;
struct TunerCandidates {
  int n = 0;
  int algo[kMaxTunerCandidates];
  int proto[kMaxTunerCandidates];
  const char* reason = "";
  void add(int a, int p);
};
TunerCandidates policyCandidates(const TunerSystem& sys, CollType coll, size_t nBytes);

// Applies the first matching rule, else the policy, to `table` (numAlgo rows of numProto floats).
// Never fails: an unknown collective or table shape leaves everything untouched.
TunerDecision applyTunerPolicy(const TunerSystem& sys, const std::vector<TunerRule>& rules,
                               int coll, size_t nBytes, float* table, int numAlgo, int numProto,
                               int* nChannels);

}  // namespace coll
}  // namespace mkernel
