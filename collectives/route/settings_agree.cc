// One route on every rank: the settings that can change where or how a collective runs
// (params.def's ROUTE column) are compared across ranks when a communicator is created
// (docs/SHIM.md, "One route on every rank").
#include <algorithm>
#include <cstring>
#include <map>
#include <string>
#include <vector>

#include "collectives/communicator.h"
#include "common/log.h"
#include "common/param.h"
#include "common/text.h"
#include "common/version.h"
#include "transport/bootstrap/bootstrap.h"

namespace mkernel {
namespace coll {

namespace {

constexpr const char* kVersionKey = "mkernel version";
constexpr int kSettingsNamed = 4;  // differing settings the error names; the rest are counted

std::string serialize(const RouteSettings& s) {
  std::string out;
  for (const auto& kv : s) out += kv.first + '=' + kv.second + '\n';
  return out;
}

RouteSettings parse(const char* text) {
  RouteSettings out;
  const char* p = text;
  while (*p != '\0') {
    const char* nl = std::strchr(p, '\n');
    const std::string line(p, nl ? static_cast<size_t>(nl - p) : std::strlen(p));
    const size_t eq = line.find('=');
    if (eq != std::string::npos) out.emplace_back(line.substr(0, eq), line.substr(eq + 1));
    if (nl == nullptr) break;
    p = nl + 1;
  }
  return out;
}

// "0-2, 5": ranks in ascending order, runs joined.
std::string rankList(const std::vector<int>& ranks) {
  std::string out;
  for (size_t i = 0; i < ranks.size();) {
    size_t j = i;
    while (j + 1 < ranks.size() && ranks[j + 1] == ranks[j] + 1) ++j;
    if (!out.empty()) out += ", ";
    out += std::to_string(ranks[i]);
    if (j > i) out += (j == i + 1 ? ", " : "-") + std::to_string(ranks[j]);
    i = j + 1;
  }
  return out;
}

}  // namespace

RouteSettings routeSettingsInEffect() {
  RouteSettings s;
  s.emplace_back(kVersionKey, MKERNEL_VERSION_STRING);
  for (const auto& kv : params::routeSettings()) s.emplace_back("MKERNEL_" + kv.first, kv.second);
  return s;
}

Result agreeSettings(bootstrap::Bootstrap& bs, const RouteSettings& mine, const char* caller) {
  const int n = bs.nRanks(), me = bs.rank();
  const std::string text = serialize(mine);
  struct Digest {
    uint64_t hash;
    uint64_t bytes;
  };
  std::vector<Digest> digests(static_cast<size_t>(n), Digest{0, 0});
  digests[static_cast<size_t>(me)] = Digest{fnv1a(text), text.size()};
  MK_CHECK(bs.allGather(digests.data(), sizeof(Digest)));
  bool same = true;
  uint64_t longest = 0;
  for (const Digest& d : digests) {
    same = same && d.hash == digests[0].hash && d.bytes == digests[0].bytes;
    longest = std::max(longest, d.bytes);
  }
  if (same) return Result::Success;

  // They differ: every rank gathers every rank's text, so that every rank names the same settings.
  const size_t stride = static_cast<size_t>(longest) + 1;
  std::vector<char> texts(stride * static_cast<size_t>(n), '\0');
  std::memcpy(&texts[stride * static_cast<size_t>(me)], text.data(), text.size());
  MK_CHECK(bs.allGather(texts.data(), stride));
  std::vector<std::map<std::string, std::string>> byRank(static_cast<size_t>(n));
  std::vector<std::string>
      names;  // every name any rank sent, in the order first seen (rank 0's first)
  for (int r = 0; r < n; ++r) {
    texts[stride * static_cast<size_t>(r) + stride - 1] = '\0';
    for (auto& kv : parse(&texts[stride * static_cast<size_t>(r)])) {
      if (std::find(names.begin(), names.end(), kv.first) == names.end()) names.push_back(kv.first);
      byRank[static_cast<size_t>(r)][kv.first] = kv.second;
    }
  }
  std::string what;
  int differing = 0;
  for (const std::string& name : names) {
    // value -> the ranks holding it, in the order the values first appear
    std::vector<std::pair<std::string, std::vector<int>>> values;
    for (int r = 0; r < n; ++r) {
      const auto& m = byRank[static_cast<size_t>(r)];
      const auto it = m.find(name);
      const std::string v =
          it == m.end() ? "(not a setting of its mkernel)" : "'" + it->second + "'";
      auto at =
          std::find_if(values.begin(), values.end(), [&](const auto& e) { return e.first == v; });
      if (at == values.end()) {
        values.emplace_back(v, std::vector<int>());
        at = values.end() - 1;
      }
      at->second.push_back(r);
    }
    if (values.size() < 2) continue;
    if (++differing > kSettingsNamed) continue;
    what += differing > 1 ? "; " : "";
    what += name + ":";
    for (size_t k = 0; k < values.size(); ++k)
      what += (k ? "," : "") + std::string(" ") + values[k].first + " on rank" +
              (values[k].second.size() > 1 ? "s " : " ") + rankList(values[k].second);
  }
  if (differing > kSettingsNamed)
    what += "; and " + std::to_string(differing - kSettingsNamed) + " more";
  return MK_ERROR(
      Result::InvalidUsage,
      "%s : rank %d: ranks of one communicator must run the same mkernel with the same settings "
      "that "
      "decide where collectives run, or they would wait on different paths; %d differ: %s",
      caller, me, differing, what.c_str());
}

Result agreeRouteSettings(bootstrap::Bootstrap& bs, const char* caller) {
  return agreeSettings(bs, routeSettingsInEffect(), caller);
}

}  // namespace coll
}  // namespace mkernel
