#include "transport/net/backend.h"

#include <algorithm>
#include <cctype>

#include "common/param.h"
#include "transport/net/ib/ib_net.h"

namespace mkernel {
namespace net {

Result createNetBackend(const std::vector<std::string>& preferredNics, BackendChoice* out) {
  const std::string choice = params::NET_BACKEND.text();
  out->setting = choice;
  std::string whyNotIb;
  if (choice != "tcp") {
    ib::setIbPreferredDevices(preferredNics);
    std::unique_ptr<Net> verbs = createIbNet(&whyNotIb);
    if (verbs && verbs->deviceCount() <= 0) {
      whyNotIb = "the verbs backend found no usable device";
      verbs.reset();
    }
    if (verbs) {
      out->why = std::string("using the verbs backend ") + verbs->name() +
                 " (MKERNEL_NET_BACKEND=" + choice + ")";
      out->net = std::move(verbs);
      return Result::Success;
    }
    if (whyNotIb.empty()) whyNotIb = "the verbs backend is unavailable";
    if (choice == "ib")
      return MK_ERROR(Result::SystemError, "MKERNEL_NET_BACKEND=ib but %s", whyNotIb.c_str());
  }
  std::string whyNotTcp;
  std::unique_ptr<Net> tcp = createTcpNet(&whyNotTcp);
  if (!tcp)
    return MK_ERROR(Result::SystemError, "no backend can run: %s%s%s", whyNotTcp.c_str(),
                    whyNotIb.empty() ? "" : "; verbs: ", whyNotIb.c_str());
  out->why = choice == "tcp" ? "MKERNEL_NET_BACKEND=tcp: using TCP" : whyNotIb + ": using TCP";
  out->net = std::move(tcp);
  return Result::Success;
}

}  // namespace net
}  // namespace mkernel
