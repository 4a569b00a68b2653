// CPU emulation of the few CUDA builtins kernels/csrc/fused_raster.cuh uses, so that the same
// kernel source runs on a CPU (tests only): a block is 256 host threads (one per GPU thread),
// __syncthreads a barrier over them, a warp shuffle a barrier over the warp's lanes plus an
// exchange array, atomicAdd an atomic_ref, __threadfence a fence. Blocks run one after another (shared memory is a
// function-static array, i.e. one per kernel, reused by each block). warpSize is a variable, so
// the tests run the kernel at several warp sizes (32 as NVIDIA, 64 as AMD's wavefronts).
#pragma once
#define ST_CPU_EMU 1
#include <math.h>
#include <stdint.h>

#include <atomic>
#include <barrier>
#include <memory>
#include <thread>
#include <vector>

struct st_emu_dim3 {
  int x = 0, y = 0, z = 0;
};
inline thread_local st_emu_dim3 threadIdx, blockIdx;
inline int warpSize = 32;
struct float4 {
  float x, y, z, w;
};
struct float2 {
  float x, y;
};
inline float4 make_float4(float x, float y, float z, float w) { return float4{x, y, z, w}; }
inline float2 make_float2(float x, float y) { return float2{x, y}; }
// the fast intrinsics, exact here (the GPU tests hold the compiled kernel to the same tolerances)
inline float __expf(float x) { return expf(x); }
inline float __fdividef(float a, float b) { return a / b; }

struct st_emu_block {
  std::unique_ptr<std::barrier<>> block;
  std::vector<std::unique_ptr<std::barrier<>>> warps;
  std::vector<float> xch;
  std::atomic<int> count{0};
};
inline st_emu_block* st_emu_current = nullptr;

#define __shared__ static
inline void __syncthreads() { st_emu_current->block->arrive_and_wait(); }
inline int __syncthreads_count(int pred) {
  auto& b = *st_emu_current;
  b.block->arrive_and_wait();
  if (pred) b.count.fetch_add(1);
  b.block->arrive_and_wait();
  const int out = b.count.load();
  b.block->arrive_and_wait();
  if (threadIdx.x == 0) b.count.store(0);
  b.block->arrive_and_wait();
  return out;
}
inline float st_emu_shfl(float v, int arg, bool up) {
  auto& b = *st_emu_current;
  const int tid = threadIdx.x, lane = tid % warpSize, base = tid - lane;
  auto& bar = *b.warps[tid / warpSize];
  b.xch[tid] = v;
  bar.arrive_and_wait();
  float out;
  if (up) {
    const int src = lane + arg;
    out = src >= 0 ? b.xch[base + src] : v;
  } else {
    out = b.xch[base + arg];
  }
  bar.arrive_and_wait();
  return out;
}
inline void st_emu_warp_sync() { st_emu_current->warps[threadIdx.x / warpSize]->arrive_and_wait(); }
inline float atomicAdd(float* p, float v) { return std::atomic_ref<float>(*p).fetch_add(v); }
inline unsigned atomicAdd(unsigned* p, unsigned v) { return std::atomic_ref<unsigned>(*p).fetch_add(v); }
inline void __threadfence() { std::atomic_thread_fence(std::memory_order_seq_cst); }

// Runs kernel(args...) on a grid of ``blocks`` blocks of ``threads`` threads.
template <typename K, typename... A>
void st_emu_launch(int blocks, int threads, K kernel, const A&... args) {
  for (int bi = 0; bi < blocks; ++bi) {
    st_emu_block b;
    b.block = std::make_unique<std::barrier<>>(threads);
    for (int w = 0; w < threads / warpSize; ++w) b.warps.push_back(std::make_unique<std::barrier<>>(warpSize));
    b.xch.assign(threads, 0.f);
    st_emu_current = &b;
    std::vector<std::thread> ts;
    ts.reserve(threads);
    for (int t = 0; t < threads; ++t)
      ts.emplace_back([&, t, bi] {
        threadIdx.x = t;
        blockIdx.x = bi;
        kernel(args...);
      });
    for (auto& t : ts) t.join();
  }
}
