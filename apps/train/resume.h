#pragma once
// Resuming a run: which checkpoint (never a silent fresh start), the run's saved settings applied
// to the request (a contradicting setting is an error unless overridden), and the finiteness
// checks that keep a diverged run from writing a checkpoint.
#include <string>
#include <utility>
#include <vector>

#include "model.h"
#include "train.h"

namespace kiln::train {

// The checkpoint folder cfg.resume continues from; empty for a fresh run (resume off, or
// --resume=auto on a run folder without checkpoints/latest). Errors name the file and the problem.
std::string resume_checkpoint(const TrainConfig& cfg);

// Applies a checkpoint's saved configuration (state.config_json) to `cfg` and returns the saved
// model (mask_block from cfg). Settings the user gave that differ from the saved ones are an error
// naming flag and both values, unless cfg.override_saved (then the given value stays, and `notes`
// says so); settings not given take the saved value. Model fields can never change.
ModelConfig apply_saved_settings(const std::string& saved_config_json, TrainConfig& cfg, std::vector<std::string>& notes);

// Data path as config.json records it ("synthetic", the default corpus, or --data).
std::string resolved_data_path(const TrainConfig& cfg);

// The first non-finite value among `params`, as "parameter NAME holds VALUE (element I)"; empty
// when all are finite. One device reduction (x * 0 summed) and one host read when all are finite.
std::string first_nonfinite_parameter(const std::vector<std::pair<std::string, Tensor>>& params);

}  // namespace kiln::train
