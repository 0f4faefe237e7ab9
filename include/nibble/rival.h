// Rivals' quantized checkpoints: Hugging Face directories whose config.json
// (or AutoGPTQ's quantize_config.json) carries a quantization_config made by
// GPTQ (AutoGPTQ / GPTQModel), AWQ (AutoAWQ's GEMM and GEMV layouts), compressed-tensors
// (llm-compressor), bitsandbytes (transformers' 4-bit and 8-bit layers) or
// auto-round (Intel's AutoRound, in GPTQ's or AWQ's layout). RivalSource presents such a directory
// with every quantized linear dequantized to F32, so that it runs through
// nibble's own forward like any other candidate (DESIGN.md, "The flows").
//
// Each scheme is one row of a table in src/io/rival_source.cpp: how its
// quantized linears are recognized among the stored tensors, and what value
// each weight has. docs/FORMAT.md, "Rivals' checkpoints", gives the layouts.
#pragma once

#include <filesystem>
#include <map>
#include <mutex>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "nibble/source.h"

namespace nibble {

// How one rival's checkpoints store a quantized linear, made from its
// quantization_config.
class RivalScheme {
 public:
  virtual ~RivalScheme() = default;
  // e.g. "GPTQ 4-bit g128 asym (v1 zeros)".
  virtual std::string describe() const = 0;
  // The linear's prefix ("model.layers.0.mlp.up_proj") when `stored` is the
  // tensor that marks a quantized linear (GPTQ's qweight, compressed-tensors'
  // weight_packed), else nullopt.
  virtual std::optional<std::string> linear_of(const std::string& stored, const TensorSource& raw) const = 0;
  // Every stored tensor of the linear at `prefix` (all of them are hidden
  // behind its logical "prefix.weight"). Throws naming the source when a
  // tensor the scheme always stores is missing.
  virtual std::vector<std::string> parts(const std::string& prefix, const TensorSource& raw) const = 0;
  // Its weight, F32 [out, in]: the value the scheme defines, computed in f32
  // (exact for the products of a 16-bit scale and a small integer).
  virtual Tensor dequantize(const std::string& prefix, const TensorSource& raw) const = 0;
  // The activation quantizer the scheme's linears run with (act_quant.h), or
  // empty: ModelSource::activation_quant.
  virtual std::string activation_quant() const { return {}; }
  // The linear in a nibble format whose values are exactly dequantize()'s, or
  // nullopt: 4-bit codes with a scale and a zero point (or min) per group of
  // 32, 64 or 128 inputs in input order (GPTQ, AWQ, compressed-tensors'
  // pack-quantized; auto-round through them) where, in every group, the
  // format decodes each of the 16 codes to the scheme's value bit for bit. The
  // first that does of int4_sym (zero points of 8, f16 scales), int4_asym
  // (bf16 scale and min = −z·scale) and int4_asym_f32 (f32 scale and min: any
  // zero points with 16-bit scales; f32 scales mostly not, fl(q·s) + fl(−z·s)
  // missing fl((q − z)·s)). Reads the zeros, group indices and scales, not the codes.
  virtual std::optional<FormatChoice> exact_format(const std::string& prefix, const TensorSource& raw) const {
    (void)prefix, (void)raw;
    return std::nullopt;
  }
  // Its parts in that format (FORMAT.md); an error where exact_format is nullopt.
  virtual std::vector<Tensor> exact_parts(const std::string& prefix, const TensorSource& raw) const;
};

// The scheme a quantization_config names by its "quant_method" (gptq, awq,
// compressed-tensors). Throws naming `where` for another method or settings
// nibble cannot read (GPTQ at 5-7 bits outside the planar layout, AWQ at other than 4 bits, ...).
std::unique_ptr<RivalScheme> make_rival_scheme(const nlohmann::json& quantization_config, const std::string& where);

// The quant_method values make_rival_scheme reads, comma-separated (its
// table's rows), for messages and --help.
std::string rival_method_names();

// The quantization_config of a model directory (config.json's, or the
// quantize_config.json AutoGPTQ wrote beside it), or nullopt (also for
// compressed-tensors' "dense" format, whose weights are plain, unless its
// sparsity_config stores them sparse). Its quant_method, when present, is a
// string (else an Error naming the file).
std::optional<nlohmann::json> rival_quantization_config(const std::filesystem::path& dir);

class RivalSource final : public ModelSource {
 public:
  static std::unique_ptr<RivalSource> open(const std::filesystem::path& dir);
  // The same with the directory's rival_quantization_config already read.
  static std::unique_ptr<RivalSource> open(const std::filesystem::path& dir, const nlohmann::json& quantization_config);

  const RivalScheme& scheme() const { return *scheme_; }
  // The stored tensors behind a logical name (one for a plain tensor).
  std::vector<std::string> stored_parts(const std::string& name) const;

  const ModelConfig& config() const override { return raw_->config(); }
  std::string describe() const override;
  std::vector<std::string> names() const override { return order_; }
  bool contains(const std::string& name) const override { return entries_.count(name) != 0; }
  TensorMeta meta(const std::string& name) const override;
  Tensor load(const std::string& name) const override;
  std::filesystem::path tokenizer_json() const override { return raw_->tokenizer_json(); }
  std::string activation_quant() const override { return scheme_->activation_quant(); }
  // Only the scheme's quantized linears: one the checkpoint stores plain
  // (skipped by the tool) runs with exact inputs.
  bool activations_quantized(const std::string& prefix) const override;
  // The scheme's exact_format / exact_parts for a quantized linear (decided
  // once per linear), meta().format for a plain tensor.
  std::optional<FormatChoice> exact_format(const std::string& name) const override;
  std::vector<Tensor> exact_parts(const std::string& name) const override;
  // The scheme's describe() for its quantized linears.
  std::string foreign_format(const std::string& name) const override;

 private:
  struct Entry {
    TensorMeta meta;
    std::string prefix;  // set for a quantized linear
    std::vector<std::string> stored;
  };
  const Entry& entry(const std::string& name) const;

  std::unique_ptr<CheckpointDir> raw_;  // the files as stored (qweight, scales, ... by their own names)
  std::unique_ptr<RivalScheme> scheme_;
  std::map<std::string, Entry> entries_;
  std::vector<std::string> order_;
  mutable std::mutex exact_mutex_;
  mutable std::map<std::string, std::optional<FormatChoice>> exact_;  // exact_format's answers so far
};

}  // namespace nibble
