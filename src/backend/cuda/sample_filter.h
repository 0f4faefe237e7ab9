// Top-k / top-p's launch rule on the device (sample_filter_kernel,
// sample_kernels.cuh): how many blocks, how many logits each. Host code, so
// that tests can work it without a device.
#pragma once

#include <algorithm>
#include <cstdint>

namespace nibble::cuda {

constexpr int kFilterThreads = 512, kFilterWarps = kFilterThreads / 32, kFilterPer = 8, kFilterBins = 256;
constexpr int kFilterSlice = kFilterThreads * kFilterPer;  // logits per block at most
constexpr int kFilterMaxBlocks = 128, kFilterTarget = 1024;  // aim: about kFilterTarget logits per block
static_assert(kFilterMaxBlocks <= kFilterThreads, "a thread per block reads the partial results");

// The most blocks on a device of `sms` SMs: at most one per SM (the blocks
// meet at grid barriers, so every one must be resident at once: the launch is
// cooperative) and at most kFilterMaxBlocks.
inline int filter_block_cap(int sms) { return std::min(kFilterMaxBlocks, std::max(1, sms)); }
// The blocks for n > 0 logits: about one per kFilterTarget logits, at most
// filter_block_cap(sms).
inline int filter_blocks(int64_t n, int sms) {
  return static_cast<int>(std::clamp<int64_t>((n + kFilterTarget - 1) / kFilterTarget, 1, filter_block_cap(sms)));
}
// Each block's logits: a multiple of kFilterPer (every thread's two 16-byte
// loads aligned), at most kFilterSlice where n <= filter_max_logits(sms).
inline int filter_per(int64_t n, int blocks) {
  const int64_t per = (n + blocks - 1) / blocks;
  return static_cast<int>((per + kFilterPer - 1) / kFilterPer * kFilterPer);
}
// The most logits the kernel takes on a device of `sms` SMs.
inline int64_t filter_max_logits(int sms) {
  return int64_t{filter_block_cap(sms)} * kFilterSlice;
}

}  // namespace nibble::cuda
