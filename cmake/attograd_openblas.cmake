# OpenBLAS as an imported target, attograd::openblas. Debian's OpenBLASConfig.cmake
# gives only variables (OpenBLAS_LIBRARIES, OpenBLAS_INCLUDE_DIRS) holding absolute
# paths; linking through a target keeps those paths out of the exported package, whose
# config (attogradConfig.cmake) finds OpenBLAS again and includes this file too.
# Expects find_package(OpenBLAS CONFIG) to have succeeded.
if(NOT TARGET attograd::openblas)
  add_library(attograd::openblas INTERFACE IMPORTED)
  set_target_properties(attograd::openblas PROPERTIES
    INTERFACE_LINK_LIBRARIES "${OpenBLAS_LIBRARIES}"
    INTERFACE_INCLUDE_DIRECTORIES "${OpenBLAS_INCLUDE_DIRS}")
endif()
