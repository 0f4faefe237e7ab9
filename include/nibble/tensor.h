// Tensor: a shape, a dtype, element strides, and storage that is either owned
// or borrowed from something kept alive by `owner` (e.g. a memory-mapped file).
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "nibble/dtype.h"
#include "nibble/error.h"

namespace nibble {

using Shape = std::vector<int64_t>;

int64_t shape_numel(const Shape& shape);
// The element count of a shape of non-negative dimensions, or nullopt when the
// product of its nonzero dimensions overflows int64: a shape with a zero
// dimension is empty, but its other dimensions must still fit, since a
// contiguous tensor's strides multiply them. For readers of untrusted shapes,
// which refuse such a shape with their file's name.
std::optional<int64_t> checked_numel(const Shape& shape);
std::string shape_str(const Shape& shape);  // "[64, 172]"

class Tensor {
 public:
  Tensor() = default;

  // A new zero-filled contiguous tensor that owns its bytes.
  static Tensor zeros(DType dtype, Shape shape);
  // Like zeros() but the bytes are left uninitialized (for outputs that are
  // about to be overwritten in full; skips a memset over large buffers).
  static Tensor empty(DType dtype, Shape shape);
  // A contiguous view of `data`; `owner` keeps the bytes alive (may be null
  // when the caller guarantees the lifetime).
  static Tensor view(DType dtype, Shape shape, const void* data, std::shared_ptr<const void> owner);
  // A view with explicit element strides (non-negative, one per dimension),
  // e.g. a transpose or a column block of a larger matrix.
  static Tensor view_strided(DType dtype, Shape shape, Shape strides, const void* data,
                             std::shared_ptr<const void> owner);

  DType dtype() const { return dtype_; }
  const Shape& shape() const { return shape_; }
  const Shape& strides() const { return strides_; }  // in elements
  int64_t dim() const { return static_cast<int64_t>(shape_.size()); }
  int64_t size(int64_t d) const;
  int64_t numel() const { return shape_numel(shape_); }
  size_t nbytes() const { return static_cast<size_t>(numel()) * dtype_size(dtype_); }
  bool defined() const { return data_ != nullptr || numel() == 0; }
  bool is_contiguous() const;

  const void* raw() const { return data_; }
  // Mutable access; only for tensors that own their storage (made by zeros,
  // empty or a copy, and reshapes/row slices of those, which share the bytes:
  // writes through a slice show in the tensor it was cut from). Throws for
  // views of borrowed memory such as a read-only file mapping.
  void* raw_mut();

  template <typename T> const T* data() const { return static_cast<const T*>(data_); }
  template <typename T> T* data_mut() { return static_cast<T*>(raw_mut()); }

  // A contiguous fp32 copy (converting from any dtype).
  Tensor to_f32() const;
  // A contiguous copy in `dtype` (F32, F16 or BF16 targets; from any float).
  Tensor to(DType dtype) const;
  // A contiguous copy (materializes strided views).
  Tensor contiguous() const;
  // Same bytes, new shape (contiguous tensors only; numel must match; one
  // dimension may be -1 and is then inferred).
  Tensor reshape(Shape shape) const;
  // Rows [begin, end) of dimension 0, sharing storage.
  Tensor slice_rows(int64_t begin, int64_t end) const;

 private:
  DType dtype_ = DType::F32;
  Shape shape_;
  Shape strides_;
  const void* data_ = nullptr;
  std::shared_ptr<const void> owner_;
  bool owns_ = false;
};

}  // namespace nibble
