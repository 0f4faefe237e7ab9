// W4A16 for int4_asym on the GPU (docs/CUDA.md has the layout and the
// measured speed): the w4a16_mma registry rows (int4_asym, and int4_sym and
// int4_asym_f32 through their parameters' conversions), the layout (upload)
// and the dispatch (w4a16_gemm).
//
// y[M, N] = x[M, K] · Ŵ[N, K]ᵀ, x and y bf16 or fp16, fp32 accumulation.
// Dispatch: M = 1 takes the integer GEMV (w4a16_gemv.cu); bf16 calls with
// M > 64 dequantize the weight and run cuBLAS, except up to 256 tokens on
// sm_90 GPUs; every other call takes the small-M kernel (w4a16_small_m.cu),
// which sends more than 16 tokens on sm_90 to the wgmma kernel
// (w4a16_wgmma.cu). Until session 80 groups of 32 at M >= 2 took a general
// kernel of this file (docs/CUDA.md "Design of the general kernel", removed);
// until session 81 they stayed on the small-M kernel's rounded path at every M.
//
// The layout serves every kernel: decode is bandwidth bound, so each byte of
// weights is read once, in coalesced 16-byte loads (a warp reads 512
// contiguous bytes). Codes are re-laid out once at load time so that one
// 16-byte load gives a lane exactly its A-fragment nibbles of four
// mma.m16n8k16 tiles (16 rows × 64 inputs per warp per load): the weights are
// the mma's A operand ("swap AB"), 16 output rows on its M side and tokens on
// its N = 8 side.
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cublas_v2.h>

#include <algorithm>
#include <cstring>

#include "backend/cuda/check.h"
#include "backend/cuda/w4a16_common.cuh"
#include "backend/cuda/w4a16_gemv.h"
#include "nibble/cuda.h"
#include "nibble/dtype.h"

