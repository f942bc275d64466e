# NCCL as an imported target, attograd::nccl, and NCCL_FOUND. NCCL has no CMake
# package of its own. It is looked for under NCCL_ROOT (a CMake or environment
# variable: a prefix with include/nccl.h and lib/libnccl.so*, such as the CUDA
# Toolkit's, or PyPI's nvidia-nccl-cu13 wheel, whose folder
#   python3 -c 'import nvidia.nccl; print(list(nvidia.nccl.__path__)[0])'
# prints), then beside the CUDA Toolkit and in the system's paths. The wheel ships
# only libnccl.so.2, with no libnccl.so link, hence both names. Expects
# find_package(CUDAToolkit) to have run. attogradConfig.cmake includes this file
# too, with the build's NCCL_ROOT as a hint.
if(NOT TARGET attograd::nccl)
  set(_attograd_nccl_hints ${NCCL_ROOT} $ENV{NCCL_ROOT} ${CUDAToolkit_LIBRARY_ROOT})
  find_path(NCCL_INCLUDE_DIR nccl.h HINTS ${_attograd_nccl_hints} ${CUDAToolkit_INCLUDE_DIRS} PATH_SUFFIXES include)
  find_library(NCCL_LIBRARY NAMES nccl libnccl.so.2 NAMES_PER_DIR HINTS ${_attograd_nccl_hints} ${CUDAToolkit_LIBRARY_DIR}
               PATH_SUFFIXES lib lib64)
  if(NCCL_INCLUDE_DIR AND NCCL_LIBRARY)
    set(NCCL_FOUND ON)
    add_library(attograd::nccl INTERFACE IMPORTED)
    set_target_properties(attograd::nccl PROPERTIES
      INTERFACE_LINK_LIBRARIES "${NCCL_LIBRARY}"
      INTERFACE_INCLUDE_DIRECTORIES "${NCCL_INCLUDE_DIR}")
  else()
    set(NCCL_FOUND OFF)
  endif()
endif()
