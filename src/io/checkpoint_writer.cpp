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
  return target.parent_path() / ("." + target.filename().string() + ".nibble-partial");
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
    : dir_(std::move(dir)), plan_(std::move(plan)), metadata_(std::move(metadata)) {
  // Greedy assignment in plan order; a unit never straddles two shards.
  size_t shard = 0;
  uint64_t in_shard = 0;
  for (const OutputUnit& u : plan_) {
    uint64_t bytes = 0;
    for (const auto& s : u.stored) bytes += stored_bytes(s);
    if (in_shard > 0 && in_shard + bytes > max_shard_bytes) {
      ++shard;
      in_shard = 0;
    }
    unit_shard_.push_back(shard);
    in_shard += bytes;
    total_bytes_ += bytes;
  }
  const size_t n = plan_.empty() ? 1 : shard + 1;
  for (size_t i = 0; i < n; ++i)
    file_names_.push_back(n == 1 ? "model.safetensors" : fmt::format("model-{:05}-of-{:05}.safetensors", i + 1, n));
  if (plan_.empty()) open_shard(0);
}

ShardedWriter::~ShardedWriter() = default;

void ShardedWriter::open_shard(size_t shard) {
  if (writer_) writer_->finish();
  std::map<std::string, std::string> meta = metadata_;
  std::string quant;
  for (size_t u = 0; u < plan_.size(); ++u) {
    if (unit_shard_[u] != shard || plan_[u].quant_meta.empty()) continue;
    quant += (quant.empty() ? "" : ", ") + nlohmann::json(plan_[u].logical_name).dump() + ": " + plan_[u].quant_meta;
  }
  if (!quant.empty()) meta[kMetaTensors] = "{" + quant + "}";
  writer_ = std::make_unique<SafetensorsWriter>(dir_ / file_names_[shard], meta);
  for (size_t u = 0; u < plan_.size(); ++u) {
    if (unit_shard_[u] != shard) continue;
    for (const auto& s : plan_[u].stored) {
      writer_->declare(s.name, s.dtype, s.shape);
      weight_map_[s.name] = file_names_[shard];
    }
  }
  current_shard_ = shard;
}

void ShardedWriter::write(const std::string& stored_name, const Tensor& t) {
  NIBBLE_CHECK(next_unit_ < plan_.size(), "ShardedWriter: '{}' written after the plan's last tensor", stored_name);
  const OutputUnit& u = plan_[next_unit_];
  NIBBLE_CHECK(u.stored[next_stored_].name == stored_name, "ShardedWriter: expected '{}' next, got '{}'",
               u.stored[next_stored_].name, stored_name);
  if (unit_shard_[next_unit_] != current_shard_) open_shard(unit_shard_[next_unit_]);
  writer_->write(stored_name, t);
  if (++next_stored_ == u.stored.size()) {
    next_stored_ = 0;
    ++next_unit_;
  }
}

void ShardedWriter::finish() {
  NIBBLE_CHECK(next_unit_ == plan_.size(), "ShardedWriter: {} of {} tensors were written", next_unit_, plan_.size());
  if (writer_) writer_->finish();
  writer_.reset();
  if (file_names_.size() > 1) {
    nlohmann::ordered_json index;
    index["metadata"]["total_size"] = total_bytes_;
    index["weight_map"] = weight_map_;
    write_file_atomic(dir_ / "model.safetensors.index.json", index.dump(2) + "\n");
  }
}

}  // namespace nibble::io
