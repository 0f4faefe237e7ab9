#include "nibble/checkpoint_writer.h"

#include <unistd.h>

#include <nlohmann/json.hpp>

#include "nibble/error.h"
#include "nibble/source.h"
#include "nibble/util.h"

namespace nibble::io {
namespace fs = std::filesystem;

fs::path OutputDir::staging_for(const fs::path& t) {
  fs::path target = fs::absolute(t).lexically_normal();
  if (target.filename().empty()) target = target.parent_path();  // "out/" -> "out"
  // Appended piece by piece: GCC 12 warns falsely (-Wrestrict) on "." + std::string&&.
  std::string name = ".";
  name += target.filename().string();
  name += ".nibble-partial";
  return target.parent_path() / name;
}

OutputDir::OutputDir(fs::path target, bool force, bool keep_staging) : force_(force) {
  target = fs::absolute(target).lexically_normal();
  if (target.filename().empty()) target = target.parent_path();  // "out/" -> "out"
  target_ = target;
  NIBBLE_CHECK(!fs::exists(target_) || fs::is_directory(target_), "{}: exists and is not a directory",
               target_.string());
  if (fs::exists(target_) && !fs::is_empty(target_))
    NIBBLE_CHECK(force_, "{}: exists and is not empty (pass --force to replace it)", target_.string());
  const fs::path parent = target_.parent_path();
  std::error_code ec;
  fs::create_directories(parent, ec);
  NIBBLE_CHECK(!ec && fs::is_directory(parent), "{}: cannot create the output's parent directory ({})",
               parent.string(), ec ? ec.message() : "not a directory");
  NIBBLE_CHECK(access(parent.c_str(), W_OK) == 0, "{}: output directory cannot be written (no write permission on {})",
               target_.string(), parent.string());
  staging_ = staging_for(target_);
  if (!keep_staging) fs::remove_all(staging_, ec);  // a leftover from an interrupted run
  fs::create_directories(staging_, ec);
  NIBBLE_CHECK(!ec, "{}: cannot create staging directory ({})", staging_.string(), ec.message());
}

OutputDir::~OutputDir() {
  if (committed_ || keep_on_failure_) return;
  std::error_code ec;
  fs::remove_all(staging_, ec);
}

void OutputDir::commit() {
  std::error_code ec;
  if (fs::exists(target_)) {
    fs::remove_all(target_, ec);
    NIBBLE_CHECK(!ec, "{}: cannot remove the previous output ({})", target_.string(), ec.message());
  }
  fs::rename(staging_, target_, ec);
  NIBBLE_CHECK(!ec, "{}: cannot move {} into place ({})", target_.string(), staging_.string(), ec.message());
  committed_ = true;
}

namespace {
uint64_t stored_bytes(const OutputUnit::Stored& s) {
  return static_cast<uint64_t>(shape_numel(s.shape)) * dtype_size(s.dtype);
}
}  // namespace

ShardedWriter::ShardedWriter(fs::path dir, std::vector<OutputUnit> plan, uint64_t max_shard_bytes,
                             std::map<std::string, std::string> metadata)
    : dir_(std::move(dir)) {
  // Greedy assignment in plan order; a unit never straddles two shards.
  std::vector<size_t> unit_shard;
  size_t shard = 0;
  uint64_t in_shard = 0;
  for (const OutputUnit& u : plan) {
    uint64_t bytes = 0;
    for (const auto& s : u.stored) bytes += stored_bytes(s);
    if (in_shard > 0 && in_shard + bytes > max_shard_bytes) {
      ++shard;
      in_shard = 0;
    }
    unit_shard.push_back(shard);
    in_shard += bytes;
    total_bytes_ += bytes;
  }
  const size_t n = plan.empty() ? 1 : shard + 1;
  for (size_t i = 0; i < n; ++i)
    file_names_.push_back(n == 1 ? "model.safetensors" : fmt::format("model-{:05}-of-{:05}.safetensors", i + 1, n));
  // Every shard is declared (and its temporary file opened) now.
  for (size_t k = 0; k < n; ++k) {
    std::map<std::string, std::string> meta = metadata;
    std::string quant;
    for (size_t u = 0; u < plan.size(); ++u) {
      if (unit_shard[u] != k || plan[u].quant_meta.empty()) continue;
      quant += (quant.empty() ? "" : ", ") + nlohmann::json(plan[u].logical_name).dump() + ": " + plan[u].quant_meta;
    }
    if (!quant.empty()) meta[kMetaTensors] = "{" + quant + "}";
    shards_.push_back(std::make_unique<SafetensorsWriter>(dir_ / file_names_[k], meta));
    for (size_t u = 0; u < plan.size(); ++u) {
      if (unit_shard[u] != k) continue;
      for (const auto& s : plan[u].stored) {
        shards_[k]->declare(s.name, s.dtype, s.shape);
        weight_map_[s.name] = file_names_[k];
        shard_of_[s.name] = k;
        ++num_stored_;
      }
    }
  }
}

ShardedWriter::~ShardedWriter() = default;

void ShardedWriter::write(const std::string& stored_name, const Tensor& t) {
  std::lock_guard<std::mutex> lock(mutex_);
  auto it = shard_of_.find(stored_name);
  NIBBLE_CHECK(it != shard_of_.end(), "ShardedWriter: '{}' is not in the plan", stored_name);
  shards_[it->second]->write(stored_name, t);
  written_.insert(stored_name);
}

bool ShardedWriter::written(const std::string& stored_name) const {
  std::lock_guard<std::mutex> lock(mutex_);
  return written_.count(stored_name) > 0;
}

void ShardedWriter::finish() {
  std::lock_guard<std::mutex> lock(mutex_);
  NIBBLE_CHECK(written_.size() == num_stored_, "ShardedWriter: {} of {} stored tensors were written", written_.size(),
               num_stored_);
  for (auto& w : shards_) w->finish();
  shards_.clear();
  if (file_names_.size() > 1) {
    nlohmann::ordered_json index;
    index["metadata"]["total_size"] = total_bytes_;
    index["weight_map"] = weight_map_;
    write_file_atomic(dir_ / "model.safetensors.index.json", index.dump(2) + "\n");
  }
}

}  // namespace nibble::io
