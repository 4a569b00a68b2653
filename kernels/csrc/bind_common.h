// Tensor -> splat_fused::Params for the extension bindings (CUDA / HIP: fused_raster_ext.cpp;
// the CPU emulation of the tests: tests/csrc/emu_ext.cpp). The Python caller
// (kernels/fused_raster.py) allocates every output and checks shapes; here only dtypes,
// contiguity and devices are asserted.
#pragma once
#include <torch/extension.h>

#include <vector>

#include "fused_raster_params.h"

namespace splat_fused {

inline float* opt_ptr(const torch::Tensor& t) { return t.numel() ? t.data_ptr<float>() : nullptr; }

inline void check_f32(const torch::Tensor& t, const char* name, const torch::Device& dev) {
  TORCH_CHECK(t.numel() == 0 || (t.scalar_type() == torch::kFloat32 && t.is_contiguous() && t.device() == dev),
              name, " must be a contiguous float32 tensor on ", dev);
}

// Arguments in the order of the Python call; empty tensors stand for "none".
inline Params make_params(const torch::Tensor& means2d, const torch::Tensor& conics, const torch::Tensor& colors,
                          const torch::Tensor& opacities, const torch::Tensor& backgrounds, const torch::Tensor& gts,
                          const torch::Tensor& offsets, const torch::Tensor& flatten_ids, int64_t num_images,
                          int64_t width, int64_t height, int64_t ox, int64_t oy, double l1_scale, double ssim_scale,
                          double ssim_lambda, double inv_count, const std::vector<double>& window, const torch::Tensor& v_means2d,
                          const torch::Tensor& v_conics, const torch::Tensor& v_colors,
                          const torch::Tensor& v_opacities, const torch::Tensor& v_backgrounds,
                          const torch::Tensor& absgrad, const torch::Tensor& image, const torch::Tensor& partial,
                          const torch::Tensor& terms, const torch::Tensor& done_tiles, const torch::Tensor& checkpoints, int64_t phases, int64_t tile_begin,
                          int64_t tile_count, int64_t cp_origin, int64_t cp_buckets,
                          const torch::Tensor& tile_order) {
  const auto dev = means2d.device();
  const std::pair<const torch::Tensor*, const char*> fs[] = {
      {&means2d, "means2d"}, {&conics, "conics"}, {&colors, "colors"}, {&opacities, "opacities"},
      {&backgrounds, "backgrounds"}, {&gts, "gts"}, {&v_means2d, "v_means2d"}, {&v_conics, "v_conics"},
      {&v_colors, "v_colors"}, {&v_opacities, "v_opacities"}, {&v_backgrounds, "v_backgrounds"},
      {&absgrad, "absgrad"}, {&image, "image"}, {&partial, "partial"}, {&terms, "terms"},
      {&checkpoints, "checkpoints"}};
  for (const auto& f : fs) check_f32(*f.first, f.second, dev);
  TORCH_CHECK(offsets.scalar_type() == torch::kInt32 && offsets.is_contiguous() && offsets.device() == dev,
              "offsets must be contiguous int32 on ", dev);
  TORCH_CHECK(flatten_ids.scalar_type() == torch::kInt32 && flatten_ids.is_contiguous() &&
                  flatten_ids.device() == dev, "flatten_ids must be contiguous int32 on ", dev);
  TORCH_CHECK(window.size() == 2 * WIN_HALF + 1, "window must have 11 taps");
  // the tile rows come from the offsets: as many as the image needs, or more (rows below the image,
  // without pixels: trainer/step/graphed.py's padded lists)
  const int64_t tiles_x = (width + TILE - 1) / TILE, tiles_y_image = (height + TILE - 1) / TILE;
  const int64_t tiles_y = num_images > 0 ? offsets.numel() / (num_images * tiles_x) : tiles_y_image;
  TORCH_CHECK(offsets.numel() == num_images * tiles_x * tiles_y && tiles_y >= tiles_y_image,
              "offsets do not match the image size");
  TORCH_CHECK(tile_begin >= 0 && tile_count >= 0 && tile_begin + tile_count <= offsets.numel(),
              "tiles ", tile_begin, "+", tile_count, " out of range");
  TORCH_CHECK(cp_buckets >= 0 && checkpoints.numel() >= cp_buckets * NPIX * 4,
              "checkpoint scratch smaller than the buckets the caller computed");
  TORCH_CHECK(partial.numel() == 2 * offsets.numel(), "partial must hold 2 floats per tile");
  TORCH_CHECK(terms.numel() == 3, "terms must hold 3 floats");
  TORCH_CHECK(done_tiles.numel() == 1 && done_tiles.scalar_type() == torch::kInt32 && done_tiles.device() == dev,
              "done_tiles must be one int32 on ", dev);
  Params p{};
  p.means2d = means2d.data_ptr<float>();
  p.conics = conics.data_ptr<float>();
  p.colors = colors.data_ptr<float>();
  p.opacities = opacities.data_ptr<float>();
  p.backgrounds = opt_ptr(backgrounds);
  p.gts = gts.data_ptr<float>();
  p.offsets = offsets.data_ptr<int32_t>();
  p.flatten_ids = flatten_ids.data_ptr<int32_t>();
  p.n_isects = flatten_ids.numel();
  p.num_images = (int)num_images;
  p.width = (int)width;
  p.height = (int)height;
  p.ox = (int)ox;
  p.oy = (int)oy;
  p.tiles_x = (int)tiles_x;
  p.num_tiles = (int)(tiles_x * tiles_y);
  p.l1_scale = (float)l1_scale;
  p.ssim_scale = (float)ssim_scale;
  p.ssim_lambda = (float)ssim_lambda;
  p.inv_count = (float)inv_count;
  for (int i = 0; i < 2 * WIN_HALF + 1; ++i) p.window[i] = (float)window[i];
  p.v_means2d = v_means2d.data_ptr<float>();
  p.v_conics = v_conics.data_ptr<float>();
  p.v_colors = v_colors.data_ptr<float>();
  p.v_opacities = v_opacities.data_ptr<float>();
  p.v_backgrounds = opt_ptr(v_backgrounds);
  p.absgrad = opt_ptr(absgrad);
  p.image = opt_ptr(image);
  p.partial = partial.data_ptr<float>();
  p.terms = terms.data_ptr<float>();
  p.done_tiles = reinterpret_cast<unsigned int*>(done_tiles.data_ptr<int32_t>());
  p.checkpoints = checkpoints.data_ptr<float>();
  TORCH_CHECK(phases >= 1 && phases <= 3, "phases must be 1, 2 or 3");
  p.phases = (int)phases;
  p.tile_begin = (int)tile_begin;
  p.tile_count = (int)tile_count;
  p.cp_origin = cp_origin;
  TORCH_CHECK(tile_order.scalar_type() == torch::kInt32 && tile_order.is_contiguous() && tile_order.device() == dev &&
                  tile_order.numel() == tile_count,
              "tile_order must hold tile_count contiguous int32 on ", dev);
  p.tile_order = tile_order.data_ptr<int32_t>();
  return p;
}

}  // namespace splat_fused

