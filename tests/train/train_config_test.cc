// train.yaml: a file with every key round-trips into TrainConfig (and its model section into a
// config.json the model parser reads back); each kind of mistake gives one line naming the key.
#include "train/train_config.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <string>

#include "base/error.h"
#include "models/config.h"
#include "token_dir.h"

namespace hybridlm {
namespace {

namespace fs = std::filesystem;
using ::testing::HasSubstr;

// Every key, none at its default.
const char* kFull = R"(# a full run
model:
  block_pattern: [m2, t, m, m2]
  hidden_size: 64
  vocab_size: 512
  rms_norm_eps: 1e-6
  tie_word_embeddings: true
  ssm: {d_state: 16, d_conv: 4, expand: 2, dt_rank: auto, head_dim: 16, n_groups: 2, chunk_size: 32,
        conv_bias: false, proj_bias: true}
  attention: {num_heads: 4, num_kv_heads: 2, head_dim: 16, rope_theta: 500000.0, partial_rotary_factor: 0.5,
              qk_norm: true, bias: false}
  mlp: {intermediate_size: 128, activation: gelu, gated: false}
tokenizer: tok
data:
  train: data/train.bin
  validation: /abs/val.bin
optimizer:
  lr: 1.5e-3
  betas: [0.8, 0.99]
  eps: 1e-7
  weight_decay: 0.05
  grad_clip: 0.5
schedule:
  kind: wsd
  warmup_steps: 50
  min_lr: 0
  decay_fraction: 0.3
batch:
  sequences: 4
  seq_len: 128
  accumulation: 3
steps: 1000
eval_interval: 25
eval_batches: 7
checkpoint_interval: 200
log_interval: 5
seed: 0x2a
threads: 2
out: runs/one
)";

const char* kMinimal = R"(model: {block_pattern: [t]}
data: {train: d/train.bin}
steps: 200
out: run
)";

// The message of the hybridlm::Error that parsing `yaml` throws ("" and a failure if none).
std::string error_of(const std::string& yaml) {
  try {
    parse_train_config(yaml, "/base");
  } catch (const Error& e) {
    const std::string m = e.what();
    EXPECT_EQ(m.find('\n'), std::string::npos) << "not one line: " << m;
    return m;
  }
  ADD_FAILURE() << "no error for:\n" << yaml;
  return "";
}

// kMinimal with `line` replacing the line that starts with the same key, or appended.
std::string minimal_with(const std::string& line) {
  std::string out;
  bool replaced = false;
  const std::string key = line.substr(0, line.find(':') + 1);
  std::string rest = kMinimal;
  for (size_t pos = 0; pos < rest.size();) {
    const size_t end = rest.find('\n', pos);
    const std::string l = rest.substr(pos, end - pos);
    if (l.rfind(key, 0) == 0) {
      out += line + "\n";
      replaced = true;
    } else {
      out += l + "\n";
    }
    pos = end + 1;
  }
  return replaced ? out : out + line + "\n";
}

