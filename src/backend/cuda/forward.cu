// The Llama-family forward pass on the GPU (include/nibble/cuda_model.h).
//
// The same computation as src/model/forward.cpp, op for op. The one difference
// is precision: the inputs of the linears are rounded to bf16, which is what
// the W4A16 kernels take (the CPU's bf16_activations mode, the noise floor's
// second computation, does the same). Linear outputs (fp32 accumulation), the
// residual stream, RMSNorm, q/k norms, RoPE, softmax and the KV cache are fp32.
// With GpuOptions::f32_linears (the yardstick's forward) there is no such
// difference: f32 weights, f32 inputs, the fp32 GEMM.
//
// Per layer: residual add + RMSNorm, q|k|v (one linear: rows concatenated at
// load), q/k norm + RoPE + cache write, attention, o, residual add + RMSNorm,
// gate|up (one linear), SiLU·up, down; the kernels are in forward_kernels.cuh.
// Attention: prefill (n > 1) runs the flash kernel (flash_attention.cu) for
// head dims 64/128/256; decode, and prefill of other head dims, the kernel
// with one block per (query, head) over the cached keys (forward_kernels.cuh).
//
// Decode with int4 linears runs the norms and SiLU·up inside the GEMVs
// (GemvFusion, include/nibble/cuda.h; GpuOptions::fuse_decode): o and down add
// to the residual and write the next norm's input, gate|up writes SiLU·up, and
// the GEMV after a norm applies its 1/rms.
//
// Decode (one token) is one CUDA graph: the step is captured once at load
// time over a scratch set of its own, with the token id and the position read
// from a small device buffer; each step copies those two ints in and replays
// the graph (docs/CUDA.md, "Decode through a CUDA graph").
#include <cuda_bf16.h>

#include <algorithm>
#include <array>
#include <cmath>
#include <cstring>
#include <functional>
#include <limits>
#include <mutex>

#include "backend/cuda/act_quant.h"
#include "backend/cuda/check.h"
#include "backend/cuda/dequant_int4.h"
#include "backend/cuda/forward_kernels.cuh"
#include "backend/cuda/sample_kernels.cuh"
#include "backend/cuda/w4a16_gemv.h"
#include "nibble/arch.h"
#include "nibble/cuda.h"
#include "nibble/cuda_attention.h"
#include "nibble/cuda_model.h"
#include "nibble/dtype.h"
#include "nibble/model.h"
#include "nibble/sampler.h"

