// Python binding of the fused rasterization kernel for CUDA, and for ROCm through PyTorch's hipify.
// Built on first use by kernels/native.py (torch.utils.cpp_extension) together with
// fused_raster_device.cu: this file holds everything that includes torch and is compiled by the
// host compiler; the device code (fused_raster.cuh) is compiled by nvcc / hipcc without torch's
// headers, which keeps the first build short.
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>

#include "bind_common.h"
#include "fused_raster_params.h"

// fused_raster_device.cu
cudaError_t splat_fused_launch(const splat_fused::Params& p, cudaStream_t stream);

// Forward, tile-local loss and backward of every (image, tile); see fused_raster.cuh.
void fused_raster_loss(SPLAT_FUSED_ARGS) {
  TORCH_CHECK(means2d.is_cuda(), "fused_raster_loss: CUDA tensors expected");
  const c10::cuda::CUDAGuard guard(means2d.device());
  const splat_fused::Params p = splat_fused::make_params(SPLAT_FUSED_CALL);
  const cudaError_t err = splat_fused_launch(p, c10::cuda::getCurrentCUDAStream().stream());
  TORCH_CHECK(err == cudaSuccess, "fused_raster_loss launch failed: ", cudaGetErrorString(err));
}

int64_t checkpoint_floats(int64_t n_isects, int64_t num_tiles_all) {
  return splat_fused::checkpoint_floats(n_isects, num_tiles_all);
}

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  m.def("fused_raster_loss", &fused_raster_loss, "fused rasterization + tile-local loss + backward");
  m.def("checkpoint_floats", &checkpoint_floats, "scratch floats of one launch");
}
