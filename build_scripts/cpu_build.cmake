# Included into PyTorch's top-level project by build_scripts/build_wheel for a
# CPU wheel (CMAKE_PROJECT_Torch_INCLUDE). ATen compiles each CPU kernel file
# once per instruction set it can dispatch to (cmake/Codegen.cmake); the
# AVX512 copies are a third of those units. Marking AVX512 as absent keeps the
# DEFAULT and AVX2 kernels, and at run time ATen dispatches to AVX2 at most.
# FindAVX.cmake sets these cache entries only where they are not set yet.
set(C_AVX512_FOUND OFF CACHE BOOL "AVX512 kernels left out of this build")
set(CXX_AVX512_FOUND OFF CACHE BOOL "AVX512 kernels left out of this build")