TEST(TrainConfig, FullFileRoundTrips) {
  const TrainConfig c = parse_train_config(kFull, "/base/dir", "conf/train.yaml");
  EXPECT_EQ(c.source, "conf/train.yaml");
  EXPECT_TRUE(c.init.empty());
  EXPECT_EQ(c.tokenizer, "/base/dir/tok");
  EXPECT_EQ(c.data.train, "/base/dir/data/train.bin");
  EXPECT_EQ(c.data.validation, "/abs/val.bin");
  EXPECT_FALSE(c.data.validation_default);
  EXPECT_FLOAT_EQ(c.schedule.lr, 1.5e-3f);
  EXPECT_FLOAT_EQ(c.adamw.beta1, 0.8f);
  EXPECT_FLOAT_EQ(c.adamw.beta2, 0.99f);
  EXPECT_FLOAT_EQ(c.adamw.eps, 1e-7f);
  EXPECT_FLOAT_EQ(c.adamw.weight_decay, 0.05f);
  EXPECT_DOUBLE_EQ(c.grad_clip, 0.5);
  EXPECT_EQ(c.schedule.kind, "wsd");
  EXPECT_EQ(c.schedule.warmup, 50);
  EXPECT_EQ(c.schedule.total, 1000);
  EXPECT_FLOAT_EQ(c.schedule.min_lr, 0.0f);
  EXPECT_FLOAT_EQ(c.schedule.decay_fraction, 0.3f);
  EXPECT_EQ(c.batch.sequences, 4);
  EXPECT_EQ(c.batch.seq_len, 128);
  EXPECT_EQ(c.batch.accumulation, 3);
  EXPECT_EQ(c.steps, 1000);
  EXPECT_EQ(c.eval_interval, 25);
  EXPECT_EQ(c.eval_batches, 7);
  EXPECT_EQ(c.checkpoint_interval, 200);
  EXPECT_EQ(c.log_interval, 5);
  EXPECT_EQ(c.seed, 42u);
  EXPECT_EQ(c.threads, 2);
  EXPECT_EQ(c.out, "/base/dir/runs/one");

  // The model section as JSON types, ready to be config.json.
  const nlohmann::json& m = c.model;
  EXPECT_EQ(m["block_pattern"], nlohmann::json({"m2", "t", "m", "m2"}));
  EXPECT_TRUE(m["hidden_size"].is_number_integer());
  EXPECT_TRUE(m["rms_norm_eps"].is_number_float());
  EXPECT_DOUBLE_EQ(m["rms_norm_eps"].get<double>(), 1e-6);
  EXPECT_TRUE(m["tie_word_embeddings"].is_boolean());
  EXPECT_EQ(m["ssm"]["dt_rank"], "auto");
  EXPECT_EQ(m["ssm"]["conv_bias"], false);
  EXPECT_TRUE(m["attention"]["rope_theta"].is_number_float());
  EXPECT_EQ(m["mlp"]["activation"], "gelu");
  EXPECT_EQ(m["model_type"], "hybridlm");
  EXPECT_EQ(m["architectures"], nlohmann::json({"HybridLMForCausalLM"}));
  EXPECT_EQ(m["num_hidden_layers"], 4);

  // Written as config.json and read back by the model's parser.
  const HybridConfig h = parse_config_text(m.dump(2), "config.json");
  EXPECT_EQ(h.family, "hybridlm");
  ASSERT_EQ(h.blocks.size(), 4u);
  EXPECT_EQ(h.blocks[0].mixer, MixerKind::Mamba2);
  EXPECT_EQ(h.blocks[1].mixer, MixerKind::Attention);
  EXPECT_EQ(h.blocks[2].mixer, MixerKind::Mamba1);
  EXPECT_EQ(h.d_model, 64);
  EXPECT_EQ(h.vocab_size, 512);
  EXPECT_TRUE(h.tie_embeddings);
  EXPECT_EQ(h.blocks[0].m2.n_groups, 2);
  EXPECT_EQ(h.blocks[0].m2.chunk_size, 32);
  EXPECT_EQ(h.blocks[1].attn.n_kv_heads, 2);
  EXPECT_EQ(h.blocks[1].attn.rope_dim, 8);
  EXPECT_EQ(h.blocks[1].ffn.mlp.d_ff, 128);
  EXPECT_FALSE(h.blocks[1].ffn.mlp.gated);
}

TEST(TrainConfig, ConfigJsonPastedAsFlowYamlGivesTheSameModel) {
  const TrainConfig a = parse_train_config(kMinimal, "/b");
  const TrainConfig b = parse_train_config(minimal_with(R"(model: {"block_pattern": ["t"], "num_hidden_layers": 1})"),
                                           "/b");
  EXPECT_EQ(a.model, b.model);
}

