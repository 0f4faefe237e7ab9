// NIBBLE_HD marks a function written once for the host and the device: nvcc
// compiles it for both, every other compiler as a plain inline function.
#pragma once

#if defined(__CUDACC__)
#define NIBBLE_HD __host__ __device__
#else
#define NIBBLE_HD
#endif
