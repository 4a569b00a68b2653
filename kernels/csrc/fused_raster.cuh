// Fused rasterization + tile-local L1 / D-SSIM loss + backward rasterization, one block per
// (image, 16x16 tile). Device code and a plain C++ launcher; no torch include, so the same file
// is compiled by nvcc, by hipcc after torch.utils.hipify, and by a C++ compiler under the CPU
// emulation of tests/csrc (ST_CPU_EMU). The definitions (loss, compositing rules) are those of
// kernels/fused_raster.py's module docstring; kernels/fused_raster.py's REFERENCE functions are
// the test oracle.
//
// One block of 256 threads per tile, one thread per pixel, in three phases:
//  1. Forward (as gsplat's forward): the tile's depth-sorted records are staged through shared
//     memory 256 at a time; each thread composites its pixel front to back (T a running product)
//     and stops before the first Gaussian that takes T to <= 1e-4. Every ``warpSize`` list
//     positions (a *bucket*) each thread writes a checkpoint to global scratch: T and the colour
//     accumulated at the end of the bucket (4 floats). The tile's loop ends once every pixel has
//     stopped.
//  2. Loss (on chip): the tile-local SSIM with the window renormalized to the tile's pixels with
//     ground truth, as separable 11-tap passes over shared memory, the L1 term, the tile's two
//     partial sums (to ``partial``) and dL/dpixel (to shared memory only). Each pixel keeps
//     K = C_final . dL/dpixel + T_final background . dL/dpixel, so that what lies behind a bucket's
//     end, dotted with dL/dpixel, is K - C_bucket_end . dL/dpixel (Taming-3DGS's form; no pass over
//     the checkpoints).
//  3. Backward (per bucket, Taming-3DGS's scheme): each warp takes buckets of the tile in turn;
//     lane l owns the bucket's Gaussian warpSize - 1 - l in registers. The pixels still
//     compositing at the bucket's start flow through the lanes: at step s lane l handles pixel
//     s - l (in the order of decreasing stop), receiving (T after this Gaussian, what lies behind it)
//     from lane l - 1 (lane 0 from the checkpoint), recovering T before it by one division
//     (re-anchored every bucket) and adding its gradient terms in registers. One set of atomics
//     per Gaussian per bucket. A tile of n Gaussians is ceil(n / warpSize) independent warp tasks,
//     shared by the block's warps; no per-Gaussian block reduction.
// Nothing is written per pixel but the checkpoints (and the image when asked): dL/dpixel stays
// in shared memory.
#pragma once

#if !defined(ST_CPU_EMU)
#include <cuda_runtime.h>
#endif
#include <stdint.h>

#include "fused_raster_params.h"
#include "portability.h"