namespace nibble::cuda {

namespace {

using namespace w4a16;  // kTileRows (16 output rows per mma tile), kChunk (64 inputs per 16-byte lane load)

// ---- the layout (docs/CUDA.md) ---------------------------------------------
// Lane l of a warp: gid = l / 4, tig = l % 4. Within a chunk of 64 inputs the
// mma's k order is permuted (a dot product does not care, as long as weights
// and activations use the same order): in k-step s, the mma's k index
// kk = 2tig + 8h + e (h, e in {0, 1}) is the chunk's input 16tig + 4s + 2h + e.
// A lane's activations for the whole chunk are then 16 consecutive inputs
// (two 16-byte loads), and its B fragment for step s is inputs 16tig + 4s .. +3.
// In chunk c of row tile t, word s of lane l holds 8 nibbles, nibble p at bits
// 4p..4p+3, with j = p % 4 the A-fragment register and e = p / 4 its half:
//   row = gid + 8·(j % 2),   input = 64c + 16tig + 4s + 2·(j / 2) + e,
// so (word >> 4j) & 0x000F000F is register j's pair.
__host__ __device__ inline void nibble_coords(int lane, int s, int p, int* row, int* k) {
  const int gid = lane >> 2, tig = lane & 3;
  const int j = p & 3, e = p >> 2;
  *row = gid + ((j & 1) ? 8 : 0);
  *k = 16 * tig + 4 * s + 2 * (j >> 1) + e;
}

struct Dims {
  int64_t tiles, chunks, groups_padded;
};
Dims dims_of(int64_t rows, int64_t cols, int group_size) {
  const int64_t chunks = (cols + kChunk - 1) / kChunk;
  return {(rows + kTileRows - 1) / kTileRows, chunks, (chunks * kChunk + group_size - 1) / group_size};
}

void check_parts(const std::vector<Tensor>& parts, int64_t rows, int64_t cols, int group_size) {
  nibble::check_parts(find_format("int4_asym", group_size), parts, rows, cols);
  NIBBLE_CHECK(cols % 2 == 0, "w4a16: the input width must be even (found {}): x is read in pairs", cols);
}

// Builds the layout on the device from the FORMAT.md parts: one thread per
// output 32-bit word (codes) and per 8-byte pair entry (meta).
__global__ void relayout_codes_kernel(const uint8_t* __restrict__ qweight, uint32_t* __restrict__ out, int64_t rows,
                                      int64_t cols, int64_t chunks) {
  const int64_t words = ((rows + kTileRows - 1) / kTileRows) * chunks * 32 * 4;
  const int64_t idx = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (idx >= words) return;
  const int s = static_cast<int>(idx & 3), lane = static_cast<int>((idx >> 2) & 31);
  const int64_t c = (idx >> 7) % chunks, t = (idx >> 7) / chunks;
  const int64_t bytes_per_row = (cols + 1) / 2;
  uint32_t w = 0;
  for (int p = 0; p < 8; ++p) {
    int r, k;
    nibble_coords(lane, s, p, &r, &k);
    const int64_t row = t * kTileRows + r, col = c * kChunk + k;
    if (row >= rows || col >= cols) continue;
    const uint8_t b = qweight[row * bytes_per_row + col / 2];
    w |= static_cast<uint32_t>((col & 1) ? (b >> 4) : (b & 0xF)) << (4 * p);
  }
  out[idx] = w;
}

__global__ void relayout_meta_kernel(const uint16_t* __restrict__ scales, const uint16_t* __restrict__ mins,
                                     uint16_t* __restrict__ out, int64_t rows, int64_t groups, int64_t groups_padded) {
  const int64_t entries = ((rows + kTileRows - 1) / kTileRows) * groups_padded * 8;
  const int64_t idx = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (idx >= entries) return;
  const int gid = static_cast<int>(idx & 7);
  const int64_t g = (idx >> 3) % groups_padded, t = (idx >> 3) / groups_padded;
  for (int h = 0; h < 2; ++h) {
    const int64_t row = t * kTileRows + gid + 8 * h;
    const bool ok = row < rows && g < groups;
    out[idx * 4 + 2 * h] = ok ? scales[row * groups + g] : 0;
    out[idx * 4 + 2 * h + 1] = ok ? mins[row * groups + g] : 0;
  }
}

unsigned blocks_for(int64_t n, int threads) { return static_cast<unsigned>((n + threads - 1) / threads); }

// The layout back to a row-major bf16 matrix [rows][cols] (large M: cuBLAS
// on the dequantized weights), a warp per (tile, chunk) of 16 rows × 64
// inputs. Each weight is fl_bf16(c·s + m) with the fp32 fused multiply-add,
// the value the rounded kernels use (FORMAT.md's value rounded once more, to
// bf16). Each lane decodes its 16 inputs of rows gid and gid + 8 into the
// warp's 16 × 64 tile in shared memory, then
// the warp writes the tile out row by row, 128 bytes per row and 16 bytes per
// lane, so every store instruction fills whole sectors. 32-bit index math
// (tiles · chunks < 2^31, checked by the caller).
constexpr int kDqWarps = 8, kDqPitch = kChunk + 8;  // a tile row in shared memory: 64 bf16 and 16 bytes of padding
__global__ void __launch_bounds__(kDqWarps * 32)
    dequant_tile_kernel(const uint4* __restrict__ codes, const uint2* __restrict__ meta,
                        __nv_bfloat16* __restrict__ out, int rows, int cols, int chunks, int groups_padded,
                        int g_shift, int units) {
  __shared__ __align__(16) __nv_bfloat16 tile_smem[kDqWarps][kTileRows * kDqPitch];
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, gid = lane >> 2, tig = lane & 3;
  const int unit = blockIdx.x * kDqWarps + warp;
  if (unit >= units) return;
  const int t = unit / chunks, c = unit - t * chunks;
  const uint4 q = codes[static_cast<int64_t>(unit) * 32 + lane];
  const uint32_t words[4] = {q.x, q.y, q.z, q.w};
  const int col0 = c * kChunk + 16 * tig;  // the lane's 16 inputs lie in one group (groups of 32 or more)
  const uint2 sm = meta[(static_cast<int64_t>(t) * groups_padded + (col0 >> g_shift)) * 8 + gid];
  __nv_bfloat16* tile = tile_smem[warp];
#pragma unroll
  for (int h = 0; h < 2; ++h) {  // row gid + 8h: nibbles j = h, h + 2 of each word
    const uint32_t pair = h ? sm.y : sm.x;
    const float sc = bf16_bits_to_float(pair & 0xFFFF), mn = bf16_bits_to_float(pair >> 16);
    __align__(16) __nv_bfloat16 v[16];
#pragma unroll
    for (int st = 0; st < 4; ++st)
#pragma unroll
      for (int jh = 0; jh < 2; ++jh)
#pragma unroll
        for (int e = 0; e < 2; ++e) {
          // nibble_coords' mapping: nibble p of word st, j = p % 4 = h + 2jh, is row gid + 8h and input
          // 4st + 2jh + e of the lane's 16.
          const int p = h + 2 * jh + 4 * e;
          v[4 * st + 2 * jh + e] =
              __float2bfloat16_rn(fmaf(static_cast<float>((words[st] >> (4 * p)) & 0xF), sc, mn));
        }
    auto* dst = reinterpret_cast<uint4*>(tile + (gid + 8 * h) * kDqPitch + 16 * tig);
    dst[0] = reinterpret_cast<const uint4*>(v)[0];
    dst[1] = reinterpret_cast<const uint4*>(v)[1];
  }
  __syncwarp();
  const int seg = lane & 7;  // 8 lanes per row, 16 bytes (8 inputs) each
  const int col = c * kChunk + 8 * seg;
  const bool whole = cols % 8 == 0 && col + 8 <= cols;
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    const int r = 4 * i + (lane >> 3), row = t * kTileRows + r;
    if (row >= rows) continue;
    const __nv_bfloat16* src = tile + r * kDqPitch + 8 * seg;
    __nv_bfloat16* o = out + static_cast<int64_t>(row) * cols + col;
    if (whole)
      *reinterpret_cast<uint4*>(o) = *reinterpret_cast<const uint4*>(src);
    else
      for (int k = 0; k < 8 && col + k < cols; ++k) o[k] = src[k];
  }
}

DeviceLinear w4a16_upload(const std::vector<Tensor>& parts, int64_t rows, int64_t cols, int group_size);
}  // namespace

