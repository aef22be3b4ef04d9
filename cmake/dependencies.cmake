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
find_package(CLI11 QUIET CONFIG)
find_path(CLI11_INCLUDE_DIR CLI/CLI.hpp REQUIRED)
find_path(HTTPLIB_INCLUDE_DIR httplib.h)
# cpp-httplib as Debian builds it: a shared library whose header needs its compile definitions (SSL, zlib).
pkg_check_modules(HTTPLIB REQUIRED IMPORTED_TARGET cpp-httplib)
if(RETROINFER_TESTS)
  find_package(GTest REQUIRED)
endif()
