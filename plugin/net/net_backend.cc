// The verbs backend as the net plugin sees it: a weak default of net::createIbNet.
//
// transport/net/ib/ defines the strong createIbNet when the verbs backend is part of the build;
// the linker then takes that one and this body is never used. With it, libmkernel.so links, loads
// and falls back to TCP in any build (for instance one configured without the verbs sources).
#include "transport/net/net.h"

namespace mkernel {
namespace net {

__attribute__((weak)) std::unique_ptr<Net> createIbNet(std::string* why) {
  if (why != nullptr) *why = "verbs backend not built";
  return nullptr;
}

}  // namespace net
}  // namespace mkernel
