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

// 8-bit codes (§7.2, §7.4): qweight [N, K] (I8, F8_E4M3 or F8_E5M2), scales F32 [N, 1] per row or scale [1].
template <Code8 C, int64_t kScaleStride>
void gemm_code8_parts(const float* x, int64_t M, const std::vector<Tensor>& parts, int64_t N, int64_t K, int,
                      float* y) {
  Code8 kind = C;
  if (C == Code8::E4M3 && parts.size() > 2 && parts[2].data<uint8_t>()[0] != 0) kind = Code8::E4M3Finite;
  gemm_code8(kind, x, M, static_cast<const uint8_t*>(parts[0].raw()), parts[1].data<float>(), kScaleStride, N, K,
             y);
}

// E4M3: the stored parts and a third, one byte: 1 when no code is NaN (S.1111.111; nibble's encoder saturates, so
// its checkpoints never hold one), which lets gemm_code8_parts take the decode without the NaN blend.
std::vector<Tensor> mark_finite_e4m3(const std::vector<Tensor>& parts, int64_t N, int64_t K, int) {
  const Tensor codes = parts[0].contiguous();
  const auto* q = static_cast<const uint8_t*>(codes.raw());
  bool finite = true;
  for (int64_t i = 0; i < N * K && finite; ++i) finite = (q[i] & 0x7F) != 0x7F;
  Tensor flag = Tensor::zeros(DType::U8, {1});
  flag.data_mut<uint8_t>()[0] = finite ? 1 : 0;
  return {codes, parts[1], flag};
}

struct KernelEntry {
  const FormatSpec* format;
  PackedKernel kernel;
};

const KernelEntry kKernels[] = {
    {&formats::kInt4Asym, {nullptr, gemm_int4_asym_parts}},
    {&formats::kInt4AsymF32, {nullptr, gemm_int4_f32_parts}},
    {&formats::kInt4Sym, {int4_sym_as_asym_f32, gemm_int4_f32_parts}},  // run as (s, −8·s), exactly
    {&formats::kInt8ChannelSym, {nullptr, gemm_code8_parts<Code8::Int8, 1>}},
    {&formats::kFp8E4m3Channel, {mark_finite_e4m3, gemm_code8_parts<Code8::E4M3, 1>}},
    {&formats::kFp8E4m3Tensor, {mark_finite_e4m3, gemm_code8_parts<Code8::E4M3, 0>}},
    {&formats::kFp8E5m2Channel, {nullptr, gemm_code8_parts<Code8::E5M2, 1>}},
    {&formats::kFp8E5m2Tensor, {nullptr, gemm_code8_parts<Code8::E5M2, 0>}},
};

}  // namespace

const PackedKernel* find_packed_kernel(const FormatSpec& format) {
  for (const KernelEntry& k : kKernels)
    if (k.format == &format) return &k.kernel;
  return nullptr;
}

}  // namespace nibble::cpu
