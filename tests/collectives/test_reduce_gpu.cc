// collectives/algo/reduce_host.h against the GPU's own arithmetic (label gpu: needs an sm_90
// device). The host emulation must give the bits the CUDA intrinsics NCCL 2.28 uses give: every fp8
// pair, random and special fp16/bf16/fp32/fp64 pairs (NaN, +-0, inf, subnormals), and the
// conversions.
#include "tests/catch.h"

#include <cmath>
#include <cstdio>
#include <cstring>
#include <vector>

#include "coll_test_util.h"
#include "collectives/algo/reduce_host.h"
#include "reduce_gpu_ops.h"

using namespace mkernel::coll;

namespace {

const RedOp kHostOp[] = {RedOp::Sum, RedOp::Prod, RedOp::Min, RedOp::Max};
const char* const kOpName[] = {"add", "mul", "min", "max"};

bool isNan(DataType t, const uint8_t* p) {
  return std::isnan(loadAsDouble(t, p, 0));
}

// Counts elements whose bits differ (two NaNs match); prints the first few.
size_t countMismatches(DataType t, const char* what, const std::vector<uint8_t>& host,
                       const std::vector<uint8_t>& gpu, const std::vector<uint8_t>* a = nullptr,
                       const std::vector<uint8_t>* b = nullptr) {
  const size_t es = dataTypeSize(t), n = host.size() / es;
  size_t bad = 0;
  for (size_t i = 0; i < n; ++i) {
    const uint8_t* h = host.data() + i * es;
    const uint8_t* g = gpu.data() + i * es;
    if (std::memcmp(h, g, es) == 0 || (isNan(t, h) && isNan(t, g))) continue;
    if (bad++ < 5) {
      std::printf("%s %s: element %zu: host %.9g, gpu %.9g", dataTypeName(t), what, i,
                  loadAsDouble(t, h, 0), loadAsDouble(t, g, 0));
      if (a && b)
        std::printf(" (a %.9g, b %.9g)", loadAsDouble(t, a->data(), i),
                    loadAsDouble(t, b->data(), i));
      std::printf("\n");
    }
  }
  return bad;
}

void requireGpu() {
  std::string why;
  const bool ok = test::gpuAvailable(&why);
  INFO("this test needs an sm_90 GPU (label gpu; CI skips it): " << why);
  REQUIRE(ok);
}

// Operand pairs: every pair of codes for 8-bit types; else random bits plus every pair of
// special values (zeros, NaN, inf, largest, subnormals).
void makePairs(DataType t, std::vector<uint8_t>* a, std::vector<uint8_t>* b) {
  const size_t es = dataTypeSize(t);
  a->clear();
  b->clear();
  auto push = [&](const void* x, const void* y) {
    a->insert(a->end(), static_cast<const uint8_t*>(x), static_cast<const uint8_t*>(x) + es);
    b->insert(b->end(), static_cast<const uint8_t*>(y), static_cast<const uint8_t*>(y) + es);
  };
  if (es == 1) {
    for (int x = 0; x < 256; ++x)
      for (int y = 0; y < 256; ++y) {
        uint8_t bx = static_cast<uint8_t>(x), by = static_cast<uint8_t>(y);
        push(&bx, &by);
      }
    return;
  }
  std::vector<double> specials = {0.0,     -0.0, 1.0,   -1.0,   INFINITY, -INFINITY, NAN,
                                  65504.0, 1e-7, -1e-7, 3.0e38, 1e-40,    0.5,       1.0 / 3};
  std::vector<uint8_t> sv(specials.size() * es);
  for (size_t i = 0; i < specials.size(); ++i) storeFromDouble(t, sv.data(), i, specials[i]);
  for (size_t i = 0; i < specials.size(); ++i)
    for (size_t j = 0; j < specials.size(); ++j) push(sv.data() + i * es, sv.data() + j * es);
  test::Rng rng(static_cast<uint64_t>(t) + 99);
  for (int i = 0; i < 1 << 20; ++i) {
    uint64_t x = rng.next(), y = rng.next();
    if (i % 2 == 0) y = x ^ (rng.next() & 0xff);  // close operands: cancellation, ties
    push(&x, &y);
  }
}

}  // namespace

