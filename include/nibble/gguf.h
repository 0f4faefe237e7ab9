// GGUF (llama.cpp's checkpoint format): a memory-mapped reader, the reference
// dequantizers of the ggml block types, and GgufSource, which presents a GGUF
// file as a Hugging Face-named ModelSource so that nibble's own forward runs it
// (DESIGN.md: rivals' checkpoints go through the same forward).
//
// Format (ggml docs/gguf.md), all little-endian:
//   "GGUF" magic, u32 version (2 or 3; version 1 had 32-bit counts),
//   u64 tensor_count, u64 kv_count,
//   kv_count × { string key, u32 value_type, value },
//   tensor_count × { string name, u32 n_dims, u64 ne[n_dims], u32 ggml_type, u64 offset },
//   padding to `general.alignment` (default 32), then the data section;
//   each tensor's offset is relative to the data section and aligned.
// A string is a u64 byte length and the bytes (no terminator). An array value
// is a u32 element type, a u64 count and the elements (arrays may nest).
// ne[0] is the innermost (contiguous) dimension: a weight stored with
// ne = [in, out] is the row-major HF matrix [out, in].
#pragma once

#include <cstdint>
#include <filesystem>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "nibble/source.h"
#include "nibble/tensor.h"

namespace nibble::io {

// ---------------------------------------------------------------- ggml types

// Tensor element types: ggml.h's `enum ggml_type` ids (gaps are retired ids).
enum class GgmlType : uint32_t {
  F32 = 0, F16 = 1, Q4_0 = 2, Q4_1 = 3, Q5_0 = 6, Q5_1 = 7, Q8_0 = 8, Q8_1 = 9,
  Q2_K = 10, Q3_K = 11, Q4_K = 12, Q5_K = 13, Q6_K = 14, Q8_K = 15,
  IQ2_XXS = 16, IQ2_XS = 17, IQ3_XXS = 18, IQ1_S = 19, IQ4_NL = 20, IQ3_S = 21, IQ2_S = 22, IQ4_XS = 23,
  I8 = 24, I16 = 25, I32 = 26, I64 = 27, F64 = 28, IQ1_M = 29, BF16 = 30, TQ1_0 = 34, TQ2_0 = 35,
  MXFP4 = 39, NVFP4 = 40, Q1_0 = 41,
};

// One row per ggml type (ggml.c's type_traits: block size and bytes per
// block). Every known type's size is here so a file holding it opens and is
// bounds-checked; `dequantize` is null for the types nibble cannot decode.
struct GgmlTypeTraits {
  GgmlType type;
  std::string_view name;   // "Q4_K"
  int64_t block_size;      // elements per block (1 for plain types)
  int64_t type_size;       // bytes per block
  // n_blocks consecutive blocks -> n_blocks × block_size floats.
  void (*dequantize)(const uint8_t* blocks, int64_t n_blocks, float* out);
};

const std::vector<GgmlTypeTraits>& ggml_type_table();
// nullptr for an id no ggml version defines.
const GgmlTypeTraits* ggml_type_traits(uint32_t type_id);
// "Q4_K", or "unknown type 99".
std::string ggml_type_name(uint32_t type_id);
// "F32, F16, BF16, Q8_0, ...": the types dequantize() supports.
std::string ggml_dequantizable_types();

// Dequantizes `n` elements (a whole number of blocks) of `type_id` stored in
// `src_bytes` bytes at `src` to f32, exactly as ggml's reference
// dequantize_row_* functions compute them (same operations in the same order,
// no FMA contraction). Throws naming the type when it is unsupported and when
// n or src_bytes do not fit the block size.
void ggml_dequantize(uint32_t type_id, const uint8_t* src, size_t src_bytes, float* dst, int64_t n);

// Q4_K/Q5_K: the 6-bit scale `sc` and min `mn` of sub-block j (0..7) from a
// super-block's 12 packed scale bytes.
void ggml_k_scale_min(int j, const uint8_t* scales, int& sc, int& mn);

// IQ4_NL's (and IQ4_XS's) 16 levels (ggml-common.h's kvalues_iq4nl), indexed by the 4-bit code.
extern const int8_t kGgmlIq4nlValues[16];

// ---------------------------------------------------------------- metadata

enum class GgufType : uint32_t {
  U8 = 0, I8 = 1, U16 = 2, I16 = 3, U32 = 4, I32 = 5, F32 = 6, Bool = 7, String = 8, Array = 9,
  U64 = 10, I64 = 11, F64 = 12,
};
// "uint32", "string", "array", ...
std::string_view gguf_type_name(GgufType t);

// One metadata value. Integers keep their value in `u` (unsigned types, bool)
// or `i` (signed types), floats in `f`; arrays hold their elements (all of
// `element_type`).
struct GgufValue {
  GgufType type = GgufType::U8;
  GgufType element_type = GgufType::U8;  // arrays only
  uint64_t u = 0;
  int64_t i = 0;
  double f = 0;
  std::string s;
  std::vector<GgufValue> array;

