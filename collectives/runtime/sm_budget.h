// The SMs of each GPU that this process's persistent kernels hold (docs/KERNEL.md, "CTA sizing").
//
// Every rank's kernel must be resident at once or the ranks wait for each other forever, and a
// process may create several communicators on one GPU (PyTorch does: one per process group). So
// the CTAs a new communicator may use are what the GPU has, less the SMs kept free for the
// callers' own kernels, less what the communicators already created in this process hold. A
// communicator reserves its CTAs once it is sized and returns them when it is released.
#pragma once

#include <string>

namespace mkernel {
namespace coll {

constexpr int kReservedSms = 4;  // never given to persistent kernels: callers' kernels need SMs

class SmBudget {
 public:
  static SmBudget& process();  // the one ledger of this process

  // SMs of device `dev` (which has `sms`) that a new communicator's kernels may use: sms, less
  // kReservedSms, less what this process's live communicators hold there. Never negative.
  int available(int dev, int sms) const;
  void reserve(int dev, int ctas);
  void release(int dev, int ctas);
  int held(int dev) const;

 private:
  SmBudget() = default;
};

}  // namespace coll
}  // namespace mkernel
