// Device memory (DeviceBuffer), the host-to-device copies every CUDA file uses,
// and the read-bandwidth measurement (the roofline of memory-bound kernels).
#include <algorithm>
#include <atomic>
#include <vector>

#include "backend/cuda/check.h"
#include "nibble/cuda.h"
#include "nibble/dtype.h"

namespace nibble::cuda {

bool device_available() {
  int n = 0;
  return cudaGetDeviceCount(&n) == cudaSuccess && n > 0;
}

void synchronize() { NIBBLE_CUDA_CHECK(cudaDeviceSynchronize()); }

namespace {

// Reads p[0, n) once (16-byte streaming loads); the xor keeps the loads alive.
__global__ void read_kernel(const uint4* __restrict__ p, int64_t n, unsigned* out) {
  unsigned acc = 0;
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n; i += int64_t(gridDim.x) * blockDim.x) {
    const uint4 v = __ldcs(p + i);
    acc ^= v.x ^ v.y ^ v.z ^ v.w;
  }
  if (acc == 0x12345678u) out[0] = acc;  // practically never taken
}

}  // namespace

double read_bandwidth_gbs(size_t bytes, int passes) {
  NIBBLE_CHECK(bytes >= 16 && passes > 0, "read_bandwidth_gbs: nothing to measure");
  bytes = bytes / 16 * 16;
  int dev = 0, sms = 0;
  NIBBLE_CUDA_CHECK(cudaGetDevice(&dev));
  NIBBLE_CUDA_CHECK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, dev));
  DeviceBuffer buf(bytes), sink(64);
  NIBBLE_CUDA_CHECK(cudaMemset(buf.get(), 0x5A, bytes));
  cudaEvent_t a = nullptr, b = nullptr;
  NIBBLE_CUDA_CHECK(cudaEventCreate(&a));
  NIBBLE_CUDA_CHECK(cudaEventCreate(&b));
  constexpr int kReads = 4;
  std::vector<float> ms;
  for (int i = -2; i < passes; ++i) {  // two warm-up passes
    NIBBLE_CUDA_CHECK(cudaEventRecord(a));
    for (int r = 0; r < kReads; ++r)  // back to back, so the launch latency is a small part of the time
      read_kernel<<<sms * 8, 512>>>(static_cast<const uint4*>(buf.get()), static_cast<int64_t>(bytes / 16),
                                    static_cast<unsigned*>(sink.get()));
    NIBBLE_CUDA_CHECK(cudaGetLastError());
    NIBBLE_CUDA_CHECK(cudaEventRecord(b));
    NIBBLE_CUDA_CHECK(cudaEventSynchronize(b));
    float t = 0;
    NIBBLE_CUDA_CHECK(cudaEventElapsedTime(&t, a, b));
    if (i >= 0) ms.push_back(t);
  }
  cudaEventDestroy(a);
  cudaEventDestroy(b);
  std::sort(ms.begin(), ms.end());
  return static_cast<double>(bytes) * kReads / (ms[ms.size() / 2] * 1e-3) / 1e9;
}

namespace {
std::atomic<size_t> g_live{0}, g_peak{0}, g_device_peak{0};
// peak = max(peak, v), safe against concurrent callers.
void raise_to(std::atomic<size_t>& peak, size_t v) {
  size_t p = peak.load();
  while (v > p && !peak.compare_exchange_weak(p, v)) {
  }
}
}  // namespace

size_t device_bytes_live() { return g_live.load(); }
size_t device_bytes_peak() { return g_peak.load(); }
DeviceMemory device_memory() {
  size_t free = 0, total = 0;
  NIBBLE_CUDA_CHECK(cudaMemGetInfo(&free, &total));
  const size_t used = total - free;
  raise_to(g_device_peak, used);
  return DeviceMemory{used, total};
}
size_t device_memory_peak() { return g_device_peak.load(); }
void reset_device_bytes_peak() { g_peak.store(g_live.load()); }

void DeviceBuffer::Free::operator()(void* p) const {
  cudaFree(p);
  g_live.fetch_sub(bytes);
}

DeviceBuffer::DeviceBuffer(size_t bytes) : bytes_(bytes) {
  void* p = nullptr;
  const cudaError_t err = cudaMalloc(&p, bytes ? bytes : 1);
  if (err == cudaErrorMemoryAllocation) {
    cudaGetLastError();  // clears the error: the device stays usable
    size_t free = 0, total = 0;
    cudaMemGetInfo(&free, &total);
    constexpr double kGiB = 1024.0 * 1024.0 * 1024.0;
    NIBBLE_FAIL("GPU out of memory: {:.2f} GiB asked for, {:.2f} GiB free of {:.2f} GiB",
                static_cast<double>(bytes) / kGiB, static_cast<double>(free) / kGiB,
                static_cast<double>(total) / kGiB);
  }
  NIBBLE_CUDA_CHECK(err);
  ptr_ = std::unique_ptr<void, Free>(p, Free{bytes});
  raise_to(g_peak, g_live.fetch_add(bytes) + bytes);
}

DeviceBuffer upload(const void* host, size_t bytes) {
  DeviceBuffer d(bytes);
  if (bytes > 0) NIBBLE_CUDA_CHECK(cudaMemcpy(d.get(), host, bytes, cudaMemcpyHostToDevice));
  return d;
}

DeviceBuffer upload(const Tensor& t) {
  if (t.is_contiguous()) return upload(t.raw(), t.nbytes());  // contiguous() would copy it on the host first
  const Tensor c = t.contiguous();
  return upload(c.raw(), c.nbytes());
}

DeviceBuffer upload_bf16(const Tensor& t) {
  const Tensor c = t.to_f32().contiguous();
  std::vector<uint16_t> h(static_cast<size_t>(c.numel()));
  const float* p = c.data<float>();
  for (size_t i = 0; i < h.size(); ++i) h[i] = f32_to_bf16(p[i]);
  return upload(h.data(), h.size() * 2);
}

}  // namespace nibble::cuda