TEST(TrainConfig, DefaultsForEverythingButModelDataStepsOut) {
  const TrainConfig c = parse_train_config(kMinimal, "/b");
  EXPECT_TRUE(c.tokenizer.empty());
  EXPECT_EQ(c.data.train, "/b/d/train.bin");
  EXPECT_EQ(c.data.validation, "/b/d/val.bin");
  EXPECT_TRUE(c.data.validation_default);
  EXPECT_FALSE(c.model.contains("vocab_size"));  // the tokenizer's, by fill_vocab_size
  EXPECT_FLOAT_EQ(c.schedule.lr, 3e-4f);
  EXPECT_FLOAT_EQ(c.schedule.min_lr, 3e-5f);
  EXPECT_EQ(c.schedule.kind, "cosine");
  EXPECT_EQ(c.schedule.warmup, 20);  // min(100, steps / 10)
  EXPECT_FLOAT_EQ(c.adamw.beta1, 0.9f);
  EXPECT_FLOAT_EQ(c.adamw.beta2, 0.95f);
  EXPECT_FLOAT_EQ(c.adamw.weight_decay, 0.1f);
  EXPECT_DOUBLE_EQ(c.grad_clip, 1.0);
  EXPECT_EQ(c.batch.sequences, 8);
  EXPECT_EQ(c.batch.seq_len, 256);
  EXPECT_EQ(c.batch.accumulation, 1);
  EXPECT_EQ(c.eval_interval, 100);
  EXPECT_EQ(c.checkpoint_interval, 1000);
  EXPECT_EQ(c.keep_checkpoints, 0);
  EXPECT_EQ(c.seed, 1u);
  EXPECT_EQ(c.out, "/b/run");

  const TrainConfig none = parse_train_config(minimal_with("data: {train: d/train.bin, validation: null}"), "/b");
  EXPECT_TRUE(none.data.validation.empty());
  EXPECT_EQ(validation_file(none), std::nullopt);
}

TEST(TrainConfig, InitStartsFromACheckpoint) {
  const TrainConfig c = parse_train_config(minimal_with("model: {init: ../ckpt}"), "/b/x");
  EXPECT_EQ(c.init, "/b/ckpt");
  EXPECT_TRUE(c.model.empty());
  EXPECT_EQ(error_of(minimal_with("model: {init: ckpt, hidden_size: 64}")),
            "train.yaml: model.hidden_size: not allowed with model.init (the checkpoint's config.json is the model)");
}

TEST(TrainConfig, WrongTypesNameTheKeyPath) {
  EXPECT_EQ(error_of(minimal_with("optimizer: {lr: fast}")),
            "train.yaml: optimizer.lr: expected a number, got \"fast\"");
  EXPECT_EQ(error_of(minimal_with("steps: \"100\"")), "train.yaml: steps: expected an integer, got \"100\"");
  EXPECT_EQ(error_of(minimal_with("steps: 1.5")), "train.yaml: steps: expected an integer, got 1.5");
  EXPECT_EQ(error_of(minimal_with("batch: [1, 2]")), "train.yaml: batch: expected a mapping, got an array of 2");
  EXPECT_EQ(error_of(minimal_with("optimizer: {betas: 0.9}")),
            "train.yaml: optimizer.betas: expected [beta1, beta2], got 0.9");
  EXPECT_EQ(error_of(minimal_with("optimizer: {betas: [0.9, x]}")),
            "train.yaml: optimizer.betas[1]: expected a number, got \"x\"");
  EXPECT_EQ(error_of(minimal_with("out: 5")), "train.yaml: out: expected a path, got 5");
  EXPECT_EQ(error_of(minimal_with("schedule: {kind: 3}")), "train.yaml: schedule.kind: expected a string, got 3");
  // YAML 1.2: yes is a string, not a boolean.
  EXPECT_EQ(error_of(minimal_with("model: {block_pattern: [t], tie_word_embeddings: yes}")),
            "train.yaml: model.tie_word_embeddings: expected true or false, got \"yes\"");
  EXPECT_EQ(error_of(minimal_with("model: {block_pattern: [t], hidden_size: \"64\"}")),
            "train.yaml: model.hidden_size: expected an integer, got \"64\"");
  EXPECT_EQ(error_of(minimal_with("model: {block_pattern: t}")),
            "train.yaml: model.block_pattern: expected a list of strings, got \"t\"");
  EXPECT_EQ(error_of(minimal_with("model: {block_pattern: [t], ssm: {dt_rank: big}}")),
            "train.yaml: model.ssm.dt_rank: expected an integer or \"auto\", got \"big\"");
  EXPECT_EQ(error_of(minimal_with("model: 3")), "train.yaml: model: expected a mapping, got 3");
  // An integral float counts as an integer (1e3 steps).
  EXPECT_EQ(parse_train_config(minimal_with("steps: 1e3"), "/b").steps, 1000);
}

