# Warnings as errors for mkernel's own code (not for third-party headers, which come in as SYSTEM).
function(mkernel_warnings target)
  set(_cxx -Wall -Wextra -Wno-unused-parameter -Wshadow=local -Wformat=2)
  if(MKERNEL_WERROR)
    list(APPEND _cxx -Werror)
  endif()
  target_compile_options(${target} PRIVATE
    $<$<COMPILE_LANGUAGE:CXX>:${_cxx}>
    $<$<COMPILE_LANGUAGE:CUDA>:-Xcompiler=-Wall,-Wno-unused-parameter --extended-lambda -lineinfo>
    $<$<AND:$<COMPILE_LANGUAGE:CUDA>,$<BOOL:${MKERNEL_WERROR}>>:-Werror=all-warnings>)
  if(MKERNEL_SANITIZE)
    # GCC 12's -Wmaybe-uninitialized misfires inside libstdc++ (<regex>) under ASan instrumentation.
    target_compile_options(${target} PRIVATE $<$<COMPILE_LANGUAGE:CXX>:-Wno-maybe-uninitialized>)
    target_compile_options(${target} PRIVATE $<$<COMPILE_LANGUAGE:CXX>:-fsanitize=address,undefined -fno-omit-frame-pointer -fno-sanitize-recover=undefined>)
    target_link_options(${target} PRIVATE -fsanitize=address,undefined)
  elseif(MKERNEL_TSAN)
    # ThreadSanitizer (scripts/test.sh tsan; not in CI, which keeps one sanitizer build).
    # -Wno-tsan: TSan does not model std::atomic_thread_fence; where a fence orders host threads
    # (proxy_ring.h) the TSan build uses a release store instead.
    target_compile_options(${target} PRIVATE $<$<COMPILE_LANGUAGE:CXX>:-Wno-maybe-uninitialized -Wno-tsan -fsanitize=thread -fno-omit-frame-pointer>)
    target_link_options(${target} PRIVATE -fsanitize=thread)
  endif()
endfunction()

# Test executables: Catch2 + mkernel_core, registered with ctest under a label.
#   mkernel_test(NAME <n> SOURCES <...> LABELS <...> [LIBS <...>] [TIMEOUT <s>] [ARGS <test filter...>])
# LIBS: the layers it needs (default mkernel_core, the whole stack below plugin/).
function(mkernel_test)
  cmake_parse_arguments(T "" "NAME;TIMEOUT" "SOURCES;LABELS;LIBS;ARGS" ${ARGN})
  # Catch2's main is compiled once for all test binaries (it is the slowest file to compile,
  # most of all under ASan): a static library whose main() the linker pulls in.
  if(NOT TARGET mkernel_catch_main)
    add_library(mkernel_catch_main STATIC ${PROJECT_SOURCE_DIR}/tests/catch_main.cc)
    target_link_libraries(mkernel_catch_main PUBLIC mkernel::catch2)
    mkernel_warnings(mkernel_catch_main)
  endif()
  add_executable(${T_NAME} ${T_SOURCES})
  if(NOT T_LIBS)
    set(T_LIBS mkernel_core)
  endif()
  target_link_libraries(${T_NAME} PRIVATE ${T_LIBS} mkernel_catch_main mkernel::catch2)
  mkernel_warnings(${T_NAME})
  if(NOT T_TIMEOUT)
    set(T_TIMEOUT 300)
  endif()
  if(MKERNEL_TSAN)
    # ThreadSanitizer runs the threaded tests 2-10x slower (scripts/test.sh tsan): 3x the time.
    math(EXPR T_TIMEOUT "${T_TIMEOUT} * 3")
  endif()
  add_test(NAME ${T_NAME} COMMAND ${T_NAME} --order lex ${T_ARGS})
  set_tests_properties(${T_NAME} PROPERTIES LABELS "${T_LABELS}" TIMEOUT ${T_TIMEOUT})
endfunction()