namespace nibble::cuda {
namespace {

int64_t pad8(int64_t v) { return (v + 7) / 8 * 8; }  // leading dimensions: the W4A16 kernels read 16-byte rows
unsigned blocks_of(int64_t n, int threads) { return static_cast<unsigned>((n + threads - 1) / threads); }

// Launches a kernel of forward_kernels.cuh with programmatic dependent launch
// (each starts with pdl_prologue(): the next launch overlaps its run, and it
// waits for the previous kernel before touching memory), in thread-block
// clusters of `cluster` blocks along x where that is above 0.
template <typename... KArgs, typename... Args>
void pdl_launch_cluster(void (*kernel)(KArgs...), unsigned cluster, dim3 grid, dim3 block, size_t smem,
                        cudaStream_t s, Args... args) {
  cudaLaunchAttribute attr[2] = {w4a16::pdl_attribute(), w4a16::cluster_attribute(cluster)};
  w4a16::launch_with(kernel, grid, block, smem, s, attr, cluster > 0 ? 2 : 1, args...);
}
template <typename... KArgs, typename... Args>
void pdl_launch(void (*kernel)(KArgs...), dim3 grid, dim3 block, size_t smem, cudaStream_t s, Args... args) {
  pdl_launch_cluster(kernel, 0, grid, block, smem, s, args...);
}
// The same as a cooperative launch (w4a16::cooperative_attribute): for kernels
// whose blocks meet at grid barriers.
template <typename... KArgs, typename... Args>
void pdl_launch_cooperative(void (*kernel)(KArgs...), dim3 grid, dim3 block, cudaStream_t s, Args... args) {
  cudaLaunchAttribute attr[2] = {w4a16::pdl_attribute(), w4a16::cooperative_attribute()};
  w4a16::launch_with(kernel, grid, block, 0, s, attr, 2, args...);
}

// argmax_kernel's state: the blocks' partial values and indices, then the ticket (zero between calls).
constexpr size_t kArgmaxStateBytes = kArgmaxBlocks * 16 + 16;
ArgmaxFeed argmax_feed(void* state, int32_t* step, int32_t* host, int host_slots) {
  auto* st = static_cast<unsigned char*>(state);
  ArgmaxFeed f;
  f.part_v = reinterpret_cast<float*>(st);
  f.part_i = reinterpret_cast<int64_t*>(st + kArgmaxBlocks * 8);
  f.ticket = reinterpret_cast<unsigned*>(st + kArgmaxBlocks * 16);
  f.step = step;
  f.host = host;
  f.host_slots = host_slots;
  return f;
}

// Whether the device is sm_90 or later (thread-block clusters: decode
// attention).
bool device_has_clusters() {
  static const bool sm90 = [] {
    int dev = 0, major = 0;
    return cudaGetDevice(&dev) == cudaSuccess &&
           cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, dev) == cudaSuccess && major >= 9;
  }();
  return sm90;
}

// One draw over logits[0 .. limit-1] (sample_kernels.cuh) at the position in
// step[1], fed to step (id, position + 1) and host[position % host_slots].
// `keys`: the slots where the head GEMV left every id's score key
// (HeadDraw::kSampleFiltered), or null: sample_keys_kernel takes them into
// st->keys. st->feed must hold {limit, kSample}; `grid` (zeroed once) serves
// top-k / top-p.
void enqueue_sample_draw(const float* logits, int64_t limit, const SampleArgs& a, SampleState* st, FilterGrid* grid,
                         unsigned long long* keys, int32_t* step, int32_t* host, int host_slots, cudaStream_t s) {
  const auto* pos = static_cast<const int32_t*>(step);
  if (keys == nullptr) {
    keys = st->keys;
    pdl_launch(sample_keys_kernel, kSampleKeysBlocks, kSampleKeysThreads, 0, s, logits, limit, a, pos, keys);
  }
  if (a.c.filters()) {
    const int sms = device_sm_count();
    NIBBLE_CHECK(limit <= filter_max_logits(sms),
                 "sampled decode: --top-k / --top-p on the GPU take at most {} logits on this device ({})",
                 filter_max_logits(sms), limit);
    const int blocks = filter_blocks(limit, sms), per = filter_per(limit, blocks);
    NIBBLE_CHECK(grid != nullptr, "sampled decode: top-k / top-p without their grid state");
    pdl_launch_cooperative(sample_filter_kernel, blocks, kFilterThreads, s, logits, limit, per, a, pos, keys, st, grid);
  }
  pdl_launch(argmax_keys_kernel, 1, 32, 0, s, keys, static_cast<const HeadDraw*>(&st->feed), step, host, host_slots);
}

SampleArgs sample_args(const SamplerConfig& c, uint64_t first_draw, int64_t first_position) {
  check_sampler_config(c);
  NIBBLE_CHECK(c.temperature > 0, "sampled decode: temperature {} (0 is greedy decode)", c.temperature);
  return SampleArgs{c, first_draw - static_cast<uint64_t>(first_position)};
}

// One matrix of an f32 linear (GpuOptions::f32_linears), held as stored and
// widened to f32 just before each GEMM: bf16 / fp16 / f32 values (`dtype`),
// or an int4 matrix's parts (group > 0: codes in `values`, scales, mins; bf16
// pairs for int4_asym, fp32 pairs (f32_params) for int4_asym_f32 and for int4_sym
// as int4_sym_as_asym_f32 gives it; a rival's linear in whichever of them holds it
// exactly, ModelSource::exact_format), dequantized there bit-identically to the
// CPU. Other formats are dequantized on the host at load and held as f32.
struct F32Matrix {
  int64_t rows = 0, cols = 0;
  DType dtype = DType::F32;
  int group = 0;
  bool f32_params = false;
  DeviceBuffer values, scales, mins;
  const void* shared = nullptr;  // f32 values owned elsewhere (a tied head: the embedding)
  const void* data() const { return shared != nullptr ? shared : values.get(); }
  bool as_f32() const { return group == 0 && dtype == DType::F32; }
  size_t bytes() const { return values.bytes() + scales.bytes() + mins.bytes(); }
  // Writes the f32 values [rows, cols] at out, on stream s.
  void widen(float* out, cudaStream_t s) const {
    const int64_t n = rows * cols;
    if (group > 0) {
      dequant_int4_asym_launch(static_cast<const uint8_t*>(values.get()), scales.get(), mins.get(), f32_params, rows,
                               cols, group, out, s);
      return;
    }
    if (n == 0) return;
    if (dtype == DType::F32)
      NIBBLE_CUDA_CHECK(cudaMemcpyAsync(out, data(), static_cast<size_t>(n) * 4, cudaMemcpyDeviceToDevice, s));
    else if (dtype == DType::BF16)
      widen_kernel<<<static_cast<unsigned>((n + 255) / 256), 256, 0, s>>>(
          static_cast<const __nv_bfloat16*>(data()), n, out);
    else
      widen_kernel<<<static_cast<unsigned>((n + 255) / 256), 256, 0, s>>>(static_cast<const __half*>(data()), n,
                                                                          out);
    NIBBLE_CUDA_CHECK(cudaGetLastError());
  }
};

// A linear on the device: packed (a registered kernel), dense bf16 (cuBLAS),
// or f32 (GpuOptions::f32_linears).
struct GpuLinear {
  int64_t out = 0, in = 0;
  DeviceLinear packed;
  DeviceBuffer dense, bias;  // dense: bf16 [out, in]; bias: f32 [out], empty when none
  const void* dense_shared = nullptr;  // bf16 [out, in] owned elsewhere (a tied head: the bf16 embedding)
  const void* dense_data() const { return dense_shared != nullptr ? dense_shared : dense.get(); }
  // f32: the matrices (rows concatenated in order) run through the fp32 GEMM
  // on f32 inputs (first rounded to bf16 with GpuOptions::bf16_inputs). One
  // f32 matrix is used in place; otherwise they are widened into `widen_to`
  // (the model's scratch, shared by every linear: one stream runs them).
  bool f32 = false;
  std::vector<F32Matrix> f32m;
  float* widen_to = nullptr;
  bool needs_widening() const { return f32 && !(f32m.size() == 1 && f32m[0].as_f32()); }
  const float* f32_weights(cudaStream_t s) const {
    if (!needs_widening()) return static_cast<const float*>(f32m[0].data());
    float* dst = widen_to;
    for (const F32Matrix& m : f32m) {
      m.widen(dst, s);
      dst += m.rows * m.cols;
    }
    return widen_to;
  }
  size_t bytes() const {
    size_t b = packed.kernel            ? packed.weight_bytes()
               : dense_shared != nullptr ? static_cast<size_t>(out * in) * 2
                                         : dense.bytes();
    for (const F32Matrix& m : f32m) b += m.bytes();
    return b + bias.bytes();
  }
};

const LinearKernel* kernel_of(const TensorMeta& meta) {
  return meta.format ? find_linear_kernel(meta.format->spec->family, meta.format->group_size) : nullptr;
}
// meta(name) with the format the kernels may take it in (ModelSource::exact_format: a rival's linear re-encoded
// without loss, where it can be); its parts come from exact_parts.
TensorMeta packed_meta(const ModelSource& src, const std::string& name) {
  TensorMeta m = src.meta(name);
  m.format = src.exact_format(name);
  return m;
}

// Tensors of one dtype and the same trailing dims, stacked along dim 0.
Tensor concat_rows(const std::vector<Tensor>& ts) {
  Shape shape = ts[0].shape();
  shape[0] = 0;
  for (const Tensor& t : ts) shape[0] += t.shape()[0];
  Tensor out = Tensor::empty(ts[0].dtype(), shape);
  auto* dst = static_cast<uint8_t*>(out.raw_mut());
  for (const Tensor& t : ts) {
    const Tensor c = t.contiguous();
    std::memcpy(dst, c.raw(), c.nbytes());
    dst += c.nbytes();
  }
  return out;
}

bool same_layout(const std::vector<Tensor>& a, const std::vector<Tensor>& b) {
  if (a.size() != b.size()) return false;
  for (size_t i = 0; i < a.size(); ++i) {
    if (a[i].dtype() != b[i].dtype() || a[i].shape().size() != b[i].shape().size() || a[i].shape().empty())
      return false;
    for (size_t d = 1; d < a[i].shape().size(); ++d)
      if (a[i].shape()[d] != b[i].shape()[d]) return false;
  }
  return true;
}

// A dense linear from f32 values, held as bf16 (cuBLAS).
GpuLinear dense_linear(const Tensor& w) {
  GpuLinear l;
  l.out = w.shape()[0];
  l.in = w.shape()[1];
  l.dense = upload_bf16(w);
  return l;
}

// One matrix of an f32 linear as the source stores it (F32Matrix).
F32Matrix f32_matrix(const ModelSource& src, const std::string& name) {
  const TensorMeta meta = src.meta(name);
  F32Matrix m;
  m.rows = meta.shape[0];
  m.cols = meta.shape[1];
  const std::optional<FormatChoice> f = src.exact_format(name);
  const std::string_view family = f ? f->spec->family : "";
  if (family == "int4_asym" || family == "int4_asym_f32" || family == "int4_sym") {
    std::vector<Tensor> parts = src.exact_parts(name);
    check_parts(*f, parts, m.rows, m.cols);
    if (family == "int4_sym") parts = int4_sym_as_asym_f32(parts, m.rows, m.cols, f->group_size);
    m.group = f->group_size;
    m.f32_params = parts[1].dtype() == DType::F32;  // int4_asym's are bf16
    m.values = upload(parts[0]);
    m.scales = upload(parts[1]);
    m.mins = upload(parts[2]);
    return m;
  }
  const Tensor t = src.load(name);
  const bool stored = !meta.format && (t.dtype() == DType::BF16 || t.dtype() == DType::F16 || t.dtype() == DType::F32);
  m.dtype = stored ? t.dtype() : DType::F32;
  m.values = stored ? upload(t) : upload(t.to_f32());
  return m;
}

// An f32 linear (GpuOptions::f32_linears) of the matrices `names`, rows
// concatenated in order (their columns agree).
GpuLinear f32_linear(const ModelSource& src, const std::vector<std::string>& names) {
  GpuLinear l;
  l.f32 = true;
  for (const std::string& n : names) {
    l.f32m.push_back(f32_matrix(src, n));
    l.in = l.f32m.back().cols;
    l.out += l.f32m.back().rows;
  }
  return l;
}

// f32: GpuOptions::f32_linears.
GpuLinear load_linear_gpu(const ModelSource& src, const std::string& prefix, bool f32) {
  const std::string wname = prefix + ".weight";
  const TensorMeta meta = f32 ? src.meta(wname) : packed_meta(src, wname);
  NIBBLE_CHECK(meta.shape.size() == 2, "{}: expected a matrix, found shape {}", wname, shape_str(meta.shape));
  GpuLinear l;
  l.out = meta.shape[0];
  l.in = meta.shape[1];
  if (f32)  // every format's f32 values, as the CPU forward computes with them
    l = f32_linear(src, {wname});
  else if (const LinearKernel* k = kernel_of(meta))
    l.packed = k->upload(src.exact_parts(wname), l.out, l.in, meta.format->group_size);
  else
    l.dense = upload_bf16(src.load(wname));  // any other format: dequantized once (the registry's fallback)
  if (src.contains(prefix + ".bias")) l.bias = upload(src.load(prefix + ".bias").to_f32());
  return l;
}

// Linears that read the same input (q, k, v; gate, up) as one linear whose rows
// are theirs concatenated in order: one launch instead of several, and the
// same values (each row keeps its own codes and group parameters, or its own
// bf16 weights). When the linears are not all packed for the same kernel and
// group size, or all dense, they stay separate (a mixed-format checkpoint).
std::vector<GpuLinear> load_linears(const ModelSource& src, const std::vector<std::string>& prefixes,
                                    bool f32) {
  std::vector<TensorMeta> metas;
  for (const std::string& p : prefixes) {
    metas.push_back(f32 ? src.meta(p + ".weight") : packed_meta(src, p + ".weight"));
    NIBBLE_CHECK(metas.back().shape.size() == 2, "{}.weight: expected a matrix, found shape {}", p,
                 shape_str(metas.back().shape));
  }
  const LinearKernel* k0 = f32 ? nullptr : kernel_of(metas[0]);
  bool fuse = prefixes.size() > 1;
  for (const TensorMeta& m : metas)
    fuse = fuse && m.shape[1] == metas[0].shape[1] && (f32 || kernel_of(m) == k0) &&
           (k0 == nullptr || m.format->group_size == metas[0].format->group_size);
  std::vector<std::vector<Tensor>> parts;
  if (fuse && k0 != nullptr)
    for (size_t i = 0; i < prefixes.size() && fuse; ++i) {
      parts.push_back(src.exact_parts(prefixes[i] + ".weight"));
      for (const Tensor& t : parts.back()) fuse = fuse && !t.shape().empty() && t.shape()[0] == metas[i].shape[0];
      fuse = fuse && same_layout(parts[0], parts.back());
    }
  std::vector<GpuLinear> out;
  if (!fuse) {
    for (const std::string& p : prefixes) out.push_back(load_linear_gpu(src, p, f32));
    return out;
  }
  GpuLinear l;
  if (k0 != nullptr) {
    std::vector<Tensor> fused;
    for (size_t j = 0; j < parts[0].size(); ++j) {
      std::vector<Tensor> column;
      for (const auto& p : parts) column.push_back(p[j]);
      fused.push_back(concat_rows(column));
    }
    l.in = metas[0].shape[1];
    for (const TensorMeta& m : metas) l.out += m.shape[0];
    l.packed = k0->upload(fused, l.out, l.in, metas[0].format->group_size);
  } else if (f32) {
    std::vector<std::string> names;
    for (const std::string& p : prefixes) names.push_back(p + ".weight");
    l = f32_linear(src, names);
  } else {
    std::vector<Tensor> ws;
    for (const std::string& p : prefixes) ws.push_back(src.load(p + ".weight").to_f32());
    l = dense_linear(concat_rows(ws));
  }
  bool any_bias = false;
  for (const std::string& p : prefixes) any_bias = any_bias || src.contains(p + ".bias");
  if (any_bias) {
    Tensor b = Tensor::zeros(DType::F32, {l.out});
    int64_t row = 0;
    for (size_t i = 0; i < prefixes.size(); ++i) {
      if (src.contains(prefixes[i] + ".bias")) {
        const Tensor bi = src.load(prefixes[i] + ".bias").to_f32().contiguous();
        NIBBLE_CHECK(bi.numel() == metas[i].shape[0], "{}.bias: expected {} values, found {}", prefixes[i],
                     metas[i].shape[0], bi.numel());
        std::memcpy(b.data_mut<float>() + row, bi.data<float>(), bi.nbytes());
      }
      row += metas[i].shape[0];
    }
    l.bias = upload(b);
  }
  out.push_back(std::move(l));
  return out;
}


// y[M, Σ out] (f32, leading dimension ldy) = x[M, in] (bf16, or f32 where
// every linear takes it; leading dimension ldx) · [W0; W1; ...]ᵀ + bias: each
// linear writes its own columns.
// round_in: f32 linears round their inputs to bf16 first (GpuOptions::bf16_inputs).
// aq: f32 inputs are first fake-quantized by it, once for all the linears
// (GpuOptions::act_quant), in place: on the device (act_quant.h), or through
// the host for a quantizer with no device row.
void linears_forward(const GpuLinear* ls, size_t count, const void* x, Act act, int64_t M, int64_t ldx, float* y,
                     int64_t ldy, cudaStream_t s, bool round_in, const ActQuantSpec* aq = nullptr) {
  if (aq != nullptr && count > 0) {
    NIBBLE_CHECK(act == Act::F32, "GpuModel: simulated activation quantization needs f32 inputs");
    const int64_t in = ls[0].in;
    auto* xf = static_cast<float*>(const_cast<void*>(x));
    if (const ActQuantDevice dev = find_act_quant_device(*aq)) {
      dev(xf, M, in, ldx, s);
    } else {  // a quantizer with no device row: a round trip through the host
      std::vector<float> host(static_cast<size_t>(M * in));
      NIBBLE_CUDA_CHECK(cudaMemcpy2DAsync(host.data(), in * 4, xf, ldx * 4, in * 4, M, cudaMemcpyDeviceToHost, s));
      NIBBLE_CUDA_CHECK(cudaStreamSynchronize(s));
      aq->apply(host.data(), M, in);
      NIBBLE_CUDA_CHECK(cudaMemcpy2DAsync(xf, ldx * 4, host.data(), in * 4, in * 4, M, cudaMemcpyHostToDevice, s));
      NIBBLE_CUDA_CHECK(cudaStreamSynchronize(s));  // the host copy goes out of scope
    }
  }
  for (size_t i = 0; i < count; ++i) {
    const GpuLinear& l = ls[i];
    // Programmatic dependent launch: the W4A16 kernel streams its weights in
    // before it waits for the kernel that writes x (and only then writes y).
    if (l.packed.kernel != nullptr) {
      l.packed.kernel->gemm(l.packed, x, M, ldx, y, ldy, act, true, s, true);
    } else if (l.f32) {
      NIBBLE_CHECK(act == Act::F32, "GpuModel: an f32 linear was given bf16 inputs");
      auto* xf = static_cast<float*>(const_cast<void*>(x));
      if (round_in) {  // in place: the buffer is this linear's input alone, and rounding twice changes nothing
        pdl_launch(round_bf16_kernel, blocks_of(M * l.in, 256), 256, 0, s, xf, M, l.in, ldx);
        NIBBLE_CUDA_CHECK(cudaGetLastError());
      }
      gemm_f32_cublas(l.f32_weights(s), l.out, l.in, xf, M, ldx, y, ldy, s);
    } else {
      NIBBLE_CHECK(act == Act::BF16, "GpuModel: a bf16 (cuBLAS) linear was given f32 inputs");
      gemm_bf16_cublas(l.dense_data(), l.out, l.in, x, M, ldx, y, ldy, s, true);
    }
    if (l.bias.bytes() > 0) {
      pdl_launch(bias_add_kernel, blocks_of(M * l.out, 256), 256, 0, s, y, ldy, static_cast<const float*>(l.bias.get()),
                 M, l.out);
      NIBBLE_CUDA_CHECK(cudaGetLastError());
    }
    y += l.out;
  }
}
void linears_forward(const std::vector<GpuLinear>& ls, const void* x, Act act, int64_t M, int64_t ldx, float* y,
                     int64_t ldy, cudaStream_t s, bool round_in, const ActQuantSpec* aq = nullptr) {
  linears_forward(ls.data(), ls.size(), x, act, M, ldx, y, ldy, s, round_in, aq);
}

// Whether a linear takes f32 inputs for one token.
bool takes_f32(const GpuLinear& l) {
  return l.packed.kernel != nullptr && l.packed.kernel->single_token_f32 != nullptr &&
         l.packed.kernel->single_token_f32(l.packed);
}

// The group size of the prepared single-token activation (w4a16_prep.cuh)
// every linear in `ls` takes, or 0 where they do not all take the same one.
int prepared_group(const GpuLinear* ls, size_t count) {
  int g = 0;
  for (size_t i = 0; i < count; ++i) {
    if (!takes_f32(ls[i]) || ls[i].packed.kernel->gemv_prepared == nullptr) return 0;
    if (g != 0 && ls[i].packed.group_size != g) return 0;
    g = ls[i].packed.group_size;
  }
  return g;
}

// Decode's GEMVs gathered for LinearKernel::gemv_chain (GpuOptions::
// chain_decode): consecutive GEMVs of one kernel and group size become one
// persistent launch, sent when the chain is full or before any other kernel
// (flush).
struct GemvChainer {
  bool on = false;
  unsigned* sync = nullptr;
  cudaStream_t stream = nullptr;
  std::vector<GemvCall> calls;
  // Takes the call (true), or sends what it holds and leaves the call to the caller (false).
  bool add(const GpuLinear& l, const void* prepared, size_t bytes, float* y, const GemvFusion* f) {
    const DeviceLinear& w = l.packed;
    if (!on || w.kernel == nullptr || w.kernel->gemv_chain == nullptr || !w4a16_gemv_chain_applies(w.group_size) ||
        l.bias.bytes() > 0 || w.cols > kGemvChainMaxCols || (f != nullptr && f->fuses_argmax())) {
      flush();
      return false;
    }
    if (!calls.empty() && (calls[0].w->kernel != w.kernel || calls[0].w->group_size != w.group_size)) flush();
    GemvCall c;
    c.w = &w;
    c.prepared = prepared;
    c.prepared_bytes = bytes;
    c.y = y;
    if (f != nullptr) c.fuse = *f;
    calls.push_back(c);
    if (calls.size() == static_cast<size_t>(kGemvChainMax)) flush();
    return true;
  }
  void flush() {
    if (calls.empty()) return;
    calls[0].w->kernel->gemv_chain(calls.data(), static_cast<int>(calls.size()), sync, stream, true);
    calls.clear();
  }
};

// Decode: y[1, Σ out] = the prepared activation · [W0; W1; ...]ᵀ + bias.
// `after_norm`: the kernel before is the one-block RMSNorm (the GEMV may
// prefetch deeper while it runs; LinearKernel::gemv_prepared). `in_norm`:
// the input is an RMSNorm's z whose 1/rms each GEMV applies (GemvFusion's
// input side; the bias is added after).
// `chain` (or null): where it takes the GEMVs, they join its chain.
void linears_prepared(const GpuLinear* ls, size_t count, const DeviceBuffer& prepared, float* y, cudaStream_t s,
                      bool after_norm = false, const GemvFusion* in_norm = nullptr, GemvChainer* chain = nullptr) {
  for (size_t i = 0; i < count; ++i) {
    const GpuLinear& l = ls[i];
    if (chain != nullptr && chain->add(l, prepared.get(), prepared.bytes(), y, in_norm)) {
      y += l.out;
      continue;
    }
    l.packed.kernel->gemv_prepared(l.packed, prepared.get(), prepared.bytes(), y, s, true, after_norm && i == 0,
                                   in_norm);
    if (l.bias.bytes() > 0) {
      pdl_launch(bias_add_kernel, blocks_of(l.out, 256), 256, 0, s, y, l.out, static_cast<const float*>(l.bias.get()),
                 1, l.out);
      NIBBLE_CUDA_CHECK(cudaGetLastError());
    }
    y += l.out;
  }
}

struct GpuLayer {
  DeviceBuffer input_norm, post_norm, q_norm, k_norm;  // f32 (q/k norms: qwen3 only)
  std::vector<GpuLinear> qkv, gate_up;                 // one fused linear each, or the separate ones
  GpuLinear o, down;
  int64_t window = 0;
  bool f32_qkv = false, f32_o = false, f32_gate_up = false, f32_down = false;  // decode inputs (GpuModel::Impl)
  // Decode: the group size of the prepared activation the norm / SiLU kernel
  // writes for these linears directly, 0 where they do not take one.
  int prep_qkv = 0, prep_o = 0, prep_gate_up = 0, prep_down = 0;
  // The inputs (by LinearInput) GpuOptions::act_quant leaves exact (DecoderLayer::exact_inputs).
  std::array<bool, 4> exact_in{};
  const ActQuantSpec* act_quant(const ActQuantSpec* aq, LinearInput which) const {
    return exact_in[static_cast<size_t>(which)] ? nullptr : aq;
  }
};

// Device scratch for `rows` tokens. tokens holds the ids, then (decode) the
// position of the first token.
struct Scratch {
  int64_t rows = 0;
  DeviceBuffer tokens, x, xn, qkv, qf, att, tmp, gu, h, logits;
  DeviceBuffer xq, oq, hq;  // decode: prepared activations of width hidden, heads·head_dim, intermediate
  // Decode with GemvFusion: the fused outputs' f32 stage (max(hidden,
  // intermediate)), the residual's sums of squares per 16 rows, the tickets,
  // and the mailbox (8 bytes per output) that replaces the tickets wherever a
  // GEMV's grid is resident at once.
  DeviceBuffer stage, ss, tickets, mail;
  DeviceBuffer chain_sync;  // decode: LinearKernel::gemv_chain's counters (zero between calls)
};

}  // namespace

