# Finds every dependency. Anything missing stops the configure step with a message naming it and
# the Debian package (or variable) that provides it.
include(CheckLanguage)

function(mkernel_missing what how)
  message(FATAL_ERROR "mkernel: ${what} not found.\n  ${how}\n  (scripts/test.sh and scripts/bench.sh install the Debian packages for you.)")
endfunction()

find_package(Threads REQUIRED)

# CUDA: nvcc for the persistent kernel, cudart (static) for the host API.
if(NOT DEFINED CMAKE_CUDA_ARCHITECTURES)
  set(CMAKE_CUDA_ARCHITECTURES ${MKERNEL_CUDA_ARCH})
endif()
if(NOT CMAKE_CUDA_COMPILER AND EXISTS /usr/local/cuda/bin/nvcc)
  set(CMAKE_CUDA_COMPILER /usr/local/cuda/bin/nvcc)
endif()
check_language(CUDA)
if(NOT CMAKE_CUDA_COMPILER)
  mkernel_missing("the CUDA compiler (nvcc)" "Install the CUDA toolkit (12.4 or newer) and put nvcc on PATH, or pass -DCMAKE_CUDA_COMPILER=/path/to/nvcc.")
endif()
enable_language(CUDA)
find_package(CUDAToolkit REQUIRED)

# NCCL headers (nccl.h). The library itself is never linked: the shim dlopens the real libnccl.
find_path(MKERNEL_NCCL_INCLUDE_DIR nccl.h
  HINTS $ENV{MKERNEL_NCCL_HOME}/include $ENV{NCCL_HOME}/include ${CUDAToolkit_INCLUDE_DIRS}
        /opt/torch/.venv/lib/python3.12/site-packages/nvidia/nccl/include
  PATHS /usr/include /usr/local/include)
if(NOT MKERNEL_NCCL_INCLUDE_DIR)
  mkernel_missing("nccl.h (NCCL headers)" "Install libnccl-dev, or the CUDA toolkit with NCCL, or set MKERNEL_NCCL_HOME to an NCCL install.")
endif()
file(STRINGS ${MKERNEL_NCCL_INCLUDE_DIR}/nccl.h _nccl_ver REGEX "#define NCCL_(MAJOR|MINOR) ")
string(REGEX REPLACE ".*NCCL_MAJOR ([0-9]+).*NCCL_MINOR ([0-9]+).*" "\\1.\\2" _nccl_mm "${_nccl_ver}")
if(_nccl_mm VERSION_LESS 2.28)
  mkernel_missing("NCCL 2.28 headers (found ${_nccl_mm} in ${MKERNEL_NCCL_INCLUDE_DIR})" "Point MKERNEL_NCCL_HOME at NCCL 2.28 or newer.")
endif()
add_library(mkernel::nccl_headers INTERFACE IMPORTED)
target_include_directories(mkernel::nccl_headers INTERFACE ${MKERNEL_NCCL_INCLUDE_DIR})
message(STATUS "mkernel: NCCL ${_nccl_mm} headers in ${MKERNEL_NCCL_INCLUDE_DIR}")

# hwloc 2.x (linked: it is a plain user-space library present wherever the package is).
find_package(PkgConfig)
if(PkgConfig_FOUND)
  pkg_check_modules(HWLOC IMPORTED_TARGET hwloc>=2.0)
endif()
if(NOT HWLOC_FOUND)
  mkernel_missing("hwloc 2.x" "apt-get install libhwloc-dev pkg-config")
endif()
add_library(mkernel::hwloc ALIAS PkgConfig::HWLOC)

# libibverbs: headers only. The library is dlopen'd at run time so that libmkernel.so loads on
# hosts without RDMA (DESIGN.md §2).
find_path(MKERNEL_IBVERBS_INCLUDE_DIR infiniband/verbs.h)
if(NOT MKERNEL_IBVERBS_INCLUDE_DIR)
  mkernel_missing("infiniband/verbs.h (rdma-core headers)" "apt-get install libibverbs-dev librdmacm-dev")
endif()
add_library(mkernel::ibverbs_headers INTERFACE IMPORTED)
target_include_directories(mkernel::ibverbs_headers INTERFACE ${MKERNEL_IBVERBS_INCLUDE_DIR})

# CLI11 (the tools' command lines) and nlohmann-json (their JSON output): header-only.
find_package(CLI11 2 QUIET CONFIG)
if(NOT CLI11_FOUND)
  mkernel_missing("CLI11 2.x (command-line parser)" "apt-get install libcli11-dev")
endif()
find_package(nlohmann_json 3 QUIET CONFIG)
if(NOT nlohmann_json_FOUND)
  mkernel_missing("nlohmann-json 3.x (JSON library)" "apt-get install nlohmann-json3-dev")
endif()

# Catch2, 2.x or 3.x: the one test framework. Tests include tests/catch.h, which picks the headers
# by MKERNEL_CATCH2_MAJOR; tests/catch_main.cc is their main() in both.
if(MKERNEL_BUILD_TESTS)
  add_library(mkernel::catch2 INTERFACE IMPORTED)
  if(MKERNEL_CATCH2_INCLUDE_DIR)
    target_include_directories(mkernel::catch2 INTERFACE ${MKERNEL_CATCH2_INCLUDE_DIR})
    set(MKERNEL_CATCH2_MAJOR 2)
  else()
    find_package(Catch2 3 QUIET)      # Ubuntu 24.04's catch2, a source build of 3.x
    if(NOT Catch2_FOUND)
      find_package(Catch2 2 QUIET)    # Debian 12's catch2 (2.13)
    endif()
    if(NOT Catch2_FOUND)
      mkernel_missing("Catch2 (2.x or 3.x)" "apt-get install catch2, or pass -DMKERNEL_CATCH2_INCLUDE_DIR=<folder with catch2/catch.hpp>, or -DMKERNEL_BUILD_TESTS=OFF.")
    endif()
    string(REGEX MATCH "^[0-9]+" MKERNEL_CATCH2_MAJOR "${Catch2_VERSION}")
    target_link_libraries(mkernel::catch2 INTERFACE Catch2::Catch2)
  endif()
  target_compile_definitions(mkernel::catch2 INTERFACE MKERNEL_CATCH2_MAJOR=${MKERNEL_CATCH2_MAJOR})
  message(STATUS "mkernel: Catch2 ${MKERNEL_CATCH2_MAJOR}.x for the tests")
endif()
