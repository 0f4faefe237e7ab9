// The CPU kernel table: which formats have a GEMM that reads their packed
// parts directly (DESIGN.md: kernels registered by format, backend and op).
// A format without an entry is dequantized to f32 when a model loads.
#include "backend/cpu/kernels.h"
#include "formats/registry_rows.h"
#include "nibble/format.h"

namespace nibble::cpu {
namespace {

// int4_asym parts: qweight U8, scales BF16, mins BF16 (docs/FORMAT.md §3).
void gemm_int4_asym_parts(const float* x, int64_t M, const std::vector<Tensor>& parts, int64_t N, int64_t K,
                          int group_size, float* y) {
  gemm_int4_asym(x, M, parts[0].data<uint8_t>(), parts[1].data<uint16_t>(), parts[2].data<uint16_t>(), N, K,
                 group_size, y);
}

// int4_asym_f32 parts (§7.8), and int4_sym's once prepared: qweight U8, scales F32, mins F32.
void gemm_int4_f32_parts(const float* x, int64_t M, const std::vector<Tensor>& parts, int64_t N, int64_t K,
                         int group_size, float* y) {
  gemm_int4_asym(x, M, parts[0].data<uint8_t>(), parts[1].data<float>(), parts[2].data<float>(), N, K, group_size,
                 y);
}

// int8_channel_sym parts (§7.2): qweight I8 [N, K], scales F32 [N, 1].
void gemm_int8_channel_parts(const float* x, int64_t M, const std::vector<Tensor>& parts, int64_t N, int64_t K, int,
                             float* y) {
  gemm_int8_channel(x, M, parts[0].data<int8_t>(), parts[1].data<float>(), N, K, y);
}

struct KernelEntry {
  const FormatSpec* format;
  PackedKernel kernel;
};

const KernelEntry kKernels[] = {
    {&formats::kInt4Asym, {nullptr, gemm_int4_asym_parts}},
    {&formats::kInt4AsymF32, {nullptr, gemm_int4_f32_parts}},
    {&formats::kInt4Sym, {int4_sym_as_asym_f32, gemm_int4_f32_parts}},  // run as (s, −8·s), exactly
    {&formats::kInt8ChannelSym, {nullptr, gemm_int8_channel_parts}},
};

}  // namespace

const PackedKernel* find_packed_kernel(const FormatSpec& format) {
  for (const KernelEntry& k : kKernels)
    if (k.format == &format) return &k.kernel;
  return nullptr;
}

}  // namespace nibble::cpu
