# attograd_find_cuda_toolkit([REQUIRED|QUIET]): find_package(CUDAToolkit ...), also with Debian 12's
# CMake 3.25.1 and CUDA 13. CUDA 13 ships no libnvToolsExt (NVTX is header-only since CUDA 10).
# CMake 3.25.1's FindCUDAToolkit then sets a deprecation note on the CUDA::nvToolsExt target it
# did not create, and stops with "set_property could not find TARGET CUDA::nvToolsExt", in every
# project whose cmake_minimum_required is 3.25 or later: the note is only for those. So
# CMAKE_MINIMUM_REQUIRED_VERSION reads 3.24 for the one call. Policies are not affected:
# cmake_minimum_required set them, and the variable is only read. The build calls it REQUIRED;
# attogradConfig.cmake calls it QUIET and reports attograd not found when it fails.
macro(attograd_find_cuda_toolkit)
  set(_attograd_minimum_required ${CMAKE_MINIMUM_REQUIRED_VERSION})
  if(CMAKE_MINIMUM_REQUIRED_VERSION VERSION_GREATER_EQUAL 3.25)
    set(CMAKE_MINIMUM_REQUIRED_VERSION 3.24)
  endif()
  find_package(CUDAToolkit ${ARGN})
  set(CMAKE_MINIMUM_REQUIRED_VERSION ${_attograd_minimum_required})
  unset(_attograd_minimum_required)
endmacro()