// The memory pool of per-call scratch (the prefill path's dequantized weights,
// the wgmma kernel's images beyond 64 tokens), one per device: it keeps freed
// memory mapped (no unmapping at each synchronisation), leaving the default
// pool and its release threshold to the rest of the process.
cudaMemPool_t w4a16_scratch_pool() {
  static Memo<int, cudaMemPool_t> pools;
  int dev = 0;
  NIBBLE_CUDA_CHECK(cudaGetDevice(&dev));
  return pools.get(dev, [&] {
    cudaMemPool_t p = nullptr;
    cudaMemPoolProps props = {};
    props.allocType = cudaMemAllocationTypePinned;
    props.handleTypes = cudaMemHandleTypeNone;
    props.location.type = cudaMemLocationTypeDevice;
    props.location.id = dev;
    NIBBLE_CUDA_CHECK(cudaMemPoolCreate(&p, &props));
    uint64_t keep = ~uint64_t{0};
    NIBBLE_CUDA_CHECK(cudaMemPoolSetAttribute(p, cudaMemPoolAttrReleaseThreshold, &keep));
    return p;
  });
}

namespace {
void w4a16_gemm(const DeviceLinear& w, const void* x, int64_t M, int64_t ldx, void* y, int64_t ldy, Act act,
                bool f32_out, void* stream, bool pdl);

bool w4a16_single_token_f32(const DeviceLinear& w) { return w4a16_gemv_applies(w.group_size); }
void w4a16_prepared(const DeviceLinear& w, const void* prepared, size_t bytes, void* y, void* stream, bool pdl,
                    bool deep, const GemvFusion* fuse);
void w4a16_prepare(const DeviceLinear& w, const void* x, Act act, void* prepared, size_t bytes, void* stream,
                   bool pdl);

void w4a16_chain(const GemvCall* calls, int count, unsigned* sync, void* stream, bool pdl);

// A w4a16_mma registry row: a format family and its upload; every row shares
// the layout and the kernels.
LinearKernel w4a16_row(std::string_view format,
                       DeviceLinear (*upload)(const std::vector<Tensor>&, int64_t, int64_t, int)) {
  return {format, "w4a16_mma", {32, 64, 128}, upload, &w4a16_gemm,
          &w4a16_single_token_f32, &w4a16_prepared, &w4a16_prepare, &w4a16_chain};
}

const LinearKernel kW4A16 = w4a16_row("int4_asym", &w4a16_upload);

// int4_sym runs on the same kernels: its parameters become int4_asym's at
// upload (int4_sym_as_asym) and the weight is an int4_asym weight from then on.
DeviceLinear w4a16_upload_sym(const std::vector<Tensor>& parts, int64_t rows, int64_t cols, int group_size) {
  return w4a16_upload(int4_sym_as_asym(parts, rows, cols, group_size), rows, cols, group_size);
}
const LinearKernel kW4A16Sym = w4a16_row("int4_sym", &w4a16_upload_sym);

// int4_asym_f32 (AWQ, asymmetric GPTQ, Q4_1, Q4_K re-encoded) likewise: each
// fp32 scale and min rounded once to bf16 (int4_asym_f32_as_asym).
DeviceLinear w4a16_upload_f32(const std::vector<Tensor>& parts, int64_t rows, int64_t cols, int group_size) {
  return w4a16_upload(int4_asym_f32_as_asym(parts, rows, cols, group_size), rows, cols, group_size);
}
const LinearKernel kW4A16F32 = w4a16_row("int4_asym_f32", &w4a16_upload_f32);

DeviceLinear w4a16_upload(const std::vector<Tensor>& parts, int64_t rows, int64_t cols, int group_size) {
  check_parts(parts, rows, cols, group_size);
  const Dims d = dims_of(rows, cols, group_size);
  DeviceLinear out;
  out.kernel = &kW4A16;
  out.rows = rows;
  out.cols = cols;
  out.group_size = group_size;
  out.a = DeviceBuffer(static_cast<size_t>(d.tiles * d.chunks * 32 * 16));
  out.b = DeviceBuffer(static_cast<size_t>(d.tiles * d.groups_padded * 8 * 8));
  if (w4a16_gemv_applies(group_size))  // the prepared activation (M = 1), the x image (17..64, sm_90)
    out.scratch = DeviceBuffer(std::max(w4a16_gemv_scratch_bytes(cols),
                                        w4a16_wgmma_device() ? w4a16_wgmma_scratch_bytes(cols, group_size) : 0));
  const DeviceBuffer qw = upload(parts[0]), sc = upload(parts[1]), mn = upload(parts[2]);
  const int64_t words = d.tiles * d.chunks * 32 * 4, entries = d.tiles * d.groups_padded * 8;
  relayout_codes_kernel<<<blocks_for(words, 256), 256>>>(static_cast<const uint8_t*>(qw.get()),
                                                          static_cast<uint32_t*>(out.a.get()), rows, cols, d.chunks);
  NIBBLE_CUDA_CHECK(cudaGetLastError());
  relayout_meta_kernel<<<blocks_for(entries, 256), 256>>>(
      static_cast<const uint16_t*>(sc.get()), static_cast<const uint16_t*>(mn.get()),
      static_cast<uint16_t*>(out.b.get()), rows, (cols + group_size - 1) / group_size, d.groups_padded);
  NIBBLE_CUDA_CHECK(cudaGetLastError());
  NIBBLE_CUDA_CHECK(cudaDeviceSynchronize());
  return out;
}

}  // namespace