TEST(TrainConfig, OutOfRangeValues) {
  EXPECT_EQ(error_of(minimal_with("optimizer: {lr: 0}")),
            "train.yaml: optimizer.lr: must be a finite number > 0 (the peak learning rate), got 0");
  EXPECT_THAT(error_of(minimal_with("optimizer: {lr: -1e-3}")), HasSubstr("optimizer.lr: must be a finite number > 0"));
  EXPECT_THAT(error_of(minimal_with("optimizer: {lr: .inf}")), HasSubstr("optimizer.lr: must be a finite number"));
  EXPECT_THAT(error_of(minimal_with("keep_checkpoints: -2")), HasSubstr("keep_checkpoints: must be >= 0"));
  EXPECT_EQ(parse_train_config(minimal_with("keep_checkpoints: 3"), "/b").keep_checkpoints, 3);
  EXPECT_EQ(error_of(minimal_with("batch: {seq_len: 1}")),
            "train.yaml: batch.seq_len: must be in [2, 1048576] (tokens per sequence), got 1");
  EXPECT_EQ(error_of(minimal_with("steps: 0")), "train.yaml: steps: must be in [1, 1099511627776] (the number of "
                                                "optimizer steps), got 0");
  EXPECT_EQ(error_of(minimal_with("optimizer: {betas: [0.9, 1.0]}")),
            "train.yaml: optimizer.betas[1]: must be in [0, 1), got 1.0");
  EXPECT_EQ(error_of(minimal_with("optimizer: {betas: [-0.1, 0.9]}")),
            "train.yaml: optimizer.betas[0]: must be in [0, 1), got -0.1");
  EXPECT_THAT(error_of(minimal_with("optimizer: {eps: 0}")), HasSubstr("optimizer.eps: must be a finite number > 0"));
  EXPECT_THAT(error_of(minimal_with("optimizer: {weight_decay: -0.1}")),
              HasSubstr("optimizer.weight_decay: must be a finite number >= 0"));
  EXPECT_THAT(error_of(minimal_with("optimizer: {grad_clip: -1}")),
              HasSubstr("optimizer.grad_clip: must be a finite number >= 0"));
  EXPECT_EQ(error_of(minimal_with("schedule: {kind: linear}")),
            "train.yaml: schedule.kind: \"linear\": unknown schedule (use cosine or wsd)");
  EXPECT_THAT(error_of(minimal_with("schedule: {warmup_steps: 201}")),
              HasSubstr("train.yaml: schedule.warmup_steps: must be in [0, 200]"));
  EXPECT_THAT(error_of(minimal_with("schedule: {min_lr: 1e-3}")),
              HasSubstr("train.yaml: schedule.min_lr: must be at most optimizer.lr = 0.0003, got 0.001"));
  EXPECT_EQ(error_of(minimal_with("schedule: {decay_fraction: 0.1}")),
            "train.yaml: schedule.decay_fraction: only for kind: wsd");
  EXPECT_EQ(error_of(minimal_with("schedule: {kind: wsd, decay_fraction: 1.5}")),
            "train.yaml: schedule.decay_fraction: must be in [0, 1], got 1.5");
  EXPECT_THAT(error_of(minimal_with("batch: {sequences: 0}")), HasSubstr("batch.sequences: must be in [1, 65536]"));
  EXPECT_THAT(error_of(minimal_with("batch: {accumulation: 0}")), HasSubstr("batch.accumulation: must be in [1,"));
  EXPECT_THAT(error_of(minimal_with("log_interval: 0")), HasSubstr("log_interval: must be >= 1"));
  EXPECT_THAT(error_of(minimal_with("eval_interval: -1")), HasSubstr("eval_interval: must be >= 0"));
  EXPECT_THAT(error_of(minimal_with("threads: 5000")), HasSubstr("threads: must be in [0, 4096]"));
  EXPECT_THAT(error_of(minimal_with("seed: -1")), HasSubstr("seed: must be >= 0"));
  EXPECT_EQ(error_of(minimal_with("steps: 99999999999999999999")),
            "train.yaml: steps: integer 99999999999999999999 out of range");
}

