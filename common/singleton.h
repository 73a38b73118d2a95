// A heap singleton for library code that static destructors, other threads and a dlclose may all
// reach (the net plugin's registries, the shim's reaper): created on first use under a mutex,
// never destroyed by a static destructor, and freed by its owner when it knows that nothing uses
// it any more (library unload). The storage is constant-initialized: no static constructor runs.
#pragma once

#include <atomic>
#include <mutex>

namespace mkernel {

template <typename T>
class LazySingleton {
 public:
  constexpr LazySingleton() = default;
  LazySingleton(const LazySingleton&) = delete;
  LazySingleton& operator=(const LazySingleton&) = delete;

  // The object, created now if it does not exist yet.
  T& get() {
    T* p = p_.load(std::memory_order_acquire);
    if (p != nullptr) return *p;
    std::lock_guard<std::mutex> lock(mu_);
    p = p_.load(std::memory_order_relaxed);
    if (p == nullptr) {
      p = new T;
      p_.store(p, std::memory_order_release);
    }
    return *p;
  }
  // The object if it exists (never creates it).
  T* peek() const { return p_.load(std::memory_order_acquire); }
  // Frees the object; a later get() makes a new one. Only when nothing else can be using it.
  void destroy() { delete p_.exchange(nullptr, std::memory_order_acq_rel); }

 private:
  std::atomic<T*> p_{nullptr};
  std::mutex mu_;
};

}  // namespace mkernel