namespace {
// Above this many tokens a bf16 call dequantizes the weight and runs cuBLAS
// (on sm_90 GPUs only above 256, w4a16_wgmma_applies: the wgmma kernel takes
// up to 256 tokens in one pass, fused stack 6.65 ms at M = 128 against this
// path's 9.61; docs/CUDA.md "More than 64 tokens on Hopper"). Measured on the
// H200 for the small-M kernel (bench_w4a16, fused 8B stack as CUDA graphs):
// it takes about 3.8 ms per block of 32 tokens (M = 64 7.7 ms, M = 96 11.6 ms,
// M = 128 15.4 ms); dequantize + cuBLAS 9.2-9.6 ms at M = 48..128 and 16.0 ms
// at M = 512 (session 13, dequant_tile_kernel; session 12's one-thread-per-lane
// version wrote at about 1 TB/s and took 25.4 ms at 512).
constexpr int64_t kLargeM = 64;
}  // namespace

namespace {

struct DeviceInfo {
  int sms = 0;
  int smem_optin = 0;  // the most dynamic shared memory a block may ask for
};
const DeviceInfo& device_info() {
  static const DeviceInfo info = [] {
    DeviceInfo i;
    int dev = 0;
    NIBBLE_CUDA_CHECK(cudaGetDevice(&dev));
    NIBBLE_CUDA_CHECK(cudaDeviceGetAttribute(&i.sms, cudaDevAttrMultiProcessorCount, dev));
    NIBBLE_CUDA_CHECK(cudaDeviceGetAttribute(&i.smem_optin, cudaDevAttrMaxSharedMemoryPerBlockOptin, dev));
    return i;
  }();
  return info;
}

}  // namespace

