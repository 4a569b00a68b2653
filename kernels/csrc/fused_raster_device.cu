// The device code's translation unit, without torch: linked into the extension with
// fused_raster_ext.cpp (kernels/native.py), compiled for AMD by CI (hipify + hipcc, .ci/run), and
// what `nvcc -Xptxas -v` reports registers and spills of.
#include "fused_raster.cuh"

cudaError_t splat_fused_launch(const splat_fused::Params& p, cudaStream_t stream) {
  return splat_fused::launch_fused_raster_loss(p, stream);
}
