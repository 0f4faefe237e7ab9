// The Llama-family forward pass on the CPU (llama, mistral, qwen2, qwen3):
// f32 activations, weights dense f32 or nibble-packed int4 (used by the int4
// kernel directly, never expanded to a full-precision copy; packed formats
// without a kernel are dequantized to f32 when loaded).
#pragma once

#include <array>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "nibble/act_quant.h"
#include "nibble/format.h"
#include "nibble/kv_quant.h"
#include "nibble/model_config.h"
#include "nibble/source.h"
#include "nibble/tensor.h"

namespace nibble {
namespace quant {
class HadamardRotation;
}

// One linear layer's weight (+ optional bias) as the forward uses it.
class LinearWeight {
 public:
  LinearWeight() = default;
  static LinearWeight dense(Tensor w_f32);  // [out, in] F32
  static LinearWeight packed(FormatChoice format, std::vector<Tensor> parts, int64_t out, int64_t in);

  // y[M, out] = x[M, in] · Wᵀ (+ bias)
  void forward(const float* x, int64_t M, float* y) const;
  int64_t out_features() const { return out_; }
  int64_t in_features() const { return in_; }
  bool is_packed() const { return format_.spec != nullptr; }
  const Tensor& dense_weight() const { return dense_; }  // F32 [out, in] (dense only)
  Tensor bias;  // F32 [out] or undefined

 private:
  Tensor dense_;  // F32 [out, in] when not packed
  FormatChoice format_;
  std::vector<Tensor> parts_;
  int64_t out_ = 0, in_ = 0;
};

// Keys and values of every layer for the positions seen so far (f32). With a
// KV-cache scheme (kv_quant.h), each layer also holds the dequantized rows
// that a quantized cache would store by now; attention reads those.
class KVCache {
 public:
  KVCache(const ModelConfig& c, int64_t max_tokens, const KvQuantSpec* kv = nullptr);
  int64_t size() const { return len_; }
  int64_t capacity() const { return max_; }
  void clear();
  float* keys(int64_t layer, int64_t pos) { return k_[layer].data() + pos * row_; }    // [kv_heads, head_dim]
  float* values(int64_t layer, int64_t pos) { return v_[layer].data() + pos * row_; }  // [kv_heads, head_dim]
  // The quantized side of layer `layer`, or nullptr for an exact cache.
  KvCacheRows* quantized_rows(int64_t layer) { return q_.empty() ? nullptr : &q_[layer]; }
  const KvQuantSpec* kv_quant() const { return kv_; }
  void advance(int64_t n) { len_ += n; }

 private:
  std::vector<std::vector<float>> k_, v_;
  const KvQuantSpec* kv_ = nullptr;
  std::vector<KvCacheRows> q_;  // one per layer when kv_ is set
  int64_t row_, max_, len_ = 0;
};

// Loads the linear "PREFIX.weight" (+ "PREFIX.bias" when present) of `src`:
// matrices in a format with a CPU kernel (cpu::find_packed_kernel: the int4,
// 8-bit and FP4 formats but the per-tensor integers), or a rival's linear that
// one of them holds exactly (ModelSource::exact_format: GGUF's legacy, K and
// IQ4 blocks, GPTQ, AWQ), stay packed unless `dense`; anything else (other
// formats dequantized) becomes f32.
LinearWeight load_linear(const ModelSource& src, const std::string& prefix, bool dense = false);

// Quantized matrices of one format that a forward cannot run packed and holds
// dequantized instead.
struct DenseFallback {
  std::string format;
  int64_t matrices = 0, params = 0;
};
// The quantized matrices of `src` (every 2-D tensor but the embedding) for
// which runs_packed(name) is false, so that a forward holds them dequantized.
// Per format (ModelSource::foreign_format for a rival's scheme or a ggml block
// type, even one a nibble format holds exactly, as GGUF Q8_0; else its
// canonical name; in name order): how many and their weights.
std::vector<DenseFallback> dense_fallbacks(const ModelSource& src,
                                           const std::function<bool(const std::string&)>& runs_packed);
// Those load_linear holds as f32 because no CPU kernel takes them (4 bytes a weight).
std::vector<DenseFallback> cpu_dense_fallbacks(const ModelSource& src);

// The inputs of a layer's linears, as a calibration tap sees them: q/k/v
// share one input, so do gate/up.
enum class LinearInput { QKV, O, GateUp, Down };

// One decoder layer's weights (norm gains f32; linears dense or packed).
struct DecoderLayer {
  Tensor input_norm, post_norm, q_norm, k_norm;  // F32 (q/k norms: qwen3 only)
  LinearWeight q, k, v, o, gate, up, down;
  int64_t window = 0;  // attention window (0 = full causal attention)
  // Round every linear's input to bf16 first (as a bf16 inference engine
  // does): the second honest computation the KL noise floor is measured with.
  bool bf16_activations = false;
  // Applied to down_proj's input first (the source's down_proj_rotation()).
  std::shared_ptr<const quant::HadamardRotation> down_rotation;
  // Fake-quantize every linear's input (simulated W8A8; nullptr: exact). The
  // same four inputs bf16_activations rounds; the embedding and the head are
  // never quantized.
  const ActQuantSpec* act_quant = nullptr;
  // The inputs (indexed by LinearInput) act_quant leaves exact: those whose
  // linears all run unquantized activations (ModelSource::activations_quantized).
  std::array<bool, 4> exact_inputs{};
  // Set when the source's declared quantizer cannot be simulated as its engine
  // runs it (an input whose linears disagree: exact_linear_inputs' conflict);
  // applying act_quant is then an Error with this message. Choosing a
  // quantizer (Model::set_act_quant, --act-quant) clears it.
  std::string unsimulated;

