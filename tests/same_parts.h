// Two checkpoints that must hold the same bytes: every stored tensor of one
// (a packed tensor's parts, or a plain tensor) is in the other, identical.
#pragma once

#include <gtest/gtest.h>

#include <cstring>
#include <filesystem>
#include <string>
#include <vector>

#include "nibble/model.h"

namespace nibble::test {

// Every stored tensor of `want` is in `got` with the same bytes.
inline void expect_same_parts(const std::filesystem::path& got_dir, const std::filesystem::path& want_dir) {
  const auto got = CheckpointDir::open(got_dir), want = CheckpointDir::open(want_dir);
  for (const std::string& name : want->names()) {
    ASSERT_TRUE(got->contains(name)) << name;
    const TensorMeta m = want->meta(name);
    EXPECT_EQ(got->meta(name).format.has_value(), m.format.has_value()) << name;
    const std::vector<Tensor> a = m.format ? got->parts(name) : std::vector<Tensor>{got->load(name)};
    const std::vector<Tensor> b = m.format ? want->parts(name) : std::vector<Tensor>{want->load(name)};
    ASSERT_EQ(a.size(), b.size()) << name;
    for (size_t i = 0; i < a.size(); ++i) {
      ASSERT_EQ(a[i].dtype(), b[i].dtype()) << name;
      ASSERT_EQ(a[i].shape(), b[i].shape()) << name;
      EXPECT_EQ(std::memcmp(a[i].raw(), b[i].raw(), a[i].nbytes()), 0) << name << " part " << i;
    }
  }
}

}  // namespace nibble::test
