# `cmake --install`: the programs, the libraries, the public headers and the package config that
# gives consumers one target, weightcast::weightcast (docs/library.md).
# The libraries are the project's static archives, installed as they are built; the config links
# them as one group, so their order and the files inside each folder are not listed here.
include(GNUInstallDirs)
include(CMakePackageConfigHelpers)

set(WEIGHTCAST_INSTALL_CMAKEDIR ${CMAKE_INSTALL_LIBDIR}/cmake/weightcast)
set(WEIGHTCAST_INSTALL_LIBRARIES
    weightcast_sync_engine_http weightcast_sync_engine weightcast_sync_trainer
    weightcast_sync_model weightcast_sync_protocol weightcast_mpi weightcast_comm)

install(TARGETS weightcast-train weightcast-engine weightcast-bench
        RUNTIME DESTINATION ${CMAKE_INSTALL_BINDIR})

set(_wc_archives "")
foreach(lib IN LISTS WEIGHTCAST_INSTALL_LIBRARIES)
  install(FILES $<TARGET_FILE:${lib}> DESTINATION ${CMAKE_INSTALL_LIBDIR}/weightcast)
  list(APPEND _wc_archives "$<TARGET_FILE_NAME:${lib}>")
endforeach()

# Public headers, by folder: every header under comm/ and sync/, plus the generated config.h.
foreach(dir comm sync)
  install(DIRECTORY ${PROJECT_SOURCE_DIR}/${dir}/
          DESTINATION ${CMAKE_INSTALL_INCLUDEDIR}/weightcast/${dir}
          FILES_MATCHING PATTERN "*.h" PATTERN "*.def")
endforeach()
install(FILES ${PROJECT_BINARY_DIR}/generated/weightcast/config.h
        DESTINATION ${CMAKE_INSTALL_INCLUDEDIR}/weightcast/weightcast)

set(WEIGHTCAST_CONFIG_WITH_NCCL ${WEIGHTCAST_HAVE_NCCL})
if(NOT WEIGHTCAST_CONFIG_WITH_NCCL)
  set(WEIGHTCAST_CONFIG_WITH_NCCL 0)
endif()
# The archive names are known at generate time only: the targets file is written per config.
string(JOIN ";" _wc_archive_list ${_wc_archives})
file(GENERATE OUTPUT ${PROJECT_BINARY_DIR}/weightcast-archives.cmake
     CONTENT "set(WEIGHTCAST_ARCHIVES \"${_wc_archive_list}\")\n")
configure_package_config_file(${PROJECT_SOURCE_DIR}/cmake/weightcast-config.cmake.in
                              ${PROJECT_BINARY_DIR}/weightcast-config.cmake
                              INSTALL_DESTINATION ${WEIGHTCAST_INSTALL_CMAKEDIR})
write_basic_package_version_file(${PROJECT_BINARY_DIR}/weightcast-config-version.cmake
                                 VERSION ${PROJECT_VERSION} COMPATIBILITY SameMinorVersion)
install(FILES ${PROJECT_BINARY_DIR}/weightcast-config.cmake
              ${PROJECT_BINARY_DIR}/weightcast-config-version.cmake
              ${PROJECT_BINARY_DIR}/weightcast-archives.cmake
              ${PROJECT_SOURCE_DIR}/cmake/weightcast-targets.cmake
        DESTINATION ${WEIGHTCAST_INSTALL_CMAKEDIR})
