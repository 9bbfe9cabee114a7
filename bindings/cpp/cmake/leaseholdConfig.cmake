# find_package(leasehold CONFIG PATHS <repo>/bindings/cpp/cmake) → leasehold::leasehold
# (and leasehold::redis when hiredis is available). See LeaseholdTargets.cmake.
include("${CMAKE_CURRENT_LIST_DIR}/LeaseholdTargets.cmake")
set(leasehold_FOUND TRUE)
