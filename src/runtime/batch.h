// Generation over several sequences at once, on top of the engine's varlen steps: a
// transformers-style left-padded batch, batched generation, and beam search (which moves whole
// sequences between beams with HybridCache::reorder).
#pragma once

#include <functional>
#include <optional>
#include <span>
#include <vector>

#include "runtime/engine.h"

namespace hybridlm {

// The prompts of a transformers-style batch: ids (B, L) and attention_mask (B, L) with the pads
// on the left. Pads are dropped here, so they never reach a recurrent state or the KV cache.
// Error when a row's mask is not 0...0 1...1 (right padding or holes) or has no token at all.
std::vector<std::vector<int32_t>> strip_left_padding(const std::vector<std::vector<int32_t>>& ids,
                                                     const std::vector<std::vector<int>>& mask);

struct BatchGenerateOptions {
  int max_new_tokens = 32;
  SamplingParams sampling;  // sequence i samples with seed sampling.seed + i
  std::optional<int32_t> eos_id;  // a sequence stops after producing it
};

// Generates for every prompt together: one varlen step prefills all prompts, then each step
// decodes one token of every unfinished sequence. Returns the generated ids per prompt.
std::vector<std::vector<int32_t>> generate_batch(Engine& engine, const std::vector<std::vector<int32_t>>& prompts,
                                                 const BatchGenerateOptions& opt);

struct BeamOptions {
  int num_beams = 4;
  int max_new_tokens = 32;
  float length_penalty = 1.0f;  // score = logprob / generated_length^length_penalty
  std::optional<int32_t> eos_id;
  // Ids at or past this are never chosen (the embedding is padded past the tokenizer); 0 = vocab.
  int32_t decodable = 0;
};

struct BeamHypothesis {
  std::vector<int32_t> tokens;  // generated ids (ending with eos when it finished)
  double logprob = 0;           // sum of log-softmax of each generated token
  double score = 0;             // logprob / length^length_penalty
};

// Beam search (deterministic), transformers' rules with early_stopping=True: each step ranks
// every (beam, token) continuation; an eos candidate ranked within the first num_beams finishes a
// hypothesis, the best non-eos ones (up to num_beams) continue. Stops when num_beams hypotheses
// have finished or after max_new_tokens. Needs num_beams free sequences in the engine. Returns up
// to num_beams hypotheses, best score first; max_new_tokens 0 returns one empty hypothesis.
//
// on_settled, when given, receives the tokens of the best hypothesis in order, each as soon as it
// is certain: once every live beam and every finished hypothesis begins with it (the best one
// returned is always one of them or a descendant of a live beam), and the rest when the search
// ends. The eos that ends a hypothesis is not passed.
std::vector<BeamHypothesis> beam_search(Engine& engine, std::span<const int32_t> prompt, const BeamOptions& opt,
                                        const std::function<void(int32_t)>& on_settled = {});

}  // namespace hybridlm
