# Install rules. Two layouts:
# - `cmake --install <build> --prefix P`: the static library, the public headers (P/include/retroinfer), the
#   CLI (P/bin/retroinfer), its chart script (P/share/retroinfer/plots.py) and a relocatable CMake package
#   (P/lib/cmake/retroinfer): find_package(retroinfer CONFIG) gives the imported target retroinfer::retroinfer
#   (examples/cmake-consumer).
# - a Python wheel (`pip install .`, scikit-build-core sets SKBUILD): the package retroinfer/ with the
#   extension module, its .py/.pyi files, and the CLI as retroinfer/bin/retroinfer, which the console script
#   `retroinfer` (retroinfer/_cli.py) runs.
include(GNUInstallDirs)
include(CMakePackageConfigHelpers)

# The installed binaries find the OpenMP build of OpenBLAS first, as the build tree's do (dependencies.cmake).
if(RETROINFER_OPENBLAS_OPENMP_DIR AND EXISTS ${RETROINFER_OPENBLAS_OPENMP_DIR}/libopenblas.so.0)
  list(APPEND CMAKE_INSTALL_RPATH ${RETROINFER_OPENBLAS_OPENMP_DIR})
  set_target_properties(retroinfer_cli PROPERTIES INSTALL_RPATH "${CMAKE_INSTALL_RPATH}")
  if(TARGET retroinfer_python)
    set_target_properties(retroinfer_python PROPERTIES INSTALL_RPATH "${CMAKE_INSTALL_RPATH}")
  endif()
endif()

if(SKBUILD)
  if(NOT TARGET retroinfer_python)
    message(FATAL_ERROR "pip install: the Python bindings are not configured (pybind11 or the Python headers "
                        "of ${Python3_EXECUTABLE} missing); run scripts/setup.sh")
  endif()
  install(TARGETS retroinfer_python LIBRARY DESTINATION retroinfer)
  install(TARGETS retroinfer_cli RUNTIME DESTINATION retroinfer/bin)
  file(GLOB _retroinfer_package_files CONFIGURE_DEPENDS ${PROJECT_SOURCE_DIR}/python/retroinfer/*.py
       ${PROJECT_SOURCE_DIR}/python/retroinfer/*.pyi ${PROJECT_SOURCE_DIR}/python/retroinfer/py.typed)
  install(FILES ${_retroinfer_package_files} DESTINATION retroinfer)
  return()
endif()

install(TARGETS retroinfer EXPORT retroinferTargets ARCHIVE DESTINATION ${CMAKE_INSTALL_LIBDIR}
        INCLUDES DESTINATION ${CMAKE_INSTALL_INCLUDEDIR})
install(DIRECTORY ${PROJECT_SOURCE_DIR}/include/retroinfer DESTINATION ${CMAKE_INSTALL_INCLUDEDIR})
install(TARGETS retroinfer_cli RUNTIME DESTINATION ${CMAKE_INSTALL_BINDIR})
install(FILES ${PROJECT_SOURCE_DIR}/python/retroinfer/plots.py DESTINATION ${CMAKE_INSTALL_DATADIR}/retroinfer)

set(RETROINFER_CMAKE_DIR ${CMAKE_INSTALL_LIBDIR}/cmake/retroinfer)
install(EXPORT retroinferTargets NAMESPACE retroinfer:: DESTINATION ${RETROINFER_CMAKE_DIR})
configure_package_config_file(${PROJECT_SOURCE_DIR}/cmake/retroinferConfig.cmake.in
                              ${PROJECT_BINARY_DIR}/retroinferConfig.cmake INSTALL_DESTINATION ${RETROINFER_CMAKE_DIR})
write_basic_package_version_file(${PROJECT_BINARY_DIR}/retroinferConfigVersion.cmake COMPATIBILITY SameMinorVersion)
install(FILES ${PROJECT_BINARY_DIR}/retroinferConfig.cmake ${PROJECT_BINARY_DIR}/retroinferConfigVersion.cmake
        DESTINATION ${RETROINFER_CMAKE_DIR})
