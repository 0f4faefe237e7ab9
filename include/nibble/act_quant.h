// Activation quantizers: simulated (fake) quantization of the inputs of the
// decoder linears, so that a W8A8 checkpoint can be measured by the same f32
// forward (issue 7). Each quantizer is one row of a registry; the forward asks
// the row, never switches on a name.
//
// Every quantizer is dynamic (its scale comes from the values it is given, as
// vLLM's and TensorRT's dynamic W8A8 paths compute it at run time) and
// symmetric, and is applied in place: x <- dequantize(quantize(x)).
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

namespace nibble {

struct ActQuantSpec {
  std::string_view name;         // as written on the command line and in nibble.json ("activations")
  std::string_view description;  // one line for --help and errors
  int bits = 8;                  // bits per stored activation
  // Fake-quantizes x[n, dim] (row-major; a row is one token) in place.
  void (*fake_quant)(float* x, int64_t n, int64_t dim) = nullptr;

  void apply(float* x, int64_t n, int64_t dim) const { fake_quant(x, n, dim); }
};

// Every activation quantizer, in a fixed order.
const std::vector<ActQuantSpec>& act_quants();
// The quantizer called `name`; "none" gives nullptr (exact activations).
// Throws nibble::Error listing the known names for anything else.
const ActQuantSpec* find_act_quant(std::string_view name);
// "int8_tensor, int8_token, fp8_e4m3_tensor" (for help texts).
std::string act_quant_names();

}  // namespace nibble
