# mkernel_sources(<target> <dir>...): adds every .cc (and, with MKERNEL_DEVICE_CODE, .cu) file of
# the given folders (not recursive) to <target>. Components are folders; a new file needs no
# CMake edit.
function(mkernel_sources target)
  foreach(dir ${ARGN})
    file(GLOB _cc CONFIGURE_DEPENDS ${dir}/*.cc)
    target_sources(${target} PRIVATE ${_cc})
    if(MKERNEL_DEVICE_CODE)
      file(GLOB _cu CONFIGURE_DEPENDS ${dir}/*.cu)
      target_sources(${target} PRIVATE ${_cu})
    endif()
  endforeach()
endfunction()
