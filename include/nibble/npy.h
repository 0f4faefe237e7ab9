// NumPy .npy files: the single-array format of np.save / np.load.
//
// Format (NumPy's NEP 1, numpy.lib.format): the magic "\x93NUMPY", a major
// and a minor version byte, the header length as a little-endian uint16
// (version 1.0) or uint32 (2.0 and 3.0; 3.0 only allows a UTF-8 header),
// then the header: a Python dict literal
//   {'descr': '<f4', 'fortran_order': False, 'shape': (3, 4), }
// padded with spaces and ended by '\n' so the data starts on a multiple of 64
// bytes (16 in old files), then the raw array bytes, exactly
// numel x itemsize of them.
//
// nibble reads little-endian, C-order (fortran_order False) arrays of plain
// numbers; float64 arrays are converted to float32 on reading (nibble's
// compute dtype). Big-endian ('>f4'), structured, complex, string and object
// arrays are refused with one Error line naming the file.
#pragma once

#include <filesystem>
#include <optional>
#include <string>
#include <string_view>

#include "nibble/tensor.h"

namespace nibble::io {

// What a .npy header says.
struct NpyHeader {
  int major = 1, minor = 0;  // format version
  std::string descr;         // e.g. "<f4"
  DType dtype = DType::F32;  // the stored element type
  Shape shape;               // () for a scalar
  size_t data_offset = 0;    // bytes before the array data
};

// Reads and validates the header of a .npy file (no data is read).
NpyHeader read_npy_header(const std::filesystem::path& path);

// Reads a whole .npy file into a new contiguous tensor that owns its bytes.
// dtype: F32 ('<f4', and '<f8' converted to F32), F16, I64, I32, I16, I8, U8,
// Bool. Throws nibble::Error naming the path on any malformed input.
Tensor read_npy(const std::filesystem::path& path);

// Parses a .npy image already in memory (`display_name` stands for the file in
// messages). read_npy maps the file and calls this.
Tensor parse_npy(const void* data, size_t size, const std::string& display_name);

// Writes `t` (any layout; F64, F32, F16, I64, I32, I16, I8, U8 or Bool) as a
// version 1.0 .npy file (2.0 when the header needs more than 64 KiB), C order.
// The file is written to path.tmp and renamed into place when complete.
void write_npy(const std::filesystem::path& path, const Tensor& t);

// The NumPy descr of a dtype ("<f4"), or nullopt when NumPy has none (BF16, F8).
std::optional<std::string> npy_descr(DType dt);

}  // namespace nibble::io
