// The quantization-method registry.
#include <algorithm>

#include "nibble/error.h"
#include "nibble/quantizer.h"

namespace nibble::quant {

extern const MethodSpec kRtn;
extern const MethodSpec kGptq;

const std::vector<const MethodSpec*>& method_registry() {
  static const std::vector<const MethodSpec*> rows = {&kRtn, &kGptq};
  return rows;
}

const MethodSpec& find_method(std::string_view name) {
  std::vector<std::string_view> names;
  for (const MethodSpec* m : method_registry()) {
    if (m->name == name) return *m;
    names.push_back(m->name);
  }
  NIBBLE_FAIL("unknown quantization method '{}' (known: {})", name, fmt::join(names, ", "));
}

}  // namespace nibble::quant
