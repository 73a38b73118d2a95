#include "collectives/stats.h"

namespace mkernel {
namespace coll {

GlobalStats& globalStats() {
  static GlobalStats stats{};  // zero-initialised atomics
  return stats;
}

}  // namespace coll
}  // namespace mkernel