  bool is_integer() const;  // any of the 8 integer types (not bool)
  bool is_float() const;    // F32 or F64
  // The integer value when it is an integer that fits int64.
  std::optional<int64_t> as_int() const;
  // "uint32 7", "string 'llama'", "array of 512 string", ...: for messages.
  std::string describe() const;
};

struct GgufTensorInfo {
  std::string name;
  std::vector<int64_t> ne;  // GGUF order: ne[0] is the innermost (row) length
  uint32_t type = 0;        // ggml type id
  uint64_t offset = 0;      // from the start of the data section
  uint64_t nbytes = 0;
  // Row-major shape: ne reversed ([out, in] for a weight with ne = [in, out]).
  Shape shape() const;
  int64_t numel() const;
};

// What `tokenizer.ggml.*` says (fields absent from the file stay empty).
struct GgufVocab {
  std::string model;                // tokenizer.ggml.model: "llama" (SentencePiece), "gpt2" (byte-level BPE), ...
  std::string pre;                  // tokenizer.ggml.pre: the pre-tokenizer name ("llama-bpe", "qwen2", ...)
  std::vector<std::string> tokens;  // tokenizer.ggml.tokens, by id
  std::vector<float> scores;        // tokenizer.ggml.scores
  std::vector<int32_t> token_types; // tokenizer.ggml.token_type (1 normal, 2 unknown, 3 control, 6 byte, ...)
  std::vector<std::string> merges;  // tokenizer.ggml.merges ("a b")
  std::optional<int64_t> bos_id, eos_id, eot_id, unknown_id, padding_id;
  std::optional<bool> add_bos, add_eos;
  std::optional<bool> add_space_prefix;  // tokenizer.ggml.add_space_prefix (SentencePiece's dummy prefix)
  std::string chat_template;             // tokenizer.chat_template
};

// The tokenizer.json that Hugging Face's converters make for the vocabulary a
// GGUF file carries, so that nibble's Tokenizer (tokenizer.h) encodes as the
// original model's tokenizer does:
//   "llama" (SentencePiece BPE: Llama 2, Mistral, TinyLlama): ▁ normalizer with
//     the dummy prefix, byte fallback, merges made from the scores the way
//     transformers' SentencePieceExtractor makes them (every split of a piece
//     into two pieces, ranked by the piece's score, then by the halves' ids);
//   "gpt2" (byte-level BPE: Llama 3, Qwen2/3, SmolLM): the file's merges and
//     the pre-tokenizer that tokenizer.ggml.pre names (llama-bpe/llama3,
//     qwen2, smollm, gpt-2; a file without tokenizer.ggml.pre is refused).
// Control, unknown and user-defined tokens become added tokens (control and
// unknown ones special); BOS/EOS follow tokenizer.ggml.add_bos_token /
// add_eos_token, with llama.cpp's defaults where the file says nothing.
// Throws nibble::Error naming `origin` for other tokenizer models and
// pre-tokenizers, and for vocabularies that do not hang together.
std::string tokenizer_json_from_gguf(const GgufVocab& vocab, const std::string& origin);

class GgufFile {
 public:
  // Maps and validates the file; throws nibble::Error (one line naming the
  // file, and the key or tensor) on anything malformed, truncated or out of
  // bounds, on GGUF version 1, and on big-endian files.
  static GgufFile open(const std::filesystem::path& path);
  // Parses a GGUF image already in memory; `owner` keeps it alive (may be
  // null when the caller guarantees the lifetime).
  static GgufFile from_buffer(std::shared_ptr<const void> owner, const uint8_t* data, size_t size,
                              std::filesystem::path display_name);

