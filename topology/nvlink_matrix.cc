// NVLink connectivity: the NvlinkMatrix helpers and the text format that lets fixtures (and users
// on machines where NVML is unavailable) describe NVLink without NVML. Format: topology.h.
#include <algorithm>
#include <fstream>
#include <sstream>

#include "common/log.h"
#include "topology/topology.h"

namespace mkernel {
namespace topo {

bool NvlinkMatrix::empty() const {
  for (int l : links)
    if (l > 0) return false;
  for (int l : switchLinks)
    if (l > 0) return false;
  return true;
}

bool NvlinkMatrix::hasNvswitch() const {
  for (int l : switchLinks)
    if (l > 0) return true;
  return false;
}

int NvlinkMatrix::pairLinks(int a, int b) const {
  if (a < 0 || b < 0 || a >= nGpus || b >= nGpus || a == b) return 0;
  int direct = links.empty() ? 0 : links[static_cast<size_t>(a) * nGpus + b];
  int viaSwitch = 0;
  if (!switchLinks.empty() && switchLinks[a] > 0 && switchLinks[b] > 0)
    viaSwitch = std::min(switchLinks[a], switchLinks[b]);
  return direct + viaSwitch;
}

Result parseNvlinkMatrix(const std::string& text, int nGpus, NvlinkMatrix* out, std::string* err) {
  NvlinkMatrix m;
  m.nGpus = nGpus;
  m.links.assign(static_cast<size_t>(nGpus) * nGpus, 0);
  m.switchLinks.assign(nGpus, 0);
  std::istringstream in(text);
  std::string line;
  int lineNo = 0;
  auto fail = [&](const std::string& why) {
    *err = "line " + std::to_string(lineNo) + ": " + why;
    return Result::InvalidArgument;
  };
  while (std::getline(in, line)) {
    ++lineNo;
    size_t hash = line.find('#');
    if (hash != std::string::npos) line.resize(hash);
    std::istringstream words(line);
    std::vector<std::string> w;
    for (std::string s; words >> s;) w.push_back(s);
    if (w.empty()) continue;
    auto toInt = [](const std::string& s, int* v) {
      char* end = nullptr;
      long x = std::strtol(s.c_str(), &end, 10);
      if (end == s.c_str() || *end != '\0' || x < 0 || x > 1024) return false;
      *v = static_cast<int>(x);
      return true;
    };
    auto checkGpu = [&](int g) { return g < nGpus; };
    if (w[0] == "gpus") {
      int n = 0;
      if (w.size() != 2 || !toInt(w[1], &n)) return fail("expected 'gpus <n>'");
      if (n != nGpus)
        return fail("the matrix describes " + std::to_string(n) + " GPUs, the topology has " +
                    std::to_string(nGpus));
    } else if (w[0] == "nvswitch") {
      int g = -1, l = 0;
      if (w.size() == 2 && toInt(w[1], &l)) {
        std::fill(m.switchLinks.begin(), m.switchLinks.end(), l);
      } else if (w.size() == 3 && toInt(w[1], &g) && toInt(w[2], &l)) {
        if (!checkGpu(g)) return fail("GPU " + w[1] + " does not exist");
        m.switchLinks[g] = l;
      } else {
        return fail("expected 'nvswitch <nlinks>' or 'nvswitch <gpu> <nlinks>'");
      }
    } else {
      int a = 0, b = 0, l = 0;
      if (w.size() != 3 || !toInt(w[0], &a) || !toInt(w[1], &b) || !toInt(w[2], &l))
        return fail("expected '<gpu_i> <gpu_j> <nlinks>'");
      if (!checkGpu(a) || !checkGpu(b))
        return fail("GPU pair " + w[0] + "," + w[1] + " is outside the topology's " +
                    std::to_string(nGpus) + " GPUs");
      if (a == b) return fail("a GPU has no NVLink to itself");
      m.links[static_cast<size_t>(a) * nGpus + b] = l;
      m.links[static_cast<size_t>(b) * nGpus + a] = l;
    }
  }
  *out = m;
  return Result::Success;
}

Result loadNvlinkMatrixFile(const std::string& path, int nGpus, NvlinkMatrix* out) {
  std::ifstream f(path);
  if (!f)
    return MK_ERROR(Result::InvalidArgument, "cannot open the NVLink matrix %s", path.c_str());
  std::stringstream ss;
  ss << f.rdbuf();
  std::string err;
  if (parseNvlinkMatrix(ss.str(), nGpus, out, &err) != Result::Success)
    return MK_ERROR(Result::InvalidArgument, "NVLink matrix %s: %s", path.c_str(), err.c_str());
  return Result::Success;
}

std::string formatNvlinkMatrix(const NvlinkMatrix& m) {
  std::string out = "gpus " + std::to_string(m.nGpus) + "\n";
  for (int g = 0; g < m.nGpus; ++g)
    if (!m.switchLinks.empty() && m.switchLinks[g] > 0)
      out += "nvswitch " + std::to_string(g) + " " + std::to_string(m.switchLinks[g]) + "\n";
  for (int a = 0; a < m.nGpus; ++a)
    for (int b = a + 1; b < m.nGpus; ++b) {
      int l = m.links.empty() ? 0 : m.links[static_cast<size_t>(a) * m.nGpus + b];
      if (l > 0)
        out += std::to_string(a) + " " + std::to_string(b) + " " + std::to_string(l) + "\n";
    }
  return out;
}

}  // namespace topo
}  // namespace mkernel