struct GpuModel::Impl {
  ModelConfig c;
  GpuOptions opts;
  int64_t max_tokens = 0, len = 0;
  int64_t ldD = 0, ldQ = 0, ldF = 0;  // linear inputs: rows padded to 8 elements
  // Decode feeds a linear f32 inputs (the norm, attention or SiLU before it
  // writes f32) where it takes them: no rounding of its input to bf16.
  bool f32_head = false;
  int prep_head = 0;
  // Decode through GemvFusion (GpuOptions::fuse_decode, where the model allows it).
  bool fuse_decode = false;
  bool chain_decode = false;  // ... with its GEMVs in chains (GpuOptions::chain_decode)
  // Decode attention split over the keys (split_attention) when the row-wise
  // kernel's shared memory cannot hold the cache; 0: the row-wise kernel.
  int attn_splits = 0;
  DeviceBuffer attn_part;
  // Decode attention from position kv_shared_from on (-1: never) through
  // kv_shared_attention, which reads each kv head's cache rows once for all of
  // its query heads; before it, decode_attention (faster at short lengths).
  // With a graph, the step is captured once per kernel (decode_graph_long).
  int64_t kv_shared_from = -1;
  bool kv_shared_now = false;  // what enqueue launches
  DeviceBuffer kv_shared_scratch;
  DeviceBuffer attn_tc;  // prefill on tensor cores (flash_attention_tc): bf16 q, and k, v of an f32 cache
  // The embedding table as stored (f32, bf16 or fp16; other formats as f32);
  // f32 with f32_linears and a tied head, which uses it in place.
  DeviceBuffer embed, final_norm, inv_freq;
  DType embed_dtype = DType::F32;
  EmbedTable embed_table() const { return EmbedTable{embed.get(), embed_dtype}; }
  GpuLinear head;
  DeviceBuffer f32_widen;  // f32 linears: the matrix widened for the current GEMM (GpuLinear::widen_to)
  std::vector<GpuLayer> layers;
  std::vector<DeviceBuffer> kcache, vcache;  // per layer, [max_tokens, KV*hd] of opts.kv_dtype
  Scratch s;    // prefill, grows to the largest n seen
  Scratch dec;  // decode: one token, never reallocated (the graph holds its pointers)
  cudaStream_t stream = nullptr;
  int32_t* host_step = nullptr;  // pinned {token, position}: a decode step's input from the host
  cudaGraphExec_t decode_graph = nullptr, decode_graph_long = nullptr;
  // Greedy decode (argmax_kernel): the blocks' partial results and ticket,
  // and the chosen ids, written by the device into mapped pinned memory at
  // slot position % kGreedySlots, each step followed by an event.
  static constexpr int kGreedySlots = 8;
  static constexpr int kGreedyLookahead = 3;  // steps enqueued ahead of the one the host waits for
  DeviceBuffer argmax_state;
  // Or, where head_argmax() holds, the head GEMV itself takes the keys
  // (GemvFusion::argmax_*: greedy or sampled) and argmax_keys_kernel, the
  // step's last kernel, feeds the next step: the key slots, then the
  // HeadDraw, whose limit is 0 outside greedy_run, so that other decode
  // steps only write the logits.
  struct HeadState {
    unsigned long long keys[GemvFusion::kArgmaxKeys];
    HeadDraw draw;
  };
  DeviceBuffer head_state_buf;
  HeadState* head_state() const { return static_cast<HeadState*>(head_state_buf.get()); }
  unsigned long long* head_argmax_keys() const { return head_state()->keys; }
  // Pinned: what greedy_run copies in, the head's HeadDraw and the sample feed's.
  HeadDraw* host_draw = nullptr;
  // Sampled decode (enqueue_sample_draw).
  DeviceBuffer sample_state_buf;
  SampleState* sample_state() const { return static_cast<SampleState*>(sample_state_buf.get()); }
  DeviceBuffer filter_grid_buf;  // top-k / top-p's grid state, from the first run that filters
  FilterGrid* filter_grid() {
    if (filter_grid_buf.get() == nullptr) {
      filter_grid_buf = DeviceBuffer(sizeof(FilterGrid));
      NIBBLE_CUDA_CHECK(cudaMemsetAsync(filter_grid_buf.get(), 0, filter_grid_buf.bytes(), stream));
    }
    return static_cast<FilterGrid*>(filter_grid_buf.get());
  }
  int32_t* greedy_host = nullptr;
  int32_t* greedy_host_dev = nullptr;
  cudaEvent_t greedy_done[kGreedySlots] = {};

  ~Impl() {
    if (decode_graph != nullptr) cudaGraphExecDestroy(decode_graph);
    if (decode_graph_long != nullptr) cudaGraphExecDestroy(decode_graph_long);
    for (cudaEvent_t e : greedy_done)
      if (e != nullptr) cudaEventDestroy(e);
    if (stream != nullptr) cudaStreamDestroy(stream);
    if (host_step != nullptr) cudaFreeHost(host_step);
    if (greedy_host != nullptr) cudaFreeHost(greedy_host);
    if (host_draw != nullptr) cudaFreeHost(host_draw);
  }

  Scratch make_scratch(int64_t n) const {
    const int64_t H = c.num_heads, KV = c.num_kv_heads, hd = c.head_dim, D = c.hidden_size, F = c.intermediate_size;
    Scratch t;
    t.rows = n;
    t.tokens = DeviceBuffer((n + 1) * 4);  // the ids; decode: {token, position}
    t.x = DeviceBuffer(n * D * 4);
    t.xn = DeviceBuffer(n * ldD * 4);  // bf16, or f32 in decode
    t.qkv = DeviceBuffer(n * (H + 2 * KV) * hd * 4);
    t.qf = DeviceBuffer(n * H * hd * 4);
    t.att = DeviceBuffer(n * ldQ * 4);
    t.tmp = DeviceBuffer(n * D * 4);
    t.gu = DeviceBuffer(n * 2 * F * 4);
    t.h = DeviceBuffer(n * ldF * 4);
    t.logits = DeviceBuffer(n * c.vocab_size * 4);
    if (n == 1) {
      t.xq = DeviceBuffer(w4a16::prep_bytes(D));
      t.oq = DeviceBuffer(w4a16::prep_bytes(c.num_heads * c.head_dim));
      t.hq = DeviceBuffer(w4a16::prep_bytes(F));
      const int64_t wide = std::max(D, F);
      t.stage = DeviceBuffer(wide * 4);
      t.ss = DeviceBuffer((D + w4a16::kTileRows - 1) / w4a16::kTileRows * 4);
      t.tickets = DeviceBuffer((wide + w4a16::kPrepInputs - 1) / w4a16::kPrepInputs * 4);
      NIBBLE_CUDA_CHECK(cudaMemset(t.tickets.get(), 0, t.tickets.bytes()));
      t.mail = DeviceBuffer(wide * 8);
      NIBBLE_CUDA_CHECK(cudaMemset(t.mail.get(), 0, t.mail.bytes()));
      t.chain_sync = DeviceBuffer(kGemvChainSync * sizeof(unsigned));
      NIBBLE_CUDA_CHECK(cudaMemset(t.chain_sync.get(), 0, t.chain_sync.bytes()));
    }
    return t;
  }

