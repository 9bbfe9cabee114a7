# Install rules of the leasehold package (scripts/install-lib.sh uses them too):
#   include/leasehold.h, include/leasehold.hpp, include/leasehold/ (every .hpp, detail/ included)
#   lib/libleasehold.a, lib/libleasehold.so.<version> with libleasehold.so.<ABI> (its SONAME)
#     and libleasehold.so
#   lib/cmake/leasehold/leaseholdConfig.cmake + leaseholdConfigVersion.cmake
#   lib/pkgconfig/leasehold.pc (shared) and leasehold-static.pc; their Cflags cover the C++
#     headers too, which sit beside leasehold.h
#   share/doc/leasehold/LICENSE-MIT, LICENSE-APACHE, CHANGELOG.md
# The libraries are the repository's release build (cargo build --release at LEASEHOLD_ROOT).
include_guard(GLOBAL)
include(GNUInstallDirs)
include(CMakePackageConfigHelpers)

set(_lh_release "${LEASEHOLD_ROOT}/target/release")
foreach(_lh_file "${_lh_release}/libleasehold.a" "${_lh_release}/libleasehold.so"
                 "${LEASEHOLD_ROOT}/include/leasehold.h" "${LEASEHOLD_ROOT}/Cargo.toml")
  if(NOT EXISTS "${_lh_file}")
    message(FATAL_ERROR "leasehold install: ${_lh_file} is missing; run `cargo build --release` "
                        "in ${LEASEHOLD_ROOT} first, or configure with -DLEASEHOLD_INSTALL=OFF")
  endif()
endforeach()

# One version for the crate and every package (docs/versioning.md): the CMake project must
# match Cargo.toml, and the SONAME follows LH_ABI_VERSION.
file(STRINGS "${LEASEHOLD_ROOT}/Cargo.toml" _lh_ver REGEX "^version = \"[0-9.]+\"$" LIMIT_COUNT 1)
string(REGEX REPLACE "^version = \"([0-9.]+)\"$" "\\1" _lh_ver "${_lh_ver}")
if(NOT _lh_ver STREQUAL PROJECT_VERSION)
  message(FATAL_ERROR "leasehold install: Cargo.toml says ${_lh_ver}, bindings/cpp/CMakeLists.txt "
                      "says ${PROJECT_VERSION}; they move together (docs/versioning.md)")
endif()
file(STRINGS "${LEASEHOLD_ROOT}/include/leasehold.h" _lh_abi REGEX "^#define LH_ABI_VERSION [0-9]+$")
string(REGEX REPLACE "^#define LH_ABI_VERSION " "" LEASEHOLD_ABI_VERSION "${_lh_abi}")
if(NOT LEASEHOLD_ABI_VERSION)
  message(FATAL_ERROR "leasehold install: no LH_ABI_VERSION in include/leasehold.h")
endif()
set(_lh_real "libleasehold.so.${PROJECT_VERSION}")
set(_lh_soname "libleasehold.so.${LEASEHOLD_ABI_VERSION}")

# Headers.
install(FILES "${LEASEHOLD_ROOT}/include/leasehold.h" "${CMAKE_CURRENT_SOURCE_DIR}/include/leasehold.hpp"
        DESTINATION "${CMAKE_INSTALL_INCLUDEDIR}")
install(DIRECTORY "${CMAKE_CURRENT_SOURCE_DIR}/include/leasehold"
        DESTINATION "${CMAKE_INSTALL_INCLUDEDIR}" FILES_MATCHING PATTERN "*.hpp")

