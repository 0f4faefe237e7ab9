// The CPU kernel table: which formats have a GEMM that reads their packed
// parts directly (DESIGN.md: kernels registered by format, backend and op).
// A format without an entry is dequantized to f32 when a model loads.
#include <cmath>

#include "backend/cpu/kernels.h"
#include "formats/registry_rows.h"
#include "nibble/dtype.h"
#include "nibble/error.h"
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

// 8-bit codes (§7.2, §7.4; §7.3's once prepared): qweight [N, K] (I8, F8_E4M3 or F8_E5M2), scales F32 [N, 1] per
// row or scale [1].
template <Code8 C, int64_t kScaleStride>
void gemm_code8_parts(const float* x, int64_t M, const std::vector<Tensor>& parts, int64_t N, int64_t K, int,
                      float* y) {
  Code8 kind = C;
  if (C == Code8::E4M3 && parts.size() > 2 && parts[2].data<uint8_t>()[0] != 0) kind = Code8::E4M3Finite;
  gemm_code8(kind, x, M, static_cast<const uint8_t*>(parts[0].raw()), parts[1].data<float>(), kScaleStride, N, K,
             y);
}

// int8_g{G}_sym (§7.9): qweight I8 [N, K] and an F16 scale per group, made F32 by `prepare` (exactly).
void gemm_int8_group_parts(const float* x, int64_t M, const std::vector<Tensor>& parts, int64_t N, int64_t K,
                           int group_size, float* y) {
  gemm_code8(Code8::Int8, x, M, static_cast<const uint8_t*>(parts[0].raw()), parts[1].data<float>(), 1, N, K, y,
             group_size);
}

// int8_g{G}_asym_f32 (§7.10): qweight U8 [N, K], an F32 scale and min per group.
void gemm_int8_asym_parts(const float* x, int64_t M, const std::vector<Tensor>& parts, int64_t N, int64_t K,
                          int group_size, float* y) {
  gemm_code8(Code8::UInt8, x, M, parts[0].data<uint8_t>(), parts[1].data<float>(), 1, N, K, y, group_size,
             parts[2].data<float>());
}

// int{B}_tensor_asym, B = 2..7 (§7.3: B-bit codes packed per row, an fp32 scale and a zero point per tensor) as
// int8 codes code − zero (|code − zero| ≤ 2^B − 1 ≤ 127) with the scale per tensor: the 8-bit kernel's fl((code −
// zero)·scale) is the format's decode, one byte a weight. (int8_tensor_asym's differences reach ±255: no row.)
template <int B>
std::vector<Tensor> tensor_asym_as_int8(const std::vector<Tensor>& parts, int64_t N, int64_t K, int g) {
  const QuantizedMatrix q = formats::kIntTensorAsym[B - 2].unpack(parts, N, K, g);
  const int zero = static_cast<int>(q.params.empty() ? 0.0f : q.params[0].zero);
  Tensor codes = Tensor::empty(DType::I8, {N, K});
  auto* c = static_cast<int8_t*>(codes.raw_mut());
  for (int64_t i = 0; i < N * K; ++i) c[i] = static_cast<int8_t>(static_cast<int>(q.codes[i]) - zero);
  return {codes, parts[1].contiguous()};
}

