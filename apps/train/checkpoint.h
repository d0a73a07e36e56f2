#pragma once
// Training checkpoints: <run>/checkpoints/step-NNNNNN/{model.safetensors, optimizer.safetensors,
// rng.safetensors, tokenizer.json, state.json}, then <run>/checkpoints/latest, a symbolic link to that
// folder (so <run>/checkpoints/latest/model.safetensors opens), is replaced atomically. A crash at
// any moment leaves `latest` naming a complete checkpoint. Runs written when `latest` was a one-line
// file naming the folder still load.
#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "kiln/optim.h"
#include "model.h"
#include "tokenizer.h"

namespace kiln::train {

struct TrainState {
  int64_t step = 0;              // optimizer steps done
  int64_t data_epoch = 0, data_cursor = 0;
  uint64_t seed = 0;
  std::string config_json;       // the resolved model + training configuration
  double first_eval_loss = 0;    // the held-out loss at step 0 (for the halving check)
  std::vector<int64_t> adam_steps;  // per parameter, in the optimizer's order
  // Generator states (get_rng_state / cuda::get_rng_state): "cpu", "cuda:N". Restored on resume so
  // random ops after it (dropout) replay; empty in checkpoints written before they were saved.
  std::vector<std::pair<std::string, Tensor>> rng;
};

// The generator states a run on `device` depends on, and their restoration.
std::vector<std::pair<std::string, Tensor>> capture_rng(Device device);
void restore_rng(const std::vector<std::pair<std::string, Tensor>>& rng);

// Writes a file atomically (temporary + fsync + rename + fsync of the folder; stale temporaries
// of the same file removed).
void write_file_atomic(const std::string& path, const std::string& contents);

// Tensors are written from the CPU (device tensors are copied), with a CRC-32 per tensor in the
// files' metadata that loading checks. opt_names: the parameter names in the optimizer's flat order
// (its groups in order). Saves and returns the checkpoint folder; keeps the newest `keep` folders.
// tensor_files false: no model / optimizer files (a sharded run's ranks wrote them into shards/).
std::string save_checkpoint(const std::string& run_dir, const GPT& model, const optim::AdamW& opt,
                            const std::vector<std::string>& opt_names, const Tokenizer& tok,
                            const TrainState& state, int keep = 2, bool tensor_files = true);

// `path` itself when it holds state.json (a checkpoint folder), the folder of a file inside one
// (e.g. its model.safetensors), else the folder <path>/checkpoints/latest (or <path>/latest) names;
// empty only when there is no `latest` at all. A `latest` that is empty, garbage, names anything but a
// step-NNNNNNN folder beside it (no paths: a run reads only its own folder) or a folder without
// state.json is an error naming the file and the problem, never "no checkpoint".
std::string find_checkpoint(const std::string& path);
// Reads and checks state.json (every field's presence, type and range: see checkpoint.cpp) and
// rng.safetensors; errors name the file and the field.
TrainState load_state(const std::string& ckpt_dir);
// The model file `kiln inspect` and `kiln convert` read for `path`: a file itself; for a run or
// checkpoint folder (anything find_checkpoint takes), its checkpoint's model.safetensors.
std::string model_file(const std::string& path);
// The parsed state's `config` object as the given text (state.config_json) with its schema checked:
// {"model": {...}, "train": {...}}.
void check_config_json(const std::string& config_json, const std::string& where);
// Loads weights (and the optimizer state when `opt` is non-null) into already-built objects.
void load_weights(const std::string& ckpt_dir, GPT& model, optim::AdamW* opt,
                  const std::vector<std::string>& opt_names = {});

}  // namespace kiln::train
