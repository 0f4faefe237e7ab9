// Per-matrix output error of a candidate checkpoint against its reference on
// the reference's own activations: for every linear, ‖(Ŵ−W)x‖ / ‖Wx‖ summed
// over held-out tokens, where x is what the reference model feeds that linear.
// It attributes a checkpoint's loss to layers and matrices.
#pragma once

#include <cstdint>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include "nibble/source.h"

namespace nibble::eval {

struct ProbeRow {
  std::string name;    // e.g. "model.layers.3.mlp.down_proj.weight"
  int64_t layer = -1;  // -1 for the head
  double sq_err = 0;   // Σ ‖(Ŵ−W)x‖²
  double sq_ref = 0;   // Σ ‖Wx‖²
  int64_t tokens = 0;
  double rel() const;  // sqrt(sq_err / sq_ref)
};

struct ProbeOptions {
  int64_t ctx = 512;            // window length (non-overlapping windows of the text)
  int64_t chunks = 8;           // windows used (0 = all)
  std::set<int64_t> layers;     // empty = every layer
  bool head = true;             // also the head (when it is a tensor of its own or differs)
  bool progress = true;
};

// `tokens`: the held-out text's ids (windows start with `bos` when given).
std::vector<ProbeRow> probe(const ModelSource& reference, const ModelSource& candidate,
                            const std::vector<int32_t>& tokens, std::optional<int32_t> bos, const ProbeOptions& o);

}  // namespace nibble::eval