  // Enqueues the forward of n tokens (ids already in sc.tokens) at positions
  // p0 .. p0+n-1 on the stream; p0_dev, when set, is read instead of p0 by
  // every kernel (decode). Logits of all rows or the last go to sc.logits.
  // att_positions: the keys the row-wise attention kernel's shared memory is
  // sized for (decode: the whole cache, so that one graph serves every step).
  void enqueue(Scratch& sc, int64_t n, int64_t p0, const int32_t* p0_dev, bool all_logits, int64_t att_positions) {
    const int64_t D = c.hidden_size, H = c.num_heads, KV = c.num_kv_heads, hd = c.head_dim, F = c.intermediate_size;
    const int64_t QKV = (H + 2 * KV) * hd;
    auto* x = static_cast<float*>(sc.x.get());
    const float eps = static_cast<float>(c.rms_norm_eps), scale = 1.0f / std::sqrt(static_cast<float>(hd));
    // The linears' inputs as the kernels write them: f32 (decode, where the
    // linears take it) or bf16.
    const bool one = n == 1;
    // f32 linears (GpuOptions::f32_linears) take f32 inputs at every n;
    // otherwise decode's where `decode_f32` says so.
    auto f32_in = [&](bool decode_f32) { return opts.f32_linears || (one && decode_f32); };
    const bool round_in = opts.f32_linears && opts.bf16_inputs;
    auto act = [](bool f32) { return f32 ? Act::F32 : Act::BF16; };
    auto norm = [&](unsigned rows, float* xr, const float* y, const float* w, void* out, bool f32) {
      if (f32)
        pdl_launch(add_rmsnorm_kernel<float>, rows, kNormThreads, 0, stream, xr, y, D, w, eps, static_cast<float*>(out),
                   ldD);
      else
        pdl_launch(add_rmsnorm_kernel<bf16>, rows, kNormThreads, 0, stream, xr, y, D, w, eps, static_cast<bf16*>(out),
                   ldD);
    };
    void* xn = sc.xn.get();
    auto* qkv = static_cast<float*>(sc.qkv.get());
    auto* qf = static_cast<float*>(sc.qf.get());
    void* att = sc.att.get();
    auto* tmp = static_cast<float*>(sc.tmp.get());
    auto* gu = static_cast<float*>(sc.gu.get());
    void* h = sc.h.get();
    auto f32p = [](const DeviceBuffer& b) { return b.bytes() ? static_cast<const float*>(b.get()) : nullptr; };
    const unsigned rows_n = static_cast<unsigned>(n);
    // Decode through GemvFusion: the GEMV after a norm applies its 1/rms
    // (in_norm); o and down add to the residual x and write the next norm's
    // z (residual_out); gate|up writes SiLU(gate)·up.
    const bool fz = one && fuse_decode;
    GemvFusion in_norm;
    in_norm.in_ss = static_cast<const float*>(sc.ss.get());
    in_norm.in_parts = static_cast<int>((D + w4a16::kTileRows - 1) / w4a16::kTileRows);
    in_norm.in_width = D;
    in_norm.eps = eps;
    auto fused_out = [&](GemvFusion& f, const DeviceBuffer& prep, int group) {
      f.prep_out = prep.get();
      f.prep_bytes = prep.bytes();
      f.prep_group = group;
      f.stage = static_cast<float*>(sc.stage.get());
      f.tickets = static_cast<unsigned*>(sc.tickets.get());
      f.mail = static_cast<unsigned long long*>(sc.mail.get());  // tickets where a grid is not one wave
    };
    auto residual_out = [&](const DeviceBuffer& norm_w, int group) {
      GemvFusion f;
      f.residual = x;
      f.norm_w = f32p(norm_w);
      f.ss_out = static_cast<float*>(sc.ss.get());
      fused_out(f, sc.xq, group);
      return f;
    };
    GemvChainer chain;
    chain.on = fz && chain_decode;
    chain.sync = fz ? static_cast<unsigned*>(sc.chain_sync.get()) : nullptr;
    chain.stream = stream;
    auto gemv_fused = [&](const GpuLinear& l, const DeviceBuffer& prep, const GemvFusion& f) {
      if (!chain.add(l, prep.get(), prep.bytes(), nullptr, &f))
        l.packed.kernel->gemv_prepared(l.packed, prep.get(), prep.bytes(), nullptr, stream, true, false, &f);
    };

    // The step's first kernel waits for everything before it (no programmatic
    // launch): the kernels after it may then read the token and the position
    // before their own wait (decode_attention_kernel does).
    // Decode with a prepared q|k|v input: the embedding and layer 0's input
    // norm in one kernel.
    const bool embed_norm = one && !layers.empty() && layers[0].prep_qkv;
    if (embed_norm)
      embed_rmsnorm_prep_kernel<<<1, kNormThreads, 0, stream>>>(
          static_cast<const int32_t*>(sc.tokens.get()), embed_table(), x, D,
          f32p(layers[0].input_norm), eps, sc.xq.get(), layers[0].prep_qkv);
    else
      embed_kernel<<<rows_n, 256, 0, stream>>>(static_cast<const int32_t*>(sc.tokens.get()), embed_table(), x, D);
    NIBBLE_CUDA_CHECK(cudaGetLastError());
    for (size_t l = 0; l < layers.size(); ++l) {
      const GpuLayer& L = layers[l];
      // x += the previous layer's MLP output (none before layer 0), then the input norm.
      if (fz && l > 0) {  // x and the norm's z: the previous layer's down GEMV
        linears_prepared(L.qkv.data(), L.qkv.size(), sc.xq, qkv, stream, false, &in_norm, &chain);
      } else if (one && L.prep_qkv) {
        if (l > 0)  // layer 0: embed_rmsnorm_prep_kernel did it
          pdl_launch(add_rmsnorm_prep_kernel, 1, kNormThreads, 0, stream, x, tmp, D, f32p(L.input_norm), eps,
                     sc.xq.get(), L.prep_qkv);
        linears_prepared(L.qkv.data(), L.qkv.size(), sc.xq, qkv, stream, true);
      } else {
        norm(rows_n, x, l == 0 ? nullptr : tmp, f32p(L.input_norm), xn, f32_in(L.f32_qkv));
        linears_forward(L.qkv, xn, act(f32_in(L.f32_qkv)), n, ldD, qkv, QKV, stream, round_in,
                        L.act_quant(opts.act_quant, LinearInput::QKV));
      }
      void* kc = kcache[l].get();
      void* vc = vcache[l].get();
      const bool kv_bf16 = opts.kv_dtype == DType::BF16;
      // Decode: the row-wise attention kernel does the RoPE step itself (one launch less).
      const bool split = one && attn_splits > 0 && !kv_shared_now;
      const bool fused_rope = one && !split && hd <= kAttentionThreads / 2;
      chain.flush();  // the GEMVs before attention
      if (!fused_rope) {
        auto rope = [&](auto kv_t) {
          using KvT = decltype(kv_t);
          pdl_launch(qkv_rope_kernel<KvT>, static_cast<unsigned>(n * (H + KV)), 32, hd * 4, stream, qkv,
                     qkv + H * hd, qkv + (H + KV) * hd, QKV, f32p(L.q_norm), f32p(L.k_norm), eps, f32p(inv_freq), H,
                     KV, hd, p0, p0_dev, qf, static_cast<KvT*>(kc), static_cast<KvT*>(vc));
        };
        kv_bf16 ? rope(bf16{}) : rope(float{});
      }
      AttentionArgs a;
      if (fused_rope) {
        a.rope_qkv = qkv;
        a.rope_q_norm = f32p(L.q_norm);
        a.rope_k_norm = f32p(L.k_norm);
        a.rope_inv_freq = f32p(inv_freq);
        a.rope_eps = eps;
      }
      a.q = qf;
      a.k = kc;
      a.v = vc;
      a.kv_bf16 = kv_bf16;
      a.out = att;
      a.out_f32 = f32_in(L.f32_o);
      if (one && L.prep_o) {
        a.prepared = sc.oq.get();
        a.prep_group = L.prep_o;
      }
      a.ldo = ldQ;
      a.n = n;
      a.p0 = p0;
      a.heads = H;
      a.kv_heads = KV;
      a.head_dim = hd;
      a.window = L.window;
      a.scale = scale;
      if (n > 1 && opts.flash_prefill && opts.tensor_core_prefill && !opts.f32_linears &&
          flash_attention_tc_supported(a)) {
        const size_t need = flash_attention_tc_scratch(a);
        if (attn_tc.bytes() < need) attn_tc = DeviceBuffer(need);
        flash_attention_tc(a, attn_tc.get(), stream);
      } else if (n > 1 && opts.flash_prefill && flash_attention_supported(hd))
        flash_attention(a, stream);
      else if (split)
        split_attention(a, p0_dev, attn_splits, attn_part.get(), stream);
      else if (fused_rope && kv_shared_now)
        kv_shared_attention(a, p0_dev, kv_shared_scratch.get(), stream);
      else if (fused_rope && decode_attention_supported(hd))
        decode_attention(a, p0_dev, att_positions, stream);
      else
        rowwise_attention(a, p0_dev, att_positions, stream);
      if (fz) {
        if (!L.prep_o)  // the attention kernel wrote f32 rows; prepare them here
          L.o.packed.kernel->prepare(L.o.packed, att, Act::F32, sc.oq.get(), sc.oq.bytes(), stream, true);
        gemv_fused(L.o, sc.oq, residual_out(L.post_norm, L.prep_gate_up));
      } else if (one && L.prep_o)
        linears_prepared(&L.o, 1, sc.oq, tmp, stream);
      else
        linears_forward(&L.o, 1, att, act(f32_in(L.f32_o)), n, ldQ, tmp, D, stream, round_in,
                        L.act_quant(opts.act_quant, LinearInput::O));
      if (fz) {
        GemvFusion f = in_norm;
        f.swiglu = true;
        fused_out(f, sc.hq, L.prep_down);
        gemv_fused(L.gate_up[0], sc.xq, f);
      } else if (one && L.prep_gate_up) {
        pdl_launch(add_rmsnorm_prep_kernel, 1, kNormThreads, 0, stream, x, tmp, D, f32p(L.post_norm), eps, sc.xq.get(),
                                                                L.prep_gate_up);
        linears_prepared(L.gate_up.data(), L.gate_up.size(), sc.xq, gu, stream, true);
      } else {
        norm(rows_n, x, tmp, f32p(L.post_norm), xn, f32_in(L.f32_gate_up));
        linears_forward(L.gate_up, xn, act(f32_in(L.f32_gate_up)), n, ldD, gu, 2 * F, stream, round_in,
                        L.act_quant(opts.act_quant, LinearInput::GateUp));
      }
      const bool last = l + 1 == layers.size();
      if (fz && (!last || prep_head)) {  // x += down's output, then the next norm's z
        gemv_fused(L.down, sc.hq,
                   last ? residual_out(final_norm, prep_head) : residual_out(layers[l + 1].input_norm,
                                                                             layers[l + 1].prep_qkv));
      } else if (fz) {
        linears_prepared(&L.down, 1, sc.hq, tmp, stream, false, nullptr, &chain);
      } else if (one && L.prep_down) {
        pdl_launch(silu_mul_prep_kernel, blocks_of(w4a16::prep_warps(F) * 32, 256), 256, 0, stream, gu, gu + F, F,
                   sc.hq.get(), L.prep_down);
        NIBBLE_CUDA_CHECK(cudaGetLastError());
        linears_prepared(&L.down, 1, sc.hq, tmp, stream);
      } else {
        if (f32_in(L.f32_down))
          pdl_launch(silu_mul_kernel<float>, blocks_of(n * F, 256), 256, 0, stream, gu, gu + F, 2 * F,
                     static_cast<float*>(h), ldF, n, F);
        else
          pdl_launch(silu_mul_kernel<bf16>, blocks_of(n * F, 256), 256, 0, stream, gu, gu + F, 2 * F,
                     static_cast<bf16*>(h), ldF, n, F);
        NIBBLE_CUDA_CHECK(cudaGetLastError());
        linears_forward(&L.down, 1, h, act(f32_in(L.f32_down)), n, ldF, tmp, D, stream, round_in,
                        L.act_quant(opts.act_quant, LinearInput::Down));
      }
    }
    // The last MLP output joins only the rows whose logits are wanted (the
    // other rows of x are not read again).
    const int64_t rows = all_logits ? n : 1, r0 = n - rows;
    // Decode's head takes greedy decode's argmax where it can (head_argmax).
    const bool head_am = &sc == &dec && head_argmax();
    auto with_argmax = [&](GemvFusion f) {
      if (head_am) {
        f.argmax_draw = &head_state()->draw;
        f.argmax_position = static_cast<const int32_t*>(dec.tokens.get()) + 1;
        f.argmax_keys = head_argmax_keys();
      }
      return f;
    };
    if (fz && prep_head) {
      const GemvFusion hf = with_argmax(in_norm);
      linears_prepared(&head, 1, sc.xq, static_cast<float*>(sc.logits.get()), stream, false, &hf, &chain);
      chain.flush();
    } else {
      chain.flush();
      if (one && prep_head) {
        pdl_launch(add_rmsnorm_prep_kernel, 1, kNormThreads, 0, stream, x, tmp, D, f32p(final_norm), eps, sc.xq.get(),
                   prep_head);
        const GemvFusion hf = with_argmax(GemvFusion{});  // none: the plain GEMV
        linears_prepared(&head, 1, sc.xq, static_cast<float*>(sc.logits.get()), stream, false, &hf);
      } else {
        norm(static_cast<unsigned>(rows), x + r0 * D, tmp + r0 * D, f32p(final_norm), xn, f32_in(f32_head));
        linears_forward(&head, 1, xn, act(f32_in(f32_head)), rows, ldD, static_cast<float*>(sc.logits.get()),
                        c.vocab_size, stream, round_in);
      }
    }
    if (head_am)  // the keys into the next step's token (greedy_run's steps; a no-op where the limit is 0)
      pdl_launch(argmax_keys_kernel, 1, 32, 0, stream, head_argmax_keys(),
                 static_cast<const HeadDraw*>(&head_state()->draw), static_cast<int32_t*>(dec.tokens.get()),
                 greedy_host_dev, kGreedySlots);
    NIBBLE_CUDA_CHECK(cudaGetLastError());
  }