#define SPLAT_FUSED_ARGS                                                                                          \
  const torch::Tensor &means2d, const torch::Tensor &conics, const torch::Tensor &colors,                          \
      const torch::Tensor &opacities, const torch::Tensor &backgrounds, const torch::Tensor &gts,                  \
      const torch::Tensor &offsets, const torch::Tensor &flatten_ids, int64_t num_images, int64_t width,           \
      int64_t height, int64_t ox, int64_t oy, double l1_scale, double ssim_scale, double ssim_lambda,              \
      double inv_count, std::vector<double> window,                                                                \
      const torch::Tensor &v_means2d, const torch::Tensor &v_conics, const torch::Tensor &v_colors,                \
      const torch::Tensor &v_opacities, const torch::Tensor &v_backgrounds, const torch::Tensor &absgrad,          \
      const torch::Tensor &image, const torch::Tensor &partial, const torch::Tensor &terms,                        \
      const torch::Tensor &done_tiles, const torch::Tensor &checkpoints, int64_t phases,                           \
      int64_t tile_begin, int64_t tile_count, int64_t cp_origin, int64_t cp_buckets,                              \
      const torch::Tensor &tile_order
#define SPLAT_FUSED_CALL                                                                                          \
  means2d, conics, colors, opacities, backgrounds, gts, offsets, flatten_ids, num_images, width, height, ox, oy,   \
      l1_scale, ssim_scale, ssim_lambda, inv_count, window, v_means2d, v_conics, v_colors, v_opacities,            \
      v_backgrounds, absgrad, image, partial, terms, done_tiles, checkpoints, phases, tile_begin, tile_count,      \
      cp_origin, cp_buckets, tile_order
