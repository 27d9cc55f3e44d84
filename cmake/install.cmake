# Installs what a C++ project needs to do `find_package(moekit)` and link `moekit::moekit`:
# the public headers (with the generated version.hpp), the static library, the `moekit` command,
# moekitTargets.cmake, moekitConfig.cmake and moekitConfigVersion.cmake.
include(CMakePackageConfigHelpers)

set(MOEKIT_INSTALL_CMAKEDIR ${CMAKE_INSTALL_LIBDIR}/cmake/moekit)

install(TARGETS moekit EXPORT moekitTargets
        ARCHIVE DESTINATION ${CMAKE_INSTALL_LIBDIR}
        LIBRARY DESTINATION ${CMAKE_INSTALL_LIBDIR})
install(TARGETS moekit_cli RUNTIME DESTINATION ${CMAKE_INSTALL_BINDIR})
install(DIRECTORY ${PROJECT_SOURCE_DIR}/include/moekit DESTINATION ${CMAKE_INSTALL_INCLUDEDIR}
        FILES_MATCHING PATTERN "*.hpp")
install(FILES ${PROJECT_BINARY_DIR}/include/moekit/version.hpp
        DESTINATION ${CMAKE_INSTALL_INCLUDEDIR}/moekit)
install(EXPORT moekitTargets NAMESPACE moekit:: DESTINATION ${MOEKIT_INSTALL_CMAKEDIR})

configure_package_config_file(${PROJECT_SOURCE_DIR}/cmake/moekitConfig.cmake.in
  ${PROJECT_BINARY_DIR}/moekitConfig.cmake INSTALL_DESTINATION ${MOEKIT_INSTALL_CMAKEDIR})
# 0.x: a minor version may break the API, so only the same minor version is compatible.
write_basic_package_version_file(${PROJECT_BINARY_DIR}/moekitConfigVersion.cmake
  VERSION ${PROJECT_VERSION} COMPATIBILITY SameMinorVersion)
install(FILES ${PROJECT_BINARY_DIR}/moekitConfig.cmake ${PROJECT_BINARY_DIR}/moekitConfigVersion.cmake
        DESTINATION ${MOEKIT_INSTALL_CMAKEDIR})