# Libraries: the static archive, and the shared library under its versioned name with the
# SONAME link (what programs load) and the development link (what -lleasehold finds).
install(FILES "${_lh_release}/libleasehold.a" DESTINATION "${CMAKE_INSTALL_LIBDIR}")
install(PROGRAMS "${_lh_release}/libleasehold.so" DESTINATION "${CMAKE_INSTALL_LIBDIR}" RENAME "${_lh_real}")
install(CODE "
  set(_lh_dir \"\$ENV{DESTDIR}\${CMAKE_INSTALL_PREFIX}/${CMAKE_INSTALL_LIBDIR}\")
  file(REMOVE \"\${_lh_dir}/${_lh_soname}\" \"\${_lh_dir}/libleasehold.so\")
  file(CREATE_LINK \"${_lh_real}\" \"\${_lh_dir}/${_lh_soname}\" SYMBOLIC)
  file(CREATE_LINK \"${_lh_soname}\" \"\${_lh_dir}/libleasehold.so\" SYMBOLIC)
  message(STATUS \"Installing: \${_lh_dir}/${_lh_soname} -> ${_lh_real}, libleasehold.so -> ${_lh_soname}\")
")

# CMake package.
set(_lh_cmakedir "${CMAKE_INSTALL_LIBDIR}/cmake/leasehold")
configure_package_config_file("${CMAKE_CURRENT_LIST_DIR}/leaseholdConfig.install.cmake.in"
  "${CMAKE_CURRENT_BINARY_DIR}/install/leaseholdConfig.cmake"
  INSTALL_DESTINATION "${_lh_cmakedir}"
  PATH_VARS CMAKE_INSTALL_INCLUDEDIR CMAKE_INSTALL_LIBDIR)
# 0.x: a new minor version may break the API, so 0.1.x satisfies find_package(leasehold 0.1)
# and 0.2 does not.
write_basic_package_version_file("${CMAKE_CURRENT_BINARY_DIR}/install/leaseholdConfigVersion.cmake"
  VERSION "${PROJECT_VERSION}" COMPATIBILITY SameMinorVersion)
install(FILES "${CMAKE_CURRENT_BINARY_DIR}/install/leaseholdConfig.cmake"
              "${CMAKE_CURRENT_BINARY_DIR}/install/leaseholdConfigVersion.cmake"
        DESTINATION "${_lh_cmakedir}")

# pkg-config, relocatable: the prefix is found from the .pc file's own directory.
file(RELATIVE_PATH _lh_pc_up "/root/${CMAKE_INSTALL_LIBDIR}/pkgconfig" "/root")
string(REGEX REPLACE "/$" "" _lh_pc_up "${_lh_pc_up}")
set(PREFIX "\${pcfiledir}/${_lh_pc_up}")
set(LIBDIR "\${prefix}/${CMAKE_INSTALL_LIBDIR}")
set(INCLUDEDIR "\${prefix}/${CMAKE_INSTALL_INCLUDEDIR}")
set(VERSION "${PROJECT_VERSION}")
# Native libraries a Rust staticlib needs on Linux (cargo rustc -- --print native-static-libs).
set(NATIVE_LIBS "-lgcc_s -lutil -lrt -lpthread -lm -ldl -lc")
set(NAME leasehold)
set(FLAVOUR shared)
set(LIBS "-L\${libdir} -lleasehold")
configure_file("${LEASEHOLD_ROOT}/leasehold.pc.in" "${CMAKE_CURRENT_BINARY_DIR}/install/leasehold.pc" @ONLY)
set(NAME leasehold-static)
set(FLAVOUR static)
set(LIBS "\${libdir}/libleasehold.a ${NATIVE_LIBS}")
configure_file("${LEASEHOLD_ROOT}/leasehold.pc.in" "${CMAKE_CURRENT_BINARY_DIR}/install/leasehold-static.pc" @ONLY)
install(FILES "${CMAKE_CURRENT_BINARY_DIR}/install/leasehold.pc"
              "${CMAKE_CURRENT_BINARY_DIR}/install/leasehold-static.pc"
        DESTINATION "${CMAKE_INSTALL_LIBDIR}/pkgconfig")

# Licence and release notes.
install(FILES "${LEASEHOLD_ROOT}/LICENSE-MIT" "${LEASEHOLD_ROOT}/LICENSE-APACHE" "${LEASEHOLD_ROOT}/CHANGELOG.md"
        DESTINATION "${CMAKE_INSTALL_DATAROOTDIR}/doc/leasehold")