  const std::filesystem::path& path() const { return path_; }
  uint32_t version() const { return version_; }
  uint64_t alignment() const { return alignment_; }
  uint64_t data_offset() const { return data_offset_; }  // file offset of the data section
  uint64_t file_size() const { return size_; }

  // Metadata in file order.
  const std::vector<std::pair<std::string, GgufValue>>& metadata() const { return kv_; }
  bool has(const std::string& key) const { return find(key) != nullptr; }
  const GgufValue* find(const std::string& key) const;  // nullptr when absent
  const GgufValue& get(const std::string& key) const;   // throws when absent
  // Typed getters: throw an Error naming the file and the key when the key is
  // absent (the overloads with a fallback return it instead) or has another
  // type. Integers of any width are accepted where an integer is asked for
  // (range-checked); floats are F32 or F64.
  int64_t get_int(const std::string& key) const;
  int64_t get_int(const std::string& key, int64_t fallback) const;
  double get_float(const std::string& key) const;
  double get_float(const std::string& key, double fallback) const;
  bool get_bool(const std::string& key) const;
  const std::string& get_string(const std::string& key) const;
  std::string get_string(const std::string& key, const std::string& fallback) const;
  std::vector<std::string> get_string_array(const std::string& key) const;
  std::vector<int64_t> get_int_array(const std::string& key) const;
  std::vector<float> get_float_array(const std::string& key) const;
  // tokenizer.ggml.* gathered (and checked for consistent lengths).
  GgufVocab vocab() const;

  // Tensors in file order.
  const std::vector<GgufTensorInfo>& tensors() const { return tensors_; }
  bool contains(const std::string& name) const { return index_.count(name) != 0; }
  const GgufTensorInfo& info(const std::string& name) const;  // throws when absent
  // The stored bytes of a tensor (info().nbytes of them), inside the mapping.
  const uint8_t* data(const GgufTensorInfo& t) const { return base_ + data_offset_ + t.offset; }
  // The tensor as stored, for plain types (F32, F16, BF16, F64, I8..I64): a
  // view into the mapping that keeps it alive (a copy when the bytes are not
  // aligned for the type). Throws for block-quantized types.
  Tensor view(const std::string& name) const;
  // Any supported type dequantized to a new F32 tensor of shape info().shape().
  Tensor dequantize(const std::string& name) const;
  // Throws unless dequantize(name) supports the tensor's type.
  void require_dequantizable(const std::string& name) const;

 private:
  std::filesystem::path path_;
  std::shared_ptr<const void> mapping_;
  const uint8_t* base_ = nullptr;
  uint64_t size_ = 0;
  uint32_t version_ = 0;
  uint64_t alignment_ = 32;
  uint64_t data_offset_ = 0;
  std::vector<std::pair<std::string, GgufValue>> kv_;
  std::map<std::string, size_t> kv_index_;
  std::vector<GgufTensorInfo> tensors_;
  std::map<std::string, size_t> index_;
};

}  // namespace nibble::io

