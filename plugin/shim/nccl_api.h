// The NCCL API as the shim sees it: nccl.h (and the 2.28 device-API host functions), included so
// that the compiler checks every shim definition against NCCL's own prototypes; the entry points
// of newer NCCLs that the shim exports (nccl_api.def) are declared here when nccl.h is older, as
// those NCCLs declare them.
//
// The CUDA headers are included first and normally (hidden visibility, like the rest of the
// library): only the nccl* definitions are exported, through MKERNEL_NCCL_EXPORT.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_fp8.h>
#include <cuda_runtime.h>

#include <cstdint>

// nccl.h of 2.30 and later declares ncclResetDebugInit only on Linux, as NCCL's build defines it.
#ifndef NCCL_OS_LINUX
#define NCCL_OS_LINUX 1
#endif
#include <nccl.h>

#if __has_include(<nccl_device/core.h>)
#include <nccl_device/core.h>
#include <nccl_device/gin_barrier.h>
#if __has_include(<nccl_device/host.h>)
// NCCL 2.32 declares the device API's host functions here.
#include <nccl_device/host.h>
#endif
#else
// An NCCL install without the device-API headers: declare the host entry points the shim must
// still export (layouts as in NCCL 2.28's nccl_device/core.h; the shim only passes them through).
struct ncclDevComm;
typedef struct ncclDevComm ncclDevComm_t;
struct ncclTeam {
  int nRanks, rank, stride;
};
typedef struct ncclTeam ncclTeam_t;
struct ncclDevCommRequirements;
typedef struct ncclDevCommRequirements ncclDevCommRequirements_t;
struct ncclDevResourceRequirements;
typedef struct ncclDevResourceRequirements ncclDevResourceRequirements_t;
struct ncclGinBarrierHandle;
typedef struct ncclGinBarrierHandle ncclGinBarrierHandle_t;
extern "C" {
ncclResult_t ncclDevCommCreate(ncclComm_t, ncclDevCommRequirements_t const*,
                               ncclDevComm_t* outDevComm);
ncclResult_t ncclDevCommDestroy(ncclComm_t, ncclDevComm_t const* devComm);
ncclTeam_t ncclTeamWorld(ncclComm_t);
ncclTeam_t ncclTeamLsa(ncclComm_t);
ncclTeam_t ncclTeamRail(ncclComm_t);
int ncclTeamRankToWorld(ncclComm_t, ncclTeam_t, int rank);
int ncclTeamRankToLsa(ncclComm_t, ncclTeam_t, int rank);
ncclResult_t ncclGinBarrierCreateRequirement(ncclComm_t, ncclTeam_t, int nBarriers,
                                             ncclGinBarrierHandle_t* outHandle,
                                             ncclDevResourceRequirements_t* outReq);
}
#endif

#if NCCL_VERSION_CODE >= NCCL_VERSION(2, 32, 0) || !defined(NCCL_COLLCONFIG_INITIALIZER)
// ncclCollConfig_t has launchCompletionEvent (2.32's, or the one declared below); 2.31's has not.
#define MKERNEL_COLLCONFIG_HAS_COMPLETION_EVENT 1
#endif

#ifndef NCCL_COLLCONFIG_INITIALIZER
// NCCL 2.32's per-collective configuration (nccl.h of 2.32.3), for its nccl*Config entry points
// (2.31 declares them with a shorter ncclCollConfig_t).
// Versioned and append-only, as ncclConfig_t: `size` says how much of it the caller filled.
typedef struct ncclConfigExt {
  struct ncclConfigExt* next;
  struct {
    int vendorId;
    int optionId;
  } key;
  union {
    int i;
    const char* s;
    void* raw;
  } val;
} ncclConfigExt_t;
typedef struct ncclCollConfig_v23200 {
  size_t size;
  unsigned int magic;
  unsigned int version;
  ncclConfigExt_t* ext;
  int minCTAs;
  int maxCTAs;
  int nvlsCTAs;
  int cgaClusterSize;
  const char* algSelection;
  int forceAlgSelection;
  int CTAPolicy;
  uint64_t userProfilerTag;
  cudaEvent_t launchCompletionEvent;
} ncclCollConfig_t;
extern "C" {
ncclResult_t ncclAllReduceConfig(const void* sendbuff, void* recvbuff, size_t count,
                                 ncclDataType_t datatype, ncclRedOp_t op, ncclComm_t comm,
                                 cudaStream_t stream, const ncclCollConfig_t* config);
ncclResult_t ncclBroadcastConfig(const void* sendbuff, void* recvbuff, size_t count,
                                 ncclDataType_t datatype, int root, ncclComm_t comm,
                                 cudaStream_t stream, const ncclCollConfig_t* config);
ncclResult_t ncclReduceConfig(const void* sendbuff, void* recvbuff, size_t count,
                              ncclDataType_t datatype, ncclRedOp_t op, int root, ncclComm_t comm,
                              cudaStream_t stream, const ncclCollConfig_t* config);
ncclResult_t ncclAllGatherConfig(const void* sendbuff, void* recvbuff, size_t sendcount,
                                 ncclDataType_t datatype, ncclComm_t comm, cudaStream_t stream,
                                 const ncclCollConfig_t* config);
ncclResult_t ncclReduceScatterConfig(const void* sendbuff, void* recvbuff, size_t recvcount,
                                     ncclDataType_t datatype, ncclRedOp_t op, ncclComm_t comm,
                                     cudaStream_t stream, const ncclCollConfig_t* config);
ncclResult_t ncclAlltoAllConfig(const void* sendbuff, void* recvbuff, size_t count,
                                ncclDataType_t datatype, ncclComm_t comm, cudaStream_t stream,
                                const ncclCollConfig_t* config);
ncclResult_t ncclGatherConfig(const void* sendbuff, void* recvbuff, size_t count,
                              ncclDataType_t datatype, int root, ncclComm_t comm,
                              cudaStream_t stream, const ncclCollConfig_t* config);
ncclResult_t ncclScatterConfig(const void* sendbuff, void* recvbuff, size_t count,
                               ncclDataType_t datatype, int root, ncclComm_t comm,
                               cudaStream_t stream, const ncclCollConfig_t* config);
}
#endif

// Every nccl* definition of the shim: C linkage, exported despite -fvisibility=hidden.
#define MKERNEL_NCCL_EXPORT extern "C" __attribute__((visibility("default")))
