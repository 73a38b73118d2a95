// libibverbs, loaded with dlopen (docs/ARCHITECTURE.md): libmkernel.so must load on hosts without
// rdma-core, so nothing here links against libibverbs. The data-path calls (ibv_post_send,
// ibv_post_recv, ibv_poll_cq) are static inline in <infiniband/verbs.h> and go through the
// context's ops table, so they need no symbol; every other call goes through IbvApi.
//
// Member names deliberately differ from the ibv_* names: several of those are function-like macros
// in verbs.h (ibv_reg_mr, ibv_query_port) that would rewrite a member access.
#pragma once

#include <infiniband/verbs.h>

#include <string>

#include "common/result.h"

namespace mkernel {
namespace verbs {

struct IbvApi {
  ibv_device** (*getDeviceList)(int* num) = nullptr;
  void (*freeDeviceList)(ibv_device** list) = nullptr;
  const char* (*getDeviceName)(ibv_device* dev) = nullptr;
  ibv_context* (*openDevice)(ibv_device* dev) = nullptr;
  int (*closeDevice)(ibv_context* ctx) = nullptr;
  int (*queryDevice)(ibv_context* ctx, ibv_device_attr* attr) = nullptr;
  // The exported ibv_query_port takes the old (shorter) attribute struct; queryPort() below
  // prefers the extended op, as verbs.h's inline wrapper does.
  int (*queryPortCompat)(ibv_context* ctx, uint8_t port, ibv_port_attr* attr) = nullptr;
  int (*queryGid)(ibv_context* ctx, uint8_t port, int index, ibv_gid* gid) = nullptr;
  ibv_pd* (*allocPd)(ibv_context* ctx) = nullptr;
  int (*deallocPd)(ibv_pd* pd) = nullptr;
  ibv_mr* (*regMr)(ibv_pd* pd, void* addr, size_t length, int access) = nullptr;
  // IBVERBS_1.12 (rdma-core 34+); nullptr when the library is older.
  ibv_mr* (*regDmabufMr)(ibv_pd* pd, uint64_t offset, size_t length, uint64_t iova, int fd,
                         int access) = nullptr;
  int (*deregMr)(ibv_mr* mr) = nullptr;
  ibv_cq* (*createCq)(ibv_context* ctx, int cqe, void* cqContext, ibv_comp_channel* channel,
                      int compVector) = nullptr;
  int (*destroyCq)(ibv_cq* cq) = nullptr;
  ibv_qp* (*createQp)(ibv_pd* pd, ibv_qp_init_attr* attr) = nullptr;
  int (*modifyQp)(ibv_qp* qp, ibv_qp_attr* attr, int mask) = nullptr;
  int (*destroyQp)(ibv_qp* qp) = nullptr;
  const char* (*wcStatusStr)(ibv_wc_status status) = nullptr;

  int queryPort(ibv_context* ctx, uint8_t port, ibv_port_attr* attr) const;
  // "IBV_WC_RETRY_EXC_ERR"-like text for an error completion, safe before loading.
  const char* statusText(ibv_wc_status status) const;
};

// Loads libibverbs once per process. Returns nullptr with the reason in *why when the library or
// a required symbol is missing.
const IbvApi* loadIbvApi(std::string* why);

// Speed of a port in Mbps from its active_speed and active_width bits (as NCCL computes it).
int portSpeedMbps(uint32_t activeSpeed, uint8_t activeWidth);

}  // namespace verbs
}  // namespace mkernel