int device_sm_count() { return device_info().sms; }
size_t device_smem_cap(size_t want) { return std::min(want, static_cast<size_t>(device_info().smem_optin)); }

namespace {

void w4a16_prepared(const DeviceLinear& w, const void* prepared, size_t bytes, void* y, void* stream, bool pdl,
                    bool deep, const GemvFusion* fuse) {
  NIBBLE_CHECK(w.kernel == &kW4A16, "w4a16: the weight was uploaded for another kernel");
  w4a16_gemv_prepared(w, prepared, bytes, y, static_cast<cudaStream_t>(stream), pdl, device_sm_count(), deep, fuse);
}

void w4a16_chain(const GemvCall* calls, int count, unsigned* sync, void* stream, bool pdl) {
  for (int c = 0; c < count; ++c)
    NIBBLE_CHECK(calls[c].w->kernel == &kW4A16, "w4a16: the weight was uploaded for another kernel");
  w4a16_gemv_chain(calls, count, sync, static_cast<cudaStream_t>(stream), pdl);
}

void w4a16_prepare(const DeviceLinear& w, const void* x, Act act, void* prepared, size_t bytes, void* stream,
                   bool pdl) {
  NIBBLE_CHECK(w.kernel == &kW4A16, "w4a16: the weight was uploaded for another kernel");
  w4a16_gemv_prepare(w, x, act, prepared, bytes, static_cast<cudaStream_t>(stream), pdl);
}

void w4a16_gemm(const DeviceLinear& w, const void* x, int64_t M, int64_t ldx, void* y, int64_t ldy, Act act,
                bool f32_out, void* stream, bool pdl) {
  NIBBLE_CHECK(w.kernel == &kW4A16, "w4a16: the weight was uploaded for another kernel");
  NIBBLE_CHECK(ldx >= w.cols && ldx % 8 == 0, "w4a16: ldx must be a multiple of 8 and at least {} (found {})", w.cols,
               ldx);
  NIBBLE_CHECK(reinterpret_cast<uintptr_t>(x) % 16 == 0, "w4a16: x must be 16-byte aligned");
  NIBBLE_CHECK(std::find(kW4A16.group_sizes.begin(), kW4A16.group_sizes.end(), w.group_size) !=
                   kW4A16.group_sizes.end(),
               "w4a16: group size {} has no kernel", w.group_size);
  NIBBLE_CHECK(ldy >= w.rows, "w4a16: ldy must be at least {} (found {})", w.rows, ldy);
  NIBBLE_CHECK(w.rows < (int64_t{1} << 31) && w.cols < (int64_t{1} << 31), "w4a16: matrix too large");
  if (M <= 0) return;
  const auto s = static_cast<cudaStream_t>(stream);
  if (M == 1 && w4a16_gemv_applies(w.group_size))  // decode: integer dot products (w4a16_gemv.cu)
    return w4a16_gemv(w, x, act, y, f32_out, s, pdl, device_sm_count());
  if (M > kLargeM && act == Act::BF16 && !w4a16_wgmma_applies(w, M, act)) {
    // Prefill-sized M: each pass of the kernels re-reads every weight for at
    // most 32 tokens (256 with wgmma), so dequantize once into a stream-ordered scratch and let
    // cuBLAS take all M tokens (bf16, fp32 accumulation).
    const Dims d = dims_of(w.rows, w.cols, w.group_size);
    void* wb = nullptr;
    NIBBLE_CUDA_CHECK(cudaMallocFromPoolAsync(&wb, static_cast<size_t>(w.rows * w.cols) * 2, w4a16_scratch_pool(), s));
    NIBBLE_CHECK(d.tiles * d.chunks < (int64_t{1} << 31), "w4a16: matrix too large");
    const int units = static_cast<int>(d.tiles * d.chunks);
    dequant_tile_kernel<<<blocks_for(units, kDqWarps), kDqWarps * 32, 0, s>>>(
        static_cast<const uint4*>(w.a.get()), static_cast<const uint2*>(w.b.get()),
        static_cast<__nv_bfloat16*>(wb), static_cast<int>(w.rows), static_cast<int>(w.cols),
        static_cast<int>(d.chunks), static_cast<int>(d.groups_padded),
        __builtin_ctz(static_cast<unsigned>(w.group_size)), units);
    NIBBLE_CUDA_CHECK(cudaGetLastError());
    gemm_bf16_cublas(wb, w.rows, w.cols, x, M, ldx, y, ldy, stream, f32_out);
    NIBBLE_CUDA_CHECK(cudaFreeAsync(wb, s));
    return;
  }
  NIBBLE_CHECK(act != Act::F32, "w4a16: f32 activations need M = 1 (M {}, group {})", M,
               w.group_size);
  w4a16_small_m(w, x, M, ldx, act, y, ldy, f32_out, s, pdl, device_sm_count());  // M >= 2 (w4a16_small_m.cu)
}

}  // namespace

