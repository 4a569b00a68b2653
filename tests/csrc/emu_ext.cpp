// The fused rasterization kernel (kernels/csrc/fused_raster.cuh) run on the CPU under the
// emulation of cpu_emu.h: the CPU tests compare it with the PyTorch reference, at warp sizes 32
// and 64. Tests only (slow: one host thread per GPU thread).
#include "cpu_emu.h"

#include "fused_raster.cuh"
#include "bind_common.h"

void fused_raster_loss(int64_t warp_size, SPLAT_FUSED_ARGS) {
  TORCH_CHECK(warp_size >= 1 && splat_fused::NPIX % warp_size == 0 && warp_size >= splat_fused::CP_BUCKET_MIN,
              "warp size must divide 256 and be >= 32");
  warpSize = (int)warp_size;
  const splat_fused::Params p = splat_fused::make_params(SPLAT_FUSED_CALL);
  if (p.absgrad != nullptr)
    st_emu_launch(p.tile_count, splat_fused::NPIX, splat_fused::fused_raster_loss_kernel<true>, p);
  else
    st_emu_launch(p.tile_count, splat_fused::NPIX, splat_fused::fused_raster_loss_kernel<false>, p);
}

int64_t checkpoint_floats(int64_t n_isects, int64_t num_tiles_all) {
  return splat_fused::checkpoint_floats(n_isects, num_tiles_all);
}

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  m.def("fused_raster_loss", &fused_raster_loss, "the fused kernel, emulated on the CPU");
  m.def("checkpoint_floats", &checkpoint_floats, "scratch floats of one launch");
}
