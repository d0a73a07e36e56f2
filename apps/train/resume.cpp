// Resume: the checkpoint to continue from, the run's saved settings, and finiteness checks.
#include "resume.h"

#include <cmath>
#include <filesystem>

#include <nlohmann/json.hpp>

#include "checkpoint.h"
#include "data.h"
#include "generate.h"
#include "kiln/autograd.h"
#include "kiln/ops.h"

namespace fs = std::filesystem;

namespace kiln::train {
namespace {

enum class Kind { Int, UInt, Real, Text, Flag };

// One saved setting: its key in config.json's "train", its flag, and how to read and write it.
struct Setting {
  const char* key;
  const char* flag;  // "" where the command line has none
  Kind kind;
  nlohmann::json (*get)(const TrainConfig&);
  void (*set)(TrainConfig&, const nlohmann::json&);
};

#define KILN_SETTING(key, flag, kind, field)                                              \
  Setting {                                                                                \
    key, flag, kind, [](const TrainConfig& c) { return nlohmann::json(c.field); },         \
        [](TrainConfig& c, const nlohmann::json& v) { v.get_to(c.field); }                 \
  }

const Setting kSettings[] = {
    KILN_SETTING("preset", "--preset", Kind::Text, preset),
    KILN_SETTING("steps", "--steps", Kind::Int, steps),
    KILN_SETTING("batch_size", "--batch-size", Kind::Int, batch_size),
    KILN_SETTING("grad_accum", "--grad-accum", Kind::Int, grad_accum),
    KILN_SETTING("lr", "--lr", Kind::Real, lr),
    KILN_SETTING("min_lr", "--min-lr", Kind::Real, min_lr),
    KILN_SETTING("warmup_steps", "--warmup-steps", Kind::Int, warmup_steps),
    KILN_SETTING("weight_decay", "--weight-decay", Kind::Real, weight_decay),
    KILN_SETTING("beta2", "", Kind::Real, beta2),
    KILN_SETTING("grad_clip", "--grad-clip", Kind::Real, grad_clip),
    KILN_SETTING("seed", "--seed", Kind::UInt, seed),
    KILN_SETTING("max_data_bytes", "--max-data-bytes", Kind::Int, max_data_bytes),
    KILN_SETTING("synthetic", "--synthetic", Kind::Flag, synthetic),
    KILN_SETTING("synthetic_doc_len", "--synthetic-doc-len", Kind::Int, synthetic_doc_len),
    Setting{"data", "--data", Kind::Text, [](const TrainConfig& c) { return nlohmann::json(resolved_data_path(c)); },
            [](TrainConfig& c, const nlohmann::json& v) {
              if (v != "synthetic") c.data = v.get<std::string>();
            }},
};
#undef KILN_SETTING

bool has_kind(const nlohmann::json& v, Kind k) {
  switch (k) {
    case Kind::Int: return v.is_number_integer() && (v.is_number_unsigned() || v.get<int64_t>() >= 0);
    case Kind::UInt: return v.is_number_unsigned() || (v.is_number_integer() && v.get<int64_t>() >= 0);
    case Kind::Real: return v.is_number();
    case Kind::Text: return v.is_string();
    case Kind::Flag: return v.is_boolean();
  }
  return false;
}

bool given(const TrainConfig& cfg, const char* flag) { return !cfg.given || (*flag != '\0' && cfg.given->count(flag) != 0); }

std::string flag_or_key(const char* flag, const char* key) { return *flag != '\0' ? flag : std::string("setting ") + key; }

}  // namespace

std::string resolved_data_path(const TrainConfig& cfg) {
  return cfg.synthetic ? std::string("synthetic") : cfg.data.empty() ? default_corpus_path() : cfg.data;
}

std::string resume_checkpoint(const TrainConfig& cfg) {
  if (!cfg.resume) return {};
  const std::string ck = find_checkpoint(cfg.run_dir);
  if (!ck.empty() || cfg.resume_auto) return ck;
  KILN_FAIL("train", "--resume: ", cfg.run_dir, " has no checkpoint to continue from (",
            (fs::path(cfg.run_dir) / "checkpoints" / "latest").string(),
            " does not exist); pass --resume=auto to start a fresh run when there is none");
}

ModelConfig apply_saved_settings(const std::string& saved_config_json, TrainConfig& cfg, std::vector<std::string>& notes) {
  const nlohmann::json saved = nlohmann::json::parse(saved_config_json);  // checked by load_state
  const nlohmann::json& train = saved.at("train");
  for (const Setting& s : kSettings) {
    if (!train.contains(s.key)) continue;  // written before this setting was saved
    const nlohmann::json& v = train.at(s.key);
    KILN_CHECK(has_kind(v, s.kind), "train", "--resume: the saved setting \"", s.key, "\" = ", v.dump(),
               " has the wrong type");
    const nlohmann::json mine = s.get(cfg);
    if (!given(cfg, s.flag)) {
      s.set(cfg, v);
      continue;
    }
    if (mine == v) continue;
    KILN_CHECK(cfg.override_saved, "train", "--resume: ", flag_or_key(s.flag, s.key), " ", mine.dump(),
               " contradicts the run's saved ", s.key, " = ", v.dump(),
               " (config.json); drop the flag to continue as saved, or add --override to change it");
    notes.push_back(flag_or_key(s.flag, s.key) + " " + mine.dump() + " replaces the saved " + v.dump());
  }
  ModelConfig mc = model_from_json(saved_config_json);
  mc.mask_block = cfg.mask_block;
  if (cfg.given) {
    const ModelConfig want = resolve_model(cfg);
    struct Field {
      const char* flag;
      double mine, theirs;
    };
    const Field fields[] = {{"--dim", static_cast<double>(want.dim), static_cast<double>(mc.dim)},
                            {"--layers", static_cast<double>(want.n_layers), static_cast<double>(mc.n_layers)},
                            {"--heads", static_cast<double>(want.n_heads), static_cast<double>(mc.n_heads)},
                            {"--seq-len", static_cast<double>(want.seq_len), static_cast<double>(mc.seq_len)},
                            {"--sliding-window", static_cast<double>(want.sliding_window),
                             static_cast<double>(mc.sliding_window)},
                            {"--dropout", want.dropout, mc.dropout},
                            // BPE may learn fewer merges than asked for: only a smaller request contradicts.
                            {"--vocab-size", static_cast<double>(want.vocab_size),
                             cfg.synthetic || want.vocab_size < mc.vocab_size ? static_cast<double>(mc.vocab_size)
                                                                              : static_cast<double>(want.vocab_size)}};
    for (const Field& f : fields) {
      KILN_CHECK(cfg.given->count(f.flag) == 0 || f.mine == f.theirs, "train", "--resume: ", f.flag, " ", f.mine,
                 " contradicts the checkpoint's model (", f.theirs, "); a resumed run keeps its model");
    }
  }
  return mc;
}

std::string first_nonfinite_parameter(const std::vector<std::pair<std::string, Tensor>>& params) {
  if (params.empty()) return {};
  NoGradGuard ng;
  Tensor probe;
  for (const auto& [name, p] : params) {
    const Tensor z = sum(p.detach() * 0.0);  // 0 when finite, NaN otherwise
    probe = probe.defined() ? probe + z : z;
  }
  if (std::isfinite(probe.item())) return {};
  constexpr int64_t kChunk = int64_t{1} << 20;  // host reads of the guilty parameter, in pieces
  for (const auto& [name, p] : params) {
    if (std::isfinite(sum(p.detach() * 0.0).item())) continue;
    const Tensor flat = p.detach().reshape({-1});
    for (int64_t i = 0; i < flat.numel(); i += kChunk) {
      const std::vector<double> v = flat.slice(0, i, std::min(flat.numel(), i + kChunk)).to_vector();
      for (size_t k = 0; k < v.size(); ++k)
        if (!std::isfinite(v[k]))
          return "parameter " + name + " holds " + std::to_string(v[k]) + " (element " + std::to_string(i + static_cast<int64_t>(k)) + ")";
    }
  }
  return "a parameter holds a non-finite value";
}

}  // namespace kiln::train
