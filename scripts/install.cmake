# scripts/install.cmake (included by the top CMakeLists.txt): what `cmake --install` puts under the
# prefix, and the .deb CPack makes of it (docs/install.md).
#
#   <prefix>/bin/dsv41                          the tool
#   <prefix>/share/dsv41/golden/{oracle,runs}   the built-in data: the tiny oracle model and the
#   <prefix>/share/dsv41/scenarios/...          official runs, the model configs, scale scenarios
#                                               (base/data_dir.h finds them relative to the binary
#                                               or the module, so the prefix can move)
#   <prefix>/lib/python3/dist-packages/dsv41    the Python module (DSV41_INSTALL_PYTHONDIR)
#   <prefix>/include/dsv41/{base,formats}       the cache formats' headers (host + device codecs)
#   <prefix>/lib/libdsv41_{base,formats}.a      and their host library, with a CMake package:
#   <prefix>/lib/cmake/dsv41                    find_package(dsv41) → dsv41::formats, dsv41::base

install(TARGETS dsv41 RUNTIME DESTINATION ${CMAKE_INSTALL_BINDIR})

install(DIRECTORY golden/oracle golden/runs DESTINATION ${DSV41_INSTALL_DATADIR}/golden)
install(FILES golden/README.md DESTINATION ${DSV41_INSTALL_DATADIR}/golden)
install(DIRECTORY scenarios/configs scenarios/scale scenarios/suite DESTINATION ${DSV41_INSTALL_DATADIR}/scenarios
        FILES_MATCHING PATTERN "*.json")

if(DSV41_PYTHON)
  install(TARGETS dsv41_python LIBRARY DESTINATION ${DSV41_INSTALL_PYTHONDIR}/dsv41)
  file(GLOB _dsv41_install_py ${PROJECT_SOURCE_DIR}/python/dsv41/*.py)
  install(FILES ${_dsv41_install_py} DESTINATION ${DSV41_INSTALL_PYTHONDIR}/dsv41)
endif()

# The formats package: headers under include/dsv41 (the includes read "formats/...", "base/...").
set_target_properties(dsv41_base PROPERTIES EXPORT_NAME base)
set_target_properties(dsv41_formats PROPERTIES EXPORT_NAME formats)
install(TARGETS dsv41_base dsv41_formats EXPORT dsv41Targets ARCHIVE DESTINATION ${CMAKE_INSTALL_LIBDIR})
install(DIRECTORY base/ DESTINATION ${CMAKE_INSTALL_INCLUDEDIR}/dsv41/base FILES_MATCHING PATTERN "*.h")
install(DIRECTORY formats/ DESTINATION ${CMAKE_INSTALL_INCLUDEDIR}/dsv41/formats FILES_MATCHING PATTERN "*.h")
install(EXPORT dsv41Targets NAMESPACE dsv41:: DESTINATION ${CMAKE_INSTALL_LIBDIR}/cmake/dsv41)
include(CMakePackageConfigHelpers)
file(WRITE ${PROJECT_BINARY_DIR}/dsv41Config.cmake
     "# find_package(dsv41): the cache formats (docs/install.md)\n"
     "include(\"\${CMAKE_CURRENT_LIST_DIR}/dsv41Targets.cmake\")\n")
write_basic_package_version_file(${PROJECT_BINARY_DIR}/dsv41ConfigVersion.cmake COMPATIBILITY SameMinorVersion)
install(FILES ${PROJECT_BINARY_DIR}/dsv41Config.cmake ${PROJECT_BINARY_DIR}/dsv41ConfigVersion.cmake
        DESTINATION ${CMAKE_INSTALL_LIBDIR}/cmake/dsv41)

# The .deb: `cpack -G DEB` in the build folder (scripts/package.sh). Shared-library dependencies
# come from dpkg-shlibdeps; the module needs the Python it was built for, and numpy.
set(CPACK_PACKAGE_NAME dsv41)
set(CPACK_PACKAGE_VENDOR "dsv41")
set(CPACK_PACKAGE_CONTACT "dsv41 developers <dsv41@localhost>")
set(CPACK_PACKAGE_DESCRIPTION_SUMMARY
    "numerical reference and conformance verifier for DeepSeek-V4.1-Flash ports")
set(CPACK_GENERATOR DEB)
set(CPACK_PACKAGING_INSTALL_PREFIX /usr)
set(CPACK_DEBIAN_FILE_NAME DEB-DEFAULT)
set(CPACK_DEBIAN_PACKAGE_SECTION science)
set(CPACK_DEBIAN_PACKAGE_SHLIBDEPS ON)
if(DSV41_PYTHON)
  math(EXPR _dsv41_py_next "${Python3_VERSION_MINOR} + 1")
  set(CPACK_DEBIAN_PACKAGE_DEPENDS "python3 (>= ${Python3_VERSION_MAJOR}.${Python3_VERSION_MINOR}), \
python3 (<< ${Python3_VERSION_MAJOR}.${_dsv41_py_next}), python3-numpy")
endif()
include(CPack)