const std::vector<const LinearKernel*>& linear_kernel_registry() {
  static const std::vector<const LinearKernel*> rows = {&kW4A16, &kW4A16Sym, &kW4A16F32};
  return rows;
}

const LinearKernel* find_linear_kernel(std::string_view format, int group_size) {
  for (const LinearKernel* k : linear_kernel_registry())
    if (k->format == format && std::find(k->group_sizes.begin(), k->group_sizes.end(), group_size) != k->group_sizes.end())
      return k;
  return nullptr;
}

std::vector<Tensor> int4_sym_as_asym(const std::vector<Tensor>& parts, int64_t rows, int64_t cols, int group_size) {
  nibble::check_parts(find_format("int4_sym", group_size), parts, rows, cols);
  const Tensor sc = parts[1].contiguous();
  const int64_t n = sc.numel();
  Tensor scale = Tensor::empty(DType::BF16, sc.shape()), min = Tensor::empty(DType::BF16, sc.shape());
  const auto* s16 = static_cast<const uint16_t*>(sc.raw());
  for (int64_t i = 0; i < n; ++i) {
    const uint16_t b = f32_to_bf16(f16_to_f32(s16[i]));  // f16 → f32 is exact: one rounding
    scale.data_mut<uint16_t>()[i] = b;
    min.data_mut<uint16_t>()[i] = f32_to_bf16(-8.0f * bf16_to_f32(b));  // exact: 8 times a bf16 value
  }
  return {parts[0], scale, min};
}

std::vector<Tensor> int4_asym_f32_as_asym(const std::vector<Tensor>& parts, int64_t rows, int64_t cols,
                                          int group_size) {
  nibble::check_parts(find_format("int4_asym_f32", group_size), parts, rows, cols);
  return {parts[0], parts[1].to(DType::BF16), parts[2].to(DType::BF16)};  // f32_to_bf16's rounding, per element
}

W4A16HostLayout w4a16_layout_host(const std::vector<Tensor>& parts, int64_t rows, int64_t cols, int group_size) {
  check_parts(parts, rows, cols, group_size);
  const Dims d = dims_of(rows, cols, group_size);
  const Tensor qw = parts[0].contiguous(), sc = parts[1].contiguous(), mn = parts[2].contiguous();
  const auto* q = static_cast<const uint8_t*>(qw.raw());
  const auto* s = static_cast<const uint16_t*>(sc.raw());
  const auto* m = static_cast<const uint16_t*>(mn.raw());
  const int64_t bytes_per_row = (cols + 1) / 2, groups = (cols + group_size - 1) / group_size;
  W4A16HostLayout out;
  out.codes.assign(static_cast<size_t>(d.tiles * d.chunks * 32 * 16), 0);
  out.meta.assign(static_cast<size_t>(d.tiles * d.groups_padded * 8 * 8), 0);
  for (int64_t t = 0; t < d.tiles; ++t)
    for (int64_t c = 0; c < d.chunks; ++c)
      for (int lane = 0; lane < 32; ++lane)
        for (int st = 0; st < 4; ++st) {
          uint32_t w = 0;
          for (int p = 0; p < 8; ++p) {
            int r, k;
            nibble_coords(lane, st, p, &r, &k);
            const int64_t row = t * kTileRows + r, col = c * kChunk + k;
            if (row >= rows || col >= cols) continue;
            const uint8_t b = q[row * bytes_per_row + col / 2];
            w |= static_cast<uint32_t>((col & 1) ? (b >> 4) : (b & 0xF)) << (4 * p);
          }
          std::memcpy(&out.codes[static_cast<size_t>((((t * d.chunks + c) * 32 + lane) * 4 + st) * 4)], &w, 4);
        }
  for (int64_t t = 0; t < d.tiles; ++t)
    for (int64_t g = 0; g < d.groups_padded; ++g)
      for (int gid = 0; gid < 8; ++gid)
        for (int h = 0; h < 2; ++h) {
          const int64_t row = t * kTileRows + gid + 8 * h;
          const bool ok = row < rows && g < groups;
          const uint16_t v[2] = {ok ? s[row * groups + g] : uint16_t{0}, ok ? m[row * groups + g] : uint16_t{0}};
          std::memcpy(&out.meta[static_cast<size_t>(((t * d.groups_padded + g) * 8 + gid) * 8 + 4 * h)], v, 4);
        }
  return out;
}

