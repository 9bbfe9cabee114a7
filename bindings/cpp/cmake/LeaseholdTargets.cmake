# Defines the imported targets of the leasehold C++ binding:
#   leasehold::leasehold  — leasehold.hpp, leasehold/*.hpp (+ memory_executor.hpp) and the Rust library
#   leasehold::redis_stream — leasehold/redis_stream_executor.hpp (RedisStreamExecutor: no Redis
#                           client library), with TLS (rediss://) through OpenSSL when it is found
#                           (it defines LEASEHOLD_OPENSSL); always defined
#   leasehold::redis      — leasehold/redis_executor.hpp + hiredis (only when hiredis is found)
#   leasehold::sqlite     — leasehold/sqlite_executor.hpp + libsqlite3 (when found)
#   leasehold::postgres   — leasehold/postgres_executor.hpp, postgres_fencing.hpp + libpq (when found)
#   leasehold::etcd       — leasehold/etcd_executor.hpp + libcurl (when found)
# Each executor's library is optional: without libpq the rest still builds. The usual
# CMAKE_DISABLE_FIND_PACKAGE_<name>=ON (hiredis, OpenSSL, SQLite3, PostgreSQL, CURL) leaves one out
# on purpose.
#
# The Rust library is looked up, in order:
#   1. LEASEHOLD_LIBRARY / LEASEHOLD_INCLUDE_DIR if set by the user;
#   2. the repository build: ${LEASEHOLD_ROOT}/target/release/libleasehold.{a,so} and
#      ${LEASEHOLD_ROOT}/include/leasehold.h (run `cargo build --release` at the repo root);
#   3. pkg-config module `leasehold-static` / `leasehold` (installed by scripts/install-lib.sh).
# LEASEHOLD_STATIC (default ON) prefers libleasehold.a over libleasehold.so (and the
# leasehold-static pkg-config module over leasehold).
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

if(LEASEHOLD_STATIC)
  set(_lh_names libleasehold.a leasehold)
else()
  set(_lh_names leasehold libleasehold.a)
endif()
set(_lh_source "")
if(NOT LEASEHOLD_LIBRARY OR NOT LEASEHOLD_INCLUDE_DIR)
  find_library(_lh_lib NAMES ${_lh_names} PATHS "${LEASEHOLD_ROOT}/target/release" NO_DEFAULT_PATH NO_CACHE)
  find_path(_lh_inc leasehold.h PATHS "${LEASEHOLD_ROOT}/include" NO_DEFAULT_PATH NO_CACHE)
  if(_lh_lib AND _lh_inc)
    set(_lh_source "the repository build")
  elseif(PkgConfig_FOUND)
    # Only the locations are taken from the .pc file: a static archive given as a path in
    # `Libs:` would otherwise land before the objects on the link line.
    pkg_search_module(LEASEHOLD_PC QUIET leasehold leasehold-static)
    if(LEASEHOLD_PC_FOUND)
      pkg_get_variable(_lh_pc_libdir ${LEASEHOLD_PC_MODULE_NAME} libdir)
      pkg_get_variable(_lh_pc_incdir ${LEASEHOLD_PC_MODULE_NAME} includedir)
      find_library(_lh_lib NAMES ${_lh_names} PATHS "${_lh_pc_libdir}" NO_DEFAULT_PATH NO_CACHE)
      find_path(_lh_inc leasehold.h PATHS "${_lh_pc_incdir}" NO_DEFAULT_PATH NO_CACHE)
      set(_lh_source "pkg-config module ${LEASEHOLD_PC_MODULE_NAME} ${LEASEHOLD_PC_VERSION}")
    endif()
  endif()
  if(NOT LEASEHOLD_LIBRARY)
    set(LEASEHOLD_LIBRARY "${_lh_lib}")
  endif()
  if(NOT LEASEHOLD_INCLUDE_DIR)
    set(LEASEHOLD_INCLUDE_DIR "${_lh_inc}")
  endif()
endif()

if(NOT TARGET leasehold::leasehold_c)
  if(NOT LEASEHOLD_LIBRARY OR NOT LEASEHOLD_INCLUDE_DIR)
    message(FATAL_ERROR "leasehold: Rust library not found. Run `cargo build --release` in "
                        "${LEASEHOLD_ROOT}, or install it (scripts/install-lib.sh, pkg-config), or "
                        "set LEASEHOLD_LIBRARY and LEASEHOLD_INCLUDE_DIR.")
  endif()
  message(STATUS "leasehold: ${LEASEHOLD_LIBRARY} + ${LEASEHOLD_INCLUDE_DIR}/leasehold.h ${_lh_source}")
  # The shared library's SONAME is libleasehold.so.<LH_ABI_VERSION>: programs look for that
  # name at run time. An install has the symlink (scripts/install-lib.sh); give the repository
  # build one too.
  if(_lh_source STREQUAL "the repository build" AND LEASEHOLD_LIBRARY MATCHES "\\.so$")
    file(STRINGS "${LEASEHOLD_INCLUDE_DIR}/leasehold.h" _lh_abi REGEX "^#define LH_ABI_VERSION [0-9]+$")
    string(REGEX REPLACE "^#define LH_ABI_VERSION " "" _lh_abi "${_lh_abi}")
    get_filename_component(_lh_libdir "${LEASEHOLD_LIBRARY}" DIRECTORY)
    if(_lh_abi AND NOT EXISTS "${_lh_libdir}/libleasehold.so.${_lh_abi}")
      file(CREATE_LINK libleasehold.so "${_lh_libdir}/libleasehold.so.${_lh_abi}" SYMBOLIC)
    endif()
  endif()
  add_library(leasehold::leasehold_c UNKNOWN IMPORTED GLOBAL)
  set_target_properties(leasehold::leasehold_c PROPERTIES
    IMPORTED_LOCATION "${LEASEHOLD_LIBRARY}"
    INTERFACE_INCLUDE_DIRECTORIES "${LEASEHOLD_INCLUDE_DIR}")
  # A Rust staticlib needs the platform libraries std links against.
  set_property(TARGET leasehold::leasehold_c PROPERTY
    INTERFACE_LINK_LIBRARIES Threads::Threads ${CMAKE_DL_LIBS} m)
