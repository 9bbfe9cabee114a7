# Defines the imported targets of the leasehold C++ binding:
#   leasehold::leasehold  — leasehold.hpp (+ leasehold/memory_transport.hpp) and the Rust library
#   leasehold::redis      — leasehold/redis_transport.hpp + hiredis (only when hiredis is found)
#
# The Rust library is looked up, in order:
#   1. LEASEHOLD_LIBRARY / LEASEHOLD_INCLUDE_DIR if set by the user;
#   2. the repository build: ${LEASEHOLD_ROOT}/target/release/libleasehold.{a,so} and
#      ${LEASEHOLD_ROOT}/include/leasehold.h (run `cargo build --release` at the repo root);
#   3. pkg-config module `leasehold` (leasehold.pc, installed by scripts/install-lib.sh).
# LEASEHOLD_STATIC (default ON) prefers libleasehold.a over libleasehold.so in the build dir.
include_guard(GLOBAL)

if(NOT DEFINED LEASEHOLD_CPP_INCLUDE_DIR)
  get_filename_component(LEASEHOLD_CPP_INCLUDE_DIR "${CMAKE_CURRENT_LIST_DIR}/../include" ABSOLUTE)
endif()
if(NOT DEFINED LEASEHOLD_ROOT)
  get_filename_component(LEASEHOLD_ROOT "${CMAKE_CURRENT_LIST_DIR}/../../.." ABSOLUTE)
endif()
set(LEASEHOLD_ROOT "${LEASEHOLD_ROOT}" CACHE PATH "leasehold repository root (target/release + include/)")
option(LEASEHOLD_STATIC "Link the static Rust library when both are available" ON)

find_package(Threads REQUIRED)
find_package(PkgConfig QUIET)

if(NOT LEASEHOLD_LIBRARY)
  if(LEASEHOLD_STATIC)
    set(_lh_names libleasehold.a leasehold)
  else()
    set(_lh_names leasehold libleasehold.a)
  endif()
  find_library(LEASEHOLD_LIBRARY NAMES ${_lh_names}
               PATHS "${LEASEHOLD_ROOT}/target/release" NO_DEFAULT_PATH NO_CACHE)
endif()
if(NOT LEASEHOLD_INCLUDE_DIR)
  find_path(LEASEHOLD_INCLUDE_DIR leasehold.h PATHS "${LEASEHOLD_ROOT}/include" NO_DEFAULT_PATH NO_CACHE)
endif()

if(NOT TARGET leasehold::leasehold_c)
  if(LEASEHOLD_LIBRARY AND LEASEHOLD_INCLUDE_DIR)
    message(STATUS "leasehold: using ${LEASEHOLD_LIBRARY} with ${LEASEHOLD_INCLUDE_DIR}/leasehold.h")
    add_library(leasehold::leasehold_c UNKNOWN IMPORTED GLOBAL)
    set_target_properties(leasehold::leasehold_c PROPERTIES
      IMPORTED_LOCATION "${LEASEHOLD_LIBRARY}"
      INTERFACE_INCLUDE_DIRECTORIES "${LEASEHOLD_INCLUDE_DIR}")
    # A Rust staticlib needs the platform libraries std links against.
    set_property(TARGET leasehold::leasehold_c PROPERTY
      INTERFACE_LINK_LIBRARIES Threads::Threads ${CMAKE_DL_LIBS} m)
  elseif(PkgConfig_FOUND)
    pkg_check_modules(LEASEHOLD_PC QUIET IMPORTED_TARGET GLOBAL leasehold)
    if(LEASEHOLD_PC_FOUND)
      message(STATUS "leasehold: using pkg-config module leasehold ${LEASEHOLD_PC_VERSION}")
      add_library(leasehold::leasehold_c INTERFACE IMPORTED GLOBAL)
      set_property(TARGET leasehold::leasehold_c PROPERTY
        INTERFACE_LINK_LIBRARIES PkgConfig::LEASEHOLD_PC Threads::Threads ${CMAKE_DL_LIBS} m)
    endif()
  endif()
endif()
if(NOT TARGET leasehold::leasehold_c)
  message(FATAL_ERROR "leasehold: Rust library not found. Run `cargo build --release` in "
                      "${LEASEHOLD_ROOT}, or install leasehold.pc, or set LEASEHOLD_LIBRARY and "
                      "LEASEHOLD_INCLUDE_DIR.")
endif()

if(NOT TARGET leasehold::leasehold)
  add_library(leasehold::leasehold INTERFACE IMPORTED GLOBAL)
  set_target_properties(leasehold::leasehold PROPERTIES
    INTERFACE_INCLUDE_DIRECTORIES "${LEASEHOLD_CPP_INCLUDE_DIR}"
    INTERFACE_COMPILE_FEATURES cxx_std_20
    INTERFACE_LINK_LIBRARIES "leasehold::leasehold_c;Threads::Threads")
endif()

if(NOT TARGET leasehold::redis AND PkgConfig_FOUND)
  pkg_check_modules(HIREDIS QUIET IMPORTED_TARGET GLOBAL hiredis)
  if(HIREDIS_FOUND)
    add_library(leasehold::redis INTERFACE IMPORTED GLOBAL)
    set_property(TARGET leasehold::redis PROPERTY
      INTERFACE_LINK_LIBRARIES "leasehold::leasehold;PkgConfig::HIREDIS")
  endif()
endif()
