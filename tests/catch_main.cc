// The one Catch2 main for every test binary (Catch2 2.x or 3.x: tests/catch.h).
#if MKERNEL_CATCH2_MAJOR == 3
#include <catch2/catch_session.hpp>
#else
#define CATCH_CONFIG_RUNNER
#include <catch2/catch.hpp>
#endif

int main(int argc, char* argv[]) {
  return Catch::Session().run(argc, argv);
}
