// TensorSource: named tensors, dequantized on request, whatever the file format
// (DESIGN.md, "The flows"). CheckpointDir is the source for a Hugging Face
// model directory: plain (F32/F16/BF16 safetensors, single or sharded) or
// packed by nibble (quantized linears stored as X.qweight / X.scales / X.mins).
#pragma once

#include <filesystem>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "nibble/format.h"
#include "nibble/model_config.h"
#include "nibble/safetensors.h"
#include "nibble/tensor.h"
#include "nibble/tokenizer.h"

namespace nibble {

struct TensorMeta {
  std::string name;                    // logical name, e.g. "model.layers.0.mlp.up_proj.weight"
  Shape shape;                         // logical shape ([out, in] for a quantized linear)
  DType dtype = DType::F32;            // stored dtype (F32 for quantized: what load() returns)
  std::optional<FormatChoice> format;  // set for quantized matrices
  uint64_t stored_bytes = 0;           // bytes on disk, all parts included
};

class TensorSource {
 public:
  virtual ~TensorSource() = default;
  virtual std::string describe() const = 0;
  // Logical tensor names in storage order.
  virtual std::vector<std::string> names() const = 0;
  virtual bool contains(const std::string& name) const = 0;
  virtual TensorMeta meta(const std::string& name) const = 0;
  // Plain tensors as stored (a view where possible); quantized matrices
  // dequantized to F32.
  virtual Tensor load(const std::string& name) const = 0;
};

// A transform the forward applies to activations because it cannot be folded
// into weights: the randomized Hadamard rotation (quant::HadamardRotation) of
// down_proj's input that `--method rotate+...` uses.
struct OnlineRotation {
  int64_t size = 0;
  uint64_t seed = 0;
};

// A whole model: named tensors plus the config they follow. CheckpointDir (HF
// and nibble-packed directories) is one; GGUF files and overlays are others.
// The forward, LayerStream, probe and eval take any ModelSource.
class ModelSource : public TensorSource {
 public:
  virtual const ModelConfig& config() const = 0;
  // The stored parts of a matrix whose meta().format is set (a format the
  // kernels run directly). Sources without such matrices never get asked.
  virtual std::vector<Tensor> parts(const std::string& name) const;
  // The matrix `name` in a nibble format whose values are exactly load(name)'s,
  // for kernels that take packed weights (the GPU forward), or nullopt (dense):
  // by default meta().format; a rival's linear re-encoded without loss where it
  // can be (RivalSource). exact_parts gives its parts where it is set.
  virtual std::optional<FormatChoice> exact_format(const std::string& name) const { return meta(name).format; }
  virtual std::vector<Tensor> exact_parts(const std::string& name) const { return parts(name); }
  // How `name` is stored when it is quantized in a layout that is not a nibble
  // format and that load() dequantizes (a rival's scheme, "GPTQ 4-bit g128 asym
  // (v1 zeros)"; a ggml block type, "Q4_K"), else "".
  virtual std::string foreign_format(const std::string& name) const {
    (void)name;
    return {};
  }
  // Checks that every tensor the config implies is present with its shape
  // (errors name describe() and the tensor).
  virtual void validate_against_config() const;
  // Throws, naming the tensor, when a weight could not be loaded for a reason
  // known without reading it (a GGUF tensor of a ggml type nibble cannot
  // dequantize). Reads no weight: verbs that run long before their first load
  // of a source (eval's candidates wait for the reference pass) call it first.
  virtual void check_loadable() const {}
  // The tokenizer.json that goes with the weights, or an empty path.
  virtual std::filesystem::path tokenizer_json() const { return {}; }
  // The tokenizer that goes with the weights, or nullopt: by default read from
  // tokenizer_json(); a GGUF file's is built from the vocabulary it carries.
  virtual std::optional<Tokenizer> tokenizer() const;
  // The rotation the forward applies to down_proj's input, if any.
  virtual std::optional<OnlineRotation> down_proj_rotation() const { return std::nullopt; }
  // The activation quantizer the weights were made for (act_quant.h; e.g.
  // "int8_token" for a SmoothQuant W8A8 checkpoint), or empty: the forward
  // then simulates it at every linear input it applies to (below).
  virtual std::string activation_quant() const { return {}; }
  // Whether the linear at `prefix` ("model.layers.0.mlp.down_proj") runs with
  // quantized inputs when an activation quantizer is simulated. False for the
  // linears a rival's checkpoint keeps in 16 bits (bitsandbytes'
  // llm_int8_skip_modules): their engine feeds them exact activations.
  virtual bool activations_quantized(const std::string& prefix) const {
    (void)prefix;
    return true;
  }
};

// Names of the quantization metadata keys in a packed file's __metadata__.
inline constexpr const char* kMetaFormat = "nibble.format";          // e.g. "int4_g128_asym"
inline constexpr const char* kMetaGroupSize = "nibble.group_size";   // e.g. "128"
inline constexpr const char* kMetaVersion = "nibble.version";
inline constexpr const char* kMetaTensors = "nibble.tensors";        // JSON: {name: {format, shape}}

class CheckpointDir final : public ModelSource {
 public:
  // Opens DIR/config.json and DIR/model.safetensors or the shards named by
  // DIR/model.safetensors.index.json. Validates the index against the files.
  static std::unique_ptr<CheckpointDir> open(const std::filesystem::path& dir);
  // One safetensors file on its own (no config.json): for inspecting files.
  static std::unique_ptr<CheckpointDir> open_file(const std::filesystem::path& file);

