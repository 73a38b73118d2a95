#include "collectives/runtime/sm_budget.h"

#include <algorithm>
#include <map>
#include <mutex>

namespace mkernel {
namespace coll {
namespace {

std::mutex gMu;
std::map<int, int> gHeld;  // device -> CTAs held by live communicators' kernels

}  // namespace

SmBudget& SmBudget::process() {
  static SmBudget ledger;
  return ledger;
}

int SmBudget::available(int dev, int sms) const {
  std::lock_guard<std::mutex> lock(gMu);
  auto it = gHeld.find(dev);
  const int held = it == gHeld.end() ? 0 : it->second;
  return std::max(0, sms - kReservedSms - held);
}

void SmBudget::reserve(int dev, int ctas) {
  std::lock_guard<std::mutex> lock(gMu);
  gHeld[dev] += ctas;
}

void SmBudget::release(int dev, int ctas) {
  std::lock_guard<std::mutex> lock(gMu);
  int& h = gHeld[dev];
  h = std::max(0, h - ctas);
}

int SmBudget::held(int dev) const {
  std::lock_guard<std::mutex> lock(gMu);
  auto it = gHeld.find(dev);
  return it == gHeld.end() ? 0 : it->second;
}

}  // namespace coll
}  // namespace mkernel
