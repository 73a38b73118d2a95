// What the CPU test tiers do differently under ThreadSanitizer (scripts/test.sh tsan, the
// MKERNEL_TSAN build). Outside that build every function here is the identity.
#pragma once

#include <algorithm>

namespace mktest {

#if defined(__SANITIZE_THREAD__)
inline constexpr bool kThreadSanitizer = true;
#else
inline constexpr bool kThreadSanitizer = false;
#endif

// An op count for the threaded simulations of the device protocols (tests/collectives/
// launch_sim.h): their spinning CTA threads run 10-20x slower under TSan on two cores (the launch
// path's random case took over 200 s there), so the audit runs a tenth of the ops, at least
// `least`, on the same shapes and seeds.
inline int tsanScaled(int ops, int least = 4) {
  return kThreadSanitizer ? std::max(least, ops / 10) : ops;
}

}  // namespace mktest
