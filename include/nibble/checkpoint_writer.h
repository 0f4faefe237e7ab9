// Writing a model directory safely: everything goes into a staging directory
// beside the target and is renamed into place only when complete, so a failed
// or interrupted run never leaves a half-written checkpoint under the target
// name. Weights are streamed into shards of bounded size.
#pragma once

#include <filesystem>
#include <map>
#include <memory>
#include <mutex>
#include <set>
#include <string>
#include <vector>

#include "nibble/safetensors.h"
#include "nibble/tensor.h"

namespace nibble::io {

class OutputDir {
 public:
  // Fails early (before any work) when `target` exists and is not an empty
  // directory (unless `force`), or when its parent cannot be written.
  // A leftover staging directory is removed, unless `keep_staging` (a resumed
  // run continues from what it holds).
  OutputDir(std::filesystem::path target, bool force, bool keep_staging = false);
  ~OutputDir();  // removes the staging directory unless committed or kept

  // Where the staging directory of `target` is (whether or not it exists).
  static std::filesystem::path staging_for(const std::filesystem::path& target);
  // Leave the staging directory in place if the run fails from here on (it
  // holds state a later run can resume from).
  void keep_on_failure(bool keep) { keep_on_failure_ = keep; }
  OutputDir(const OutputDir&) = delete;
  OutputDir& operator=(const OutputDir&) = delete;

  const std::filesystem::path& staging() const { return staging_; }
  const std::filesystem::path& target() const { return target_; }
  // Replaces `target` with the staging directory.
  void commit();

 private:
  std::filesystem::path target_, staging_;
  bool force_, committed_ = false, keep_on_failure_ = false;
};

// One logical tensor of the output: its stored tensors (one for a plain
// tensor, several parts for a quantized matrix), kept together in one shard.
struct OutputUnit {
  std::string logical_name;
  struct Stored {
    std::string name;
    DType dtype;
    Shape shape;
  };
  std::vector<Stored> stored;
  std::string quant_meta;  // JSON object text for __metadata__["nibble.tensors"], or empty for plain tensors
};

// Writes units into model.safetensors, or model-0000k-of-0000n.safetensors
// plus model.safetensors.index.json when they exceed `max_shard_bytes`. The
// layout follows the plan; the stored tensors may be written in any order
// and from several threads (the calibration writes its layers as they finish).
class ShardedWriter {
 public:
  ShardedWriter(std::filesystem::path dir, std::vector<OutputUnit> plan, uint64_t max_shard_bytes,
                std::map<std::string, std::string> metadata);
  ~ShardedWriter();
  void write(const std::string& stored_name, const Tensor& t);
  bool written(const std::string& stored_name) const;
  void finish();  // every stored tensor must have been written
  uint64_t total_bytes() const { return total_bytes_; }
  std::vector<std::string> file_names() const { return file_names_; }

 private:
  std::filesystem::path dir_;
  std::vector<std::string> file_names_;
  std::map<std::string, std::string> weight_map_;
  std::vector<std::unique_ptr<SafetensorsWriter>> shards_;
  std::map<std::string, size_t> shard_of_;  // stored name -> shard
  std::set<std::string> written_;
  size_t num_stored_ = 0;
  uint64_t total_bytes_ = 0;
  mutable std::mutex mutex_;
};

}  // namespace nibble::io
