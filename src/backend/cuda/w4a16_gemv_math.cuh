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
// (groups of G = 32, 64 or 128), and a warp's ring stage for one unit: the
// lane's 16 bytes of codes per chunk and its 8-byte scale/min entry per group.
__host__ __device__ constexpr int gemv_chunks_per_unit(int g) { return g == 128 ? 2 : 1; }
__host__ __device__ constexpr int gemv_groups_per_unit(int g) { return g == 32 ? 2 : 1; }
__host__ __device__ constexpr size_t gemv_stage_bytes(int g) {
  return static_cast<size_t>(gemv_chunks_per_unit(g)) * 32 * 16 + static_cast<size_t>(gemv_groups_per_unit(g)) * 32 * 8;
}

// Groups of 32: what lane tig's accumulator columns 2tig and 2tig + 1 hold.
// Columns 0, 1, 2 are the chunk's first group's planes a, b, c (weights
// 65536, 256, 1), columns 3, 4, 5 its second group's; 6, 7 are zero. Each
// group's min term is added once per row (tig 0: the first, tig 2: the second).
struct GemvLanes32 {
  float c_even, c_odd, c_min;
  bool even_second, odd_second, min_second;
  __device__ explicit GemvLanes32(int tig)
      : c_even(tig == 0 ? 65536.0f : tig == 1 ? 1.0f : tig == 2 ? 256.0f : 0.0f),
        c_odd(tig == 0 ? 256.0f : tig == 1 ? 65536.0f : tig == 2 ? 1.0f : 0.0f),
        c_min(tig == 0 || tig == 2 ? 1.0f : 0.0f),
        even_second(tig >= 2),
        odd_second(tig >= 1),
        min_second(tig >= 2) {}
};

// group_combine for a chunk of two groups of 32: sa, sb their scale/min
// entries (rows gid, gid + 8), gi their (d, Σx): (gi.x, gi.y) and (gi.z, gi.w).
__device__ __forceinline__ void group_combine32(const int32_t (&acc)[4], uint2 sa, uint2 sb, float4 gi,
                                                const GemvLanes32& l, float& out_lo, float& out_hi) {
  auto row = [&](uint32_t a, uint32_t b, int32_t even, int32_t odd, float& out) {
    const float ds_a = w4a16::bf16_bits_to_float(a & 0xFFFFu) * gi.x;
    const float ds_b = w4a16::bf16_bits_to_float(b & 0xFFFFu) * gi.z;
    const float m = l.min_second ? w4a16::bf16_bits_to_float(b >> 16) * gi.w
                                 : w4a16::bf16_bits_to_float(a >> 16) * gi.y;
    out = fmaf(l.even_second ? ds_b : ds_a, l.c_even * static_cast<float>(even),
               fmaf(l.odd_second ? ds_b : ds_a, l.c_odd * static_cast<float>(odd), fmaf(l.c_min, m, out)));
  };
  row(sa.x, sb.x, acc[0], acc[1], out_lo);
  // Rows gid + 8 are 16× (their nibbles were not shifted down): exact shift.
  row(sa.y, sb.y, acc[2] >> 4, acc[3] >> 4, out_hi);
}

}  // namespace nibble::cuda
