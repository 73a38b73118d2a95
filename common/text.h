// Small string and identifier helpers shared by the layers: trimming a configuration token, the
// random nonce that tells one rendezvous (or one descriptor exchange) from a stale one, and the
// hash that names a host, a communicator or a set of settings.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

namespace mkernel {

// `s` without leading and trailing white space (std::isspace: blanks, tabs, CR, LF, VT, FF).
std::string trim(const std::string& s);

// A random 64-bit value, never 0: 8 bytes of /dev/urandom, or, where that cannot be read,
// std::random_device mixed with the steady clock.
uint64_t randomNonce();

// 64-bit FNV-1a of `bytes` bytes at `data`: a stable identity, not a cryptographic hash.
uint64_t fnv1a(const void* data, size_t bytes);
inline uint64_t fnv1a(const std::string& s) {
  return fnv1a(s.data(), s.size());
}

}  // namespace mkernel
