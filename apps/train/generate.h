#pragma once
// Sampling text from the GPT (no KV cache: the tiny models recompute the window each token).
#include <cstdint>
#include <string>

#include "model.h"
#include "tokenizer.h"

namespace kiln::train {

struct SampleOptions {
  int64_t max_tokens = 200;
  double temperature = 0.8;  // 0: greedy
  int64_t top_k = 40;        // 0: the whole vocabulary
  uint64_t seed = 0;
};

// prompt + continuation (stops early at <|endoftext|>).
std::string generate(GPT& model, const Tokenizer& tok, const std::string& prompt, const SampleOptions& options);

// The model configuration stored in a checkpoint's config ({"model": {...}} or the bare object).
ModelConfig model_from_json(const std::string& json);

}  // namespace kiln::train
