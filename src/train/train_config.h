// train.yaml: everything `hybridlm train --config train.yaml` needs to run (docs/train-config.md).
//
//   model:      {init: DIR} (start from a checkpoint), or config.json's keys (docs/model-format.md)
//   tokenizer:  tokenizer.json or a directory holding it
//   data:       {train: train.bin, validation: val.bin}   (files of `hybridlm prepare-data`)
//   optimizer:  {lr, betas: [b1, b2], eps, weight_decay, grad_clip}
//   schedule:   {kind: cosine | wsd, warmup_steps, min_lr, decay_fraction}
//   batch:      {sequences, seq_len, accumulation}
//   steps, eval_interval, eval_batches, checkpoint_interval, keep_checkpoints, log_interval, seed, threads, out
//
// Scalars are typed by the YAML 1.2 core schema (3e-4 is a number, yes is a string, "64" quoted is
// a string). Paths are relative to the YAML file's folder. Every error is one line naming the key
// path: "train.yaml: optimizer.lr: expected a number, got "fast"".
#pragma once

#include <cstdint>
#include <filesystem>
#include <optional>
#include <string>
#include <string_view>

#include <nlohmann/json.hpp>

#include "train/optimizer.h"

namespace hybridlm {

struct TrainConfig {
  // The model: a checkpoint directory to start from (its config.json and weights), or, when
  // init is empty, config.json's keys as a JSON object with proper JSON types, to be written
  // verbatim as the new model's config.json. model_type, architectures and num_hidden_layers
  // are filled in when absent; vocab_size is absent unless given (fill_vocab_size).
  std::filesystem::path init;
  nlohmann::json model = nlohmann::json::object();

  // tokenizer.json or a directory holding one; empty when not given (tokenizer_file resolves it).
  std::filesystem::path tokenizer;

  struct Data {
    std::filesystem::path train;       // a token file of prepare-data (train.bin)
    std::filesystem::path validation;  // empty: no evaluation
    // validation was not given: it is the val.bin beside train, and a missing or empty one means
    // no evaluation rather than an error (validation_file).
    bool validation_default = false;
  } data;

  AdamWOptions adamw;    // optimizer.betas, eps, weight_decay
  double grad_clip = 1;  // optimizer.grad_clip: max global gradient norm; 0 = no clipping
  // optimizer.lr and schedule.* (defaults: cosine, warmup min(100, steps / 10), min_lr = lr / 10);
  // total = steps. Validated.
  Schedule schedule;

  struct Batch {
    int sequences = 8;     // per micro-batch
    int seq_len = 256;     // tokens per sequence (each reads seq_len + 1: inputs and shifted targets)
    int accumulation = 1;  // micro-batches per optimizer step
  } batch;

  int64_t steps = 0;                   // optimizer steps (required)
  int64_t eval_interval = 100;         // steps between evaluations; 0 = none
  int64_t eval_batches = 20;           // micro-batches of validation windows per evaluation; 0 = all
  int64_t checkpoint_interval = 1000;  // steps between checkpoints; 0 = only at the end
  int64_t keep_checkpoints = 0;        // the newest this many step-N checkpoints stay; 0 = all
  int64_t log_interval = 10;           // steps between metrics lines
  uint64_t seed = 1;                   // data sampling and initialisation
  int threads = 0;                     // 0 = every hardware thread
  std::filesystem::path out;           // run directory (required)

  std::string source;  // the YAML file, for messages
};

// Parses train.yaml's text. Relative paths resolve against base_dir (the YAML file's folder);
// messages start with `source`. Throws Error on any problem: YAML syntax (with its line), unknown
// keys (with the nearest known one), wrong types, out-of-range values, and the model section as the
// model's own config parser checks it.
TrainConfig parse_train_config(const std::string& yaml_text, const std::filesystem::path& base_dir,
                               std::string_view source = "train.yaml");
// Reads and parses the file; base_dir is its folder, messages start with its path.
TrainConfig load_train_config(const std::filesystem::path& path);

// The tokenizer.json to load: `tokenizer` (a directory: its tokenizer.json); else the init
// checkpoint's tokenizer.json; else the one the data's index.json names. Throws Error if none exists.
std::filesystem::path tokenizer_file(const TrainConfig& c);
// The validation token file, or nullopt for no evaluation (not given and no non-empty val.bin
// beside the training file).
std::optional<std::filesystem::path> validation_file(const TrainConfig& c);
// Sets model.vocab_size to the tokenizer's vocabulary when absent; when present, checks that it
// holds every token id (>= tokenizer_vocab). No-op with init.
void fill_vocab_size(TrainConfig& c, int tokenizer_vocab);

}  // namespace hybridlm
