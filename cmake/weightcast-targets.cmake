# Installed with weightcast-config.cmake: the one consumer target over the installed archives.
if(TARGET weightcast::weightcast)
  return()
endif()
get_filename_component(_wc_prefix "${CMAKE_CURRENT_LIST_DIR}/../../.." ABSOLUTE)
set(_wc_libdir "${CMAKE_CURRENT_LIST_DIR}/../../weightcast")
get_filename_component(_wc_libdir "${_wc_libdir}" ABSOLUTE)
set(_wc_paths "")
foreach(archive IN LISTS WEIGHTCAST_ARCHIVES)
  list(APPEND _wc_paths "${_wc_libdir}/${archive}")
endforeach()
add_library(weightcast::weightcast INTERFACE IMPORTED)
set(_wc_deps gloo MPI::MPI_CXX nlohmann_json::nlohmann_json PkgConfig::HTTPLIB
             PkgConfig::XXHASH PkgConfig::ZSTD PkgConfig::LZ4 Threads::Threads)
if(WEIGHTCAST_WITH_NCCL)
  list(APPEND _wc_deps CUDA::cudart)
  list(APPEND _wc_deps "${WEIGHTCAST_NCCL_LIBRARY}")
endif()
set_target_properties(weightcast::weightcast PROPERTIES
  INTERFACE_INCLUDE_DIRECTORIES "${_wc_prefix}/include/weightcast"
  INTERFACE_COMPILE_DEFINITIONS "OMPI_SKIP_MPICXX;MPICH_SKIP_MPICXX"
  INTERFACE_LINK_LIBRARIES "-Wl,--start-group;${_wc_paths};-Wl,--end-group;${_wc_deps}")
unset(_wc_paths)
unset(_wc_deps)