  // Whether decode's head GEMV takes greedy decode's argmax (in place of
  // argmax_kernel after the step): a packed head with a prepared input, no
  // bias (the argmax must see the final logits) and no chain. On an H100,
  // 8B shape: step span 1677.4 -> 1668.2 us, `nibble run` 598.7-598.8 ->
  // 601.2-601.4 tok/s (docs/CUDA.md "Session 69").
  bool head_argmax() const {
    return prep_head != 0 && head.bias.bytes() == 0 && !chain_decode;
  }

  // Whether decode may run through GemvFusion (GpuOptions::fuse_decode): every
  // layer's int4 linears take prepared inputs and have the kernel's prepare
  // step (o, where attention does not write its prepared input), o, gate|up
  // and down have no bias, gate|up is one linear of 2F rows with F a multiple
  // of 16, the norm's sums of squares fit GemvFusion::kMaxParts, and groups
  // of 32 are all or none of the prepared inputs (a GEMV writes a prepared
  // output in groups of 32 only where its own groups are 32: prep_warp_store).
  bool fusion_applies() const {
    const int64_t D = c.hidden_size, F = c.intermediate_size;
    if (!norm_prep_supported(D) || (D + w4a16::kTileRows - 1) / w4a16::kTileRows > GemvFusion::kMaxParts) return false;
    bool with32 = prep_head == 32, other = prep_head != 0 && prep_head != 32;  // the groups of the prepared inputs
    for (const GpuLayer& L : layers) {
      if (!L.prep_qkv || !L.prep_gate_up || !L.prep_down || L.gate_up.size() != 1) return false;
      const GpuLinear &gu = L.gate_up[0], &o = L.o, &down = L.down;
      if (gu.out != 2 * F || F % w4a16::kTileRows != 0) return false;
      if (gu.bias.bytes() || o.bias.bytes() || down.bias.bytes()) return false;
      const int o_group = prepared_group(&o, 1);
      if (o_group == 0 || (!L.prep_o && o.packed.kernel->prepare == nullptr)) return false;
      for (const int g : {L.prep_qkv, L.prep_gate_up, L.prep_down, o_group}) (g == 32 ? with32 : other) = true;
    }
    return !(with32 && other);
  }

  // forward()'s argument checks: ids in the vocabulary, room in the cache.
  void check_tokens(const std::vector<int32_t>& tokens) const;
  // Copies {token, position} in as the next decode step's input (pinned, async).
  void set_step_input(int32_t token, int64_t position) {
    host_step[0] = token;
    host_step[1] = static_cast<int32_t>(position);
    NIBBLE_CUDA_CHECK(cudaMemcpyAsync(dec.tokens.get(), host_step, 8, cudaMemcpyHostToDevice, stream));
  }
  // One decode step for `token` at position len (graph or eager), len + 1.
  void enqueue_step(int32_t token);
  // The decode step over dec.tokens as it stands (graph or eager), for
  // position `pos` (which attention kernel: kv_shared_from).
  void launch_step(int64_t pos) {
    const bool lng = kv_shared_from >= 0 && pos >= kv_shared_from;
    if (decode_graph != nullptr) {
      NIBBLE_CUDA_CHECK(cudaGraphLaunch(lng ? decode_graph_long : decode_graph, stream));
    } else {
      kv_shared_now = lng;
      enqueue_decode();
    }
  }
  // After a step: its greedy id among 0 .. limit-1 into dec.tokens (the next
  // step's token and position) and the mapped slot of its position.
  void enqueue_argmax(int64_t limit) {
    const ArgmaxFeed f =
        argmax_feed(argmax_state.get(), static_cast<int32_t*>(dec.tokens.get()), greedy_host_dev, kGreedySlots);
    pdl_launch(argmax_kernel, kArgmaxBlocks, kArgmaxThreads, 0, stream, static_cast<const float*>(dec.logits.get()),
               limit, f);
  }
  // After a step: its sampled id among 0 .. limit-1 (sample_kernels.cuh) fed
  // as enqueue_argmax feeds the greedy one; sample_state()->feed must hold
  // {limit, kSample}. `head_keys`: the head GEMV took every id's score key
  // (HeadDraw::kSampleFiltered).
  void enqueue_sample(int64_t limit, const SampleArgs& a, bool head_keys) {
    enqueue_sample_draw(static_cast<const float*>(dec.logits.get()), limit, a, sample_state(),
                        a.c.filters() ? filter_grid() : nullptr, head_keys ? head_argmax_keys() : nullptr,
                        static_cast<int32_t*>(dec.tokens.get()), greedy_host_dev, kGreedySlots, stream);
  }
  // Greedy (sample null) or sampled steps back to back (greedy_run below).
  int64_t greedy_run(int32_t token, int64_t limit, int64_t steps, const std::function<bool(int32_t)>& on_token,
                     const SampleArgs* sample = nullptr);
  // The decode step over `dec`: token and position from dec.tokens[0], [1].
  void enqueue_decode() {
    enqueue(dec, 1, 0, static_cast<const int32_t*>(dec.tokens.get()) + 1, false, max_tokens);
  }

  // Runs the decode step once outside a graph (module loading, the cuBLAS
  // handle and workspace, kernel attributes: nothing of the kind may happen
  // during capture), then captures it. The warm-up writes cache row 0, which
  // is harmless: every row is written by its own step before any step reads it.
  void capture_decode_graph() {
    kv_shared_now = false;
    capture_decode_graph(decode_graph);
    if (kv_shared_from >= 0) {
      kv_shared_now = true;
      capture_decode_graph(decode_graph_long);
      kv_shared_now = false;
    }
  }
  void capture_decode_graph(cudaGraphExec_t& exec) {
    set_step_input(0, 0);
    enqueue_decode();
    NIBBLE_CUDA_CHECK(cudaStreamSynchronize(stream));
    cudaGraph_t graph = nullptr;
    NIBBLE_CUDA_CHECK(cudaStreamBeginCapture(stream, cudaStreamCaptureModeThreadLocal));
    try {
      enqueue_decode();
    } catch (...) {
      cudaStreamEndCapture(stream, &graph);  // leave the stream usable
      if (graph != nullptr) cudaGraphDestroy(graph);
      throw;
    }
    NIBBLE_CUDA_CHECK(cudaStreamEndCapture(stream, &graph));
    const cudaError_t err = cudaGraphInstantiate(&exec, graph, 0);
    cudaGraphDestroy(graph);
    NIBBLE_CUDA_CHECK(err);
  }

  template <typename Fn>
  void for_each_linear(Fn&& fn) {
    fn(head);
    for (GpuLayer& L : layers) {
      for (GpuLinear& l : L.qkv) fn(l);
      for (GpuLinear& l : L.gate_up) fn(l);
      fn(L.o);
      fn(L.down);
    }
  }

  size_t decode_weight_bytes() const {
    size_t b = final_norm.bytes() + head.bytes() + static_cast<size_t>(c.hidden_size) * 4;  // + one embedding row
    for (const GpuLayer& L : layers) {
      b += L.input_norm.bytes() + L.post_norm.bytes() + L.q_norm.bytes() + L.k_norm.bytes() + L.o.bytes() +
           L.down.bytes();
      for (const GpuLinear& l : L.qkv) b += l.bytes();
      for (const GpuLinear& l : L.gate_up) b += l.bytes();
    }
    return b;
  }
};

int64_t kv_shared_crossover(DType kv_dtype) { return kv_dtype == DType::BF16 ? 2048 : 3072; }

int32_t device_argmax(const float* logits, int64_t n) {
  NIBBLE_CHECK(n > 0 && n <= std::numeric_limits<int32_t>::max(), "device_argmax: {} values", n);
  DeviceBuffer state(kArgmaxStateBytes + 16);  // the kernel's state, then {token, position} and one slot
  NIBBLE_CUDA_CHECK(cudaMemset(state.get(), 0, state.bytes()));
  auto* step = reinterpret_cast<int32_t*>(static_cast<unsigned char*>(state.get()) + kArgmaxStateBytes);
  const ArgmaxFeed f = argmax_feed(state.get(), step, step + 2, 1);
  pdl_launch(argmax_kernel, kArgmaxBlocks, kArgmaxThreads, 0, nullptr, logits, n, f);
  NIBBLE_CUDA_CHECK(cudaGetLastError());
  int32_t out[3] = {};
  NIBBLE_CUDA_CHECK(cudaMemcpy(out, f.step, sizeof out, cudaMemcpyDeviceToHost));
  unsigned ticket = 1;
  NIBBLE_CUDA_CHECK(cudaMemcpy(&ticket, f.ticket, sizeof ticket, cudaMemcpyDeviceToHost));
  NIBBLE_CHECK(out[0] == out[2] && out[1] == 1 && ticket == 0,
               "device_argmax: the step feed ({}, {}), slot {} and ticket {} disagree", out[0], out[1], out[2], ticket);
  return out[0];
}

int32_t device_sample(const float* logits, int64_t n, const SamplerConfig& c, uint64_t draw, bool* checked) {
  NIBBLE_CHECK(n > 0 && n <= std::numeric_limits<int32_t>::max(), "device_sample: {} values", n);
  const SampleArgs a = sample_args(c, draw, 0);
  struct State {
    SampleState st;
    int32_t step[4];  // {token, position}, then one slot
    FilterGrid grid;
  };
  DeviceBuffer buf(sizeof(State));
  NIBBLE_CUDA_CHECK(cudaMemset(buf.get(), 0, buf.bytes()));
  auto* dev = static_cast<State*>(buf.get());
  HeadDraw feed;
  feed.limit = static_cast<int32_t>(n);
  feed.mode = HeadDraw::kSample;
  NIBBLE_CUDA_CHECK(cudaMemcpy(&dev->st.feed, &feed, sizeof feed, cudaMemcpyHostToDevice));
  const uint32_t unset = 2;  // neither answer: sample_filter_kernel writes 0 or 1
  NIBBLE_CUDA_CHECK(cudaMemcpy(&dev->st.checked, &unset, 4, cudaMemcpyHostToDevice));
  enqueue_sample_draw(logits, n, a, &dev->st, &dev->grid, nullptr, dev->step, dev->step + 2, 1, nullptr);
  NIBBLE_CUDA_CHECK(cudaGetLastError());
  State out;
  NIBBLE_CUDA_CHECK(cudaMemcpy(&out, buf.get(), sizeof out, cudaMemcpyDeviceToHost));
  NIBBLE_CHECK(out.step[0] == out.step[2] && out.step[1] == 1 &&
                   std::all_of(out.st.keys, out.st.keys + GemvFusion::kArgmaxKeys,
                               [](unsigned long long k) { return k == 0; }) &&
                   (out.st.checked == (c.filters() ? 0u : 2u) || (c.filters() && out.st.checked == 1)) &&
                   out.grid.count == 0,
               "device_sample: the step feed ({}, {}), slot {}, the key slots, the check ({}) or the grid barrier's "
               "count ({}) disagree", out.step[0], out.step[1], out.step[2], out.st.checked, out.grid.count);
  if (checked != nullptr) *checked = out.st.checked == 1;
  return out.step[0];
}

