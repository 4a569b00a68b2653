// The device code alone, without torch: what CI compiles for AMD (hipify + hipcc, .ci/run) and
// what `nvcc -Xptxas -v` reports registers and spills of.
#include "fused_raster.cuh"

cudaError_t splat_fused_launch(const splat_fused::Params& p, cudaStream_t stream) {
  return splat_fused::launch_fused_raster_loss(p, stream);
}
