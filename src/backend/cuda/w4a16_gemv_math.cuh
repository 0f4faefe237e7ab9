// The single-token GEMV's per-group arithmetic (src/backend/cuda/w4a16_gemv.cu),
// shared with the kernel probes under docs/results/ that measure other shapes
// of the same GEMV: the u8·s8 integer mma, one group's int32 sums, and their
// combination with the group's bf16 scale and min.
#pragma once

#include <cstdint>

#include "backend/cuda/w4a16_common.cuh"

namespace nibble::cuda {

__device__ inline void mma_u8s8(int32_t (&d)[4], uint32_t a0, uint32_t a1, uint32_t a2, uint32_t a3, uint32_t b0,
                                uint32_t b1) {
  asm volatile(
      "mma.sync.aligned.m16n8k32.row.col.s32.u8.s8.s32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};\n"
      : "+r"(d[0]), "+r"(d[1]), "+r"(d[2]), "+r"(d[3])
      : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1));
}

// One group's int32 sums from its CPG chunks' codes (q, the lane's 16 bytes
// of each) and the input's B fragments (xf): one accumulator chain per chunk,
// issued interleaved (the mmas are volatile asm, so source order is issue
// order), summed exactly after. Rows gid and gid + 8 (the latter 16×),
// columns 2tig and 2tig + 1.
template <int CPG>
__device__ __forceinline__ void group_sums(const uint4 (&q)[CPG], const uint4 (&xf)[CPG], int32_t (&sum)[4]) {
  int32_t acc[CPG][4];
#pragma unroll
  for (int u = 0; u < CPG; ++u) acc[u][0] = acc[u][1] = acc[u][2] = acc[u][3] = 0;
#pragma unroll
  for (int u = 0; u < CPG; ++u)
    mma_u8s8(acc[u], q[u].x & 0x0F0F0F0Fu, q[u].x & 0xF0F0F0F0u, q[u].y & 0x0F0F0F0Fu, q[u].y & 0xF0F0F0F0u, xf[u].x,
             xf[u].y);
#pragma unroll
  for (int u = 0; u < CPG; ++u)
    mma_u8s8(acc[u], q[u].z & 0x0F0F0F0Fu, q[u].z & 0xF0F0F0F0u, q[u].w & 0x0F0F0F0Fu, q[u].w & 0xF0F0F0F0u, xf[u].z,
             xf[u].w);
#pragma unroll
  for (int r = 0; r < 4; ++r) {
    sum[r] = acc[0][r];
#pragma unroll
    for (int u = 1; u < CPG; ++u) sum[r] += acc[u][r];
  }
}

// One group's int32 sums (acc: rows gid and gid + 8, the latter 16×) into
// the lane's outputs: s·d·(65536·A + 256·B + C) + m·Σx, with the lane's
// column constants (planes a, b, c in columns 0..2; the min term once per row).
__device__ __forceinline__ void group_combine(const int32_t (&acc)[4], uint2 sm, float d, float sx, float c_even,
                                              float c_odd, float c_min, float& out_lo, float& out_hi) {
  // Rows gid + 8 are 16× (their nibbles were not shifted down): exact shift.
  const float v_lo = fmaf(c_odd, static_cast<float>(acc[1]), c_even * static_cast<float>(acc[0]));
  const float v_hi = fmaf(c_odd, static_cast<float>(acc[3] >> 4), c_even * static_cast<float>(acc[2] >> 4));
  const float s_lo = w4a16::bf16_bits_to_float(sm.x & 0xFFFFu), m_lo = w4a16::bf16_bits_to_float(sm.x >> 16);
  const float s_hi = w4a16::bf16_bits_to_float(sm.y & 0xFFFFu), m_hi = w4a16::bf16_bits_to_float(sm.y >> 16);
  out_lo = fmaf(s_lo * d, v_lo, fmaf(c_min * m_lo, sx, out_lo));
  out_hi = fmaf(s_hi * d, v_hi, fmaf(c_min * m_hi, sx, out_hi));
}

// The GEMV's unit of work: max(G, 64) inputs, CPG chunks of 64 and GPU groups
// (groups of G = 32, 64 or 128). A warp's ring stage for one unit is
// stage_bytes(CPG) at every G: the lane's 16 bytes of codes per chunk and the
// 8-byte scale/min entry of its group (groups of 32: the lanes of tig 0, 1
// take the unit's first group, tig 2, 3 its second).
__host__ __device__ constexpr int gemv_chunks_per_unit(int g) { return g == 128 ? 2 : 1; }
__host__ __device__ constexpr int gemv_groups_per_unit(int g) { return g == 32 ? 2 : 1; }

}  // namespace nibble::cuda