DeviceBuffer dequantize_to_bf16_device(const std::vector<Tensor>& parts, int64_t rows, int64_t cols, int group_size) {
  return upload_bf16(dequantize_parts(find_format("int4_asym", group_size), parts, rows, cols));
}

namespace {
// One handle and one workspace for the process (never freed), set to `stream`.
// The workspace is ours, not cuBLAS's pool: a call captured into a CUDA graph
// (the GPU forward's decode step) then gets the same workspace, and so the
// same algorithm, as the same call launched directly. 32 MiB is what the
// cuBLAS documentation recommends for Hopper.
cublasHandle_t cublas_on(void* stream) {
  constexpr size_t kWorkspaceBytes = size_t{32} << 20;
  struct Cublas {
    cublasHandle_t handle = nullptr;
    void* workspace = nullptr;
  };
  static const Cublas lib = [] {
    Cublas c;
    NIBBLE_CHECK(cublasCreate(&c.handle) == CUBLAS_STATUS_SUCCESS, "cuBLAS: cublasCreate failed");
    NIBBLE_CUDA_CHECK(cudaMalloc(&c.workspace, kWorkspaceBytes));
    return c;
  }();
  // cublasSetStream resets the workspace to the library's pool: set ours after it.
  NIBBLE_CHECK(cublasSetStream(lib.handle, static_cast<cudaStream_t>(stream)) == CUBLAS_STATUS_SUCCESS,
               "cuBLAS: cublasSetStream failed");
  NIBBLE_CHECK(cublasSetWorkspace(lib.handle, lib.workspace, kWorkspaceBytes) == CUBLAS_STATUS_SUCCESS,
               "cuBLAS: cublasSetWorkspace failed");
  return lib.handle;
}
}  // namespace

void gemm_bf16_cublas(const void* w_bf16, int64_t rows, int64_t cols, const void* x, int64_t M, int64_t ldx, void* y,
                      int64_t ldy, void* stream, bool f32_out) {
  const float alpha = 1.0f, beta = 0.0f;
  // Column-major view: Yᵀ[rows, M] = W[rows, cols] (row-major = colmajor Wᵀ) · Xᵀ[cols, M].
  const cublasStatus_t st = cublasGemmEx(
      cublas_on(stream), CUBLAS_OP_T, CUBLAS_OP_N, static_cast<int>(rows), static_cast<int>(M), static_cast<int>(cols),
      &alpha, w_bf16, CUDA_R_16BF, static_cast<int>(cols), x, CUDA_R_16BF, static_cast<int>(ldx), &beta, y,
      f32_out ? CUDA_R_32F : CUDA_R_16BF, static_cast<int>(ldy), CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT);
  NIBBLE_CHECK(st == CUBLAS_STATUS_SUCCESS, "cuBLAS: bf16 GEMM failed (status {})", static_cast<int>(st));
}

void gemm_f32_cublas(const float* w, int64_t rows, int64_t cols, const float* x, int64_t M, int64_t ldx, float* y,
                     int64_t ldy, void* stream) {
  const float alpha = 1.0f, beta = 0.0f;
  // fp32 throughout: the pedantic compute type rules out TF32 and any other reduced-precision path.
  const cublasStatus_t st = cublasGemmEx(
      cublas_on(stream), CUBLAS_OP_T, CUBLAS_OP_N, static_cast<int>(rows), static_cast<int>(M), static_cast<int>(cols),
      &alpha, w, CUDA_R_32F, static_cast<int>(cols), x, CUDA_R_32F, static_cast<int>(ldx), &beta, y, CUDA_R_32F,
      static_cast<int>(ldy), CUBLAS_COMPUTE_32F_PEDANTIC, CUBLAS_GEMM_DEFAULT);
  NIBBLE_CHECK(st == CUBLAS_STATUS_SUCCESS, "cuBLAS: f32 GEMM failed (status {})", static_cast<int>(st));
}

}  // namespace nibble::cuda
