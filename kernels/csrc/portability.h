// Portability layer of the fused rasterizer's device code: CUDA (nvcc), HIP (hipcc, after
// torch.utils.hipify) and a CPU emulation (ST_CPU_EMU, tests/csrc/cpu_emu.h) that runs the same
// kernel source with one host thread per GPU thread, for CPU tests against the PyTorch reference.
//
// No warp size is assumed anywhere: the device code reads warpSize (32 on NVIDIA, 64 on CDNA
// wavefronts, whatever the emulation sets), and every cross-lane operation goes through the
// functions below, which take no lane mask and are called by all lanes of a warp together.
// HIP 5.2 has no __shfl_*_sync, hence the two spellings. No inline PTX / GCN assembly.
#pragma once

#if defined(ST_CPU_EMU)
// cpu_emu.h (included before this header) defines the builtins and st_emu_shfl.
#define ST_DEVICE inline
#define ST_GLOBAL
#define ST_LAUNCH_BOUNDS(n, m)
#elif defined(__HIPCC__) || defined(__HIP_PLATFORM_AMD__) || defined(USE_ROCM)
#define ST_HIP 1
#define ST_DEVICE __device__ __forceinline__
#define ST_GLOBAL __global__
#define ST_LAUNCH_BOUNDS(n, m) __launch_bounds__(n, m)
#else
#define ST_DEVICE __device__ __forceinline__
#define ST_GLOBAL __global__
#define ST_LAUNCH_BOUNDS(n, m) __launch_bounds__(n, m)
#endif

namespace st {

// The value of ``v`` held by lane (this lane - delta); lanes below delta get their own value.
ST_DEVICE float shfl_up(float v, int delta) {
#if defined(ST_CPU_EMU)
  return st_emu_shfl(v, -delta, true);
#elif defined(ST_HIP)
  return __shfl_up(v, delta);
#else
  return __shfl_up_sync(0xffffffffu, v, delta);  // NVIDIA warps are 32 lanes: the full mask
#endif
}

// The value of ``v`` held by lane ``src`` (0 <= src < warpSize).
ST_DEVICE float shfl(float v, int src) {
#if defined(ST_CPU_EMU)
  return st_emu_shfl(v, src, false);
#elif defined(ST_HIP)
  return __shfl(v, src);
#else
  return __shfl_sync(0xffffffffu, v, src);
#endif
}

// Orders the shared-memory writes of a warp's lanes before its lanes' later reads (the warp's lanes
// only; warps of a block may be at different points).
ST_DEVICE void warp_sync() {
#if defined(ST_CPU_EMU)
  st_emu_warp_sync();
#elif defined(ST_HIP)
  __builtin_amdgcn_fence(__ATOMIC_RELEASE, "workgroup");
  __builtin_amdgcn_wave_barrier();
  __builtin_amdgcn_fence(__ATOMIC_ACQUIRE, "workgroup");
#else
  __syncwarp();
#endif
}

}  // namespace st