endif()

if(NOT TARGET leasehold::leasehold)
  add_library(leasehold::leasehold INTERFACE IMPORTED GLOBAL)
  set_target_properties(leasehold::leasehold PROPERTIES
    INTERFACE_INCLUDE_DIRECTORIES "${LEASEHOLD_CPP_INCLUDE_DIR}"
    INTERFACE_COMPILE_FEATURES cxx_std_20
    INTERFACE_LINK_LIBRARIES "leasehold::leasehold_c;Threads::Threads")
endif()

if(NOT TARGET leasehold::redis_stream)
  add_library(leasehold::redis_stream INTERFACE IMPORTED GLOBAL)
  set_property(TARGET leasehold::redis_stream PROPERTY INTERFACE_LINK_LIBRARIES leasehold::leasehold)
  find_package(OpenSSL QUIET COMPONENTS SSL)
  if(TARGET OpenSSL::SSL)
    get_target_property(_lh_global OpenSSL::SSL IMPORTED_GLOBAL)
    if(NOT _lh_global)  # seen by a parent project too (add_subdirectory)
      set_target_properties(OpenSSL::SSL OpenSSL::Crypto PROPERTIES IMPORTED_GLOBAL TRUE)
    endif()
    set_property(TARGET leasehold::redis_stream APPEND PROPERTY INTERFACE_LINK_LIBRARIES OpenSSL::SSL)
    set_property(TARGET leasehold::redis_stream PROPERTY INTERFACE_COMPILE_DEFINITIONS LEASEHOLD_OPENSSL=1)
  endif()
endif()

# pkg-config does not read CMAKE_DISABLE_FIND_PACKAGE_hiredis: checked here.
if(NOT TARGET leasehold::redis AND PkgConfig_FOUND AND NOT CMAKE_DISABLE_FIND_PACKAGE_hiredis)
  pkg_check_modules(HIREDIS QUIET IMPORTED_TARGET GLOBAL hiredis)
  if(HIREDIS_FOUND)
    add_library(leasehold::redis INTERFACE IMPORTED GLOBAL)
    set_property(TARGET leasehold::redis PROPERTY
      INTERFACE_LINK_LIBRARIES "leasehold::leasehold;PkgConfig::HIREDIS")
  endif()
endif()

# An optional executor target: leasehold::<target> = leasehold::leasehold + the library, found
# through pkg-config module <pc>, else CMake's find module <pkg> (imported target <imported>).
function(_leasehold_executor target pc pkg imported)
  if(TARGET leasehold::${target})
    return()
  endif()
  set(_dep "")
  if(CMAKE_DISABLE_FIND_PACKAGE_${pkg})
    return()
  endif()
  if(PkgConfig_FOUND)
    pkg_check_modules(LEASEHOLD_DEP_${target} QUIET IMPORTED_TARGET GLOBAL ${pc})
    if(LEASEHOLD_DEP_${target}_FOUND)
      set(_dep PkgConfig::LEASEHOLD_DEP_${target})
    endif()
  endif()
  if(NOT _dep)
    find_package(${pkg} QUIET)
    if(TARGET ${imported})
      set(_dep ${imported})
    endif()
  endif()
  if(_dep)
    add_library(leasehold::${target} INTERFACE IMPORTED GLOBAL)
    set_property(TARGET leasehold::${target} PROPERTY INTERFACE_LINK_LIBRARIES "leasehold::leasehold;${_dep}")
    # leasehold/open.hpp serves the backend's URLs where this is defined.
    string(TOUPPER ${target} _up)
    set_property(TARGET leasehold::${target} PROPERTY INTERFACE_COMPILE_DEFINITIONS LEASEHOLD_HAVE_${_up}=1)
  endif()
endfunction()
_leasehold_executor(sqlite sqlite3 SQLite3 SQLite::SQLite3)
_leasehold_executor(postgres libpq PostgreSQL PostgreSQL::PostgreSQL)
_leasehold_executor(etcd libcurl CURL CURL::libcurl)
