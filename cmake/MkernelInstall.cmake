# The install tree, laid out like NCCL's and aws-ofi-nccl's (GNUInstallDirs):
#   <libdir>/libmkernel.so.X.Y.Z, libmkernel.so.0 (SONAME), libmkernel.so        component runtime/devel
#   <libdir>/libnccl-net-mkernel.so, libnccl-tuner-mkernel.so -> libmkernel.so.0  component runtime
#     (NCCL_NET_PLUGIN=mkernel / NCCL_TUNER_PLUGIN=mkernel dlopen these names; one file serves the
#     shim, the net plugin and the tuner, so a process that also LD_PRELOADs it loads it once)
#   <bindir>/mkernel-topo, mkernel-model                                          component runtime
#   <includedir>/mkernel_api.h                                                    component devel
#   <libdir>/cmake/mkernel/mkernelConfig.cmake (+ version, targets): mkernel::mkernel
#   <libdir>/pkgconfig/mkernel.pc                                                 component devel
# `cmake --install <build>` installs runtime and devel. The Python wheel (pyproject.toml) installs
# component python only: the library as one plain file (a wheel holds no symlinks) and the header
# that python/mkernel reads mkernelStats_t from.
include(CMakePackageConfigHelpers)

# The library directory as install() rules and scripts see it at install time (DESTDIR and
# `cmake --install --prefix` respected).
if(IS_ABSOLUTE "${CMAKE_INSTALL_LIBDIR}")
  set(_mk_libdir_at_install "\$ENV{DESTDIR}${CMAKE_INSTALL_LIBDIR}")
  set(MKERNEL_PC_LIBDIR "${CMAKE_INSTALL_LIBDIR}")
else()
  set(_mk_libdir_at_install "\$ENV{DESTDIR}\${CMAKE_INSTALL_PREFIX}/${CMAKE_INSTALL_LIBDIR}")
  set(MKERNEL_PC_LIBDIR "\${prefix}/${CMAKE_INSTALL_LIBDIR}")
endif()
if(IS_ABSOLUTE "${CMAKE_INSTALL_INCLUDEDIR}")
  set(MKERNEL_PC_INCLUDEDIR "${CMAKE_INSTALL_INCLUDEDIR}")
else()
  set(MKERNEL_PC_INCLUDEDIR "\${prefix}/${CMAKE_INSTALL_INCLUDEDIR}")
endif()

# --- the library, its links and the header ---------------------------------------------------------
install(TARGETS mkernel EXPORT mkernelTargets
  LIBRARY DESTINATION ${CMAKE_INSTALL_LIBDIR} COMPONENT runtime NAMELINK_COMPONENT devel
  INCLUDES DESTINATION ${CMAKE_INSTALL_INCLUDEDIR})
install(CODE "
  foreach(_plugin nccl-net-mkernel nccl-tuner-mkernel)
    set(_link \"${_mk_libdir_at_install}/lib\${_plugin}.so\")
    message(STATUS \"Installing: \${_link} -> $<TARGET_SONAME_FILE_NAME:mkernel>\")
    file(CREATE_LINK \"$<TARGET_SONAME_FILE_NAME:mkernel>\" \"\${_link}\" SYMBOLIC)
    list(APPEND CMAKE_INSTALL_MANIFEST_FILES \"\${_link}\")
  endforeach()" COMPONENT runtime)
install(FILES ${PROJECT_SOURCE_DIR}/plugin/mkernel_api.h DESTINATION ${CMAKE_INSTALL_INCLUDEDIR}
        COMPONENT devel)

# --- the commands (tools/<name>/ defines them; a build without a tool installs the others) -----------
foreach(_tool mkernel-topo mkernel-model)
  if(TARGET ${_tool})
    install(TARGETS ${_tool} RUNTIME DESTINATION ${CMAKE_INSTALL_BINDIR} COMPONENT runtime)
  endif()
endforeach()

# --- find_package(mkernel): imported target mkernel::mkernel ------------------------------------------
set(MKERNEL_CMAKE_DIR ${CMAKE_INSTALL_LIBDIR}/cmake/mkernel)
install(EXPORT mkernelTargets NAMESPACE mkernel:: DESTINATION ${MKERNEL_CMAKE_DIR} COMPONENT devel)
configure_package_config_file(${CMAKE_CURRENT_LIST_DIR}/mkernelConfig.cmake.in
  ${PROJECT_BINARY_DIR}/cmake/mkernelConfig.cmake INSTALL_DESTINATION ${MKERNEL_CMAKE_DIR})
# 0.x: a minor version may change the ABI (mkernel_api.h), so only the same X.Y matches.
write_basic_package_version_file(${PROJECT_BINARY_DIR}/cmake/mkernelConfigVersion.cmake
  COMPATIBILITY SameMinorVersion)
install(FILES ${PROJECT_BINARY_DIR}/cmake/mkernelConfig.cmake ${PROJECT_BINARY_DIR}/cmake/mkernelConfigVersion.cmake
        DESTINATION ${MKERNEL_CMAKE_DIR} COMPONENT devel)

# --- pkg-config: the prefix is filled in at install time, so that `cmake --install --prefix P` ----
# writes prefix=P; everything else at configure time.
set(MKERNEL_PC_PREFIX "@MKERNEL_PC_PREFIX@")
configure_file(${CMAKE_CURRENT_LIST_DIR}/mkernel.pc.in ${PROJECT_BINARY_DIR}/pkgconfig/mkernel.pc.in @ONLY)
install(CODE "
  set(MKERNEL_PC_PREFIX \"\${CMAKE_INSTALL_PREFIX}\")
  configure_file(\"${PROJECT_BINARY_DIR}/pkgconfig/mkernel.pc.in\" \"${PROJECT_BINARY_DIR}/pkgconfig/mkernel.pc\" @ONLY)"
  COMPONENT devel)
install(FILES ${PROJECT_BINARY_DIR}/pkgconfig/mkernel.pc DESTINATION ${CMAKE_INSTALL_LIBDIR}/pkgconfig COMPONENT devel)

# --- the wheel (component python, never part of a plain install) ------------------------------------
# python/mkernel/ finds lib/libmkernel.so and include/mkernel_api.h next to itself.
install(FILES $<TARGET_FILE:mkernel> DESTINATION lib RENAME libmkernel.so COMPONENT python EXCLUDE_FROM_ALL)
install(FILES ${PROJECT_SOURCE_DIR}/plugin/mkernel_api.h DESTINATION include COMPONENT python EXCLUDE_FROM_ALL)
