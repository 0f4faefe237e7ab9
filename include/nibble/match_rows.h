// Layout checks of a candidate against its reference: a relative error near
// 1.0 on a tensor usually means "rows in another order" (a converter's
// permutation), not "lossy". match_rows finds, per 2-D tensor, the reference
// row each candidate row is closest to (cosine) and, when that is a
// permutation, can undo it.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "nibble/source.h"

namespace nibble::eval {

struct RowMatch {
  std::string name;
  double rel_error = 0;        // ‖C − R‖ / ‖R‖ as stored
  bool checked_rows = false;   // rows were matched (rel_error was large)
  bool permutation = false;    // each candidate row has its own best reference row
  double min_cosine = 0;       // worst row's cosine with its best match
  double rel_error_after = 0;  // with the permutation undone
  std::vector<int64_t> perm;   // candidate row i holds reference row perm[i]
};

// Tensors whose relative error exceeds `threshold` get their rows matched.
std::vector<RowMatch> match_rows(const ModelSource& reference, const ModelSource& candidate, double threshold = 0.5);

// The candidate with the found permutations undone (rows put back in the
// reference's order; those tensors are served dense).
std::unique_ptr<ModelSource> undo_permutations(std::unique_ptr<ModelSource> candidate,
                                               const std::vector<RowMatch>& matches);

}  // namespace nibble::eval