namespace splat_fused {

constexpr float MAX_ALPHA = 0.999f;
// log2(1 / 255): a pair composites when log2(opacity) - sigma log2(e) >= this, i.e. alpha >= 1/255
constexpr float LOG2_ALPHA_MIN = -7.99435343685886f;
constexpr float LOG2E = 1.44269504088896341f;
constexpr float T_MIN = 1e-4f;
constexpr float SSIM_C1 = 0.01f * 0.01f;
constexpr float SSIM_C2 = 0.03f * 0.03f;

// Scratch position of a tile's first bucket, in buckets: floor(start / 32) + tile. A tile needs at
// most ceil(n / 32) buckets, so consecutive tiles never overlap, for any warpSize >= 32.
ST_DEVICE int64_t bucket_base(int64_t start, int tile) { return start / CP_BUCKET_MIN + tile; }

// sigma log2(e), sigma = 0.5 (a dx^2 + c dy^2) + b dx dy, from the scaled conic ha = a log2(e) / 2,
// sb = b log2(e), hc = c log2(e) / 2 (scaled_conic) and the products dxx = dx^2, dxy = dx dy,
// dyy = dy^2, with every rounding explicit, so that the forward and the backward (different code,
// different compiler contraction choices otherwise) compute the same bits and take the same skip
// decisions. A pair's alpha is then min(0.999, 2^p) with p = log2(opacity) - this: the opacity
// and the base change folded into one subtraction and the exponential (Faster-GS and LiteGS
// composite in base 2 too).
ST_DEVICE float gauss_sigma2(float ha, float sb, float hc, float dxx, float dxy, float dyy) {
  return fmaf(sb, dxy, fmaf(ha, dxx, hc * dyy));
}

// The scaled conic of record g (see gauss_sigma2) and log2 of its opacity.
ST_DEVICE float4 scaled_conic(const Params& P, int64_t g) {
  return make_float4(0.5f * LOG2E * P.conics[3 * g], LOG2E * P.conics[3 * g + 1], 0.5f * LOG2E * P.conics[3 * g + 2],
                     log2f(P.opacities[g]));
}

// Whether a pair composites (gsplat's rule: sigma >= 0 and alpha >= 1/255), from s2 = sigma log2(e)
// and p = log2(opacity) - s2; the forward and the backward decide with this one test.
ST_DEVICE bool composites(float s2, float p) { return s2 >= 0.f && p >= LOG2_ALPHA_MIN; }

// This pixel's place in the order of decreasing stop, ties broken by thread index (the lower first),
// for every thread of the block (calls __syncthreads; s_stop is scratch here). n_list (the tile's
// list length, an upper bound of every stop) is the same in every thread. Below 2^(31 - PIX_BITS)
// the stop and NPIX - 1 - tid pack into one distinct key below 2^31, and the rank is the count of
// larger keys: the sign bits of key - key_q (a subtraction and a shift-add per pixel); longer
// lists compare the pairs.
constexpr int PIX_BITS = 8;
static_assert(NPIX <= (1 << PIX_BITS), "the packed sort key holds a thread index in PIX_BITS bits");
ST_DEVICE int rank_by_stop(int* s_stop, int my_stop, int64_t n_list, int tid) {
  int rank = 0;
  if (n_list < ((int64_t)1 << (31 - PIX_BITS))) {
    unsigned* s_key = reinterpret_cast<unsigned*>(s_stop);
    const unsigned key = ((unsigned)my_stop << PIX_BITS) | (unsigned)(NPIX - 1 - tid);
    s_key[tid] = key;
    __syncthreads();
#pragma unroll 16
    for (int q = 0; q < NPIX; ++q) rank += (int)((key - s_key[q]) >> 31);  // 1 where key_q > key
  } else {
    s_stop[tid] = my_stop;
    __syncthreads();
    for (int q = 0; q < NPIX; ++q) {
      const int kq = s_stop[q];
      rank += (kq > my_stop || (kq == my_stop && q < tid)) ? 1 : 0;
    }
  }
  __syncthreads();
  return rank;
}

// Number of sorted pixels whose stop exceeds ``v`` (s_stop is non-increasing, NPIX entries): a
// branch-free binary search, the same 9 steps in every lane.
ST_DEVICE int count_above(const int* s_stop, int v) {
  int lo = 0;
#pragma unroll
  for (int step = NPIX / 2; step > 0; step >>= 1) lo += s_stop[lo + step - 1] > v ? step : 0;
  return lo + (s_stop[lo] > v ? 1 : 0);
}

// Block-wide sum (op 0) or max (op 1) over the 256 threads; every thread gets the result.
ST_DEVICE float block_reduce(float v, float* s_red, int tid, bool max_op) {
  __syncthreads();
  s_red[tid] = v;
  __syncthreads();
  for (int stride = NPIX / 2; stride > 0; stride >>= 1) {
    if (tid < stride) {
      const float o = s_red[tid + stride];
      s_red[tid] = max_op ? fmaxf(s_red[tid], o) : s_red[tid] + o;
    }
    __syncthreads();
  }
  const float out = s_red[0];
  __syncthreads();
  return out;
}

// Called by every block once its tile's partial sums are written: the last block of all
// (num_images * num_tiles, over every launch of the call; P.done_tiles counts them, zeroed by the
// caller) sums every tile's partials, in tile order (so the loss does not depend on which block
// came last), and writes P.terms = (loss, L1, SSIM): L1 and SSIM the means over the pixels with
// ground truth and the channels, loss = (1 - lambda) L1 + lambda (1 - SSIM). The threadfence
// reduction of the CUDA samples.
ST_DEVICE void reduce_terms_if_last(const Params& P, float* s_red, int tid) {
  __shared__ int s_last;
  const int total = P.num_images * P.num_tiles;
  if (tid == 0) {
    __threadfence();  // this tile's partials are visible to every block before the count says so
    s_last = atomicAdd(P.done_tiles, 1u) + 1u == (unsigned)total ? 1 : 0;
  }
  __syncthreads();
  if (!s_last) return;  // uniform over the block
  __threadfence();
  const volatile float* part = P.partial;  // written by other blocks: not through this SM's L1
  float l1 = 0.f, ssim = 0.f;
  for (int t = tid; t < total; t += NPIX) {
    l1 += part[2 * (int64_t)t];
    ssim += part[2 * (int64_t)t + 1];
  }
  l1 = block_reduce(l1, s_red, tid, false) * P.inv_count;
  ssim = block_reduce(ssim, s_red, tid, false) * P.inv_count;
  if (tid == 0) {
    P.terms[0] = (1.f - P.ssim_lambda) * l1 + P.ssim_lambda * (1.f - ssim);
    P.terms[1] = l1;
    P.terms[2] = ssim;
  }
}

// Horizontal then vertical 11-tap pass of ``count`` maps (m_in -> m_out via m_tmp), window w,
// zero outside the tile. Thread (r, c) returns its outputs in out[]. Callers synchronize before.
template <int COUNT>
ST_DEVICE void blur_maps(const float* m_in, float* m_tmp, const float* w, int r, int c, int tid, float* out) {
#pragma unroll
  for (int k = 0; k < COUNT; ++k) {
    float h = 0.f;
    for (int d = -WIN_HALF; d <= WIN_HALF; ++d) {
      const int cc = c + d;
      if (cc >= 0 && cc < TILE) h += w[d + WIN_HALF] * m_in[k * NPIX + r * TILE + cc];
    }
    m_tmp[k * NPIX + tid] = h;
  }
  __syncthreads();
#pragma unroll
  for (int k = 0; k < COUNT; ++k) {
    float v = 0.f;
    for (int d = -WIN_HALF; d <= WIN_HALF; ++d) {
      const int rr = r + d;
      if (rr >= 0 && rr < TILE) v += w[d + WIN_HALF] * m_tmp[k * NPIX + rr * TILE + c];
    }
    out[k] = v;
  }
}

// ABSGRAD: also accumulate the absolute 2D-mean gradients (P.absgrad is not null).
template <bool ABSGRAD>
ST_GLOBAL void ST_LAUNCH_BOUNDS(NPIX, 4) fused_raster_loss_kernel(const Params P) {
  constexpr int MAX_WARPS = NPIX / CP_BUCKET_MIN;
  // the staged records (forward: mean x, y, log2 opacity | scaled conic | colour), then SSIM maps
  __shared__ float4 s_rec[3 * NPIX];
  __shared__ float4 s_g[NPIX];        // pixels sorted by stop (below): dL/dpixel (3) and K
  __shared__ float2 s_pxy[NPIX];      // pixel centre x, y, sorted
  __shared__ int s_stop[NPIX];        // list position (from start) each pixel stopped before (0: no gradient), sorted
  __shared__ int s_perm[NPIX];        // pixels by decreasing stop
  __shared__ float2 s_anchor[NPIX * MAX_WARPS];  // per warp: its bucket's active pixels' (T, behind), sorted
  __shared__ float s_red[NPIX];

  const int tile = P.tile_begin + P.tile_order[blockIdx.x];
  const int img = tile / P.num_tiles;
  const int tile_in_img = tile % P.num_tiles;
  const int tx = tile_in_img % P.tiles_x, ty = tile_in_img / P.tiles_x;
  const int x0 = tx * TILE, y0 = ty * TILE;
  const int tid = threadIdx.x;
  const int r = tid / TILE, c = tid % TILE;
  const int x = x0 + c, y = y0 + r;
  const bool in_img = x < P.width && y < P.height;
  const bool has_gt = in_img && x >= P.ox && y >= P.oy;
  const float px = (float)x + 0.5f, py = (float)y + 0.5f;
  const int num_all = P.num_images * P.num_tiles;
  const int64_t start = P.offsets[tile];
  const int64_t end = tile + 1 < num_all ? (int64_t)P.offsets[tile + 1] : P.n_isects;
  const int B = warpSize;  // bucket length = lanes per warp
  float* cp = P.checkpoints + (bucket_base(start, tile) - P.cp_origin) * (NPIX * 4);

  // ---------------------------------------------------------------- 1. forward
  float4* s_geo = s_rec;
  float4* s_con = s_rec + NPIX;
  float4* s_col = s_rec + 2 * NPIX;
  float T = 1.f, col_r = 0.f, col_g = 0.f, col_b = 0.f;
  int64_t stop = in_img ? end : start;
  bool done = !in_img;
  int bucket = 0;
  for (int64_t b0 = start; b0 < end; b0 += NPIX) {
    const int n = (int)((end - b0) < NPIX ? (end - b0) : NPIX);
    __syncthreads();  // the previous batch is consumed
    if (tid < n) {
      const int64_t g = P.flatten_ids[b0 + tid];
      const float4 sc = scaled_conic(P, g);
      s_geo[tid] = make_float4(P.means2d[2 * g], P.means2d[2 * g + 1], sc.w, 0.f);
      s_con[tid] = make_float4(sc.x, sc.y, sc.z, 0.f);
      s_col[tid] = make_float4(P.colors[3 * g], P.colors[3 * g + 1], P.colors[3 * g + 2], 0.f);
    }
    __syncthreads();
    for (int j0 = 0; j0 < n; j0 += B) {
      const int j1 = j0 + B < n ? j0 + B : n;
      const bool active = !done;  // the backward reads this bucket's checkpoint only for such pixels
      if (active) {
        // one pair: false once the pixel stops before record j
        auto composite = [&](int j) -> bool {
          const float4 geo = s_geo[j];
          const float dx = geo.x - px, dy = geo.y - py;
          const float4 con = s_con[j];
          const float s2 = gauss_sigma2(con.x, con.y, con.z, dx * dx, dx * dy, dy * dy);
          const float p = geo.z - s2;
          if (!composites(s2, p)) return true;
          const float alpha = fminf(MAX_ALPHA, exp2f(p));
          const float next_T = T * (1.f - alpha);
          if (next_T <= T_MIN) {
            done = true;
            stop = b0 + j;
            return false;
          }
          const float w = alpha * T;
          const float4 cl = s_col[j];
          col_r += w * cl.x;
          col_g += w * cl.y;
          col_b += w * cl.z;
          T = next_T;
          return true;
        };
        int j = j0;  // four pairs per iteration (the loop's exit on a stop keeps the compiler from unrolling)
        for (; j + 4 <= j1; j += 4)
          if (!(composite(j) && composite(j + 1) && composite(j + 2) && composite(j + 3))) goto bucket_end;
        for (; j < j1; ++j)
          if (!composite(j)) break;
      bucket_end:
        if (has_gt)  // T and the colour accumulated at the bucket's end
          reinterpret_cast<float4*>(cp)[(int64_t)bucket * NPIX + tid] = make_float4(T, col_r, col_g, col_b);
      }
      ++bucket;
    }
    if (__syncthreads_count(done ? 0 : 1) == 0) break;
  }

  float bg_r = 0.f, bg_g = 0.f, bg_b = 0.f;
  if (P.backgrounds != nullptr) {
    bg_r = P.backgrounds[3 * img];
    bg_g = P.backgrounds[3 * img + 1];
    bg_b = P.backgrounds[3 * img + 2];
  }
  float xv[3] = {col_r + T * bg_r, col_g + T * bg_g, col_b + T * bg_b};
  if (P.image != nullptr && in_img) {
    float* o = P.image + (((int64_t)img * P.height + y) * P.width + x) * 3;
    o[0] = xv[0];
    o[1] = xv[1];
    o[2] = xv[2];
  }

  if (P.phases < 2) return;  // timing variant (uniform over the block)

  // ---------------------------------------------------------------- 2. tile-local loss
  float yv[3] = {0.f, 0.f, 0.f};
  if (has_gt) {
    const int gw = P.width - P.ox, gh = P.height - P.oy;
    const float* q = P.gts + (((int64_t)img * gh + (y - P.oy)) * gw + (x - P.ox)) * 3;
    yv[0] = q[0];
    yv[1] = q[1];
    yv[2] = q[2];
  } else {
    xv[0] = xv[1] = xv[2] = 0.f;
  }
  // The renormalized window's in-tile weight of this pixel: the 1D sums over the tile's columns
  // and rows with ground truth (a rectangle, so the 2D weight is their product).
  float nx = 0.f, ny = 0.f;
  for (int d = -WIN_HALF; d <= WIN_HALF; ++d) {
    const int cc = c + d, rr = r + d;
    const int gx = x0 + cc, gy = y0 + rr;
    if (cc >= 0 && cc < TILE && gx >= P.ox && gx < P.width) nx += P.window[d + WIN_HALF];
    if (rr >= 0 && rr < TILE && gy >= P.oy && gy < P.height) ny += P.window[d + WIN_HALF];
  }
  const float inv_n = has_gt ? 1.f / (nx * ny) : 0.f;
  float* m_in = reinterpret_cast<float*>(s_rec);
  float* m_tmp = m_in + 5 * NPIX;
  float ssim_sum = 0.f, abs_sum = 0.f, g[3];
#pragma unroll
  for (int ch = 0; ch < 3; ++ch) {
    const float xa = xv[ch], ya = yv[ch];
    __syncthreads();
    m_in[tid] = xa;
    m_in[NPIX + tid] = ya;
    m_in[2 * NPIX + tid] = xa * xa;
    m_in[3 * NPIX + tid] = ya * ya;
    m_in[4 * NPIX + tid] = xa * ya;
    __syncthreads();
    float f[5];
    blur_maps<5>(m_in, m_tmp, P.window, r, c, tid, f);
    const float mu_x = f[0] * inv_n, mu_y = f[1] * inv_n;
    const float var_x = f[2] * inv_n - mu_x * mu_x;
    const float var_y = f[3] * inv_n - mu_y * mu_y;
    const float cov = f[4] * inv_n - mu_x * mu_y;
    const float a1 = 2.f * mu_x * mu_y + SSIM_C1, a2 = 2.f * cov + SSIM_C2;
    const float b1 = mu_x * mu_x + mu_y * mu_y + SSIM_C1, b2 = var_x + var_y + SSIM_C2;
    const float den = b1 * b2;
    const float s = a1 * a2 / den;
    // d s / d mu_x, d s / d E[x^2], d s / d E[xy], through the window's normalization
    const float d_mu = has_gt ? (2.f * mu_y * (a2 - a1) - 2.f * mu_x * s * (b2 - b1)) / den * inv_n : 0.f;
    const float d_xx = has_gt ? -s / b2 * inv_n : 0.f;
    const float d_xy = has_gt ? 2.f * a1 / den * inv_n : 0.f;
    if (has_gt) ssim_sum += s;
    __syncthreads();  // every thread has read the blur passes' maps
    m_in[tid] = d_mu;
    m_in[NPIX + tid] = d_xx;
    m_in[2 * NPIX + tid] = d_xy;
    __syncthreads();
    float bw[3];
    blur_maps<3>(m_in, m_tmp, P.window, r, c, tid, bw);  // the window is symmetric: its transpose
    const float ds = bw[0] + 2.f * xa * bw[1] + ya * bw[2];
    const float e = xa - ya;
    abs_sum += fabsf(e);
    const float sgn = e > 0.f ? 1.f : (e < 0.f ? -1.f : 0.f);
    g[ch] = has_gt ? P.l1_scale * sgn - P.ssim_scale * ds : 0.f;
  }
  const float tile_abs = block_reduce(abs_sum, s_red, tid, false);
  const float tile_ssim = block_reduce(ssim_sum, s_red, tid, false);
  if (tid == 0) {
    P.partial[2 * (int64_t)tile] = tile_abs;
    P.partial[2 * (int64_t)tile + 1] = tile_ssim;
  }
  reduce_terms_if_last(P, s_red, tid);
  if (P.v_backgrounds != nullptr) {
#pragma unroll
    for (int ch = 0; ch < 3; ++ch) {
      const float t = block_reduce(T * g[ch], s_red, tid, false);
      if (tid == 0) atomicAdd(P.v_backgrounds + 3 * img + ch, t);
    }
  }
  const int my_stop = has_gt ? (int)(stop - start) : 0;  // the other pixels have no gradient
  // what lies behind the start of the tile's list, dotted with g: behind a bucket's end it is K
  // minus the checkpoint's accumulated colour dotted with g
  const float K = (col_r * g[0] + col_g * g[1] + col_b * g[2]) + T * (bg_r * g[0] + bg_g * g[1] + bg_b * g[2]);
  // Pixels by decreasing stop: bucket b's pixels with something to do (stop > b * warpSize) are then
  // the first n of this order, and the backward's pipeline runs over those only.
  const int rank = rank_by_stop(s_stop, my_stop, end - start, tid);
  s_stop[rank] = my_stop;
  s_perm[rank] = tid;
  s_pxy[rank] = make_float2(px, py);
  s_g[rank] = make_float4(g[0], g[1], g[2], K);
  __syncthreads();  // also orders the forward's checkpoint writes before the backward's reads
  const int num_buckets = (s_stop[0] + B - 1) / B;

  if (P.phases < 3) return;

  // ---------------------------------------------------------------- 3. backward, per bucket
  // Lane l's Gaussian (list position k, mean m, conic (a, b, c), opacity o) and pixel p, with
  // d = m - p, raw = o exp(-sigma) (computed as 2^p, gauss_sigma2), alpha = min(0.999, raw), and
  // u = raw dL/dalpha below the clamp (0 above it, where alpha depends on neither o nor sigma):
  // dL/do = u / o and dL/dsigma = -u, so
  //   dL/da = -1/2 sum u dx^2,  dL/db = -sum u dx dy,  dL/dc = -1/2 sum u dy^2,
  //   dL/dm = -(a sum u dx + b sum u dy,  b sum u dx + c sum u dy)
  // (sigma = (a dx^2 + c dy^2) / 2 + b dx dy). The step loop accumulates the six sums over the
  // lane's pixels and the per-Gaussian factors are applied once per bucket: fewer instructions per
  // pipeline step than summing each pixel's gradients.
  const int lane = tid % B, warp = tid / B, num_warps = NPIX / B;
  float2* anchors = s_anchor + warp * NPIX;  // this warp's part
  for (int b = warp; b < num_buckets; b += num_warps) {
    const int k = b * B + (B - 1 - lane);  // list position (from start) of this lane's Gaussian
    float mx = 0.f, my = 0.f, cr = 0.f, cg = 0.f, cbl = 0.f;
    float4 sc = make_float4(0.f, 0.f, 0.f, 0.f);  // scaled conic, log2 opacity
    if (start + k < end) {
      const int64_t gid = P.flatten_ids[start + k];
      mx = P.means2d[2 * gid];
      my = P.means2d[2 * gid + 1];
      sc = scaled_conic(P, gid);
      cr = P.colors[3 * gid];
      cg = P.colors[3 * gid + 1];
      cbl = P.colors[3 * gid + 2];
    }
    // The pixels whose stop lies past the bucket's start are a prefix of the sorted order; this
    // lane's Gaussian reaches the shorter prefix of those whose stop lies past it (none when the
    // list ends before k, since no stop exceeds the list's length).
    const int n_act = count_above(s_stop, b * B);
    const int n_mine = count_above(s_stop, k);
    // their anchors at the bucket's end: T, and what lies behind, K - C_bucket_end . g
    const float4* cpb = reinterpret_cast<const float4*>(cp + (int64_t)b * NPIX * 4);
    st::warp_sync();  // the previous bucket's reads are done
    for (int i = lane; i < n_act; i += B) {
      const float4 q = cpb[s_perm[i]];
      const float4 gk = s_g[i];
      anchors[i] = make_float2(q.x, gk.w - (q.y * gk.x + q.z * gk.y + q.w * gk.z));
    }
    st::warp_sync();
    float v_r = 0.f, v_g = 0.f, v_bl = 0.f;
    float su = 0.f, sx = 0.f, sy = 0.f, sxx = 0.f, sxy = 0.f, syy = 0.f, abs_x = 0.f, abs_y = 0.f;
    float t_state = 0.f, behind_state = 0.f;
    for (int s = 0; s < n_act + B - 1; ++s) {
      float t_in = st::shfl_up(t_state, 1);
      float behind_in = st::shfl_up(behind_state, 1);
      if (lane == 0 && s < n_act) {
        const float2 a = anchors[s];
        t_in = a.x;
        behind_in = a.y;
      }
      t_state = t_in;
      behind_state = behind_in;
      const int i = s - lane;  // this lane's pixel, in the sorted order
      if ((unsigned)i >= (unsigned)n_mine) continue;
      const float2 q = s_pxy[i];
      const float dx = mx - q.x, dy = my - q.y;
      const float dxx = dx * dx, dxy = dx * dy, dyy = dy * dy;
      const float s2 = gauss_sigma2(sc.x, sc.y, sc.z, dxx, dxy, dyy);
      const float p = sc.w - s2;
      if (!composites(s2, p)) continue;
      const float raw = exp2f(p);
      const float alpha = fminf(MAX_ALPHA, raw);
      const float inv_one_minus = __fdividef(1.f, 1.f - alpha);
      const float t_before = t_state * inv_one_minus;
      const float w = alpha * t_before;
      const float4 gk = s_g[i];
      const float cdot = cr * gk.x + cg * gk.y + cbl * gk.z;
      const float v_alpha = t_before * cdot - behind_state * inv_one_minus;
      v_r += w * gk.x;
      v_g += w * gk.y;
      v_bl += w * gk.z;
      const float u = raw <= MAX_ALPHA ? raw * v_alpha : 0.f;
      su += u;
      sx += u * dx;
      sy += u * dy;
      sxx += u * dxx;
      sxy += u * dxy;
      syy += u * dyy;
      if (ABSGRAD) {  // |dL/dm| of this pixel's term, times log2(e) (the scaled conic's factor)
        abs_x += fabsf(u * fmaf(sc.x + sc.x, dx, sc.y * dy));
        abs_y += fabsf(u * fmaf(sc.z + sc.z, dy, sc.y * dx));
      }
      behind_state += w * cdot;
      t_state = t_before;
    }
    // Adding zeros changes no sum: a lane whose sums are all zero (no pixel reached, or terms that
    // cancel exactly) skips the atomics. (A lane with a nonzero sum composited a pair, so its
    // opacity is at least 1/255.)
    const bool any = (su != 0.f) | (sx != 0.f) | (sy != 0.f) | (sxx != 0.f) | (sxy != 0.f) | (syy != 0.f) |
                     (v_r != 0.f) | (v_g != 0.f) | (v_bl != 0.f) | (ABSGRAD && ((abs_x != 0.f) | (abs_y != 0.f)));
    if (any) {
      const int64_t gid = P.flatten_ids[start + k];
      const float ca = P.conics[3 * gid], cb = P.conics[3 * gid + 1], cc = P.conics[3 * gid + 2];
      atomicAdd(P.v_means2d + 2 * gid, -fmaf(ca, sx, cb * sy));
      atomicAdd(P.v_means2d + 2 * gid + 1, -fmaf(cb, sx, cc * sy));
      atomicAdd(P.v_conics + 3 * gid, -0.5f * sxx);
      atomicAdd(P.v_conics + 3 * gid + 1, -sxy);
      atomicAdd(P.v_conics + 3 * gid + 2, -0.5f * syy);
      atomicAdd(P.v_opacities + gid, su / P.opacities[gid]);
      atomicAdd(P.v_colors + 3 * gid, v_r);
      atomicAdd(P.v_colors + 3 * gid + 1, v_g);
      atomicAdd(P.v_colors + 3 * gid + 2, v_bl);
      if (ABSGRAD) {
        atomicAdd(P.absgrad + 2 * gid, abs_x * (1.f / LOG2E));
        atomicAdd(P.absgrad + 2 * gid + 1, abs_y * (1.f / LOG2E));
      }
    }
  }
}

#if !defined(ST_CPU_EMU)
// Launches one block of 256 threads per (image, tile). Returns the launch error.
inline cudaError_t launch_fused_raster_loss(const Params& p, cudaStream_t stream) {
  const int blocks = p.tile_count;
  if (blocks == 0) return cudaSuccess;
  if (p.absgrad != nullptr)
    fused_raster_loss_kernel<true><<<blocks, NPIX, 0, stream>>>(p);
  else
    fused_raster_loss_kernel<false><<<blocks, NPIX, 0, stream>>>(p);
  return cudaGetLastError();
}
#endif

}  // namespace splat_fused
