// nibble inspect: what a checkpoint (dir or .safetensors file) holds.
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <memory>

#include <nlohmann/json.hpp>

#include "commands.h"
#include "nibble/format.h"
#include "nibble/gguf.h"
#include "nibble/rival.h"
#include "nibble/source.h"
#include "nibble/util.h"

namespace nibble::cli {
namespace fs = std::filesystem;

namespace {

// "stored as" for a tensor: its nibble format or dtype; for a GGUF file's block types, the ggml type; for a rival's
// quantized linear "rival" (its scheme is in the header). Either is followed by ":FORMAT" where that nibble format
// holds the values exactly (ModelSource::exact_format: the CPU's and the GPU's int4 kernels take it),
// "Q4_0:int4_g32_sym".
std::string stored_as(const ModelSource& src, const std::string& name, const TensorMeta& m) {
  std::string foreign = src.foreign_format(name);
  if (foreign.empty()) return m.format ? m.format->canonical_name() : std::string(dtype_name(m.dtype));
  if (dynamic_cast<const RivalSource*>(&src)) foreign = "rival";
  const std::optional<FormatChoice> exact = src.exact_format(name);
  return exact ? foreign + ":" + exact->canonical_name() : foreign;
}

// A nibble format, or a GGUF block type (stored as something other than the dtype it loads as).
bool is_quantized(const TensorMeta& m, const std::string& stored) {
  return m.format || stored != dtype_name(m.dtype);
}

void print_header(const ModelSource& src) {
  std::printf("%s\n", src.describe().c_str());
  if (const auto* g = dynamic_cast<const GgufSource*>(&src)) {
    const io::GgufFile& f = g->file();
    const io::GgufVocab v = g->vocab();
    std::printf("GGUF v%u, %s, %s; tokenizer %s%s%s, %zu tokens\n", f.version(),
                f.get_string("general.architecture", "?").c_str(), f.get_string("general.name", "unnamed").c_str(),
                v.model.empty() ? "none" : v.model.c_str(), v.pre.empty() ? "" : "/", v.pre.c_str(), v.tokens.size());
    for (const std::string& n : src.names())
      if (src.exact_format(n)) {
        std::printf("a block type listed as TYPE:FORMAT is that nibble format exactly (the CPU's packed kernels take "
                    "those linears as stored; the GPU's int4 kernels take the int4 ones, and it loads the others "
                    "dense)\n");
        break;
      }
    return;
  }
  if (const auto* r = dynamic_cast<const RivalSource*>(&src)) {
    std::printf("a rival's quantized (or pruned) checkpoint: each of its quantized or sparse linears is listed as "
                "'rival' (%s), or 'rival:FORMAT' where that nibble format holds its values exactly (the CPU's and the "
                "GPU's int4 kernels then take it), its bytes all its stored parts\n",
                r->scheme().describe().c_str());
    return;
  }
  const auto* dir = dynamic_cast<const CheckpointDir*>(&src);
  if (!dir) return;
  const auto& md = dir->metadata();
  if (auto it = md.find(kMetaFormat); it != md.end()) std::printf("format: %s\n", it->second.c_str());
  const fs::path report = dir->dir() / "nibble.json";
  if (fs::is_directory(dir->dir()) && fs::exists(report)) {
    std::ifstream f(report);
    const auto j = nlohmann::json::parse(f, nullptr, false);
    if (!j.is_discarded() && j.contains("method"))
      std::printf("made by: nibble %s, method %s, %s\n", j.value("nibble_version", "?").c_str(),
                  j.value("method", "?").c_str(), j.value("created", "?").c_str());
  }
}

// A string JSON-quoted and cut at 80 characters.
std::string quoted(const std::string& s) {
  std::string q = nlohmann::json(s).dump(-1, ' ', false, nlohmann::json::error_handler_t::replace);
  return q.size() > 80 ? q.substr(0, 77) + "...\"" : q;
}

// A metadata value on one line: strings quoted, arrays as their length and first elements.
std::string short_value(const io::GgufValue& v) {
  switch (v.type) {
    case io::GgufType::String: return quoted(v.s);
    case io::GgufType::Bool: return v.u ? "true" : "false";
    case io::GgufType::F32: case io::GgufType::F64: return fmt::format("{}", v.f);
    case io::GgufType::I8: case io::GgufType::I16: case io::GgufType::I32: case io::GgufType::I64:
      return fmt::format("{}", v.i);
    case io::GgufType::Array: {
      std::string out = fmt::format("[{} x {}]", v.array.size(), io::gguf_type_name(v.element_type));
      for (size_t k = 0; k < std::min<size_t>(v.array.size(), 4); ++k) out += (k ? ", " : " ") + short_value(v.array[k]);
      return out + (v.array.size() > 4 ? ", ..." : "");
    }
    default: return fmt::format("{}", v.u);
  }
}

// Every metadata key: a GGUF file's key/value pairs, or a safetensors file's __metadata__.
void print_metadata(const ModelSource& src) {
  std::printf("%s\n\n", src.describe().c_str());
  if (const auto* g = dynamic_cast<const GgufSource*>(&src)) {
    for (const auto& [key, value] : g->file().metadata())
      std::printf("%-44s %-8s %s\n", key.c_str(), std::string(io::gguf_type_name(value.type)).c_str(),
                  short_value(value).c_str());
    return;
  }
  if (const auto* d = dynamic_cast<const CheckpointDir*>(&src))
    for (const auto& [key, value] : d->metadata()) std::printf("%-44s %s\n", key.c_str(), quoted(value).c_str());
}

void print_summary(const ModelSource& src) {
  print_header(src);
  // The "stored as" column as wide as its longest entry ("Q4_1:int4_g32_asym_f32").
  const std::vector<std::string> names = src.names();
  std::vector<std::string> stored_col;
  int width = 19;
  for (const std::string& name : names) {
    stored_col.push_back(stored_as(src, name, src.meta(name)));
    width = std::max(width, static_cast<int>(stored_col.back().size()));
  }
  std::printf("\n%-48s %-*s %-14s %12s %8s\n", "tensor", width, "stored as", "shape", "bytes", "bits/w");
  uint64_t params = 0, bytes = 0, qparams = 0, qbytes = 0;
  size_t nq = 0;
  for (size_t i = 0; i < names.size(); ++i) {
    const std::string& name = names[i];
    const TensorMeta m = src.meta(name);
    const uint64_t n = static_cast<uint64_t>(shape_numel(m.shape));
    const std::string& stored = stored_col[i];
    std::printf("%-48s %-*s %-14s %12s %8.3f\n", name.c_str(), width, stored.c_str(), shape_str(m.shape).c_str(),
                human_bytes(m.stored_bytes).c_str(), n ? 8.0 * m.stored_bytes / n : 0.0);
    params += n;
    bytes += m.stored_bytes;
    if (is_quantized(m, stored)) qparams += n, qbytes += m.stored_bytes, ++nq;
  }
  std::printf("\ntotal: %zu tensors, %.3f M params, %s, %.3f bits/weight\n", names.size(), params / 1e6,
              human_bytes(bytes).c_str(), params ? 8.0 * bytes / params : 0.0);
  if (nq)
    std::printf("quantized: %zu matrices, %.3f M params, %s, %.3f bits/weight\n", nq, qparams / 1e6,
                human_bytes(qbytes).c_str(), 8.0 * qbytes / qparams);
}

void print_tensor(const ModelSource& src, const std::string& name, int64_t rows_shown, int64_t cols_shown) {
  const TensorMeta m = src.meta(name);
  const Tensor t = src.load(name).to_f32();
  const std::string stored = stored_as(src, name, m);
  std::printf("%s: %s %s%s\n", name.c_str(), stored.c_str(), shape_str(m.shape).c_str(),
              is_quantized(m, stored) ? " (dequantized)" : "");
  const int64_t cols = t.dim() >= 2 ? t.size(t.dim() - 1) : t.numel();
  const int64_t rows = cols ? t.numel() / cols : 0;
  const float* p = t.data<float>();
  for (int64_t r = 0; r < std::min(rows, rows_shown); ++r) {
    std::printf("  [%lld]", static_cast<long long>(r));
    for (int64_t c = 0; c < std::min(cols, cols_shown); ++c) std::printf(" % .6g", p[r * cols + c]);
    std::printf("%s\n", cols > cols_shown ? " ..." : "");
  }
  double mn = INFINITY, mx = -INFINITY, sum_abs = 0;
  for (int64_t i = 0; i < t.numel(); ++i) {
    mn = std::min<double>(mn, p[i]);
    mx = std::max<double>(mx, p[i]);
    sum_abs += std::abs(p[i]);
  }
  std::printf("  min %.6g  max %.6g  mean|w| %.6g  (%lld values)\n", mn, mx, t.numel() ? sum_abs / t.numel() : 0.0,
              static_cast<long long>(t.numel()));
}

}  // namespace

std::string model_help() {
  return "a directory (HF, nibble-packed, or a rival's quantized checkpoint: " + rival_method_names() +
         ") or a GGUF file";
}

std::string candidate_help() {
  return "DIR (HF, nibble-packed, or a rival's quantized checkpoint: " + rival_method_names() +
         "), hf:DIR, packed:DIR, gguf:FILE or FILE.gguf, overlay:CAND,keep=REGEX, overlay:CAND,head=SRC";
}

std::string format_list_text() {
  std::string out;
  for (const FormatSpec* f : format_registry()) {
    for (int g : f->group_sizes) {
      const FormatChoice c{f, g};
      out += fmt::format("  {:<18} {:6.3f} b/w  {}\n", c.canonical_name(), bits_per_weight(c, 4096, 4096),
                         f->description);
    }
  }
  return out;
}

void register_inspect(CLI::App& app, const GlobalOptions& global) {
  auto* cmd = app.add_subcommand("inspect", "List a checkpoint's tensors, formats, sizes and bits per weight");
  auto path = std::make_shared<std::string>();
  auto tensor = std::make_shared<std::string>();
  auto rows = std::make_shared<int64_t>(2);
  auto cols = std::make_shared<int64_t>(8);
  auto formats = std::make_shared<bool>(false);
  auto metadata = std::make_shared<bool>(false);
  cmd->add_option("path", *path, "Model directory, .safetensors file or GGUF file");
  cmd->add_flag("--formats", *formats, "List the storage formats nibble knows (the format registry) and exit");
  cmd->add_flag("--metadata", *metadata,
                "Print the file's metadata instead: every GGUF key and value, or the safetensors __metadata__");
  cmd->add_option("--tensor", *tensor, "Print a few (dequantized) values of this tensor");
  cmd->add_option("--rows", *rows, "Rows shown with --tensor")->capture_default_str()->check(nonnegative());
  cmd->add_option("--cols", *cols, "Values per row shown with --tensor")->capture_default_str()->check(nonnegative());
  cmd->footer(
      "Examples:\n  nibble inspect out/stories-rtn\n"
      "  nibble inspect out/stories-rtn --tensor model.layers.0.mlp.down_proj.weight\n"
      "  nibble inspect ../shared/models/stories260K/gguf/stories260K-Q4_K_M.gguf\n"
      "  nibble inspect ../shared/models/stories260K/gguf/stories260K-Q4_K_M.gguf --metadata\n"
      "  nibble inspect --formats");
  cmd->callback([path, tensor, rows, cols, formats, metadata] {
    if (*formats) {
      std::printf("formats (canonical name, bits/weight of a 4096x4096 matrix with all stored parameters, what):\n%s",
                  format_list_text().c_str());
      return;
    }
    NIBBLE_CHECK(!path->empty(), "inspect: give a model directory, .safetensors file or GGUF file (or --formats)");
    const fs::path p = *path;
    // A directory (nibble, HF or a rival's) or a GGUF file as every verb opens them; else one safetensors file.
    const std::unique_ptr<ModelSource> src = fs::is_directory(p) || is_gguf_file(p)
                                                 ? open_model_source(p.string())
                                                 : CheckpointDir::open_file(p);
    if (*metadata)
      print_metadata(*src);
    else if (tensor->empty())
      print_summary(*src);
    else
      print_tensor(*src, *tensor, *rows, *cols);
  });
}

}  // namespace nibble::cli
