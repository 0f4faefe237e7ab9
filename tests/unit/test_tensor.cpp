// Tensor: shapes, owned vs borrowed storage, views, conversions.
#include <gtest/gtest.h>

#include <cstring>
#include <memory>
#include <vector>

#include "nibble/tensor.h"

namespace nibble {
namespace {

// A borrowed buffer kept alive by a shared_ptr, as a file mapping would be.
template <typename T>
std::shared_ptr<std::vector<T>> shared_buffer(std::vector<T> values) {
  return std::make_shared<std::vector<T>>(std::move(values));
}

// An F32 tensor holding 0, 1, 2, ... in row-major order.
Tensor iota_f32(Shape shape) {
  Tensor t = Tensor::zeros(DType::F32, std::move(shape));
  float* p = t.data_mut<float>();
  for (int64_t i = 0; i < t.numel(); ++i) p[i] = static_cast<float>(i);
  return t;
}

std::vector<float> values(const Tensor& t) {
  Tensor f = t.to_f32();
  return std::vector<float>(f.data<float>(), f.data<float>() + f.numel());
}

TEST(TensorShape, NumelAndStr) {
  EXPECT_EQ(shape_numel({2, 3}), 6);
  EXPECT_EQ(shape_numel({}), 1);  // a scalar
  EXPECT_EQ(shape_numel({4, 0, 5}), 0);
  EXPECT_THROW(shape_numel({3, -1}), Error);
  EXPECT_THROW(shape_numel({int64_t{1} << 40, int64_t{1} << 40}), Error);  // overflows int64
  EXPECT_EQ(shape_str({64, 172}), "[64, 172]");
  EXPECT_EQ(shape_str({7}), "[7]");
  EXPECT_EQ(shape_str({}), "[]");
}

// checked_numel: an empty shape's nonzero dimensions must still fit int64,
// since a contiguous tensor's strides multiply them (found by fuzz_gguf and
// fuzz_npy, whose readers now refuse such shapes with their file's name).
TEST(TensorShape, CheckedNumelAndEmptyShapesThatOverflow) {
  constexpr int64_t big = int64_t{1} << 40;
  EXPECT_EQ(checked_numel({2, 3}), 6);
  EXPECT_EQ(checked_numel({}), 1);
  EXPECT_EQ(checked_numel({4, 0, 5}), 0);
  EXPECT_EQ(checked_numel({0, big, big}), std::nullopt);
  EXPECT_EQ(checked_numel({big, 0, big}), std::nullopt);
  EXPECT_EQ(checked_numel({big, big}), std::nullopt);
  EXPECT_EQ(checked_numel({3, -1}), std::nullopt);
  EXPECT_EQ(checked_numel({0, big, 1 << 20}), 0);  // 2^60 fits
  EXPECT_THROW(Tensor::empty(DType::F32, {0, big, big}), Error);
  const Tensor t = Tensor::empty(DType::F32, {0, big, 1 << 20});
  EXPECT_EQ(t.numel(), 0);
  EXPECT_EQ(t.strides(), (Shape{int64_t{1} << 60, 1 << 20, 1}));
}

TEST(Tensor, DefaultIsUndefined) {
  Tensor t;
  EXPECT_FALSE(t.defined());
  EXPECT_EQ(t.dim(), 0);
}

TEST(Tensor, ZerosOwnsAlignedZeroedStorage) {
  Tensor t = Tensor::zeros(DType::BF16, {3, 5});
  EXPECT_TRUE(t.defined());
  EXPECT_EQ(t.dtype(), DType::BF16);
  EXPECT_EQ(t.shape(), (Shape{3, 5}));
  EXPECT_EQ(t.strides(), (Shape{5, 1}));
  EXPECT_EQ(t.dim(), 2);
  EXPECT_EQ(t.numel(), 15);
  EXPECT_EQ(t.nbytes(), 30u);
  EXPECT_TRUE(t.is_contiguous());
  EXPECT_EQ(reinterpret_cast<uintptr_t>(t.raw()) % 64, 0u);
  const auto* b = static_cast<const unsigned char*>(t.raw());
  for (size_t i = 0; i < t.nbytes(); ++i) ASSERT_EQ(b[i], 0) << i;
  EXPECT_EQ(t.raw_mut(), t.raw());  // owned: writable

  Tensor empty = Tensor::zeros(DType::F32, {0, 4});
  EXPECT_TRUE(empty.defined());
  EXPECT_EQ(empty.numel(), 0);
  EXPECT_EQ(empty.nbytes(), 0u);

  Tensor scalar = Tensor::zeros(DType::F32, {});
  EXPECT_EQ(scalar.numel(), 1);
  EXPECT_EQ(scalar.nbytes(), 4u);

  EXPECT_THROW(Tensor::zeros(DType::F32, {2, -3}), Error);

  Tensor u = Tensor::empty(DType::F16, {7});
  EXPECT_EQ(u.nbytes(), 14u);
  EXPECT_EQ(reinterpret_cast<uintptr_t>(u.raw()) % 64, 0u);
}

TEST(Tensor, SizeChecksBounds) {
  Tensor t = Tensor::zeros(DType::F32, {2, 3, 4});
  EXPECT_EQ(t.size(0), 2);
  EXPECT_EQ(t.size(2), 4);
  EXPECT_EQ(t.size(-1), 4);
  EXPECT_EQ(t.size(-3), 2);
  EXPECT_THROW(t.size(3), Error);
  EXPECT_THROW(t.size(-4), Error);
}

TEST(Tensor, ViewBorrowsAndKeepsOwnerAlive) {
  auto buf = shared_buffer<float>({1, 2, 3, 4, 5, 6});
  const float* p = buf->data();
  Tensor t = Tensor::view(DType::F32, {2, 3}, p, buf);
  std::weak_ptr<std::vector<float>> weak = buf;
  buf.reset();
  EXPECT_FALSE(weak.expired());  // the tensor holds the owner
  EXPECT_EQ(t.raw(), p);
  EXPECT_EQ(t.strides(), (Shape{3, 1}));
  EXPECT_TRUE(t.is_contiguous());
  EXPECT_EQ(t.data<float>()[4], 5.0f);
  EXPECT_THROW(t.raw_mut(), Error);  // borrowed: read-only
  EXPECT_THROW(t.data_mut<float>(), Error);
  {
    Tensor copy = t;
    t = Tensor();
    EXPECT_FALSE(weak.expired());
  }
  EXPECT_TRUE(weak.expired());  // last tensor gone, owner released

  EXPECT_THROW(Tensor::view(DType::F32, {2}, nullptr, nullptr), Error);
  EXPECT_NO_THROW(Tensor::view(DType::F32, {0}, nullptr, nullptr));
}

TEST(Tensor, SliceRowsSharesStorage) {
  Tensor t = iota_f32({4, 3});
  Tensor s = t.slice_rows(1, 3);
  EXPECT_EQ(s.shape(), (Shape{2, 3}));
  EXPECT_EQ(s.data<float>(), t.data<float>() + 3);
  EXPECT_TRUE(s.is_contiguous());
  EXPECT_EQ(values(s), (std::vector<float>{3, 4, 5, 6, 7, 8}));
  s.data_mut<float>()[0] = 100.0f;  // a slice of an owned tensor is writable and aliases it
  EXPECT_EQ(t.data<float>()[3], 100.0f);

  EXPECT_EQ(t.slice_rows(4, 4).numel(), 0);
  EXPECT_EQ(t.slice_rows(0, 4).raw(), t.raw());
  EXPECT_THROW(t.slice_rows(3, 5), Error);
  EXPECT_THROW(t.slice_rows(-1, 2), Error);
  EXPECT_THROW(t.slice_rows(3, 2), Error);
  EXPECT_THROW(Tensor::zeros(DType::F32, {}).slice_rows(0, 0), Error);

  Tensor v = iota_f32({10});
  EXPECT_EQ(values(v.slice_rows(7, 10)), (std::vector<float>{7, 8, 9}));

  // Slicing a slice accumulates the offset.
  EXPECT_EQ(values(t.slice_rows(1, 4).slice_rows(1, 2)), (std::vector<float>{6, 7, 8}));
}

TEST(Tensor, Bf16ViewSliceToF32) {
  // Rows of bf16 bit patterns: 1, -2 / 0.5, 3 / -0.25, 65536 / Inf, 0.
  auto buf = shared_buffer<uint16_t>({0x3F80, 0xC000, 0x3F00, 0x4040, 0xBE80, 0x4780, 0x7F80, 0x0000});
  Tensor t = Tensor::view(DType::BF16, {4, 2}, buf->data(), buf);
  Tensor s = t.slice_rows(1, 3);
  EXPECT_EQ(s.shape(), (Shape{2, 2}));
  EXPECT_EQ(s.raw(), static_cast<const void*>(buf->data() + 2));
  EXPECT_THROW(s.raw_mut(), Error);  // slice of a borrowed view stays read-only
  Tensor f = s.to_f32();
  EXPECT_EQ(f.dtype(), DType::F32);
  EXPECT_EQ(f.shape(), (Shape{2, 2}));
  EXPECT_EQ(values(f), (std::vector<float>{0.5f, 3.0f, -0.25f, 65536.0f}));
  EXPECT_EQ(values(t.slice_rows(3, 4)), (std::vector<float>{INFINITY, 0.0f}));
  buf.reset();
  EXPECT_EQ(values(s), (std::vector<float>{0.5f, 3.0f, -0.25f, 65536.0f}));  // owner kept alive by s
}

TEST(Tensor, ToConvertsAndCopies) {
  auto buf = shared_buffer<float>({1.0f, 1.00390625f, -65520.0f, 0.1f});
  Tensor t = Tensor::view(DType::F32, {2, 2}, buf->data(), buf);

  Tensor b = t.to(DType::BF16);
  EXPECT_EQ(b.dtype(), DType::BF16);
  EXPECT_EQ(b.shape(), (Shape{2, 2}));
  for (int i = 0; i < 4; ++i) EXPECT_EQ(b.data<uint16_t>()[i], f32_to_bf16((*buf)[static_cast<size_t>(i)])) << i;
  EXPECT_EQ(b.data<uint16_t>()[1], 0x3F80);  // 1 + 2^-8 is a bf16 tie: back to even 1.0

  Tensor h = t.to(DType::F16);
  EXPECT_EQ(h.data<uint16_t>()[2], 0xFC00);  // -65520 overflows f16
  for (int i = 0; i < 4; ++i) EXPECT_EQ(h.data<uint16_t>()[i], f32_to_f16((*buf)[static_cast<size_t>(i)])) << i;

  // Back to f32, and between half types.
  EXPECT_EQ(values(h.to(DType::F32)), (std::vector<float>{1.0f, 1.00390625f, -INFINITY, f16_to_f32(f32_to_f16(0.1f))}));
  Tensor hb = h.to(DType::BF16);
  EXPECT_EQ(hb.data<uint16_t>()[3], f32_to_bf16(f16_to_f32(f32_to_f16(0.1f))));

  // Same dtype: a contiguous owned copy.
  Tensor c = t.to(DType::F32);
  EXPECT_NE(c.raw(), t.raw());
  EXPECT_NO_THROW(c.raw_mut());
  EXPECT_EQ(values(c), values(t));

  EXPECT_THROW(t.to(DType::I8), Error);
  EXPECT_THROW(t.to(DType::F8_E4M3), Error);
  EXPECT_THROW(Tensor().to_f32(), Error);
}

TEST(Tensor, ToF32FromIntegersAndFp8) {
  auto ints = shared_buffer<int32_t>({-3, 0, 1 << 20});
  EXPECT_EQ(values(Tensor::view(DType::I32, {3}, ints->data(), ints)), (std::vector<float>{-3, 0, 1 << 20}));
  auto f8 = shared_buffer<uint8_t>({0x7E, 0x38, 0xB8});
  EXPECT_EQ(values(Tensor::view(DType::F8_E4M3, {3}, f8->data(), f8)), (std::vector<float>{448, 1, -1}));
}

TEST(Tensor, ReshapeSharesBytes) {
  Tensor t = iota_f32({2, 6});
  Tensor r = t.reshape({3, 4});
  EXPECT_EQ(r.shape(), (Shape{3, 4}));
  EXPECT_EQ(r.strides(), (Shape{4, 1}));
  EXPECT_EQ(r.raw(), t.raw());
  EXPECT_EQ(t.reshape({-1, 3}).shape(), (Shape{4, 3}));
  EXPECT_EQ(t.reshape({12}).shape(), (Shape{12}));
  EXPECT_EQ(t.reshape({2, 1, -1}).shape(), (Shape{2, 1, 6}));
  EXPECT_THROW(t.reshape({5, 2}), Error);
  EXPECT_THROW(t.reshape({-1, 5}), Error);
  EXPECT_THROW(t.reshape({-1, -1}), Error);
  EXPECT_THROW(t.reshape({-2, -6}), Error);
  // A row slice is contiguous and can be reshaped.
  EXPECT_EQ(values(t.slice_rows(1, 2).reshape({2, 3})), (std::vector<float>{6, 7, 8, 9, 10, 11}));
}

TEST(Tensor, StridedViewsAndContiguous) {
  // A [3, 2] transpose of a row-major [2, 3] buffer.
  auto buf = shared_buffer<float>({0, 1, 2, 3, 4, 5});
  Tensor tr = Tensor::view_strided(DType::F32, {3, 2}, {1, 3}, buf->data(), buf);
  EXPECT_FALSE(tr.is_contiguous());
  EXPECT_THROW(tr.reshape({6}), Error);
  Tensor c = tr.contiguous();
  EXPECT_TRUE(c.is_contiguous());
  EXPECT_EQ(c.strides(), (Shape{2, 1}));
  EXPECT_EQ(values(c), (std::vector<float>{0, 3, 1, 4, 2, 5}));
  EXPECT_EQ(values(tr), (std::vector<float>{0, 3, 1, 4, 2, 5}));  // to_f32 materializes too

  // A column block [2, 2] of a bf16 [2, 4] matrix (rows stride 4), as f32.
  auto hb = shared_buffer<uint16_t>({0x3F80, 0x4000, 0x4040, 0x4080, 0x40A0, 0x40C0, 0x40E0, 0x4100});
  Tensor blk = Tensor::view_strided(DType::BF16, {2, 2}, {4, 1}, hb->data() + 1, hb);
  EXPECT_FALSE(blk.is_contiguous());
  EXPECT_EQ(values(blk), (std::vector<float>{2, 3, 6, 7}));
  EXPECT_EQ(blk.to(DType::BF16).data<uint16_t>()[2], 0x40C0);

  // A 3-d strided view: dims of size 1 do not break contiguity.
  Tensor one = Tensor::view_strided(DType::F32, {1, 2, 3}, {99, 3, 1}, buf->data(), buf);
  EXPECT_TRUE(one.is_contiguous());
  Tensor perm = Tensor::view_strided(DType::F32, {3, 1, 2}, {1, 6, 3}, buf->data(), buf);
  EXPECT_FALSE(perm.is_contiguous());
  EXPECT_EQ(values(perm.contiguous()), (std::vector<float>{0, 3, 1, 4, 2, 5}));

  // Contiguous copies own their storage.
  Tensor src = Tensor::view(DType::F32, {6}, buf->data(), buf);
  Tensor own = src.contiguous();
  EXPECT_NE(own.raw(), src.raw());
  own.data_mut<float>()[0] = 42;
  EXPECT_EQ((*buf)[0], 0.0f);

  EXPECT_THROW(Tensor::view_strided(DType::F32, {2, 3}, {3}, buf->data(), buf), Error);
  EXPECT_THROW(Tensor::view_strided(DType::F32, {2, 3}, {-3, 1}, buf->data(), buf), Error);
}

}  // namespace
}  // namespace nibble
