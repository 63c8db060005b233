# cmake --install for amp: headers, the shared library, and a relocatable config-file package.
include_guard(GLOBAL)
include(GNUInstallDirs)
include(CMakePackageConfigHelpers)

set(AMP_INSTALL_CMAKEDIR "${CMAKE_INSTALL_LIBDIR}/cmake/amp" CACHE STRING
    "Where ampConfig.cmake is installed, relative to the prefix")

set(_amp_installed_targets amp)
set(_amp_header_excludes "")
if(AMP_WITH_DISTRIBUTED)
  list(APPEND _amp_installed_targets amp_distributed)  # amp::distributed, the component
else()
  set(_amp_header_excludes PATTERN "distributed.h" EXCLUDE PATTERN "distributed_export.h" EXCLUDE
    PATTERN "distributed" EXCLUDE)
endif()
install(TARGETS ${_amp_installed_targets} EXPORT ampTargets
  LIBRARY DESTINATION ${CMAKE_INSTALL_LIBDIR}
  ARCHIVE DESTINATION ${CMAKE_INSTALL_LIBDIR}
  RUNTIME DESTINATION ${CMAKE_INSTALL_BINDIR}
  INCLUDES DESTINATION ${CMAKE_INSTALL_INCLUDEDIR})
install(DIRECTORY "${PROJECT_SOURCE_DIR}/include/amp" "${PROJECT_BINARY_DIR}/include/amp"
  DESTINATION ${CMAKE_INSTALL_INCLUDEDIR}
  FILES_MATCHING PATTERN "*.h" ${_amp_header_excludes})
install(EXPORT ampTargets NAMESPACE amp:: DESTINATION ${AMP_INSTALL_CMAKEDIR})

configure_package_config_file(cmake/ampConfig.cmake.in
  "${PROJECT_BINARY_DIR}/ampConfig.cmake" INSTALL_DESTINATION ${AMP_INSTALL_CMAKEDIR})
write_basic_package_version_file("${PROJECT_BINARY_DIR}/ampConfigVersion.cmake"
  COMPATIBILITY SameMajorVersion)
install(FILES "${PROJECT_BINARY_DIR}/ampConfig.cmake" "${PROJECT_BINARY_DIR}/ampConfigVersion.cmake"
  "${PROJECT_SOURCE_DIR}/cmake/ampTorchWheel.cmake"
  DESTINATION ${AMP_INSTALL_CMAKEDIR})