// The codes as stored and the 16-bit scales (f16 or bf16) as F32, exactly.
std::vector<Tensor> scales_to_f32(const std::vector<Tensor>& parts, int64_t, int64_t, int) {
  return {parts[0], parts[1].to(DType::F32)};
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

// FP4 E2M1 codes (§7.5-7.7): qweight U8 [N, ceil(K/2)] and the scales their decode multiplies by: fp4_e2m1's bf16
// made F32 by `prepare`; mxfp4's and nvfp4's scale bytes as stored, with a third part `prepare` appends, the F32
// [256] table of every byte's scale: E8M0's 2^(b − 127), NVFP4's fl(e4m3(b)·global) (the format's product first).
void gemm_fp4_parts(const float* x, int64_t M, const std::vector<Tensor>& parts, int64_t N, int64_t K, int group_size,
                    float* y) {
  cpu::Fp4Scales s;
  if (parts.size() == 3) {
    s.codes = static_cast<const uint8_t*>(parts[1].raw());
    s.table = parts[2].data<float>();
  } else {
    s.f32 = parts[1].data<float>();
  }
  gemm_fp4(x, M, parts[0].data<uint8_t>(), s, N, K, group_size, y);
}

// The scale bytes as stored and the F32 [256] table of every byte's scale; a byte the matrix uses must not be NaN
// (the formats' unpack refuses those).
std::vector<Tensor> fp4_scale_table(const std::vector<Tensor>& parts, const char* format, float (*value)(uint8_t),
                                    float factor) {
  const Tensor bytes = parts[1].contiguous();
  Tensor table = Tensor::zeros(DType::F32, {256});
  float* t = table.data_mut<float>();
  for (int b = 0; b < 256; ++b) t[b] = value(static_cast<uint8_t>(b)) * factor;
  const auto* q = static_cast<const uint8_t*>(bytes.raw());
  for (int64_t i = 0; i < bytes.numel(); ++i)
    NIBBLE_CHECK(!std::isnan(t[q[i]]), "{}: block scale {} (byte {:#04x}) is NaN", format, i, q[i]);
  return {parts[0], bytes, table};
}

std::vector<Tensor> fp4_e8m0_scales(const std::vector<Tensor>& parts, int64_t, int64_t, int) {
  return fp4_scale_table(parts, "mxfp4", e8m0_to_f32, 1.0f);  // 2^(b − 127), exactly
}

std::vector<Tensor> fp4_e4m3_global_scales(const std::vector<Tensor>& parts, int64_t, int64_t, int) {
  return fp4_scale_table(parts, "nvfp4", f8_e4m3_to_f32, parts[2].contiguous().data<float>()[0]);  // e4m3·global
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
    {&formats::kInt8Sym, {scales_to_f32, gemm_int8_group_parts}},
    {&formats::kInt8AsymF32, {nullptr, gemm_int8_asym_parts}},
    {&formats::kIntTensorAsym[0], {tensor_asym_as_int8<2>, gemm_code8_parts<Code8::Int8, 0>}},
    {&formats::kIntTensorAsym[1], {tensor_asym_as_int8<3>, gemm_code8_parts<Code8::Int8, 0>}},
    {&formats::kIntTensorAsym[2], {tensor_asym_as_int8<4>, gemm_code8_parts<Code8::Int8, 0>}},
    {&formats::kIntTensorAsym[3], {tensor_asym_as_int8<5>, gemm_code8_parts<Code8::Int8, 0>}},
    {&formats::kIntTensorAsym[4], {tensor_asym_as_int8<6>, gemm_code8_parts<Code8::Int8, 0>}},
    {&formats::kIntTensorAsym[5], {tensor_asym_as_int8<7>, gemm_code8_parts<Code8::Int8, 0>}},
    {&formats::kFp8E4m3Channel, {mark_finite_e4m3, gemm_code8_parts<Code8::E4M3, 1>}},
    {&formats::kFp8E4m3Tensor, {mark_finite_e4m3, gemm_code8_parts<Code8::E4M3, 0>}},
    {&formats::kFp8E5m2Channel, {nullptr, gemm_code8_parts<Code8::E5M2, 1>}},
    {&formats::kFp8E5m2Tensor, {nullptr, gemm_code8_parts<Code8::E5M2, 0>}},
    {&formats::kFp4E2m1, {scales_to_f32, gemm_fp4_parts}},
    {&formats::kMxfp4, {fp4_e8m0_scales, gemm_fp4_parts}},
    {&formats::kNvfp4, {fp4_e4m3_global_scales, gemm_fp4_parts}},
};

}  // namespace

const PackedKernel* find_packed_kernel(const FormatSpec& format) {
  for (const KernelEntry& k : kKernels)
    if (k.format == &format) return &k.kernel;
  return nullptr;
}

}  // namespace nibble::cpu
