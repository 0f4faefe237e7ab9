// The rows of the format registry, one per file in src/formats/.
#pragma once

#include "nibble/format.h"

namespace nibble::formats {

extern const FormatSpec kInt4Asym;

}  // namespace nibble::formats
