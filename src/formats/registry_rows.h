// The rows of the format registry, one per file in src/formats/.
#pragma once

#include "nibble/format.h"

namespace nibble::formats {

extern const FormatSpec kInt4Asym;          // int4_asym.cpp
extern const FormatSpec kInt4Sym;           // int4_sym.cpp
extern const FormatSpec kInt4AsymF32;       // int4_asym.cpp
extern const FormatSpec kInt8AsymF32;       // int4_asym.cpp (8-bit codes)
extern const FormatSpec kInt8ChannelSym;    // int8_channel.cpp
extern const FormatSpec kInt8Sym;           // int8_group.cpp
extern const FormatSpec kIntTensorAsym[7];  // int_tensor.cpp: int2 .. int8, in order of bits
extern const FormatSpec kFp8E4m3Tensor;     // fp8.cpp
extern const FormatSpec kFp8E4m3Channel;
extern const FormatSpec kFp8E5m2Tensor;
extern const FormatSpec kFp8E5m2Channel;
extern const FormatSpec kFp4E2m1;           // fp4_e2m1.cpp
extern const FormatSpec kMxfp4;             // mxfp4.cpp
extern const FormatSpec kNvfp4;             // nvfp4.cpp

}  // namespace nibble::formats