TEST(TrainConfig, ModelErrors) {
  EXPECT_EQ(error_of(minimal_with("model: {block_pattern: [m2, x, t]}")),
            "train.yaml: model.block_pattern[1]: \"x\": unknown block kind (use m = Mamba-1, m2 = Mamba-2, m2d = "
            "discrete Mamba-2, t = attention)");
  EXPECT_EQ(error_of(minimal_with("model: {block_pattern: []}")),
            "train.yaml: model.block_pattern: empty (one entry per layer: m, m2, m2d or t)");
  EXPECT_THAT(error_of(minimal_with("model: {hidden_size: 64}")),
              HasSubstr("train.yaml: model.block_pattern: missing"));
  EXPECT_EQ(error_of(minimal_with("model: {block_pattern: [t], mlp: {intermediate_size: 8, activation: tanh}}")),
            "train.yaml: model.mlp.activation: \"tanh\": unknown activation (use silu, gelu or relu2)");
  EXPECT_THAT(error_of(minimal_with("model: {block_pattern: [t], model_type: mamba}")),
              HasSubstr("model.model_type: \"mamba\": the trainer writes hybridlm models only"));
  // The model parser's own checks, under the model key.
  EXPECT_THAT(error_of(minimal_with("model: {block_pattern: [m2], hidden_size: 64, ssm: {head_dim: 48}}")),
              HasSubstr("train.yaml: model: ssm: head_dim"));
  EXPECT_THAT(error_of(minimal_with("model: {block_pattern: [t], hidden_size: -64}")),
              HasSubstr("train.yaml: model: hidden_size"));
  EXPECT_THAT(error_of(minimal_with("model: {block_pattern: [t, t], num_hidden_layers: 3}")),
              HasSubstr("train.yaml: model: num_hidden_layers"));
}

TEST(TrainConfig, UnknownKeysSuggestTheNearestKnownOne) {
  EXPECT_EQ(error_of(minimal_with("stepz: 5")), "train.yaml: stepz: unknown key (did you mean 'steps'?)");
  EXPECT_EQ(error_of(minimal_with("optimizer: {lrr: 1}")),
            "train.yaml: optimizer.lrr: unknown key (did you mean 'lr'?)");
  EXPECT_EQ(error_of(minimal_with("lr: 1e-3")), "train.yaml: lr: unknown key (did you mean optimizer.lr?)");
  EXPECT_EQ(error_of(minimal_with("schedule: {warmup: 10}")),
            "train.yaml: schedule.warmup: unknown key (did you mean 'warmup_steps'?)");
  EXPECT_EQ(error_of(minimal_with("model: {block_pattern: [m], ssm: {d_stat: 8}}")),
            "train.yaml: model.ssm.d_stat: unknown key (did you mean 'd_state'?)");
  EXPECT_EQ(error_of(minimal_with("data: {train: a, valdiation: b}")),
            "train.yaml: data.valdiation: unknown key (did you mean 'validation'?)");
  EXPECT_EQ(error_of(minimal_with("colour: blue")), "train.yaml: colour: unknown key");
  // A quoted key with a newline still gives one line.
  EXPECT_EQ(error_of(minimal_with("\"bad\\nkey\": 1")), "train.yaml: bad key: unknown key");
}