TEST_CASE("gpu: NCCL's element arithmetic equals reduce_host's bit for bit") {
  requireGpu();
  for (DataType t : {DataType::Fp8E4M3, DataType::Fp8E5M2, DataType::Float16, DataType::Bfloat16,
                     DataType::Float32, DataType::Float64}) {
    std::vector<uint8_t> a, b;
    makePairs(t, &a, &b);
    const size_t es = dataTypeSize(t), n = a.size() / es;
    for (int op = 0; op < 4; ++op) {
      std::vector<uint8_t> gpu(a.size()), host(a);
      std::string why;
      const bool ran = test::gpuBinary(t, static_cast<test::GpuBinaryOp>(op), a.data(), b.data(),
                                       gpu.data(), n, &why);
      INFO(dataTypeName(t) << " " << kOpName[op] << ": " << why);
      REQUIRE(ran);
      DevRedOp d{};
      REQUIRE(makeDevRedOp(kHostOp[op], t, 2, 1.0, &d) == mkernel::Result::Success);
      hostReduce(d, t, host.data(), b.data(), n);
      size_t bad = countMismatches(t, kOpName[op], host, gpu, &a, &b);
      std::printf("gpu check: %-8s %s: %zu pairs, %zu differ\n", dataTypeName(t), kOpName[op], n,
                  bad);
      CHECK(bad == 0);
    }
  }
}

TEST_CASE("gpu: float -> fp16/bf16/fp8 and half -> fp8 conversions equal the software ones") {
  requireGpu();
  test::Rng rng(17);
  std::vector<float> in;
  for (float s : {0.0f, -0.0f, INFINITY, -INFINITY, NAN, 448.0f, 464.0f, 465.0f, 57344.0f, 61440.0f,
                  65504.0f, 65520.0f, 1e-9f, 1.0f / 3})
    in.push_back(s);
  for (int i = 0; i < 1 << 20; ++i) {
    float f = static_cast<float>(std::ldexp(rng.uniform(-2.0, 2.0), rng.below(60) - 30));
    in.push_back(f);
  }
  for (DataType t : {DataType::Float16, DataType::Bfloat16, DataType::Fp8E4M3, DataType::Fp8E5M2}) {
    const size_t es = dataTypeSize(t);
    std::vector<uint8_t> gpu(in.size() * es), host(in.size() * es);
    std::string why;
    const bool ran = test::gpuFromFloat(t, in.data(), gpu.data(), in.size(), &why);
    INFO(dataTypeName(t) << ": " << why);
    REQUIRE(ran);
    for (size_t i = 0; i < in.size(); ++i) {
      if (t == DataType::Float16) {
        uint16_t h = fp::floatToHalf(in[i]);
        std::memcpy(host.data() + 2 * i, &h, 2);
      } else if (t == DataType::Bfloat16) {
        uint16_t h = fp::floatToBf16(in[i]);
        std::memcpy(host.data() + 2 * i, &h, 2);
      } else {
        host[i] = fp::floatToFp8(in[i], t == DataType::Fp8E5M2);
      }
    }
    size_t bad = countMismatches(t, "from float", host, gpu);
    std::printf("gpu check: %-8s from float: %zu values, %zu differ\n", dataTypeName(t), in.size(),
                bad);
    CHECK(bad == 0);
  }
  std::vector<uint16_t> halves(1 << 16);
  for (size_t i = 0; i < halves.size(); ++i) halves[i] = static_cast<uint16_t>(i);
  for (bool e5m2 : {false, true}) {
    std::vector<uint8_t> gpu(halves.size()), host(halves.size());
    std::string why;
    const bool ran = test::gpuHalfToFp8(e5m2, halves.data(), gpu.data(), halves.size(), &why);
    INFO(why);
    REQUIRE(ran);
    for (size_t i = 0; i < halves.size(); ++i)
      host[i] = fp::floatToFp8(fp::halfToFloat(halves[i]), e5m2);
    DataType t = e5m2 ? DataType::Fp8E5M2 : DataType::Fp8E4M3;
    size_t bad = countMismatches(t, "from every half", host, gpu);
    std::printf("gpu check: %-8s from every half: %zu differ\n", dataTypeName(t), bad);
    CHECK(bad == 0);
  }
}
