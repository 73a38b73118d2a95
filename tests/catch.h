// The test framework for every test file: Catch2 2.x (the single header catch2/catch.hpp) or
// Catch2 3.x (its split headers), whichever the configure step found (cmake/MkernelDeps.cmake
// defines MKERNEL_CATCH2_MAJOR). Test files include this, never Catch2's headers directly.
#pragma once

#if MKERNEL_CATCH2_MAJOR == 3
#include <catch2/catch_approx.hpp>
#include <catch2/catch_test_macros.hpp>
#include <catch2/generators/catch_generators.hpp>
// 2.x has Approx at global scope; 3.x moved it into namespace Catch.
using Catch::Approx;
#elif MKERNEL_CATCH2_MAJOR == 2
#include <catch2/catch.hpp>
#else
#error "MKERNEL_CATCH2_MAJOR is 2 or 3 (tests link mkernel::catch2, which defines it)"
#endif
