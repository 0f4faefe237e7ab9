// The least-squares refit of one row's group in refine (src/quant/refine.cpp's
// header comment gives the math), written once for the CPU and the GPU
// (src/backend/cuda/gptq_refine.cu) so that both take the same step. Each side
// compiles it with its own floating-point settings, as it did its own copy.
#pragma once

#include "nibble/hd.h"

namespace nibble::quant {

// The group's sums against the row's gradient e and A = A_GG: ce = cᵀe,
// oe = 1ᵀe, cAc = cᵀAc, cA1 = cᵀA1, c11 = 1ᵀA1 (c the codes' values).
struct RefitSums {
  double ce, oe, cAc, cA1, c11;
};

// The step (ds, dm) that minimises f's quadratic model: both with a min, the
// scale alone (dm = 0) without. False where it is not determined: one distinct
// code (with a min), every code's value 0 (without).
NIBBLE_HD inline bool refit_step(const RefitSums& r, bool with_min, double& ds, double& dm) {
  dm = 0;
  if (with_min) {
    const double det = r.cAc * r.c11 - r.cA1 * r.cA1;
    if (!(det > 0)) return false;
    ds = (-r.ce * r.c11 + r.oe * r.cA1) / det;
    dm = (-r.oe * r.cAc + r.ce * r.cA1) / det;
  } else {
    if (!(r.cAc > 0)) return false;
    ds = -r.ce / r.cAc;
  }
  return true;
}

// The change of f's quadratic model for the stored step (s_, m_): the cheap
// screen before the exact change on the decoded values.
NIBBLE_HD inline double refit_model_change(const RefitSums& r, double s_, double m_) {
  return 2 * (s_ * r.ce + m_ * r.oe) + s_ * s_ * r.cAc + 2 * s_ * m_ * r.cA1 + m_ * m_ * r.c11;
}

}  // namespace nibble::quant
