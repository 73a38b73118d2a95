#include "common/text.h"

#include <cctype>
#include <chrono>
#include <cstdio>
#include <random>

namespace mkernel {

std::string trim(const std::string& s) {
  size_t b = 0, e = s.size();
  while (b < e && std::isspace(static_cast<unsigned char>(s[b]))) ++b;
  while (e > b && std::isspace(static_cast<unsigned char>(s[e - 1]))) --e;
  return s.substr(b, e - b);
}

uint64_t randomNonce() {
  uint64_t v = 0;
  FILE* f = std::fopen("/dev/urandom", "rb");
  if (f != nullptr) {
    if (std::fread(&v, sizeof(v), 1, f) != 1) v = 0;
    std::fclose(f);
  }
  while (v == 0) {
    const auto now = std::chrono::steady_clock::now().time_since_epoch().count();
    v = (static_cast<uint64_t>(std::random_device{}()) << 32) ^ std::random_device{}() ^
        (static_cast<uint64_t>(now) << 1);
  }
  return v;
}

uint64_t fnv1a(const void* data, size_t bytes) {
  const unsigned char* p = static_cast<const unsigned char*>(data);
  uint64_t h = 1469598103934665603ull;
  for (size_t i = 0; i < bytes; ++i) h = (h ^ p[i]) * 1099511628211ull;
  return h;
}

}  // namespace mkernel