TEST(TrainConfig, MissingRequiredKeys) {
  EXPECT_THAT(error_of("data: {train: a}\nsteps: 1\nout: o\n"), HasSubstr("train.yaml: model: missing"));
  EXPECT_THAT(error_of("model: {block_pattern: [t]}\nsteps: 1\nout: o\n"), HasSubstr("train.yaml: data: missing"));
  EXPECT_THAT(error_of("model: {block_pattern: [t]}\ndata: {}\nsteps: 1\nout: o\n"),
              HasSubstr("train.yaml: data.train: missing"));
  EXPECT_EQ(error_of("model: {block_pattern: [t]}\ndata: {train: a}\nout: o\n"),
            "train.yaml: steps: missing (the number of optimizer steps)");
  EXPECT_THAT(error_of("model: {block_pattern: [t]}\ndata: {train: a}\nsteps: 1\n"),
              HasSubstr("train.yaml: out: missing"));
}

TEST(TrainConfig, YamlProblems) {
  EXPECT_EQ(error_of("model: {block_pattern: [t]}\nsteps: [1, 2\nout: o\n"),
            "train.yaml: line 3, column 4: invalid YAML: end of sequence flow not found");
  EXPECT_THAT(error_of("model:\n  block_pattern: [t]\n   hidden: 3\n"), HasSubstr("train.yaml: line 3"));
  EXPECT_EQ(error_of(std::string(kMinimal) + "steps: 300\n"), "train.yaml: steps: duplicate key (line 5)");
  EXPECT_EQ(error_of(std::string(kMinimal) + "---\nsteps: 1\n"), "train.yaml: 2 YAML documents (---); expected one");
  EXPECT_EQ(error_of(""), "train.yaml: empty (expected a mapping with model, data, steps, out, ...)");
  EXPECT_EQ(error_of("# nothing\n"), "train.yaml: empty (expected a mapping with model, data, steps, out, ...)");
  EXPECT_EQ(error_of("- a\n- b\n"), "train.yaml: expected a mapping of settings at the top, got an array of 2");
  EXPECT_EQ(error_of(minimal_with("steps: !!float abc")),
            "train.yaml: steps: tag tag:yaml.org,2002:float does not apply to \"abc\"");
  // Nested aliases would expand to 10^6 values.
  std::string bomb = "a: &a [1, 1, 1, 1, 1, 1, 1, 1, 1, 1]\n";
  for (char c = 'b'; c <= 'f'; ++c) {
    bomb += std::string(1, c) + ": &" + c + " [";
    for (int i = 0; i < 10; ++i) bomb += std::string(i ? ", *" : "*") + static_cast<char>(c - 1);
    bomb += "]\n";
  }
  EXPECT_THAT(error_of(bomb), HasSubstr("more than 100000 values (aliases expanded)"));
}

TEST(TrainConfig, ScalarsAreTypedByTheYamlCoreSchema) {
  const TrainConfig c = parse_train_config(
      minimal_with("model: {block_pattern: [t], hidden_size: 0x40, rms_norm_eps: 1E-5, tie_word_embeddings: False, "
                   "bos_token_id: ~, eos_token_id: 0o7, attention: {rope_theta: +1e4, partial_rotary_factor: .5}}"),
      "/b");
  EXPECT_EQ(c.model["hidden_size"], 64);
  EXPECT_DOUBLE_EQ(c.model["rms_norm_eps"].get<double>(), 1e-5);
  EXPECT_EQ(c.model["tie_word_embeddings"], false);
  EXPECT_TRUE(c.model["bos_token_id"].is_null());
  EXPECT_EQ(c.model["eos_token_id"], 7);
  EXPECT_DOUBLE_EQ(c.model["attention"]["rope_theta"].get<double>(), 1e4);
  EXPECT_DOUBLE_EQ(c.model["attention"]["partial_rotary_factor"].get<double>(), 0.5);
  // Quoted or explicitly tagged: a string.
  EXPECT_EQ(error_of(minimal_with("steps: !!str 5")), "train.yaml: steps: expected an integer, got \"5\"");
}

