// The M = 1 W4A16 kernel with integer dot products (w4a16_gemv.cu), used by
// the w4a16_mma registry row for single-token calls with group size 32, 64 or 128,
// and the kernel for M >= 2 (w4a16_small_m.cu).
// Internal to the CUDA backend.
#pragma once

#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>
#include <map>
#include <mutex>

#include "nibble/cuda.h"

namespace nibble::cuda {

// A per-process table of values that depend only on their key (the occupancy
// answers behind the launch rules, the scratch pool of each device): the first
// call with a key computes its value, later ones look it up, so a launch costs
// one lookup rather than a round of occupancy queries (eager decode launches
// every GEMV from the host). Thread-safe; `compute` runs under the table's lock.
template <typename Key, typename Value>
class Memo {
 public:
  template <typename F>
  Value get(const Key& key, F&& compute) {
    const std::lock_guard<std::mutex> lock(mu_);
    if (const auto it = table_.find(key); it != table_.end()) return it->second;
    return table_.emplace(key, compute()).first->second;
  }

 private:
  std::mutex mu_;
  std::map<Key, Value> table_;
};

// Whether the integer GEMV serves this group size.
bool w4a16_gemv_applies(int group_size);
// Whether LinearKernel::gemv_chain takes calls of this group size (64 or 128).
bool w4a16_gemv_chain_applies(int group_size);
// Bytes of the per-linear scratch (the prepared activation) for an input width.
size_t w4a16_gemv_scratch_bytes(int64_t cols);
// y[1, rows] = x[1, cols] · Ŵᵀ; w.scratch holds the prepared activation, so a
// DeviceLinear serves one stream at a time. `sms`: the device's SM count.
void w4a16_gemv(const DeviceLinear& w, const void* x, Act act, void* y, bool f32_out, cudaStream_t stream, bool pdl,
                int sms);
// The same GEMV on an activation already prepared (w4a16_prep.cuh: written by
// the kernel before, e.g. GpuModel's fused RMSNorm); y is f32. The prepared
// buffer must be for w.cols inputs and w.group_size. `deep` (LinearKernel::
// gemv_prepared): a 4-stage ring, three groups per warp in flight before the
// wait, where the kernel before leaves the SMs free.
// `fuse`: work fused around the GEMV (GemvFusion; y unused where it fuses the output).
void w4a16_gemv_prepared(const DeviceLinear& w, const void* prepared, size_t prepared_bytes, void* y,
                         cudaStream_t stream, bool pdl, int sms, bool deep = false, const GemvFusion* fuse = nullptr);
// LinearKernel::gemv_chain: the calls in one persistent launch (groups of 64 or 128).
void w4a16_gemv_chain(const GemvCall* calls, int count, unsigned* sync, cudaStream_t stream, bool pdl);
// Writes x (w.cols wide, `act` type) as the prepared activation (w4a16_prep.cuh).
void w4a16_gemv_prepare(const DeviceLinear& w, const void* x, Act act, void* prepared, size_t prepared_bytes,
                        cudaStream_t stream, bool pdl);
// The kernel for M >= 2 tokens with groups of 64 or 128 (w4a16_small_m.cu).
// Up to 16 tokens: exact weights, Σx per token and group summed by the
// kernel's own warps (no scratch); 17..24 exact on three token tiles where
// w4a16_three_tiles_exact says or the resident-activation kernel takes the
// call; else 16-bit weights (w4a16_exact_weights).
bool w4a16_small_m_applies(int group_size, int64_t M);
void w4a16_small_m(const DeviceLinear& w, const void* x, int64_t M, int64_t ldx, Act act, void* y, int64_t ldy,
                   bool f32_out, cudaStream_t stream, bool pdl, int sms);
// The wgmma kernel for more than 16 tokens (w4a16_wgmma.cu; sm_90a GPUs;
// bf16 up to 256 tokens): up to 64 tokens it writes the activations' image
// into w.scratch (so, as above, one stream at a time per DeviceLinear), beyond
// into per-call scratch from w4a16_scratch_pool. w4a16_wgmma_device: the
// current device runs it; w4a16_wgmma_applies: it serves this call
// (w4a16_small_m and, for bf16 beyond 64 tokens, w4a16_gemm dispatch;
// w4a16_small_m_first below).
bool w4a16_wgmma_device();
bool w4a16_wgmma_applies(const DeviceLinear& w, int64_t M, Act act);
size_t w4a16_wgmma_scratch_bytes(int64_t cols, int group_size);
// The wgmma kernel's grid for a matrix of `row_wgs` warpgroup row blocks (64
// rows each) and `groups` groups of inputs on `sms` SMs: ks blocks of a
// cluster split K, nwg warpgroups per block (at most max_nwg), `blocks` row
// blocks. `wide`: the rule for passes of 128 and 256 tokens (w4a16_wgmma.cu).
struct WgGrid {
  int64_t ks = 1, nwg = 1, blocks = 1;
};
WgGrid wg_grid(int64_t row_wgs, int64_t groups, int sms, int max_nwg, bool wide);
// Whether a call of up to 32 tokens (one pass of the small-M kernel,
// w4a16_small_m.cu, the path of other GPUs) runs faster there than on the
// wgmma kernel: where the wgmma grid would split K 4 or more ways. Those
// matrices give the wgmma kernel few groups per block, so its fixed costs (the
// image kernel, clusters, the reduction through distributed shared memory)
// dominate. H200, 8B stack at 17..32 tokens: 4096 × 4096 14.5-15.2 → 8.4-9.0
// µs, 4096 × 14336 28.9-30.3 → 23.1-25.3, fused stack M = 17 3.09 → 2.69 ms
// (docs/CUDA.md, "17..64 tokens on Hopper"). Also at 17..24 tokens where it
// splits K 2 ways and the small-M kernel takes three exact token tiles
// (session 45: 14336 × 4096 19.75 -> 17.92 us at 17 tokens, 20.00 -> 18.43 at
// 24), and at 17..24 tokens where the resident-activation kernel takes the
// call (w4a16_resident_x_ks below; session 47: gate|up 31.3 -> 26.9 us at 17
// tokens).
// 9..16 tokens on sm_90 with the activations resident in shared memory
// (w4a16_small_m.cu, session 36), and 17..24 on three token tiles (session
// 47): 1 where each block (one per SM) takes all of K
// (matrices of at least 16 units of two row tiles per SM: vocabulary heads),
// 2 where the two blocks of a cluster split K (at least 12 units per cluster
// and warp: gate|up; the head at 17..24, whose 24 rows of x do not fit one
// block), 0 where the kernel does not apply. K must be a whole number of
// groups (an even number with 2), and the padded activation rows, Σx, rings
// and (2) partial sums must fit in 227 KiB (elem: bytes per activation).
// w4a16_small_m_first sends 17..24-token calls it takes to the small-M path.
int w4a16_resident_x_ks(int64_t rows, int64_t cols, int group_size, int64_t M, int sms, size_t elem);
bool w4a16_small_m_first(int64_t rows, int64_t cols, int group_size, int64_t M, int sms);
// 17..24 tokens on the small-M kernel, groups of 128: exact weights on three
// token tiles where its grid has two-tile warps (at least 2 tiles per SM), staged
// activations (at least 64 groups) or fewer tiles than SMs; the rounded path
// of four token tiles elsewhere (one-tile grids of 1-2 tiles per SM, where
// three exact tiles lost: 4096 × 4096 8.35 -> 9.32 us on the H200) and for
// groups of 64 (the 8B stack lost with the dependent launch).
bool w4a16_three_tiles_exact(int64_t rows, int64_t cols, int group_size, int sms);
void w4a16_wgmma(const DeviceLinear& w, const void* x, int64_t M, int64_t ldx, Act act, void* y, int64_t ldy,
                 bool f32_out, cudaStream_t stream, bool pdl, int sms);
// The memory pool of per-call scratch (dequantized weights, large x images),
// one per device, that keeps freed memory mapped.
cudaMemPool_t w4a16_scratch_pool();
// The device's SM count (cached).
int device_sm_count();
// `want` bytes of dynamic shared memory per block, or the most the device
// allows a block to ask for (227 KiB on sm_90, 163 on sm_80, 99 on sm_86/89).
size_t device_smem_cap(size_t want);
// Warps per block for a kernel whose blocks hold `unit` × warps warps that
// split each tile's K by interleaved groups (unit × warps × `smem_per_warp`
// bytes of dynamic shared memory): the most, up to `most`, for which all
// `blocks` blocks are resident at once (one wave), then the fewest that keep
// the same groups per warp. 0 where no warp count gives one wave.
int64_t one_wave_warps(const void* kernel, int64_t blocks, int64_t most, int64_t groups, int unit, size_t smem_per_warp,
                       int sms);
// The same rule on a given occupancy: per_sm(w) blocks of w warps per tile
// are resident on one SM (one_wave_warps asks the CUDA occupancy API).
template <typename PerSm>
int64_t one_wave_warps_for(int64_t blocks, int64_t most, int64_t groups, int sms, PerSm per_sm) {
  for (int64_t w = most; w >= 1; --w)
    if (blocks <= int64_t{sms} * per_sm(w)) {
      const int64_t iters = (groups + w - 1) / w;
      return (groups + iters - 1) / iters;
    }
  return 0;
}

// Dynamic shared memory for a grid of `blocks` blocks (`threads` each, asking
// `smem` bytes) that launches early (programmatic dependent launch): raised,
// up to `most` bytes, until no more than the even share of ceil(blocks / sms)
// blocks fit on one SM; `smem` where they already do or cannot be made to.
// Launched early, a grid's blocks take the room the kernel before leaves as
// its SMs drain, so where an SM holds more than the even share, the first SMs
// to empty take more than theirs and the grid ends with them (session 48: the
// fp16 wgmma kernel at groups of 64 fits 3 blocks of 256 threads per SM, bf16
// 2; gate|up's 224 blocks at 25 tokens took 58 us after o with the early
// launch and 43 without; docs/CUDA.md "Session 48").
size_t even_share_smem(const void* kernel, int threads, size_t smem, int64_t blocks, int sms, size_t most);
// The same rule on a given occupancy: per_sm(s) blocks of s bytes are
// resident on one SM (non-increasing in s). Sizes step by 128 bytes.
template <typename PerSm>
size_t even_share_smem_for(size_t smem, int64_t blocks, int sms, size_t most, PerSm per_sm) {
  if (sms <= 0 || blocks <= 0) return smem;
  const int64_t share = (blocks + sms - 1) / sms;
  if (per_sm(smem) <= share || most <= smem || per_sm(most) > share) return smem;
  // The least s = smem + 128·k (or `most`) with per_sm(s) <= share.
  auto at = [&](int64_t k) { return std::min(smem + static_cast<size_t>(k) * 128, most); };
  int64_t lo = 0, hi = static_cast<int64_t>((most - smem + 127) / 128);  // per_sm(at(lo)) > share >= per_sm(at(hi))
  while (hi - lo > 1) {
    const int64_t mid = lo + (hi - lo) / 2;
    (per_sm(at(mid)) > share ? lo : hi) = mid;
  }
  return at(hi);
}

}  // namespace nibble::cuda