GpuModel::GpuModel() : impl_(std::make_unique<Impl>()) {}
GpuModel::~GpuModel() = default;
const ModelConfig& GpuModel::config() const { return impl_->c; }
int64_t GpuModel::size() const { return impl_->len; }
void GpuModel::reset() { impl_->len = 0; }
bool GpuModel::decode_graph() const { return impl_->decode_graph != nullptr; }
bool GpuModel::keys_in_head() const { return impl_->head_argmax(); }
bool GpuModel::decode_fused() const { return impl_->fuse_decode; }
bool GpuModel::decode_chained() const { return impl_->fuse_decode && impl_->chain_decode; }
size_t GpuModel::embedding_bytes() const { return impl_->embed.bytes(); }
size_t GpuModel::cache_bytes() const {
  size_t b = 0;
  for (size_t l = 0; l < impl_->kcache.size(); ++l) b += impl_->kcache[l].bytes() + impl_->vcache[l].bytes();
  return b;
}
size_t GpuModel::decode_weight_bytes() const { return impl_->decode_weight_bytes(); }

void GpuModel::set_bf16_inputs(bool on) {
  Impl& m = *impl_;
  NIBBLE_CHECK(m.opts.f32_linears, "GpuModel::set_bf16_inputs: the model was loaded without f32 linears");
  if (m.opts.bf16_inputs == on) return;
  NIBBLE_CUDA_CHECK(cudaStreamSynchronize(m.stream));
  m.opts.bf16_inputs = on;
  if (m.decode_graph != nullptr) {  // the captured step holds the linears' launches as they were
    NIBBLE_CUDA_CHECK(cudaGraphExecDestroy(m.decode_graph));
    m.decode_graph = nullptr;
    if (m.decode_graph_long != nullptr) NIBBLE_CUDA_CHECK(cudaGraphExecDestroy(m.decode_graph_long));
    m.decode_graph_long = nullptr;
    m.capture_decode_graph();
  }
}

namespace {
constexpr const char* kEmbed = "model.embed_tokens.weight";  // held as a table, not as a linear

// One layer's key (or value) cache: [positions, kv_heads · head_dim] of `kv`.
size_t kv_cache_bytes(const ModelConfig& c, int64_t positions, DType kv) {
  return static_cast<size_t>(positions * c.num_kv_heads * c.head_dim) * dtype_size(kv);
}

// The embedding table's dtype on the device: as stored where that is f32,
// bf16 or fp16, else f32 (GpuModel::Impl::embed).
DType embed_device_dtype(DType stored, bool f32_tied) {
  if (f32_tied) return DType::F32;
  return stored == DType::BF16 || stored == DType::F16 ? stored : DType::F32;
}

// Before any upload: what the model needs at the least (every tensor as
// stored, the embedding as it will be held, the KV cache; other formats and
// f32 linears take more) against the device's free memory, so that a model
// too large fails at once, by name, rather than layers into its load.
void check_fits(const ModelSource& src, int64_t max_tokens, bool f32_tied, DType kv_dtype) {
  const ModelConfig& c = src.config();
  uint64_t weights = 0;
  for (const std::string& n : src.names())
    if (n != kEmbed) weights += src.meta(n).stored_bytes;
  const uint64_t embed = dtype_size(embed_device_dtype(src.meta(kEmbed).dtype, f32_tied)) *
                         static_cast<uint64_t>(c.vocab_size * c.hidden_size);
  const uint64_t kv = 2ull * static_cast<uint64_t>(c.num_layers) * kv_cache_bytes(c, max_tokens, kv_dtype);  // k, v
  size_t free = 0, total = 0;
  NIBBLE_CUDA_CHECK(cudaMemGetInfo(&free, &total));
  constexpr double kGiB = 1024.0 * 1024.0 * 1024.0;
  auto gib = [&](uint64_t b) { return static_cast<double>(b) / kGiB; };
  NIBBLE_CHECK(weights + embed + kv <= free,
               "--device cuda: {} needs at least {:.2f} GiB of GPU memory (weights as stored {:.2f} GiB, "
               "embedding {:.2f} GiB, KV cache of {} positions {:.2f} GiB); {:.2f} GiB of {:.2f} GiB are free",
               src.describe(), gib(weights + embed + kv), gib(weights), gib(embed), max_tokens, gib(kv), gib(free),
               gib(total));
}
}  // namespace

std::vector<DenseFallback> dense_fallbacks(const ModelSource& src) {
  return nibble::dense_fallbacks(src, [&](const std::string& n) { return kernel_of(packed_meta(src, n)) != nullptr; });
}

std::unique_ptr<GpuModel> GpuModel::load(const ModelSource& src, int64_t max_tokens, const GpuOptions& opts) {
  NIBBLE_CHECK(device_available(), "--device cuda: no CUDA device is visible");
  NIBBLE_CHECK(max_tokens > 0, "GpuModel: the KV cache needs at least one position");
  src.validate_against_config();
  NIBBLE_CHECK(!src.down_proj_rotation(),
               "--device cuda: {} rotates down_proj's input online (--method rotate+...), which the GPU forward does "
               "not do yet; run it on the CPU",
               src.describe());
  NIBBLE_CHECK(opts.kv_dtype == DType::F32 || opts.kv_dtype == DType::BF16,
               "GpuModel: a KV cache of {} (f32 or bf16 only)", dtype_name(opts.kv_dtype));
  NIBBLE_CHECK(opts.act_quant == nullptr || (opts.f32_linears && !opts.decode_graph),
               "GpuModel: simulated activation quantization ({}) runs with f32 linears and no decode graph only",
               opts.act_quant ? std::string(opts.act_quant->name) : std::string());
  check_fits(src, max_tokens, opts.f32_linears && src.config().tie_word_embeddings, opts.kv_dtype);
  std::unique_ptr<GpuModel> model(new GpuModel());
  Impl& m = *model->impl_;
  m.c = src.config();
  m.opts = opts;
  const ModelConfig& c = m.c;
  NIBBLE_CHECK(c.head_dim % 4 == 0 && c.num_heads % c.num_kv_heads == 0, "GpuModel: unsupported head layout");
  NIBBLE_CHECK(max_tokens < (int64_t{1} << 31), "GpuModel: {} positions do not fit the decode step's int32 position",
               max_tokens);
  m.max_tokens = max_tokens;
  m.ldD = pad8(c.hidden_size);
  m.ldQ = pad8(c.num_heads * c.head_dim);
  m.ldF = pad8(c.intermediate_size);
  const bool f32 = opts.f32_linears;
  Tensor embed = src.load(kEmbed);
  m.embed_dtype = embed_device_dtype(embed.dtype(), f32 && c.tie_word_embeddings);
  if (embed.dtype() != m.embed_dtype) embed = embed.to_f32();
  m.embed = upload(embed);
  m.final_norm = upload(src.load("model.norm.weight").to_f32());
  if (!c.tie_word_embeddings) {
    m.head = load_linear_gpu(src, "lm_head", f32);
  } else if (f32) {  // the embedding's f32 copy on the device, used in place
    m.head.f32 = true;
    m.head.out = c.vocab_size;
    m.head.in = c.hidden_size;
    F32Matrix e;
    e.rows = c.vocab_size;
    e.cols = c.hidden_size;
    e.shared = m.embed.get();
    m.head.f32m.push_back(std::move(e));
  } else if (m.embed_dtype == DType::BF16) {  // the bf16 table, used in place
    m.head.out = c.vocab_size;
    m.head.in = c.hidden_size;
    m.head.dense_shared = m.embed.get();
  } else {
    m.head = dense_linear(embed);
  }
  const bool qk_norm = find_arch(c.model_type).qk_norm;
  for (int64_t i = 0; i < c.num_layers; ++i) {
    const std::string p = fmt::format("model.layers.{}.", i);
    GpuLayer L;
    L.window = c.window(i);
    L.input_norm = upload(src.load(p + "input_layernorm.weight").to_f32());
    L.post_norm = upload(src.load(p + "post_attention_layernorm.weight").to_f32());
    if (qk_norm) {
      L.q_norm = upload(src.load(p + "self_attn.q_norm.weight").to_f32());
      L.k_norm = upload(src.load(p + "self_attn.k_norm.weight").to_f32());
    }
    const std::string a = p + "self_attn.", f = p + "mlp.";
    if (opts.fuse_linears) {
      L.qkv = load_linears(src, {a + "q_proj", a + "k_proj", a + "v_proj"}, f32);
      L.gate_up = load_linears(src, {f + "gate_proj", f + "up_proj"}, f32);
    } else {
      for (const char* n : {"q_proj", "k_proj", "v_proj"}) L.qkv.push_back(load_linear_gpu(src, a + n, f32));
      for (const char* n : {"gate_proj", "up_proj"}) L.gate_up.push_back(load_linear_gpu(src, f + n, f32));
    }
    L.o = load_linear_gpu(src, a + "o_proj", f32);
    L.down = load_linear_gpu(src, f + "down_proj", f32);
    if (opts.act_quant) {  // the declared quantizer must be simulable as the checkpoint runs it (DecoderLayer::unsimulated)
      std::string conflict;
      L.exact_in = exact_linear_inputs(src, i, &conflict);
      NIBBLE_CHECK(conflict.empty() || opts.act_quant != declared_act_quant(src), "{}", conflict);
    }
    m.layers.push_back(std::move(L));
    m.kcache.emplace_back(kv_cache_bytes(c, max_tokens, opts.kv_dtype));
    m.vcache.emplace_back(kv_cache_bytes(c, max_tokens, opts.kv_dtype));
  }
  for (GpuLayer& L : m.layers) {
    L.f32_qkv = std::all_of(L.qkv.begin(), L.qkv.end(), takes_f32);
    L.f32_gate_up = std::all_of(L.gate_up.begin(), L.gate_up.end(), takes_f32);
    L.f32_o = takes_f32(L.o);
    L.f32_down = takes_f32(L.down);
    // The fused RMSNorm writes qkv's, gate|up's and the head's prepared input.
    const bool norm_ok = norm_prep_supported(c.hidden_size);
    L.prep_qkv = norm_ok ? prepared_group(L.qkv.data(), L.qkv.size()) : 0;
    L.prep_gate_up = norm_ok ? prepared_group(L.gate_up.data(), L.gate_up.size()) : 0;
    L.prep_down = prepared_group(&L.down, 1);
    // The attention kernel writes o's prepared input per head: whole prep warps of 128.
    L.prep_o = c.head_dim % w4a16::kPrepInputs == 0 ? prepared_group(&L.o, 1) : 0;
  }
  {  // f32 linears held as stored: one scratch for the largest, widened into before each GEMM
    size_t most = 0;
    m.for_each_linear([&](GpuLinear& l) {
      if (l.needs_widening()) most = std::max(most, static_cast<size_t>(l.out * l.in) * 4);
    });
    if (most > 0) m.f32_widen = DeviceBuffer(most);
    m.for_each_linear([&](GpuLinear& l) { l.widen_to = static_cast<float*>(m.f32_widen.get()); });
  }
  m.f32_head = takes_f32(m.head);
  m.prep_head = norm_prep_supported(c.hidden_size) ? prepared_group(&m.head, 1) : 0;
  m.fuse_decode = opts.fuse_decode && m.fusion_applies();
  m.chain_decode = opts.chain_decode;
  const std::vector<float> inv = rope_inv_freq(c);
  m.inv_freq = upload(inv.data(), inv.size() * 4);
  // The row-wise attention kernel (decode) keeps q, its partial outputs and the
  // scores of one query in shared memory, sized for the whole cache. Prefill
  // of head dims 64/128/256 runs the flash kernel, which has no such limit.
  // Longer caches: prefill through the flash kernel and decode through the
  // split-over-keys kernel, neither of which has a length cap.
  if (rowwise_attention_smem(c.head_dim, max_tokens) > rowwise_attention_smem_limit()) {
    NIBBLE_CHECK(opts.flash_prefill && flash_attention_supported(c.head_dim) && c.head_dim % 32 == 0 &&
                     c.head_dim <= 256,
                 "GpuModel: a KV cache of {} positions is more than the row-wise attention kernel's shared memory "
                 "holds, and head_dim {} has no flash prefill / split decode kernel", max_tokens, c.head_dim);
    m.attn_splits = static_cast<int>(std::clamp<int64_t>((max_tokens + 1023) / 1024, 1, 256));
    m.attn_part = DeviceBuffer(split_attention_scratch_bytes(c.num_heads, c.head_dim, m.attn_splits));
  }
  {
    const int64_t from =
        opts.kv_shared_from == GpuOptions::kKvSharedAuto ? kv_shared_crossover(opts.kv_dtype) : opts.kv_shared_from;
    if (from >= 0 && m.max_tokens > from && kv_shared_attention_supported(c.head_dim, c.num_heads, c.num_kv_heads)) {
      m.kv_shared_from = from;
      m.kv_shared_scratch =
          DeviceBuffer(kv_shared_attention_scratch_bytes(c.num_heads, c.num_kv_heads, c.head_dim));
      NIBBLE_CUDA_CHECK(cudaMemset(m.kv_shared_scratch.get(), 0, m.kv_shared_scratch.bytes()));
    }
  }
  NIBBLE_CUDA_CHECK(cudaDeviceSynchronize());  // the uploads (legacy stream) are done before the stream starts
  NIBBLE_CUDA_CHECK(cudaStreamCreateWithFlags(&m.stream, cudaStreamNonBlocking));
  NIBBLE_CUDA_CHECK(cudaMallocHost(reinterpret_cast<void**>(&m.host_step), 8));
  m.argmax_state = DeviceBuffer(kArgmaxStateBytes);
  NIBBLE_CUDA_CHECK(cudaMemset(m.argmax_state.get(), 0, m.argmax_state.bytes()));  // the ticket starts at 0
  m.head_state_buf = DeviceBuffer(sizeof(Impl::HeadState));
  NIBBLE_CUDA_CHECK(cudaMemset(m.head_state_buf.get(), 0, m.head_state_buf.bytes()));  // no keys, limit 0
  m.sample_state_buf = DeviceBuffer(sizeof(SampleState));
  NIBBLE_CUDA_CHECK(cudaMemset(m.sample_state_buf.get(), 0, m.sample_state_buf.bytes()));  // no keys
  NIBBLE_CUDA_CHECK(cudaMallocHost(reinterpret_cast<void**>(&m.host_draw), 2 * sizeof(HeadDraw)));
  NIBBLE_CUDA_CHECK(cudaHostAlloc(reinterpret_cast<void**>(&m.greedy_host), Impl::kGreedySlots * 4,
                                  cudaHostAllocMapped));
  NIBBLE_CUDA_CHECK(cudaHostGetDevicePointer(reinterpret_cast<void**>(&m.greedy_host_dev), m.greedy_host, 0));
  for (cudaEvent_t& e : m.greedy_done) NIBBLE_CUDA_CHECK(cudaEventCreateWithFlags(&e, cudaEventDisableTiming));
  m.dec = m.make_scratch(1);
  if (opts.decode_graph) m.capture_decode_graph();
  return model;
}