namespace nibble {

// A GGUF file of a Llama-family model (general.architecture llama, qwen2 or
// qwen3; Mistral files say llama) as a ModelSource with Hugging Face tensor
// names and shapes:
//   token_embd → model.embed_tokens, output_norm → model.norm, output → lm_head,
//   blk.N.attn_norm → model.layers.N.input_layernorm,
//   blk.N.attn_q/k/v/output → ….self_attn.q_proj/k_proj/v_proj/o_proj,
//   blk.N.attn_q_norm/attn_k_norm → ….self_attn.q_norm/k_norm,
//   blk.N.ffn_norm → ….post_attention_layernorm,
//   blk.N.ffn_gate/up/down → ….mlp.gate_proj/up_proj/down_proj (.weight and .bias).
// Plain tensors (F32, F16, BF16) load as stored; block-quantized ones are
// dequantized to F32 on load (meta().format stays empty: the forward uses
// dense f32 weights). For llama, llama.cpp's converters store the q and k
// rows of each head in interleaved RoPE-pair order (row 2j+h of a head is HF
// row h·head_dim/2 + j); load() puts them back in HF rotate_half order.
// The config comes from the `<arch>.*` metadata; tie_word_embeddings is true
// when the file has no output.weight.
class GgufSource final : public ModelSource {
 public:
  static std::unique_ptr<GgufSource> open(const std::filesystem::path& path);

  const io::GgufFile& file() const { return file_; }
  // tokenizer.ggml.* of the file.
  io::GgufVocab vocab() const { return file_.vocab(); }
  // The file's own tokenizer (tokenizer_json_from_gguf), with its BOS/EOS tokens and chat template;
  // nullopt when it carries none.
  std::optional<Tokenizer> tokenizer() const override;
  // The same as tokenizer.json text and the config it is built with (what a checkpoint made from the
  // file writes beside its weights); tokenizer() is Tokenizer::from_json of these.
  struct TokenizerSpec {
    std::string json;
    TokenizerConfig config;
  };
  std::optional<TokenizerSpec> tokenizer_spec() const;
  // The GGUF tensor a logical (HF) name is read from.
  const std::string& gguf_name(const std::string& name) const;
  // Whether that tensor is stored plain (F32, F16, BF16), not in a ggml block type.
  bool is_plain(const std::string& name) const;

  const ModelConfig& config() const override { return config_; }
  std::string describe() const override;
  std::vector<std::string> names() const override { return order_; }
  bool contains(const std::string& name) const override { return entries_.count(name) != 0; }
  TensorMeta meta(const std::string& name) const override;
  Tensor load(const std::string& name) const override;
  void check_loadable() const override;
  // The ggml type of a tensor stored in a block type ("Q4_K").
  std::string foreign_format(const std::string& name) const override;
  // A matrix in a block type that a nibble format holds exactly, for the GPU's W4A16 kernels: Q4_0 is int4_g32_sym
  // (the same codes around 8, the same f16 scales); Q4_1 is int4_g32_asym_f32 (scale d, min m); Q4_K is
  // int4_g32_asym_f32 with a group per sub-block of 32 (scale d·sc, min −dmin·mn, each the fp32 product ggml forms).
  // q/k rows are unpermuted like load()'s, and the parts dequantize to load()'s values bit for bit; else nullopt.
  std::optional<FormatChoice> exact_format(const std::string& name) const override;
  std::vector<Tensor> exact_parts(const std::string& name) const override;

 private:
  struct Entry {
    TensorMeta meta;
    std::string gguf_name;
    int64_t unpermute_heads = 0;  // > 0: undo llama.cpp's q/k row permutation with this many heads
  };
  const Entry& entry(const std::string& name) const;

  io::GgufFile file_;
  ModelConfig config_;
  std::map<std::string, Entry> entries_;
  std::vector<std::string> order_;
};

// Whether `path` is a regular file that starts with the GGUF magic.
bool is_gguf_file(const std::filesystem::path& path);

// GgufSource::open as the generic interface.
std::unique_ptr<ModelSource> open_gguf(const std::filesystem::path& path);

}  // namespace nibble
