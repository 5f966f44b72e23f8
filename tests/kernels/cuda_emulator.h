// Runs the CUDA source TVM generates for one kernel on the CPU: every thread of a block is an
// OS thread, __syncthreads is a block barrier, shared memory is a function-static array (blocks
// run one after another; the test rewrites `__shared__` as `static`), and the PTX helpers the
// kernel calls are emulated: mma.sync m16n8k16 (f32 += f16 x f16) from the fragment layouts of
// the PTX ISA, gathered across the warp's 32 threads at a warp barrier; prmt.b32; fma.rn.f16x2.
//
// Why: the tensor-core kernels (kernels/gpu_matmul_mma.py) cannot run on the CPU devices CI
// has, and their likeliest bugs are in which lane holds which element. This checks that
// indexing against numpy on every run; the tensor core's own rounding is checked on the GPU
// (speccompile/gpu_check/kernels_bench.py). Included by the test before the kernel's source.
#include <algorithm>
#include <barrier>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <functional>
#include <memory>
#include <thread>
#include <vector>

using std::max;
using std::min;
using std::nearbyintf;  // the activation's exp (kernels/activation.py) rounds with it

typedef unsigned int uint;
struct emu_dim3 { int x, y, z; };
static thread_local emu_dim3 threadIdx, blockIdx;

#define __global__
#define __device__
#define __forceinline__ inline
#define __launch_bounds__(n)


struct half {
  _Float16 v;
  half() = default;
  half(float f) : v((_Float16)f) {}
  operator float() const { return (float)v; }
};
struct half2 { half x, y; };
static inline half __float2half_rn(float f) { return half(f); }
static inline half2 make_half2(half a, half b) { return half2{a, b}; }
struct uint4 { uint x, y, z, w; };
static inline uint4 make_uint4(uint x, uint y, uint z, uint w) { return uint4{x, y, z, w}; }

static inline float emu_lo(uint32_t r) { half h; std::memcpy(&h, &r, 2); return (float)h; }
static inline float emu_hi(uint32_t r) { r >>= 16; half h; std::memcpy(&h, &r, 2); return (float)h; }

static inline uint32_t emu_pack(float lo, float hi) {
  half l(lo), h(hi);  // one rounding to fp16 each
  uint16_t a, b;
  std::memcpy(&a, &l, 2);
  std::memcpy(&b, &h, 2);
  return (uint32_t)a | ((uint32_t)b << 16);
}

// fma.rn.f16x2: a * b + c per half, rounded once (exact in double for fp16 operands)
static inline void tvm_builtin_ptx_fma_half_rn_f16x2(uint32_t& d, uint32_t a, uint32_t b, uint32_t c) {
  d = emu_pack((float)((double)emu_lo(a) * emu_lo(b) + emu_lo(c)), (float)((double)emu_hi(a) * emu_hi(b) + emu_hi(c)));
}

// prmt.b32 (no mode): byte i of d is byte (c >> 4i) & 7 of {b, a} (a = bytes 0-3), sign-replicated if bit 3
static inline void tvm_builtin_ptx_prmt_b32(uint32_t& d, uint32_t a, uint32_t b, uint32_t c) {
  uint64_t src = ((uint64_t)b << 32) | a;
  uint32_t out = 0;
  for (int i = 0; i < 4; ++i) {
    uint32_t sel = (c >> (4 * i)) & 15;
    uint32_t byte = (src >> (8 * (sel & 7))) & 0xFF;
    if (sel & 8) byte = (byte & 0x80) ? 0xFF : 0;
    out |= byte << (8 * i);
  }
  d = out;
}

// One warp's staged operands: every lane writes its registers, then reads the whole tiles.
struct EmuWarp {
  uint32_t a[32][4], b[32][2];
  std::unique_ptr<std::barrier<>> bar;
};
static std::vector<EmuWarp> emu_warps;
static std::unique_ptr<std::barrier<>> emu_block_bar;

static inline void __syncthreads() { emu_block_bar->arrive_and_wait(); }

static inline void tvm_builtin_ptx_mma_sync_aligned_m16n8k16_row_col_f32_f16_f16_f32(
    float& d0, float& d1, float& d2, float& d3, uint32_t a0, uint32_t a1, uint32_t a2, uint32_t a3,
    uint32_t b0, uint32_t b1, float c0, float c1, float c2, float c3) {
  EmuWarp& w = emu_warps[threadIdx.y];
  int lane = threadIdx.x;
  w.a[lane][0] = a0; w.a[lane][1] = a1; w.a[lane][2] = a2; w.a[lane][3] = a3;
  w.b[lane][0] = b0; w.b[lane][1] = b1;
  w.bar->arrive_and_wait();
  float A[16][16], B[16][8];
  for (int l = 0; l < 32; ++l) {
    int g = l / 4, t = l % 4;
    // A (row major 16 x 16): reg r holds rows g (+8 for odd r), cols 2t, 2t+1 (+8 for r >= 2)
    for (int r = 0; r < 4; ++r) {
      int row = g + (r % 2) * 8, col = 2 * t + (r / 2) * 8;
      A[row][col] = emu_lo(w.a[l][r]);
      A[row][col + 1] = emu_hi(w.a[l][r]);
    }
    // B (16 x 8, "col"): reg r holds rows (k) 2t, 2t+1 (+8 for r = 1) of column g
    for (int r = 0; r < 2; ++r) {
      B[2 * t + r * 8][g] = emu_lo(w.b[l][r]);
      B[2 * t + r * 8 + 1][g] = emu_hi(w.b[l][r]);
    }
  }
  w.bar->arrive_and_wait();  // every lane has read the stage before any lane writes it again
  int g = lane / 4, t = lane % 4;
  float c[4] = {c0, c1, c2, c3}, d[4];
  // C/D: element i at row g + (i / 2) * 8, column 2t + i % 2
  for (int i = 0; i < 4; ++i) {
    int row = g + (i / 2) * 8, col = 2 * t + i % 2;
    double s = 0;  // fp16 products are exact in double; the sum's order is the emulator's own
    for (int k = 0; k < 16; ++k) s += (double)A[row][k] * (double)B[k][col];
    d[i] = (float)(s + (double)c[i]);
  }
  d0 = d[0]; d1 = d[1]; d2 = d[2]; d3 = d[3];
}

// Launch: blocks in order, each as block_x * block_y threads.
template <typename F>
static void emu_launch(int grid_x, int grid_y, int block_x, int block_y, F kernel, int grid_z = 1) {
  for (int bz = 0; bz < grid_z; ++bz)
  for (int by = 0; by < grid_y; ++by)
    for (int bx = 0; bx < grid_x; ++bx) {
      emu_warps = std::vector<EmuWarp>(block_y);
      for (auto& w : emu_warps) w.bar = std::make_unique<std::barrier<>>(block_x);
      emu_block_bar = std::make_unique<std::barrier<>>(block_x * block_y);
      std::vector<std::thread> threads;
      for (int ty = 0; ty < block_y; ++ty)
        for (int tx = 0; tx < block_x; ++tx)
          threads.emplace_back([=] {
            threadIdx = {tx, ty, 0};
            blockIdx = {bx, by, bz};
            kernel();
          });
      for (auto& th : threads) th.join();
    }
}