void GpuModel::Impl::check_tokens(const std::vector<int32_t>& tokens) const {
  const int64_t n = static_cast<int64_t>(tokens.size());
  NIBBLE_CHECK(n > 0, "forward: no tokens");
  NIBBLE_CHECK(len + n <= max_tokens, "forward: {} + {} tokens exceed the cache of {} positions", len, n,
               max_tokens);
  for (int32_t t : tokens)
    NIBBLE_CHECK(t >= 0 && t < c.vocab_size, "forward: token id {} is outside the vocabulary (size {})", t,
                 c.vocab_size);
}

void GpuModel::Impl::enqueue_step(int32_t token) {
  // Decode: the same kernels whether replayed from the graph or launched
  // here, all reading the token and the position from dec.tokens.
  set_step_input(token, len);
  launch_step(len);
  ++len;
}

// Greedy steps back to back: step k's input is step k-1's argmax, which the
// head GEMV with argmax_keys_kernel (head_argmax) or argmax_kernel leaves in
// dec.tokens, so the host only copies the first token in and then stays
// kGreedyLookahead steps behind the device, reading each id
// from its mapped slot once the step's event has completed. Steps enqueued
// past a stop write cache rows beyond the new length, which later steps
// overwrite before reading. With `sample`, each step's id is a draw
// (enqueue_sample) instead, fed the same way.
int64_t GpuModel::Impl::greedy_run(int32_t token, int64_t limit, int64_t steps,
                                   const std::function<bool(int32_t)>& on_token, const SampleArgs* sample) {
  const char* what = sample != nullptr ? "sampled decode" : "greedy decode";
  check_tokens({token});
  NIBBLE_CHECK(limit > 0 && limit <= c.vocab_size, "{}: vocab_limit {} outside 1 .. {}", what, limit, c.vocab_size);
  NIBBLE_CHECK(steps >= 0 && len + steps <= max_tokens, "{}: {} + {} steps exceed the cache of {} positions", what,
               len, steps, max_tokens);
  const int64_t len0 = len;
  int64_t enqueued = 0, done = 0;
  // The head GEMV takes the keys (head_argmax) while its HeadDraw's limit is
  // set: for this run, 0 again after it. Greedy and temperature alone are
  // then fed by the step's own argmax_keys_kernel; top-k / top-p take the
  // head's score keys through enqueue_sample. Without head_argmax, a kernel
  // after the step takes the argmax or the draw.
  const bool in_head = head_argmax() && steps > 0;
  const bool filtered = sample != nullptr && sample->c.filters();
  auto clear_limit = [&] { return cudaMemsetAsync(&head_state()->draw.limit, 0, 4, stream); };
  try {
    bool go = true;
    if (in_head) {
      HeadDraw& d = host_draw[0];
      d = HeadDraw{};
      d.limit = static_cast<int32_t>(limit);
      if (sample != nullptr) {
        d.mode = filtered ? HeadDraw::kSampleFiltered : HeadDraw::kSample;
        d.temperature = sample->c.temperature;
        d.seed = sample->c.seed;
        d.draw_base = sample->draw_base;
      }
      NIBBLE_CUDA_CHECK(cudaMemcpyAsync(&head_state()->draw, &d, sizeof d, cudaMemcpyHostToDevice, stream));
    }
    if (sample != nullptr) {
      HeadDraw& f = host_draw[1];
      f = HeadDraw{};
      f.limit = static_cast<int32_t>(limit);
      f.mode = HeadDraw::kSample;
      NIBBLE_CUDA_CHECK(cudaMemcpyAsync(&sample_state()->feed, &f, sizeof f, cudaMemcpyHostToDevice, stream));
    }
    while (go && done < steps) {
      for (; enqueued < steps && enqueued <= done + kGreedyLookahead; ++enqueued) {
        if (enqueued == 0) set_step_input(token, len0);
        launch_step(len0 + enqueued);
        if (sample != nullptr && (!in_head || filtered))
          enqueue_sample(limit, *sample, in_head);
        else if (sample == nullptr && !in_head)
          enqueue_argmax(limit);
        NIBBLE_CUDA_CHECK(cudaEventRecord(greedy_done[(len0 + enqueued) % kGreedySlots], stream));
      }
      const int64_t slot = (len0 + done) % kGreedySlots;
      NIBBLE_CUDA_CHECK(cudaEventSynchronize(greedy_done[slot]));
      const int32_t id = reinterpret_cast<volatile int32_t*>(greedy_host)[slot];
      ++done;
      go = on_token(id);
    }
  } catch (...) {
    if (in_head) clear_limit();
    cudaStreamSynchronize(stream);
    len = len0 + done;
    throw;
  }
  if (in_head) NIBBLE_CUDA_CHECK(clear_limit());
  NIBBLE_CUDA_CHECK(cudaStreamSynchronize(stream));  // the steps enqueued past a stop
  len = len0 + done;
  return done;
}

int32_t GpuModel::decode_greedy(int32_t token, int64_t vocab_limit) {
  int32_t id = -1;
  impl_->greedy_run(token, vocab_limit, 1, [&](int32_t t) {
    id = t;
    return true;
  });
  return id;
}

int64_t GpuModel::decode_greedy_run(int32_t token, int64_t vocab_limit, int64_t max_steps,
                                    const std::function<bool(int32_t)>& on_token) {
  return impl_->greedy_run(token, vocab_limit, max_steps, on_token);
}

int64_t sample_filter_max_logits() { return filter_max_logits(device_sm_count()); }

bool samples_on_device(const SamplerConfig& s, int64_t vocab_limit) {
  return s.temperature > 0 && (!s.filters() || vocab_limit <= sample_filter_max_logits());
}

int64_t GpuModel::decode_sample_run(int32_t token, int64_t vocab_limit, int64_t max_steps, const SamplerConfig& s,
                                    uint64_t first_draw, const std::function<bool(int32_t)>& on_token) {
  const SampleArgs a = sample_args(s, first_draw, impl_->len);
  return impl_->greedy_run(token, vocab_limit, max_steps, on_token, &a);
}

Tensor GpuModel::forward(const std::vector<int32_t>& tokens, bool all_logits) {
  Impl& m = *impl_;
  const ModelConfig& c = m.c;
  const int64_t n = static_cast<int64_t>(tokens.size()), p0 = m.len, V = c.vocab_size;
  m.check_tokens(tokens);
  Scratch* sc = &m.dec;
  if (n == 1) {
    m.enqueue_step(tokens[0]);
  } else {
    if (n > m.s.rows) m.s = m.make_scratch(n);
    sc = &m.s;
    NIBBLE_CUDA_CHECK(cudaMemcpyAsync(sc->tokens.get(), tokens.data(), n * 4, cudaMemcpyHostToDevice, m.stream));
    m.enqueue(*sc, n, p0, nullptr, all_logits, p0 + n);
    m.len += n;
  }
  const int64_t rows = all_logits ? n : 1;
  Tensor logits = Tensor::empty(DType::F32, {rows, V});
  NIBBLE_CUDA_CHECK(cudaMemcpyAsync(logits.raw_mut(), sc->logits.get(), logits.nbytes(), cudaMemcpyDeviceToHost,
                                    m.stream));
  NIBBLE_CUDA_CHECK(cudaStreamSynchronize(m.stream));
  return logits;
}

// The decode kernels' fused RoPE step (AttentionArgs::rope_qkv), or none.
static RopeIn rope_in(const AttentionArgs& a) {
  RopeIn rope;
  if (a.rope_qkv != nullptr) {
    rope.qkv = a.rope_qkv;
    rope.q_norm = a.rope_q_norm;
    rope.k_norm = a.rope_k_norm;
    rope.inv_freq = a.rope_inv_freq;
    rope.eps = a.rope_eps;
    // AttentionArgs holds the caches read-only for every other use; this step writes row p0.
    rope.kc = const_cast<void*>(a.k);
    rope.vc = const_cast<void*>(a.v);
  }
  return rope;
}

// The row-wise kernel's launcher (include/nibble/cuda_attention.h); it lives
// here because the kernel is one of forward_kernels.cuh's.
size_t rowwise_attention_smem(int64_t head_dim, int64_t max_positions) {
  return attention_smem(head_dim, max_positions);
}
size_t rowwise_attention_smem_limit() { return 200u << 10; }

void rowwise_attention(const AttentionArgs& a, const int32_t* p0_dev, int64_t max_positions, void* stream) {
  NIBBLE_CHECK(a.n > 0 && a.heads > 0 && a.kv_heads > 0 && a.heads % a.kv_heads == 0,
               "rowwise_attention: bad shape (n {}, heads {}, kv_heads {})", a.n, a.heads, a.kv_heads);
  NIBBLE_CHECK(a.head_dim > 0 && a.head_dim % 4 == 0, "rowwise_attention: head_dim {} is not a multiple of 4",
               a.head_dim);
  NIBBLE_CHECK(a.prepared == nullptr || (a.n == 1 && a.head_dim % w4a16::kPrepInputs == 0 &&
                                         w4a16_gemv_applies(a.prep_group)),
               "rowwise_attention: a prepared output needs one query, head_dim a multiple of 128 and groups of 32, "
               "64 or 128 (n {}, head_dim {}, group {})", a.n, a.head_dim, a.prep_group);
  NIBBLE_CHECK(p0_dev != nullptr || a.p0 + a.n <= max_positions,
               "rowwise_attention: {} + {} positions exceed the {} it is sized for", a.p0, a.n, max_positions);
  const size_t smem = attention_smem(a.head_dim, max_positions);
  NIBBLE_CHECK(smem <= rowwise_attention_smem_limit(),
               "rowwise_attention: {} positions need {} bytes of shared memory, more than the kernel's {}",
               max_positions, smem, rowwise_attention_smem_limit());
  // The attribute is per kernel, not per model: never lower it below what a
  // model loaded earlier (still alive, maybe) needs. Raised outside graph
  // capture: the decode step's warm-up launch asks for the largest size first.
  // Under a lock: models on other threads may raise it at the same time.
  {
    static std::mutex smem_mu;
    static size_t smem_allowed = 0;
    const std::lock_guard<std::mutex> lock(smem_mu);
    if (smem > smem_allowed) {
      for (const void* k : {reinterpret_cast<const void*>(attention_kernel<bf16, float>),
                             reinterpret_cast<const void*>(attention_kernel<float, float>),
                             reinterpret_cast<const void*>(attention_kernel<bf16, bf16>),
                             reinterpret_cast<const void*>(attention_kernel<float, bf16>)})
        NIBBLE_CUDA_CHECK(cudaFuncSetAttribute(k, cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(smem)));
      smem_allowed = smem;
    }
  }
  NIBBLE_CHECK(a.rope_qkv == nullptr || (a.n == 1 && a.head_dim <= kAttentionThreads / 2),
               "rowwise_attention: the fused RoPE step needs one query and head_dim <= {} (n {}, head_dim {})",
               kAttentionThreads / 2, a.n, a.head_dim);
  const RopeIn rope = rope_in(a);
  const dim3 grid(static_cast<unsigned>(a.n), static_cast<unsigned>(a.heads));
  const auto st = static_cast<cudaStream_t>(stream);
  auto launch = [&](auto out_t, auto kv_t) {
    using OutT = decltype(out_t);
    using KvT = decltype(kv_t);
    pdl_launch(attention_kernel<OutT, KvT>, grid, kAttentionThreads, smem, st, a.q, static_cast<const KvT*>(a.k),
               static_cast<const KvT*>(a.v), static_cast<OutT*>(a.out), a.ldo, a.heads, a.kv_heads, a.head_dim, a.p0,
               p0_dev, a.window, a.scale, a.prepared, a.prep_group, rope);
  };
  if (a.kv_bf16)
    a.out_f32 ? launch(float{}, bf16{}) : launch(bf16{}, bf16{});
  else
    a.out_f32 ? launch(float{}, float{}) : launch(bf16{}, float{});
  NIBBLE_CUDA_CHECK(cudaGetLastError());
}

