#include "collectives/stats.h"

#include <map>
#include <mutex>
#include <utility>

namespace mkernel {
namespace coll {

GlobalStats& globalStats() {
  static GlobalStats stats{};  // zero-initialised atomics
  return stats;
}

namespace {
struct Folders {
  std::mutex mu;
  std::map<const void*, std::function<void()>> fold;
};
Folders& folders() {
  static Folders* f = new Folders;  // never destroyed: communicators may outlive static destruction
  return *f;
}
}  // namespace

void registerStatsFolder(const void* key, std::function<void()> fold) {
  std::lock_guard<std::mutex> lock(folders().mu);
  folders().fold[key] = std::move(fold);
}

void unregisterStatsFolder(const void* key) {
  std::lock_guard<std::mutex> lock(folders().mu);
  folders().fold.erase(key);
}

void foldLiveStats() {
  std::lock_guard<std::mutex> lock(folders().mu);
  for (auto& f : folders().fold) f.second();
}

}  // namespace coll
}  // namespace mkernel
