// The fused rasterization kernel's parameters and tile geometry, for the device code
// (fused_raster.cuh) and the host bindings (fused_raster_ext.cpp, tests/csrc/emu_ext.cpp): plain
// C++, no CUDA and no torch include, so the binding compiles with the host compiler alone.
#pragma once
#include <stdint.h>

namespace splat_fused {

constexpr int TILE = 16;                     // tile side, pixels
constexpr int NPIX = TILE * TILE;            // threads per block, one per pixel
constexpr int WIN_HALF = 5;                  // the SSIM window is 11 taps
constexpr int CP_BUCKET_MIN = 32;            // smallest warp size: the host sizes the scratch by it

struct Params {
  // records, flattened over images (dense [I * N]) or packed [nnz]; flatten_ids index them
  const float* means2d;      // [R, 2]
  const float* conics;       // [R, 3]
  const float* colors;       // [R, 3]
  const float* opacities;    // [R]
  const float* backgrounds;  // [I, 3] or null
  const float* gts;          // [I, height - oy, width - ox, 3]
  const int32_t* offsets;    // [I * tiles_y * tiles_x] start of each tile's list
  const int32_t* flatten_ids;
  int64_t n_isects;
  int num_images, width, height, ox, oy, tiles_x, num_tiles;  // num_tiles per image
  float l1_scale, ssim_scale;  // dL/dpixel = l1_scale sign(x - y) - ssim_scale d SSIM_sum / dx
  float ssim_lambda;           // loss = (1 - ssim_lambda) L1 + ssim_lambda (1 - SSIM)
  float inv_count;             // 1 / (num_images * 3 * pixels with ground truth per image)
  float window[2 * WIN_HALF + 1];
  float* v_means2d;    // [R, 2], zeroed
  float* v_conics;     // [R, 3]
  float* v_colors;     // [R, 3]
  float* v_opacities;  // [R]
  float* v_backgrounds;  // [I, 3] or null
  float* absgrad;      // [R, 2] or null
  float* image;        // [I, height, width, 3] or null
  float* partial;      // [I * num_tiles, 2]: sum |x - y|, sum SSIM map, over the tile's pixels with ground truth
  float* terms;        // [3]: loss, L1, SSIM (written by the last block; phases >= 2)
  unsigned int* done_tiles;  // [1], zeroed by the caller: tiles whose partials are written
  float* checkpoints;  // (n_isects / 32 + I * num_tiles + 1) * 256 * 4 floats, scratch
  int phases;          // 3: all; for timing only, 1: forward only, 2: forward and loss (no gradients)
  // This launch's tiles: flat (image, tile) ids tile_begin ... tile_begin + tile_count - 1; their
  // checkpoints start at bucket bucket_base(start, tile) - cp_origin of ``checkpoints`` (launches in
  // chunks of tiles reuse one scratch buffer; one launch: 0, every tile, 0).
  int tile_begin, tile_count;
  int64_t cp_origin;
  // [tile_count]: block b renders tile tile_begin + tile_order[b], a permutation of 0 ..
  // tile_count - 1. The host puts the longest lists first, so that the blocks that run longest
  // start first and the launch does not end on a few long tiles.
  const int32_t* tile_order;
};

// Scratch floats one launch over every tile needs: (n_isects / 32 + number of tiles + 1) buckets of
// 256 pixels x 4 (a launch over tiles t0..t1 needs from bucket_base of t0 to that of t1 plus its
// buckets; kernels/fused_raster.py sizes chunks of tiles from the tile lists).
inline int64_t checkpoint_floats(int64_t n_isects, int64_t num_tiles_all) {
  return (n_isects / CP_BUCKET_MIN + num_tiles_all + 1) * (int64_t)NPIX * 4;
}

}  // namespace splat_fused
