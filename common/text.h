// Small string and identifier helpers shared by the layers: trimming a configuration token, and
// the random nonce that tells one rendezvous (or one descriptor exchange) from a stale one.
#pragma once

#include <cstdint>
#include <string>

namespace mkernel {

// `s` without leading and trailing white space (std::isspace: blanks, tabs, CR, LF, VT, FF).
std::string trim(const std::string& s);

// A random 64-bit value, never 0: 8 bytes of /dev/urandom, or, where that cannot be read,
// std::random_device mixed with the steady clock.
uint64_t randomNonce();

}  // namespace mkernel
