# Third-party dependencies, all from Debian packages (scripts/setup.sh installs them).
find_package(OpenMP REQUIRED COMPONENTS CXX)
find_package(Threads REQUIRED)
find_package(nlohmann_json 3 REQUIRED)
find_package(PkgConfig REQUIRED)
pkg_check_modules(PCRE2 REQUIRED IMPORTED_TARGET libpcre2-8)
# OpenBLAS (cblas_sgemm for the large matrix products on the CPU).
set(BLA_VENDOR OpenBLAS)
find_package(BLAS REQUIRED)
find_path(CBLAS_INCLUDE_DIR cblas.h PATHS /usr/include/x86_64-linux-gnu/openblas-pthread /usr/include/openblas
          /usr/include REQUIRED)
# Debian ships OpenBLAS built on pthreads (libopenblas0-pthread, the default alternative) and on OpenMP
# (libopenblas0-openmp, same soname). The OpenMP build runs its products on the OpenMP runtime's threads, the
# ones our own parallel loops use; the pthread build's threads spin-yield beside them. Measured on the 2-core
# development machine: the main job's CPU prefill (3.7K tokens, SmolLM2) took 17.7 / 18.0 s with the OpenMP
# build against 21.1 / 26.6 s with the pthread one, decode unchanged. So when the OpenMP build is installed,
# binaries find it first through their RUNPATH (LD_LIBRARY_PATH still takes precedence).
set(RETROINFER_OPENBLAS_OPENMP_DIR /usr/lib/${CMAKE_LIBRARY_ARCHITECTURE}/openblas-openmp)
if(CMAKE_LIBRARY_ARCHITECTURE AND EXISTS ${RETROINFER_OPENBLAS_OPENMP_DIR}/libopenblas.so.0)
  list(APPEND CMAKE_BUILD_RPATH ${RETROINFER_OPENBLAS_OPENMP_DIR})
  message(STATUS "OpenBLAS at run time: the OpenMP build in ${RETROINFER_OPENBLAS_OPENMP_DIR}")
endif()
find_package(CLI11 QUIET CONFIG)
find_path(CLI11_INCLUDE_DIR CLI/CLI.hpp REQUIRED)
# Boost.Beast and Boost.Asio (the HTTP server's transport), header-only from libboost-dev.
find_package(Boost 1.74 REQUIRED)
if(RETROINFER_TESTS)
  find_package(GTest REQUIRED)
endif()
