// The calibrated flow's layer stream on the GPU (src/quant/calibrate.cpp with
// --method gptq --device cuda; CUDA builds only). The hidden states of every
// calibration sequence stay in device memory (f32), one decoder layer's
// weights at a time go up, each linear's input is added into a GpuHessian as
// the layer runs, GPTQ quantizes the layer's matrices where they lie, and the
// stream moves on through the quantized layer. docs/CUDA.md ("GPTQ end to
// end on the GPU") says what differs from the CPU's LayerStream.
#pragma once

#include <array>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "nibble/cuda_gptq.h"
#include "nibble/model.h"
#include "nibble/model_config.h"
#include "nibble/source.h"

namespace nibble::cuda {

// GPTQ's --refine after a GPU sweep: the passes, the objective A (refine_objective
// for the same Hessian) and where the report goes. No passes: no refinement.
struct GpuRefine {
  int passes = 0;
  const DeviceBuffer* objective = nullptr;
  quant::RefineReport* report = nullptr;
};

// GPTQ (int4_asym) of one matrix given on the host in any float dtype
// (uploaded as stored, converted on the device), with the same error report
// as GpuLayerStream::quantize_linear. For the head.
quant::GptqResult gptq_matrix(const Tensor& w, const GpuPreparedHessian& hessian, const FormatChoice& format, bool mse,
                              const quant::GptqOptions& options, double* rel_error, double* max_abs_error,
                              const GpuRefine& refine = {});

class GpuLayerStream {
 public:
  // Sequences of these lengths (tokens); their hidden states start as zeros
  // until upload_hidden. Throws when there is no device. Attention runs on
  // tensor cores in bf16 where the head dim allows (flash_attention_bf16);
  // bf16_attention = false keeps it in fp32 (the CPU twin test compares the
  // rest of the arithmetic exactly that way).
  GpuLayerStream(const ModelConfig& config, const std::vector<int64_t>& lengths, bool bf16_attention = true);
  ~GpuLayerStream();
  GpuLayerStream(GpuLayerStream&&) noexcept;
  GpuLayerStream& operator=(GpuLayerStream&&) noexcept;

  // Whether the GPU stream runs the layers of `layer` as the CPU would: no
  // activation quantizers, no bf16 rounding mode, no online rotation of
  // down_proj's input. When not, *why says what is missing.
  static bool supports(const DecoderLayer& layer, std::string* why);

  size_t num_sequences() const;
  int64_t length(size_t s) const;
  // Sequence s's hidden states, f32 [length(s), hidden], to and from the host.
  void upload_hidden(size_t s, const float* host);
  void download_hidden(size_t s, float* host) const;
  // Every sequence's hidden states become its tokens' rows of `table` (the
  // embedding, [vocab, hidden], bf16 / fp16 / f32 as stored: uploaded as it
  // is, widened on the device). The ids must be checked against the vocabulary
  // already; sequences[s] has length(s) ids.
  void embed(const Tensor& table, const std::vector<std::vector<int32_t>>& sequences);

  // Puts a decoder layer (dense f32 linears) on the device: each linear as f32
  // (what GPTQ quantizes) and as bf16 (what the forward multiplies by).
  void load_layer(const DecoderLayer& layer);
  // The same for layer i of `src` read as stored: bf16 / fp16 / f32 tensors go
  // up as they are and are converted on the device (packed ones are
  // dequantized on the host first). Needs supports(src).
  void load_layer(const ModelSource& src, int64_t i);
  // Starts reading layer i of `src` into pinned host memory on a background
  // thread (while the device works on the layer before it); load_layer(src, i)
  // then uploads from there.
  void prefetch_layer(const ModelSource& src, int64_t i);
  static bool supports(const ModelSource& src, std::string* why);

  // Runs every sequence through the loaded layer, each from position 0. The
  // inputs of the linears (bf16, as the GEMMs read them) are added into
  // taps[LinearInput] where that entry is set (Hessians of HessianPrecision::BF16).
  // advance = false leaves the hidden states as they were.
  void apply(const std::array<GpuHessian*, 4>& taps, bool advance);

  // GPTQ (int4_asym) of the loaded layer's linear decoder_linears()[slot] with
  // a prepared Hessian. The layer's copy then holds the quantized weights, so
  // a later apply() runs the quantized layer. Returns the codes and group
  // parameters (no host dequant) and the stored weight's error against the
  // matrix that was quantized (QuantizeInfo::rel_error, max_abs_error).
  quant::GptqResult quantize_linear(size_t slot, const GpuPreparedHessian& hessian, const FormatChoice& format,
                                    bool mse, const quant::GptqOptions& options, double* rel_error,
                                    double* max_abs_error, const GpuRefine& refine = {});

  // Adds the final RMSNorm of every hidden state (the head's input, f32) into h.
  void add_final_normed(const Tensor& final_norm, GpuHessian& h) const;

 private:
  struct State;
  std::unique_ptr<State> s_;
};

}  // namespace nibble::cuda