  // Loads layer i of `src`, with the activation quantizer the source declares
  // (ModelSource::activation_quant()). With `dense`, packed linears are dequantized to
  // f32 (for calibration, which needs plain weights to quantize).
  static DecoderLayer load(const ModelSource& src, int64_t i, bool dense = false);
};

// The activation quantizer `src` declares (ModelSource::activation_quant()),
// or nullptr: what its linears run with unless the user picks another.
const ActQuantSpec* declared_act_quant(const ModelSource& src);

// DecoderLayer::exact_inputs of layer `layer` of `src`: the inputs none of
// whose linears runs quantized activations. An input whose linears disagree
// counts as quantized, and `conflict` (when given) gets a message naming two
// of them.
std::array<bool, 4> exact_linear_inputs(const ModelSource& src, int64_t layer, std::string* conflict = nullptr);

// Called with x[n, dim] (row-major) before the linears that read it.
using InputTap = std::function<void(LinearInput which, const float* x, int64_t n, int64_t dim)>;

// The seven linears of a decoder layer: name under "model.layers.N.", member,
// and which input they read (in forward order).
struct LinearSlot {
  const char* name;
  LinearWeight DecoderLayer::*member;
  LinearInput input;
};
const std::vector<LinearSlot>& decoder_linears();

// Inverse RoPE frequencies [head_dim / 2] with the config's scaling applied.
std::vector<float> rope_inv_freq(const ModelConfig& c);

// Runs n tokens (positions p0 .. p0+n-1 of one sequence) through one decoder
// layer: x[n, hidden] is updated in place. keys/values are this layer's cache
// rows ([positions, kv_heads*head_dim]); the new rows are written at p0.. and
// attention reads rows 0 .. p0+n-1 (or the sliding window). With `kv_rows`
// (a quantized cache: kv_quant.h), the query at position p reads row j from
// kv_rows when j < boundary(p + 1), as a token-by-token decode would; kv_rows
// must have seen this cache's rows 0 .. p0-1 and nothing else.
void decoder_layer_forward(const ModelConfig& c, const DecoderLayer& L, const std::vector<float>& inv_freq, float* x,
                           int64_t n, int64_t p0, float* keys, float* values, const InputTap* tap = nullptr,
                           KvCacheRows* kv_rows = nullptr);

// One sequence's rows in a batch of several run through one decoder layer together: n tokens at positions
// p0 .. p0+n-1, with that sequence's cache rows (keys/values) and quantized cache (kv_rows, or nullptr), as in the
// call above.
struct LayerSegment {
  int64_t n, p0;
  float* keys;
  float* values;
  KvCacheRows* kv_rows = nullptr;
};
// The same for several sequences at once: x holds their rows one segment after another, [Σ n, hidden]. The linears
// run over all rows in one product each (each row as in a call of its own when every segment's n is a multiple of
// the GEMM's 256-row tiles: cpu::sgemm); attention stays within each segment; the activation quantizer and the
// tap see one segment at a time, in order.
void decoder_layer_forward(const ModelConfig& c, const DecoderLayer& L, const std::vector<float>& inv_freq, float* x,
                           const std::vector<LayerSegment>& segments, const InputTap* tap = nullptr);

// x[n, dim] -> out = x / sqrt(mean(x²) + eps) * w (fp32, as HF); out may be x.
void rms_norm(const float* x, int64_t n, int64_t dim, const float* w, float eps, float* out);

class Model {
 public:
  // Loads every weight of `src` (plain or packed) for the CPU forward, with
  // the activation quantizer the source declares.
  static std::unique_ptr<Model> load(const ModelSource& src);

  const ModelConfig& config() const { return config_; }
  // Replaces the activation quantizer of every layer (nullptr: exact).
  void set_act_quant(const ActQuantSpec* a);
  const ActQuantSpec* act_quant() const { return layers_.empty() ? nullptr : layers_[0].act_quant; }
  // Runs `tokens` at positions cache.size() .. cache.size()+n-1 and appends
  // them to the cache. Returns logits F32 [n, vocab] (all rows) or [1, vocab]
  // (the last row only).
  Tensor forward(const std::vector<int32_t>& tokens, KVCache& cache, bool all_logits = true) const;

 private:
  ModelConfig config_;
  Tensor embed_;  // F32 [vocab, hidden]
  Tensor final_norm_;
  LinearWeight head_;
  std::vector<DecoderLayer> layers_;
  std::vector<float> inv_freq_;  // [head_dim / 2], scaling applied
};

}  // namespace nibble