class TrainConfigFiles : public ::testing::Test {
 protected:
  void SetUp() override { dir_ = testing::scratch_dir("train_config"); }
  void TearDown() override { fs::remove_all(dir_); }
  fs::path dir_;
};

TEST_F(TrainConfigFiles, LoadResolvesPathsAgainstTheFilesFolder) {
  fs::create_directories(dir_ / "conf");
  testing::write_file(dir_ / "conf/train.yaml", kMinimal);
  const TrainConfig c = load_train_config(dir_ / "conf/train.yaml");
  EXPECT_EQ(c.data.train, dir_ / "conf/d/train.bin");
  EXPECT_EQ(c.out, dir_ / "conf/run");
  EXPECT_EQ(c.source, (dir_ / "conf/train.yaml").string());

  testing::write_file(dir_ / "bad.yaml", "steps: [\n");
  try {
    load_train_config(dir_ / "bad.yaml");
    ADD_FAILURE() << "no error";
  } catch (const Error& e) {
    EXPECT_THAT(e.what(), HasSubstr((dir_ / "bad.yaml").string() + ": line 2"));
  }
  try {
    load_train_config(dir_ / "missing.yaml");
    ADD_FAILURE() << "no error";
  } catch (const Error& e) {
    EXPECT_EQ(std::string(e.what()), (dir_ / "missing.yaml").string() + ": no such file");
  }
}

TEST_F(TrainConfigFiles, TokenizerAndValidationResolution) {
  testing::write_file(dir_ / "tokenizer.json", "{}");
  testing::write_token_dir(dir_ / "d", {1, 2, 3}, {}, 2, 16, (dir_ / "tokenizer.json").string());
  TrainConfig c = parse_train_config(kMinimal, dir_);
  // Not given: the one the data was encoded with.
  EXPECT_EQ(tokenizer_file(c), dir_ / "tokenizer.json");
  // The default val.bin is empty: no evaluation.
  EXPECT_EQ(validation_file(c), std::nullopt);
  testing::write_token_dir(dir_ / "d", {1, 2, 3}, {4, 5}, 2, 16, (dir_ / "tokenizer.json").string());
  EXPECT_EQ(validation_file(c), dir_ / "d/val.bin");

  // A directory holding tokenizer.json, or the file.
  c = parse_train_config(minimal_with("tokenizer: ."), dir_);
  EXPECT_EQ(tokenizer_file(c), dir_ / "tokenizer.json");
  c = parse_train_config(minimal_with("tokenizer: nope"), dir_);
  try {
    tokenizer_file(c);
    ADD_FAILURE() << "no error";
  } catch (const Error& e) {
    EXPECT_EQ(std::string(e.what()), "train.yaml: tokenizer: no tokenizer.json at " + (dir_ / "nope").string());
  }

  // fill_vocab_size: the tokenizer's when absent; a given one must hold it.
  c = parse_train_config(kMinimal, dir_);
  fill_vocab_size(c, 300);
  EXPECT_EQ(c.model["vocab_size"], 300);
  c = parse_train_config(minimal_with("model: {block_pattern: [t], vocab_size: 256}"), dir_);
  fill_vocab_size(c, 256);
  EXPECT_EQ(c.model["vocab_size"], 256);
  try {
    fill_vocab_size(c, 300);
    ADD_FAILURE() << "no error";
  } catch (const Error& e) {
    EXPECT_EQ(std::string(e.what()),
              "train.yaml: model.vocab_size: 256 is smaller than the tokenizer's vocabulary of 300");
  }
}

}  // namespace
}  // namespace hybridlm
