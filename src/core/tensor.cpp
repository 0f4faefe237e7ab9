// Tensor: shape, dtype, element strides and owned or borrowed storage.
#include "nibble/tensor.h"

#include <cstring>
#include <limits>
#include <new>

namespace nibble {

namespace {

// Owned buffers start on a 64-byte boundary: a cache line, and the widest
// SIMD load (AVX-512) can then be aligned on the first element.
constexpr std::align_val_t kAlignment{64};

Shape contiguous_strides(const Shape& shape) {
  NIBBLE_CHECK(checked_numel(shape), "shape {} has more elements than int64 can count", shape_str(shape));
  Shape strides(shape.size());
  int64_t s = 1;
  for (size_t i = shape.size(); i-- > 0;) {
    strides[i] = s;
    if (shape[i] != 0) s *= shape[i];  // fits: checked above (a zero dimension leaves its outer strides finite)
  }
  return strides;
}

size_t checked_nbytes(DType dtype, const Shape& shape) {
  const int64_t n = shape_numel(shape);
  const size_t esize = dtype_size(dtype);
  NIBBLE_CHECK(static_cast<uint64_t>(n) <= std::numeric_limits<size_t>::max() / esize,
               "tensor {} of {} is too large to allocate", shape_str(shape), dtype_name(dtype));
  return static_cast<size_t>(n) * esize;
}

std::shared_ptr<void> allocate(size_t nbytes) {
  // Always allocate at least one line so an empty tensor still has a non-null
  // data pointer like any other owned tensor.
  void* p = ::operator new(nbytes < 64 ? 64 : nbytes, kAlignment);
  return std::shared_ptr<void>(p, [](void* q) { ::operator delete(q, kAlignment); });
}

}  // namespace

int64_t shape_numel(const Shape& shape) {
  int64_t n = 1;
  for (int64_t d : shape) {
    NIBBLE_CHECK(d >= 0, "shape {} has a negative dimension", shape_str(shape));
    NIBBLE_CHECK(!__builtin_mul_overflow(n, d, &n), "shape {} has more elements than int64 can count",
                 shape_str(shape));
  }
  return n;
}

std::optional<int64_t> checked_numel(const Shape& shape) {
  int64_t n = 1;
  bool empty = false;
  for (int64_t d : shape) {
    if (d == 0) {
      empty = true;
      continue;
    }
    if (d < 0 || __builtin_mul_overflow(n, d, &n)) return std::nullopt;
  }
  return empty ? 0 : n;
}

std::string shape_str(const Shape& shape) { return fmt::format("[{}]", fmt::join(shape, ", ")); }

Tensor Tensor::empty(DType dtype, Shape shape) {
  const size_t nbytes = checked_nbytes(dtype, shape);
  Tensor t;
  t.dtype_ = dtype;
  t.strides_ = contiguous_strides(shape);
  t.shape_ = std::move(shape);
  std::shared_ptr<void> storage = allocate(nbytes);
  t.data_ = storage.get();
  t.owner_ = std::move(storage);
  t.owns_ = true;
  return t;
}

Tensor Tensor::zeros(DType dtype, Shape shape) {
  Tensor t = empty(dtype, std::move(shape));
  std::memset(const_cast<void*>(t.data_), 0, t.nbytes());
  return t;
}

Tensor Tensor::view(DType dtype, Shape shape, const void* data, std::shared_ptr<const void> owner) {
  const int64_t n = shape_numel(shape);
  NIBBLE_CHECK(data != nullptr || n == 0, "Tensor::view: null data for a {} tensor of shape {}",
               dtype_name(dtype), shape_str(shape));
  Tensor t;
  t.dtype_ = dtype;
  t.strides_ = contiguous_strides(shape);
  t.shape_ = std::move(shape);
  t.data_ = data;
  t.owner_ = std::move(owner);
  t.owns_ = false;
  return t;
}

Tensor Tensor::view_strided(DType dtype, Shape shape, Shape strides, const void* data,
                            std::shared_ptr<const void> owner) {
  NIBBLE_CHECK(strides.size() == shape.size(), "Tensor::view_strided: {} strides for shape {}", strides.size(),
               shape_str(shape));
  for (int64_t s : strides) {
    NIBBLE_CHECK(s >= 0, "Tensor::view_strided: negative stride in {}", shape_str(strides));
  }
  Tensor t = view(dtype, std::move(shape), data, std::move(owner));
  t.strides_ = std::move(strides);
  return t;
}

int64_t Tensor::size(int64_t d) const {
  // Negative d counts from the end, as in PyTorch: size(-1) is the last dim.
  const int64_t nd = dim();
  NIBBLE_CHECK(d >= -nd && d < nd, "size({}) out of range for a tensor of shape {}", d, shape_str(shape_));
  return shape_[static_cast<size_t>(d < 0 ? d + nd : d)];
}

bool Tensor::is_contiguous() const {
  if (numel() == 0) return true;
  int64_t expected = 1;
  for (size_t i = shape_.size(); i-- > 0;) {
    // A dimension of size 1 is never stepped over, so its stride is free.
    if (shape_[i] != 1 && strides_[i] != expected) return false;
    expected *= shape_[i];
  }
  return true;
}

void* Tensor::raw_mut() {
  NIBBLE_CHECK(owns_, "cannot write to a {} tensor of shape {}: it borrows its storage (copy it first)",
               dtype_name(dtype_), shape_str(shape_));
  return const_cast<void*>(data_);
}

Tensor Tensor::contiguous() const {
  NIBBLE_CHECK(defined(), "contiguous() of an undefined tensor");
  Tensor out = empty(dtype_, shape_);
  const size_t nbytes = out.nbytes();
  if (nbytes == 0) return out;
  if (is_contiguous()) {
    std::memcpy(out.raw_mut(), data_, nbytes);
    return out;
  }
  // Strided gather: walk the output in row-major order, keeping a multi-index
  // over all but the last dimension and copying the last one element-wise.
  const size_t esize = dtype_size(dtype_);
  const size_t nd = shape_.size();
  const int64_t inner = shape_[nd - 1];
  const int64_t inner_stride = strides_[nd - 1];
  const auto* src = static_cast<const unsigned char*>(data_);
  auto* dst = static_cast<unsigned char*>(out.raw_mut());
  std::vector<int64_t> index(nd, 0);
  const int64_t outer = numel() / inner;
  for (int64_t row = 0; row < outer; ++row) {
    int64_t offset = 0;  // in elements
    for (size_t i = 0; i + 1 < nd; ++i) offset += index[i] * strides_[i];
    for (int64_t j = 0; j < inner; ++j) {
      std::memcpy(dst, src + (offset + j * inner_stride) * static_cast<int64_t>(esize), esize);
      dst += esize;
    }
    for (size_t i = nd - 1; i-- > 0;) {  // odometer increment over the outer dims
      if (++index[i] < shape_[i]) break;
      index[i] = 0;
    }
  }
  return out;
}

Tensor Tensor::to_f32() const {
  NIBBLE_CHECK(defined(), "to_f32() of an undefined tensor");
  if (!is_contiguous()) return contiguous().to_f32();
  Tensor out = empty(DType::F32, shape_);
  convert_to_f32(data_, dtype_, out.data_mut<float>(), static_cast<size_t>(numel()));
  return out;
}

Tensor Tensor::to(DType dtype) const {
  NIBBLE_CHECK(dtype == DType::F32 || dtype == DType::F16 || dtype == DType::BF16,
               "cannot convert a tensor of shape {} to {}: targets are F32, F16 and BF16", shape_str(shape_),
               dtype_name(dtype));
  if (dtype == dtype_) return contiguous();
  Tensor f32 = to_f32();
  if (dtype == DType::F32) return f32;
  // Non-F32 sources pass through fp32 first. That is exact for every source
  // except F64 (and I32/I64 beyond 2^24), where it rounds twice.
  Tensor out = empty(dtype, shape_);
  convert_from_f32(f32.data<float>(), dtype, out.raw_mut(), static_cast<size_t>(numel()));
  return out;
}

Tensor Tensor::reshape(Shape shape) const {
  NIBBLE_CHECK(is_contiguous(), "reshape of a non-contiguous tensor of shape {} (call contiguous() first)",
               shape_str(shape_));
  int64_t known = 1;
  int inferred = -1;
  for (size_t i = 0; i < shape.size(); ++i) {
    if (shape[i] == -1) {
      NIBBLE_CHECK(inferred < 0, "reshape to {}: at most one dimension may be -1", shape_str(shape));
      inferred = static_cast<int>(i);
    } else {
      NIBBLE_CHECK(shape[i] >= 0, "reshape to {}: negative dimension", shape_str(shape));
      known *= shape[i];
    }
  }
  const int64_t n = numel();
  if (inferred >= 0) {
    NIBBLE_CHECK(known != 0 && n % known == 0, "cannot reshape {} ({} elements) to {}", shape_str(shape_), n,
                 shape_str(shape));
    shape[static_cast<size_t>(inferred)] = n / known;
  }
  NIBBLE_CHECK(shape_numel(shape) == n, "cannot reshape {} ({} elements) to {}", shape_str(shape_), n,
               shape_str(shape));
  Tensor t = *this;
  t.strides_ = contiguous_strides(shape);
  t.shape_ = std::move(shape);
  return t;
}

Tensor Tensor::slice_rows(int64_t begin, int64_t end) const {
  NIBBLE_CHECK(dim() >= 1, "slice_rows of a 0-d tensor");
  NIBBLE_CHECK(0 <= begin && begin <= end && end <= shape_[0],
               "slice_rows [{}, {}) out of range for a tensor of shape {}", begin, end, shape_str(shape_));
  Tensor t = *this;
  t.shape_[0] = end - begin;
  if (begin != 0 && data_ != nullptr) {
    const int64_t offset = begin * strides_[0] * static_cast<int64_t>(dtype_size(dtype_));
    t.data_ = static_cast<const unsigned char*>(data_) + offset;
  }
  return t;
}

}  // namespace nibble
