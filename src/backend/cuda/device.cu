// Device memory (DeviceBuffer) and the host-to-device copies every CUDA file uses.
#include <vector>

#include "backend/cuda/check.h"
#include "nibble/cuda.h"
#include "nibble/dtype.h"

namespace nibble::cuda {

bool device_available() {
  int n = 0;
  return cudaGetDeviceCount(&n) == cudaSuccess && n > 0;
}

void DeviceBuffer::Free::operator()(void* p) const { cudaFree(p); }

DeviceBuffer::DeviceBuffer(size_t bytes) : bytes_(bytes) {
  void* p = nullptr;
  NIBBLE_CUDA_CHECK(cudaMalloc(&p, bytes ? bytes : 1));
  ptr_.reset(p);
}

DeviceBuffer upload(const void* host, size_t bytes) {
  DeviceBuffer d(bytes);
  if (bytes > 0) NIBBLE_CUDA_CHECK(cudaMemcpy(d.get(), host, bytes, cudaMemcpyHostToDevice));
  return d;
}

DeviceBuffer upload(const Tensor& t) {
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
