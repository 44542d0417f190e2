// Training checkpoints: a directory written whole or not at all, and the trainer's state in it.
//
// write_checkpoint puts every file in a temporary sibling, <out>/.tmp-<name>-<pid>, fsyncs each
// file and the directory, then swaps it onto <out>/<name> with one rename (renameat2
// RENAME_EXCHANGE where the filesystem has it, else the old directory is renamed aside first), and
// fsyncs <out>. A reader, or a run killed at any moment, sees the old checkpoint or the new one,
// never a mix. One process writes to an out directory at a time.
//
// A checkpoint of a run holds config.json, model.safetensors and tokenizer.json (a model directory
// every subcommand reads) plus trainer_state.json and optimizer.safetensors (what --resume needs).
#pragma once

#include <cstdint>
#include <filesystem>
#include <map>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "io/safetensors.h"

namespace hybridlm {

// One file of a checkpoint: its name in the directory and its bytes, `owned` first, then each of
// `borrowed` in order (tensor data, written without copying it; it must stay valid until
// write_checkpoint returns).
struct CheckpointFile {
  std::string name;
  std::string owned;
  std::vector<std::span<const uint8_t>> borrowed;

  static CheckpointFile text(std::string name, std::string contents);
  // A safetensors file of these tensors (header owned, tensor bytes borrowed). Throws Error for a
  // tensor whose bytes do not match its shape and dtype.
  static CheckpointFile safetensors(std::string name, const std::vector<TensorToWrite>& tensors,
                                    const std::map<std::string, std::string>& metadata = {});
  uint64_t size() const;
};

// Writes `files` as the directory out/name (out is created if needed), replacing a previous
// out/name. name and file names are plain names (no '/', not starting with '.'). On any failure
// (not writable, disk full, ...: every write, fsync, close and rename is checked) the temporary
// directory is removed and Error names the path and the system's reason; out/name is as it was,
// unless only the final fsync of `out` failed (then the new checkpoint is in place, not yet durable).
// Leftovers of a run killed while writing this name (.tmp-<name>-*, .old-<name>-*) are removed first.
void write_checkpoint(const std::filesystem::path& out, const std::string& name,
                      const std::vector<CheckpointFile>& files);

// trainer_state.json: where a run stands, to resume it.
struct TrainerState {
  int64_t step = 0;                // optimizer steps done; a resumed run continues with step `step`
  int64_t tokens = 0;              // training tokens consumed
  uint64_t seed = 0;               // the run's seed (the batch sampler's)
  double elapsed_s = 0;            // training wall time so far
  std::optional<double> loss;      // the last logged training loss
  std::optional<double> val_loss;  // the last validation loss
};
inline constexpr const char* kTrainerStateFile = "trainer_state.json";

std::string trainer_state_json(const TrainerState& s);
// Throws Error naming `where` and the key for anything missing, mistyped or negative.
TrainerState parse_trainer_state(const std::string& text, const std::string& where);
TrainerState read_trainer_state(const std::filesystem::path& checkpoint_dir);

// The directory under `out` (not hidden) whose trainer_state.json has the highest step (ties: the
// greater name); nullopt if none has one. Throws Error for an unreadable trainer_state.json.
std::optional<std::filesystem::path> latest_checkpoint(const std::filesystem::path& out);

// After saving step-<saved_step> under `out`: removes the checkpoints named step-<N> with N below
// saved_step, all but the newest keep - 1 of them, so that `keep` remain with the one just saved;
// each is renamed to a hidden name first, so that no half-removed directory is ever visible. keep
// 0 removes none. Higher steps (left by an earlier, longer run in the same directory) and other
// directories are never touched. Returns the names removed. Throws Error if one cannot be removed
// (the trainer only warns: housekeeping does not stop a run).
std::vector<std::string> prune_checkpoints(const std::filesystem::path& out, int64_t keep, int64_t saved_step);

}  // namespace hybridlm