namespace {
template <int HD, typename KvT>
void launch_decode_attention(const AttentionArgs& a, const int32_t* p0_dev, size_t smem, const RopeIn& rope,
                             void* stream) {
  const dim3 grid(static_cast<unsigned>(a.heads * kDecodeRanks));
  const auto s = static_cast<cudaStream_t>(stream);
  const float* q = a.q;
  const auto* k = static_cast<const KvT*>(a.k);
  const auto* v = static_cast<const KvT*>(a.v);
  if (a.out_f32)
    pdl_launch_cluster(decode_attention_kernel<float, HD, KvT>, kDecodeRanks, grid, kDecodeThreads, smem, s, q, k, v,
                       static_cast<float*>(a.out), a.heads, a.kv_heads, a.p0, p0_dev, a.window, a.scale, a.prepared,
                       a.prep_group, rope);
  else
    pdl_launch_cluster(decode_attention_kernel<bf16, HD, KvT>, kDecodeRanks, grid, kDecodeThreads, smem, s, q, k, v,
                       static_cast<bf16*>(a.out), a.heads, a.kv_heads, a.p0, p0_dev, a.window, a.scale, a.prepared,
                       a.prep_group, rope);
}
template <int HD>
void launch_decode_attention(const AttentionArgs& a, const int32_t* p0_dev, size_t smem, const RopeIn& rope,
                             void* stream) {
  if (a.kv_bf16)
    launch_decode_attention<HD, bf16>(a, p0_dev, smem, rope, stream);
  else
    launch_decode_attention<HD, float>(a, p0_dev, smem, rope, stream);
}
}  // namespace

bool decode_attention_supported(int64_t head_dim) {
  return device_has_clusters() && (head_dim == 32 || head_dim == 64 || head_dim == 128 || head_dim == 256);
}

void decode_attention(const AttentionArgs& a, const int32_t* p0_dev, int64_t max_positions, void* stream) {
  NIBBLE_CHECK(decode_attention_supported(a.head_dim),
               "decode_attention: head_dim {} (32, 64, 128 or 256) on an sm_90 or later device", a.head_dim);
  NIBBLE_CHECK(a.n == 1 && a.heads > 0 && a.kv_heads > 0 && a.heads % a.kv_heads == 0,
               "decode_attention: one query, heads a multiple of kv_heads (n {}, heads {}, kv_heads {})", a.n, a.heads,
               a.kv_heads);
  NIBBLE_CHECK(a.prepared == nullptr || (a.head_dim % w4a16::kPrepInputs == 0 &&
                                         w4a16_gemv_applies(a.prep_group)),
               "decode_attention: a prepared output needs head_dim a multiple of 128 and groups of 32, 64 or 128");
  NIBBLE_CHECK(p0_dev != nullptr || a.p0 + 1 <= max_positions,
               "decode_attention: position {} is past the {} it is sized for", a.p0, max_positions);
  const size_t smem = decode_attention_smem(a.head_dim);  // under the 48 KB a launch gets without asking
  const RopeIn rope = rope_in(a);
  switch (a.head_dim) {
    case 32: return launch_decode_attention<32>(a, p0_dev, smem, rope, stream);
    case 64: return launch_decode_attention<64>(a, p0_dev, smem, rope, stream);
    case 128: return launch_decode_attention<128>(a, p0_dev, smem, rope, stream);
    default: return launch_decode_attention<256>(a, p0_dev, smem, rope, stream);
  }
}

namespace {
int kv_shared_ranks(int64_t kv_heads) {
  return static_cast<int>(std::clamp<int64_t>(device_sm_count() / std::max<int64_t>(kv_heads, 1), 1, kSharedMaxRanks));
}
template <typename OutT, int HD, int G>
void launch_kv_shared(const AttentionArgs& a, const int32_t* p0_dev, const RopeIn& rope, float* part, unsigned* tickets,
                      int R, cudaStream_t st) {
  auto launch = [&](auto kv_t) {
    using KvT = decltype(kv_t);
    pdl_launch(kv_shared_attention_kernel<OutT, HD, G, KvT>, static_cast<unsigned>(a.kv_heads * R), kSharedThreads,
               kv_shared_smem_floats<HD, G>() * 4, st, a.q, static_cast<const KvT*>(a.k), static_cast<const KvT*>(a.v),
               static_cast<OutT*>(a.out), a.heads, a.kv_heads, R, a.p0, p0_dev, a.window, a.scale, a.prepared,
               a.prep_group, rope, part, tickets);
  };
  a.kv_bf16 ? launch(bf16{}) : launch(float{});
}
template <typename OutT, int HD>
void launch_kv_shared_g(const AttentionArgs& a, const int32_t* p0_dev, const RopeIn& rope, float* part,
                        unsigned* tickets, int R, cudaStream_t st) {
  switch (a.heads / a.kv_heads) {
    case 1: return launch_kv_shared<OutT, HD, 1>(a, p0_dev, rope, part, tickets, R, st);
    case 2: return launch_kv_shared<OutT, HD, 2>(a, p0_dev, rope, part, tickets, R, st);
    case 4: return launch_kv_shared<OutT, HD, 4>(a, p0_dev, rope, part, tickets, R, st);
    default: return launch_kv_shared<OutT, HD, 8>(a, p0_dev, rope, part, tickets, R, st);
  }
}
}  // namespace

bool kv_shared_attention_supported(int64_t head_dim, int64_t heads, int64_t kv_heads) {
  if (kv_heads <= 0 || heads % kv_heads != 0) return false;
  const int64_t g = heads / kv_heads;
  return (head_dim == 64 || head_dim == 128) && (g == 1 || g == 2 || g == 4 || g == 8);
}

size_t kv_shared_attention_scratch_bytes(int64_t heads, int64_t kv_heads, int64_t head_dim) {
  return static_cast<size_t>(heads * kv_shared_ranks(kv_heads) * (head_dim + 2)) * 4 +
         static_cast<size_t>(kv_heads) * sizeof(unsigned);
}

void kv_shared_attention(const AttentionArgs& a, const int32_t* p0_dev, void* scratch, void* stream) {
  NIBBLE_CHECK(a.n == 1 && kv_shared_attention_supported(a.head_dim, a.heads, a.kv_heads),
               "kv_shared_attention: one query, head_dim 64 or 128 and 1, 2, 4 or 8 query heads per kv head (n {}, "
               "head_dim {}, heads {}, kv_heads {})",
               a.n, a.head_dim, a.heads, a.kv_heads);
  NIBBLE_CHECK(a.prepared == nullptr || (a.head_dim % w4a16::kPrepInputs == 0 &&
                                         w4a16_gemv_applies(a.prep_group)),
               "kv_shared_attention: a prepared output needs head_dim a multiple of 128 and groups of 32, 64 or 128");
  NIBBLE_CHECK(scratch != nullptr, "kv_shared_attention: no scratch");
  const int R = kv_shared_ranks(a.kv_heads);
  auto* part = static_cast<float*>(scratch);
  auto* tickets = reinterpret_cast<unsigned*>(part + a.heads * R * (a.head_dim + 2));
  const RopeIn rope = rope_in(a);
  const auto st = static_cast<cudaStream_t>(stream);
  if (a.head_dim == 64)
    a.out_f32 ? launch_kv_shared_g<float, 64>(a, p0_dev, rope, part, tickets, R, st)
              : launch_kv_shared_g<bf16, 64>(a, p0_dev, rope, part, tickets, R, st);
  else
    a.out_f32 ? launch_kv_shared_g<float, 128>(a, p0_dev, rope, part, tickets, R, st)
              : launch_kv_shared_g<bf16, 128>(a, p0_dev, rope, part, tickets, R, st);
}

size_t split_attention_scratch_bytes(int64_t heads, int64_t head_dim, int splits) {
  return static_cast<size_t>(heads * splits * (head_dim + 2)) * 4;
}

void split_attention(const AttentionArgs& a, const int32_t* p0_dev, int splits, void* scratch, void* stream) {
  NIBBLE_CHECK(a.n == 1 && a.heads > 0 && a.kv_heads > 0 && a.heads % a.kv_heads == 0,
               "split_attention: one query and heads a multiple of kv_heads (n {}, heads {}, kv_heads {})", a.n,
               a.heads, a.kv_heads);
  NIBBLE_CHECK(a.head_dim % 32 == 0 && a.head_dim <= kSplitMaxHd, "split_attention: head_dim {} (a multiple of 32, "
               "at most {})", a.head_dim, kSplitMaxHd);
  NIBBLE_CHECK(splits >= 1 && splits <= kSplitMaxSplits, "split_attention: {} splits (1 .. {})", splits,
               kSplitMaxSplits);
  NIBBLE_CHECK(a.rope_qkv == nullptr, "split_attention: the RoPE step is the row-wise kernel's");
  NIBBLE_CHECK(a.prepared == nullptr || (a.head_dim % w4a16::kPrepInputs == 0 &&
                                         w4a16_gemv_applies(a.prep_group)),
               "split_attention: a prepared output needs head_dim a multiple of 128 and groups of 32, 64 or 128");
  const auto st = static_cast<cudaStream_t>(stream);
  auto* part = static_cast<float*>(scratch);
  const float qscale = a.scale * 1.4426950408889634f;  // log2(e): scores in log2 units for exp2
  const dim3 grid(static_cast<unsigned>(a.heads), static_cast<unsigned>(splits));
  if (a.kv_bf16)
    pdl_launch(split_attention_kernel<bf16>, grid, kSplitThreads, 0, st, a.q, static_cast<const bf16*>(a.k),
               static_cast<const bf16*>(a.v), a.heads, a.kv_heads, a.head_dim, a.p0, p0_dev, a.window, qscale, part);
  else
    pdl_launch(split_attention_kernel<float>, grid, kSplitThreads, 0, st, a.q, static_cast<const float*>(a.k),
               static_cast<const float*>(a.v), a.heads, a.kv_heads, a.head_dim, a.p0, p0_dev, a.window, qscale, part);
  if (a.out_f32)
    pdl_launch(split_combine_kernel<float>, static_cast<unsigned>(a.heads), kSplitThreads, 0, st,
               static_cast<const float*>(part), a.head_dim, splits, static_cast<float*>(a.out), a.prepared,
               a.prep_group, a.heads);
  else
    pdl_launch(split_combine_kernel<bf16>, static_cast<unsigned>(a.heads), kSplitThreads, 0, st,
               static_cast<const float*>(part), a.head_dim, splits, static_cast<bf16*>(a.out), a.prepared,
               a.prep_group, a.heads);
}

}  // namespace nibble::cuda
