// Tensor maps for TMA copies (cuda/tma.cuh): cuTensorMapEncodeTiled, a driver
// API call, reached through the runtime (cudaGetDriverEntryPointByVersion) so
// that attograd does not link libcuda, which machines without a GPU lack; in
// the emulated build, the emulator's own description.

#include "cuda/check.h"
#include "cuda/tma.cuh"

namespace attograd::cuda::tma {
namespace {

constexpr std::int64_t kMaxStrideBytes = std::int64_t{1} << 40, kMaxExtent = std::int64_t{1} << 32;

#if !defined(ATTOGRAD_CUDA_EMULATION)
using EncodeTiled = CUresult (*)(CUtensorMap*, CUtensorMapDataType, cuuint32_t, void*, const cuuint64_t*,
                                 const cuuint64_t*, const cuuint32_t*, const cuuint32_t*, CUtensorMapInterleave,
                                 CUtensorMapSwizzle, CUtensorMapL2promotion, CUtensorMapFloatOOBfill);

EncodeTiled encode_tiled() {
  static EncodeTiled encode = [] {
    void* entry = nullptr;
    cudaDriverEntryPointQueryResult found{};
    CUDA_CHECK(cudaGetDriverEntryPointByVersion("cuTensorMapEncodeTiled", &entry, 12000, cudaEnableDefault, &found));
    AG_CHECK(found == cudaDriverEntryPointSuccess && entry, "matmul",
             "the CUDA driver has no cuTensorMapEncodeTiled (TMA needs a driver of CUDA 12 or newer)");
    return reinterpret_cast<EncodeTiled>(entry);
  }();
  return encode;
}
#endif

}  // namespace

bool tile_map_allowed(const Bf16Tensor& t) {
  constexpr std::int64_t kElement = 2;
  if (reinterpret_cast<std::uintptr_t>(t.base) % 16 != 0) return false;
  for (const std::int64_t e : t.extent)
    if (e < 1 || e >= kMaxExtent) return false;
  for (const std::int64_t s : t.stride)
    if (s < 1 || s * kElement % 16 != 0 || s * kElement >= kMaxStrideBytes) return false;
  return t.box[0] >= 8 && t.box[0] * kElement <= 128 && t.box[0] * kElement % 16 == 0 && t.box[1] >= 1 &&
         t.box[1] <= 256;
}

TensorMap tile_map(const Bf16Tensor& t) {
  AG_CHECK(tile_map_allowed(t), "matmul", "a TMA copy of boxes {} x {} from a tensor {} x {} x {} (strides {}, {}) at {}",
           t.box[0], t.box[1], t.extent[0], t.extent[1], t.extent[2], t.stride[0], t.stride[1], t.base);
#if defined(ATTOGRAD_CUDA_EMULATION)
  TensorMap map{};
  map.base = t.base;
  map.rank = 3;
  map.element_bytes = 2;
  for (int d = 0; d < 3; ++d) map.dims[d] = static_cast<std::uint64_t>(t.extent[d]);
  map.strides[0] = 2;
  map.strides[1] = static_cast<std::uint64_t>(t.stride[0]) * 2;
  map.strides[2] = static_cast<std::uint64_t>(t.stride[1]) * 2;
  map.box[0] = static_cast<std::uint32_t>(t.box[0]);
  map.box[1] = static_cast<std::uint32_t>(t.box[1]);
  map.box[2] = 1;
  map.swizzle_128 = true;
  return map;
#else
  TensorMap map{};
  const cuuint64_t dims[3] = {static_cast<cuuint64_t>(t.extent[0]), static_cast<cuuint64_t>(t.extent[1]),
                              static_cast<cuuint64_t>(t.extent[2])};
  const cuuint64_t strides[2] = {static_cast<cuuint64_t>(t.stride[0]) * 2, static_cast<cuuint64_t>(t.stride[1]) * 2};
  const cuuint32_t box[3] = {static_cast<cuuint32_t>(t.box[0]), static_cast<cuuint32_t>(t.box[1]), 1};
  const cuuint32_t element_strides[3] = {1, 1, 1};
  const CUresult status =
      encode_tiled()(&map, CU_TENSOR_MAP_DATA_TYPE_BFLOAT16, 3, const_cast<void*>(t.base), dims, strides, box,
                     element_strides, CU_TENSOR_MAP_INTERLEAVE_NONE, CU_TENSOR_MAP_SWIZZLE_128B,
                     CU_TENSOR_MAP_L2_PROMOTION_L2_256B, CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE);
  AG_CHECK(status == CUDA_SUCCESS, "matmul", "cuTensorMapEncodeTiled refused boxes {} x {} of a tensor {} x {} x {}: error {}",
           t.box[0], t.box[1], t.extent[0], t.extent[1], t.extent[2], static_cast<int>(status));
  return map;
#endif
}

}  // namespace attograd::cuda::tma
