// Checkpoint save/load for the training job (see checkpoint.h for the layout).
#include "checkpoint.h"

#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <optional>

#include <fcntl.h>
#include <unistd.h>

#include <nlohmann/json.hpp>

#include "kiln/autograd.h"
#include "kiln/cuda.h"
#include "kiln/io.h"

namespace fs = std::filesystem;

namespace kiln::train {

void write_file_atomic(const std::string& path, const std::string& contents) {
  io::write_file_atomic(path, contents.data(), contents.size());
}

namespace {

constexpr size_t kMaxStateBytes = size_t{64} << 20;

// Replaces <root>/latest by a relative symbolic link to `name`: made under a temporary name, renamed
// over the old one (atomic), the folder synced. A killed save's temporary link is removed here, as
// are the .latest.tmp.* files of saves from when `latest` was a text file (one writer per run).
void point_latest(const fs::path& root, const std::string& name) {
  const std::string prefix = ".latest.link.";
  for (const auto& e : fs::directory_iterator(root)) {
    const std::string f = e.path().filename().string();
    if (f.rfind(prefix, 0) == 0 || f.rfind(".latest.tmp.", 0) == 0) fs::remove(e.path());
  }
  const fs::path tmp = root / (prefix + name);
  fs::create_directory_symlink(name, tmp);
  fs::rename(tmp, root / "latest");
  const int dfd = ::open(root.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (dfd >= 0) {
    fsync(dfd);
    close(dfd);
  }
}

// How a JSON value reads in an error: `a string "10"`, `null`, `a number 1.5`, ...
std::string found(const nlohmann::json& v) {
  std::string text = v.dump();
  if (text.size() > 40) text = text.substr(0, 37) + "...";
  if (v.is_string()) return "a string " + text;
  if (v.is_number()) return "the number " + text;
  if (v.is_object()) return "an object";
  if (v.is_array()) return "an array";
  return text;  // null, true, false
}

// A field of a checked JSON object; errors name the file and the field's path ("data.epoch").
class Fields {
 public:
  Fields(const nlohmann::json& j, std::string file, std::string prefix = "")
      : j_(j), file_(std::move(file)), prefix_(std::move(prefix)) {
    if (j_.is_object()) return;
    std::string what = "the file";
    if (!prefix_.empty()) {
      what = prefix_;
      what.back() = '"';  // "config.model." -> "config.model"
      what.insert(what.begin(), '"');
    }
    KILN_FAIL("checkpoint", file_, ": ", what, " must be a JSON object, found ", found(j_));
  }
  const nlohmann::json& at(const char* key) const {
    KILN_CHECK(j_.contains(key), "checkpoint", file_, ": missing ", quoted(key));
    return j_.at(key);
  }
  bool has(const char* key) const { return j_.contains(key); }
  int64_t count(const char* key, int64_t max = INT64_MAX) const { return count_value(at(key), key, max); }
  int64_t count_value(const nlohmann::json& v, const std::string& key, int64_t max = INT64_MAX) const {
    KILN_CHECK(v.is_number_integer() && (v.is_number_unsigned() || v.get<int64_t>() >= 0), "checkpoint", file_, ": ",
               quoted(key), " must be a non-negative integer, found ", found(v));
    KILN_CHECK(!v.is_number_unsigned() || v.get<uint64_t>() <= static_cast<uint64_t>(max), "checkpoint", file_, ": ",
               quoted(key), " = ", v.dump(), " is out of range (at most ", max, ")");
    return v.get<int64_t>();
  }
  double number(const char* key) const {
    const nlohmann::json& v = at(key);
    KILN_CHECK(v.is_number(), "checkpoint", file_, ": ", quoted(key), " must be a number, found ", found(v));
    return v.get<double>();
  }
  std::string string(const char* key) const {
    const nlohmann::json& v = at(key);
    KILN_CHECK(v.is_string(), "checkpoint", file_, ": ", quoted(key), " must be a string, found ", found(v));
    return v.get<std::string>();
  }
  Fields object(const char* key) const { return Fields(at(key), file_, prefix_ + key + "."); }
  std::string quoted(const std::string& key) const { return "\"" + prefix_ + key + "\""; }
  const nlohmann::json& json() const { return j_; }

 private:
  const nlohmann::json& j_;
  std::string file_, prefix_;
};

// "cuda:N" -> N; anything else (cuda:x, cuda:, cuda:-1, cuda:99999999999) -> nullopt.
std::optional<int> cuda_index(const std::string& key) {
  if (key.rfind("cuda:", 0) != 0 || key.size() == 5 || key.size() > 5 + 6) return std::nullopt;
  int n = 0;
  for (size_t i = 5; i < key.size(); ++i) {
    if (key[i] < '0' || key[i] > '9') return std::nullopt;
    n = n * 10 + (key[i] - '0');
  }
  return n;
}

// A checkpoint file loaded with its checksums verified; errors name the file.
io::Checkpoint load_file(const std::string& path) {
  try {
    return io::load(path);
  } catch (const Error& e) {
    KILN_FAIL("checkpoint", path, ": ", e.what());
  }
}

nlohmann::json parse_json_file(const std::string& path) {
  const std::string text = io::read_small_file(path, kMaxStateBytes);
  nlohmann::json j = nlohmann::json::parse(text, nullptr, false);
  KILN_CHECK(!j.is_discarded(), "checkpoint", path, " is not valid JSON");
  return j;
}

}  // namespace

void check_config_json(const std::string& config_json, const std::string& where) {
  const nlohmann::json j = nlohmann::json::parse(config_json, nullptr, false);
  KILN_CHECK(!j.is_discarded(), "checkpoint", where, ": the configuration is not valid JSON");
  const Fields config(j, where, "config.");
  const Fields m = config.object("model");
  for (const char* k : {"vocab_size", "dim", "n_layers", "n_heads", "mlp_hidden", "seq_len"})
    KILN_CHECK(m.count(k, int64_t{1} << 32) > 0, "checkpoint", where, ": ", m.quoted(k), " must be positive");
  m.count("sliding_window");
  for (const char* k : {"rope_theta", "norm_eps"}) m.number(k);
  if (m.has("dropout")) m.number("dropout");
  config.object("train");
}

std::string save_checkpoint(const std::string& run_dir, const GPT& model, const optim::AdamW& opt,
                            const std::vector<std::string>& opt_names, const Tokenizer& tok,
                            const TrainState& state, int keep, bool tensor_files) {
  const fs::path root = fs::path(run_dir) / "checkpoints";
  char name[32];
  std::snprintf(name, sizeof(name), "step-%07lld", static_cast<long long>(state.step));
  const fs::path dir = root / name;
  fs::create_directories(dir);

  if (tensor_files) {
    io::TensorDict weights;
    for (const auto& [pname, p] : model.named_parameters()) weights.insert(pname, p.detach().cpu());
    io::save((dir / "model.safetensors").string(), weights, {{"format", "kiln-gpt"}}, /*checksums=*/true);
  }
  io::TensorDict moments;
  nlohmann::json adam_steps = nlohmann::json::array();
  const auto& st = opt.state();
  KILN_CHECK(st.size() == opt_names.size(), "checkpoint", "optimizer holds ", st.size(), " states for ",
             opt_names.size(), " names");
  for (size_t i = 0; i < st.size(); ++i) {
    adam_steps.push_back(st[i].step);
    if (st[i].exp_avg.defined()) {
      moments.insert("exp_avg." + opt_names[i], st[i].exp_avg.cpu());
      moments.insert("exp_avg_sq." + opt_names[i], st[i].exp_avg_sq.cpu());
    }
  }
  if (tensor_files) io::save((dir / "optimizer.safetensors").string(), moments, {}, /*checksums=*/true);
  io::TensorDict rng;
  nlohmann::json rng_json = {{"seed", state.seed}};
  for (const auto& [key, t] : state.rng) {
    const Tensor c = t.cpu().contiguous();
    rng.insert(key, c);
    rng_json[key] = {{"seed_bits", c.data_ptr<int64_t>()[0]}, {"offset", c.data_ptr<int64_t>()[1]}};
  }
  io::save((dir / "rng.safetensors").string(), rng, {}, /*checksums=*/true);
  write_file_atomic((dir / "tokenizer.json").string(), tok.to_json());

  nlohmann::json j;
  j["step"] = state.step;
  j["data"] = {{"epoch", state.data_epoch}, {"cursor", state.data_cursor}};
  j["rng"] = rng_json;  // informative; rng.safetensors holds the exact states
  j["config"] = nlohmann::json::parse(state.config_json);
  j["adam_steps"] = adam_steps;
  j["first_eval_loss"] = state.first_eval_loss;
  write_file_atomic((dir / "state.json").string(), j.dump(2));
  // The folder is complete: point `latest` at it, then drop the oldest.
  point_latest(root, name);
  std::vector<fs::path> all;
  for (const auto& e : fs::directory_iterator(root))
    if (e.is_directory() && e.path().filename().string().rfind("step-", 0) == 0) all.push_back(e.path());
  std::sort(all.begin(), all.end());
  for (size_t i = 0; i + static_cast<size_t>(keep) < all.size(); ++i)
    if (all[i] != dir) fs::remove_all(all[i]);
  return dir.string();
}

std::string find_checkpoint(const std::string& path) {
  std::error_code ec;
  if (fs::exists(fs::path(path) / "state.json")) return path;
  const fs::path parent = fs::path(path).parent_path();
  if (fs::is_regular_file(path, ec) && fs::exists(parent / "state.json", ec)) return parent.empty() ? "." : parent.string();
  // A run folder, or its checkpoints/ folder.
  const fs::path root = fs::exists(fs::symlink_status(fs::path(path) / "latest", ec)) ? fs::path(path)
                                                                                       : fs::path(path) / "checkpoints";
  const fs::path latest = root / "latest";
  if (!fs::exists(fs::symlink_status(latest, ec))) return {};
  std::string name = fs::is_symlink(fs::symlink_status(latest, ec)) ? fs::read_symlink(latest, ec).string()
                                                                     : io::read_small_file(latest.string(), 4096);
  while (!name.empty() && (name.back() == '\n' || name.back() == '\r' || name.back() == ' ')) name.pop_back();
  KILN_CHECK(!name.empty(), "checkpoint", latest.string(), " is empty: it should name a step-NNNNNNN folder");
  const bool step_name = name.size() > 5 && name.rfind("step-", 0) == 0 &&
                         name.find_first_not_of("0123456789", 5) == std::string::npos;
  if (!step_name) {
    std::string shown;  // printable, short
    for (const char ch : name.substr(0, 64)) {
      char esc[8];
      std::snprintf(esc, sizeof(esc), "\\x%02x", static_cast<unsigned char>(ch));
      shown += ch >= 0x20 && ch < 0x7f ? std::string(1, ch) : std::string(esc);
    }
    KILN_FAIL("checkpoint", latest.string(), " names '", shown, name.size() > 64 ? "...'" : "'",
              ", not a step-NNNNNNN folder of this run (a run reads checkpoints only from its own folder)");
  }
  const fs::path dir = root / name;
  KILN_CHECK(fs::is_directory(fs::symlink_status(dir, ec)), "checkpoint", latest.string(), " names ", name,
             ", but ", dir.string(), " is missing (or not a folder)");
  KILN_CHECK(fs::exists(dir / "state.json"), "checkpoint", latest.string(), " names ", name, ", but ",
             (dir / "state.json").string(), " is missing: the checkpoint is incomplete");
  return dir.string();
}

std::string model_file(const std::string& path) {
  std::error_code ec;
  if (!fs::is_directory(path, ec)) return path;
  const std::string dir = find_checkpoint(path);
  KILN_CHECK(!dir.empty(), "checkpoint", path, " is a folder with no checkpoint (give a model file, a checkpoint "
             "folder holding state.json, or a run folder with checkpoints/latest)");
  return (fs::path(dir) / "model.safetensors").string();
}

TrainState load_state(const std::string& ckpt_dir) {
  const std::string file = (fs::path(ckpt_dir) / "state.json").string();
  const nlohmann::json j = parse_json_file(file);
  const Fields f(j, file);
  TrainState s;
  s.step = f.count("step");
  // A step-NNNNNNN folder records its own step: the two must agree.
  const std::string folder = fs::path(ckpt_dir).filename().string();
  if (folder.rfind("step-", 0) == 0 && folder.size() > 5 && folder.find_first_not_of("0123456789", 5) == std::string::npos &&
      folder.size() < 5 + 19) {
    const int64_t named = std::stoll(folder.substr(5));
    KILN_CHECK(named == s.step, "checkpoint", file, ": \"step\" = ", s.step, " but the folder is ", folder);
  }
  const Fields data = f.object("data");
  s.data_epoch = data.count("epoch");
  s.data_cursor = data.count("cursor");
  const Fields rng = f.object("rng");
  const nlohmann::json& seed = rng.at("seed");
  KILN_CHECK(seed.is_number_unsigned() || (seed.is_number_integer() && seed.get<int64_t>() >= 0), "checkpoint", file,
             ": \"rng.seed\" must be a non-negative integer, found ", found(seed));
  s.seed = seed.get<uint64_t>();
  for (const auto& [key, value] : rng.json().items()) {
    KILN_CHECK(key == "seed" || key == "cpu" || cuda_index(key), "checkpoint", file, ": \"rng\" has a generator '",
               key, "': only cpu and cuda:N exist");
  }
  s.config_json = f.at("config").dump();
  check_config_json(s.config_json, file);
  const nlohmann::json& steps = f.at("adam_steps");
  KILN_CHECK(steps.is_array(), "checkpoint", file, ": \"adam_steps\" must be an array, found ", found(steps));
  for (size_t i = 0; i < steps.size(); ++i)
    s.adam_steps.push_back(f.count_value(steps[i], "adam_steps[" + std::to_string(i) + "]", s.step));
  if (f.has("first_eval_loss") && !f.at("first_eval_loss").is_null()) s.first_eval_loss = f.number("first_eval_loss");
  const fs::path rng_file = fs::path(ckpt_dir) / "rng.safetensors";
  if (fs::exists(rng_file)) {
    const io::Checkpoint ck = load_file(rng_file.string());
    for (const auto& e : ck.tensors) {
      KILN_CHECK(e.name == "cpu" || cuda_index(e.name), "checkpoint", rng_file.string(), ": generator '", e.name,
                 "' is not cpu or cuda:N");
      KILN_CHECK(e.tensor.dtype() == kInt64 && e.tensor.sizes() == Shape{2}, "checkpoint", rng_file.string(),
                 ": generator '", e.name, "' must be int64 [2] {seed, offset}, found ", dtype_name(e.tensor.dtype()), " ",
                 shape_str(e.tensor.sizes()));
      s.rng.emplace_back(e.name, e.tensor);
    }
  }
  return s;
}

std::vector<std::pair<std::string, Tensor>> capture_rng(Device device) {
  std::vector<std::pair<std::string, Tensor>> r{{"cpu", get_rng_state()}};
  if (device.is_cuda()) r.emplace_back("cuda:" + std::to_string(device.index), cuda::get_rng_state(device.index));
  return r;
}

void restore_rng(const std::vector<std::pair<std::string, Tensor>>& rng) {
  for (const auto& [key, t] : rng) {
    if (key == "cpu") {
      set_rng_state(t);
      continue;
    }
    const std::optional<int> index = cuda_index(key);
    KILN_CHECK(index.has_value(), "checkpoint", "unknown generator '", key, "' in rng.safetensors");
    cuda::set_rng_state(t, *index);
  }
}

void load_weights(const std::string& ckpt_dir, GPT& model, optim::AdamW* opt,
                  const std::vector<std::string>& opt_names) {
  const io::Checkpoint ck = load_file((fs::path(ckpt_dir) / "model.safetensors").string());
  const auto named = model.named_parameters();
  {
    NoGradGuard ng;
    for (const auto& [name, p] : named) {
      KILN_CHECK(ck.tensors.contains(name), "checkpoint", "model.safetensors has no tensor ", name);
      const Tensor& src = ck.tensors.at(name);
      KILN_CHECK(src.sizes() == p.sizes(), "checkpoint", name, " is ", shape_str(src.sizes()), " in the file but ",
                 shape_str(p.sizes()), " in the model");
      Tensor dst = p;
      dst.copy_(src);
    }
  }
  if (!opt) return;
  const io::Checkpoint mo = load_file((fs::path(ckpt_dir) / "optimizer.safetensors").string());
  const std::vector<int64_t> steps = load_state(ckpt_dir).adam_steps;
  KILN_CHECK(steps.size() == opt_names.size(), "checkpoint", "optimizer state for ", steps.size(),
             " parameters, the optimizer has ", opt_names.size());
  std::vector<optim::AdamWState> state(opt_names.size());
  for (size_t i = 0; i < opt_names.size(); ++i) {
    state[i].step = steps[i];
    const std::string a = "exp_avg." + opt_names[i], b = "exp_avg_sq." + opt_names[i];
    KILN_CHECK(mo.tensors.contains(a) == mo.tensors.contains(b), "checkpoint",
               "optimizer.safetensors holds only one of ", a, " and ", b);
    if (mo.tensors.contains(a)) {
      state[i].exp_avg = mo.tensors.at(a);
      state[i].exp_avg_sq = mo.tensors.at(b);
    }
  }
  opt->load_state(state);
}

}  // namespace kiln::train
