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

// One block's rank_by_stop over the given stops (NPIX of them), for a list of n_list entries.
static void rank_kernel(const int* stops, int* ranks, int64_t n_list) {
  __shared__ int s_stop[splat_fused::NPIX];
  const int tid = threadIdx.x;
  ranks[tid] = splat_fused::rank_by_stop(s_stop, stops[tid], n_list, tid);
}

torch::Tensor rank_by_stop(const torch::Tensor& stops, int64_t n_list) {
  TORCH_CHECK(stops.dtype() == torch::kInt32 && stops.is_contiguous() && stops.numel() == splat_fused::NPIX,
              "stops: NPIX contiguous int32");
  auto ranks = torch::empty_like(stops);
  st_emu_launch(1, splat_fused::NPIX, rank_kernel, stops.data_ptr<int>(), ranks.data_ptr<int>(), n_list);
  return ranks;
}

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  m.def("rank_by_stop", &rank_by_stop, "one block's ranks by decreasing stop (ties: lower thread first)");
  m.def("fused_raster_loss", &fused_raster_loss, "the fused kernel, emulated on the CPU");
  m.def("checkpoint_floats", &checkpoint_floats, "scratch floats of one launch");
}