  const std::filesystem::path& dir() const { return dir_; }
  bool has_config() const { return has_config_; }
  const ModelConfig& config() const override;  // throws for a lone file
  // __metadata__ of the first weight file.
  const std::map<std::string, std::string>& metadata() const;
  // The weight files, in index order.
  std::vector<std::filesystem::path> weight_files() const;
  bool is_packed() const { return packed_; }

  std::string describe() const override;
  std::vector<std::string> names() const override { return order_; }
  bool contains(const std::string& name) const override { return entries_.count(name) != 0; }
  TensorMeta meta(const std::string& name) const override;
  Tensor load(const std::string& name) const override;

  // The stored parts of a quantized matrix (views into the files).
  std::vector<Tensor> parts(const std::string& name) const override;

  void validate_against_config() const override;
  std::filesystem::path tokenizer_json() const override;
  // From nibble.json's "online_rotation" (packed checkpoints of rotate+...).
  std::optional<OnlineRotation> down_proj_rotation() const override { return down_rotation_; }
  // nibble.json's "activations" (validated against the registry when opened).
  std::string activation_quant() const override { return activations_; }

 private:
  struct Entry {
    TensorMeta meta;
    std::vector<std::pair<size_t, std::string>> stored;  // (file index, stored name) per part
  };
  const Entry& entry(const std::string& name) const;
  void index_files();  // builds entries_/order_ from files_

  std::filesystem::path dir_;
  ModelConfig config_;
  bool has_config_ = false;
  std::vector<io::SafetensorsFile> files_;
  std::map<std::string, Entry> entries_;
  std::vector<std::string> order_;
  bool packed_ = false;
  std::optional<OnlineRotation> down_rotation_;
  std::string activations_;
};

// Files of a model directory that travel with its weights (config, tokenizer,
// generation config, chat template), i.e. regular top-level files that are
// not weights.
std::vector<std::filesystem::path> carried_files(const std::filesystem::path& dir);

// The tokenizer that goes with the weights (ModelSource::tokenizer()); throws
// naming `name` (the source as the user gave it) when there is none.
Tokenizer require_tokenizer(const ModelSource& src, const std::string& name);

// Opens a source named on the command line: "DIR" (plain, packed by nibble,
// or a rival's quantized checkpoint, rival.h: detected),
// "hf:DIR", "packed:DIR", "gguf:FILE" or a GGUF file's own path (llama.cpp's
// format, dequantized to f32), "overlay:CAND,keep=REGEX" (tensors matching
// REGEX come from `reference`), "overlay:CAND,head=SRC" (lm_head from SRC).
std::unique_ptr<ModelSource> open_model_source(const std::string& spec, const ModelSource* reference = nullptr);

}  // namespace nibble
