// Checkpoint save/load for the training job (see checkpoint.h for the layout).
#include "checkpoint.h"

#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <sstream>

#include <nlohmann/json.hpp>

#include "kiln/autograd.h"
#include "kiln/cuda.h"
#include "kiln/io.h"

namespace fs = std::filesystem;

namespace kiln::train {

void write_file_atomic(const std::string& path, const std::string& contents) {
  const std::string tmp = path + ".tmp." + std::to_string(getpid());
  const int fd = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
  KILN_CHECK(fd >= 0, "checkpoint", "cannot create ", tmp);
  size_t done = 0;
  while (done < contents.size()) {
    const ssize_t n = ::write(fd, contents.data() + done, contents.size() - done);
    if (n <= 0) {
      ::close(fd);
      ::unlink(tmp.c_str());
      KILN_CHECK(false, "checkpoint", "write failed: ", tmp);
    }
    done += static_cast<size_t>(n);
  }
  const bool synced = ::fsync(fd) == 0;
  ::close(fd);
  KILN_CHECK(synced && std::rename(tmp.c_str(), path.c_str()) == 0, "checkpoint", "cannot replace ", path);
  const std::string dir = fs::path(path).parent_path().string();
  const int dfd = ::open(dir.empty() ? "." : dir.c_str(), O_RDONLY | O_DIRECTORY);
  if (dfd >= 0) {
    ::fsync(dfd);
    ::close(dfd);
  }
}

std::string save_checkpoint(const std::string& run_dir, const GPT& model, const optim::AdamW& opt,
                            const std::vector<std::string>& opt_names, const Tokenizer& tok,
                            const TrainState& state, int keep) {
  const fs::path root = fs::path(run_dir) / "checkpoints";
  char name[32];
  std::snprintf(name, sizeof(name), "step-%07lld", static_cast<long long>(state.step));
  const fs::path dir = root / name;
  fs::create_directories(dir);

  io::TensorDict weights;
  for (const auto& [pname, p] : model.named_parameters()) weights.insert(pname, p.detach().cpu());
  io::save((dir / "model.safetensors").string(), weights, {{"format", "kiln-gpt"}});
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
  io::save((dir / "optimizer.safetensors").string(), moments);
  io::TensorDict rng;
  nlohmann::json rng_json = {{"seed", state.seed}};
  for (const auto& [key, t] : state.rng) {
    const Tensor c = t.cpu().contiguous();
    rng.insert(key, c);
    rng_json[key] = {{"seed_bits", c.data_ptr<int64_t>()[0]}, {"offset", c.data_ptr<int64_t>()[1]}};
  }
  io::save((dir / "rng.safetensors").string(), rng);
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
  write_file_atomic((root / "latest").string(), std::string(name) + "\n");
  std::vector<fs::path> all;
  for (const auto& e : fs::directory_iterator(root))
    if (e.is_directory() && e.path().filename().string().rfind("step-", 0) == 0) all.push_back(e.path());
  std::sort(all.begin(), all.end());
  for (size_t i = 0; i + static_cast<size_t>(keep) < all.size(); ++i)
    if (all[i] != dir) fs::remove_all(all[i]);
  return dir.string();
}

std::string find_checkpoint(const std::string& path) {
  if (fs::exists(fs::path(path) / "state.json")) return path;
  const fs::path latest = fs::path(path) / "checkpoints" / "latest";
  std::ifstream f(latest);
  std::string name;
  if (!(f >> name)) return {};
  const fs::path dir = fs::path(path) / "checkpoints" / name;
  return fs::exists(dir / "state.json") ? dir.string() : std::string();
}

TrainState load_state(const std::string& ckpt_dir) {
  std::ifstream f(fs::path(ckpt_dir) / "state.json");
  KILN_CHECK(f.good(), "checkpoint", "no state.json in ", ckpt_dir);
  std::stringstream ss;
  ss << f.rdbuf();
  const nlohmann::json j = nlohmann::json::parse(ss.str(), nullptr, false);
  KILN_CHECK(!j.is_discarded(), "checkpoint", "state.json in ", ckpt_dir, " is not valid JSON");
  TrainState s;
  s.step = j.at("step").get<int64_t>();
  s.data_epoch = j.at("data").at("epoch").get<int64_t>();
  s.data_cursor = j.at("data").at("cursor").get<int64_t>();
  s.seed = j.at("rng").at("seed").get<uint64_t>();
  s.config_json = j.at("config").dump();
  s.first_eval_loss = j.value("first_eval_loss", 0.0);
  const fs::path rng = fs::path(ckpt_dir) / "rng.safetensors";
  if (fs::exists(rng)) {
    const io::Checkpoint ck = io::load(rng.string());
    for (const auto& name : ck.tensors.names()) s.rng.emplace_back(name, ck.tensors.at(name));
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
    } else {
      KILN_CHECK(key.rfind("cuda:", 0) == 0, "checkpoint", "unknown generator '", key, "' in rng.safetensors");
      cuda::set_rng_state(t, std::stoi(key.substr(5)));
    }
  }
}

void load_weights(const std::string& ckpt_dir, GPT& model, optim::AdamW* opt,
                  const std::vector<std::string>& opt_names) {
  const io::Checkpoint ck = io::load((fs::path(ckpt_dir) / "model.safetensors").string());
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
  const io::Checkpoint mo = io::load((fs::path(ckpt_dir) / "optimizer.safetensors").string());
  std::ifstream f(fs::path(ckpt_dir) / "state.json");
  std::stringstream ss;
  ss << f.rdbuf();
  const nlohmann::json j = nlohmann::json::parse(ss.str());
  const auto& steps = j.at("adam_steps");
  KILN_CHECK(steps.size() == opt_names.size(), "checkpoint", "optimizer state for ", steps.size(),
             " parameters, the optimizer has ", opt_names.size());
  std::vector<optim::AdamWState> state(opt_names.size());
  for (size_t i = 0; i < opt_names.size(); ++i) {
    state[i].step = steps[i].get<int64_t>();
    const std::string a = "exp_avg." + opt_names[i], b = "exp_avg_sq." + opt_names[i];
    if (mo.tensors.contains(a)) {
      state[i].exp_avg = mo.tensors.at(a);
      state[i].exp_avg_sq = mo.tensors.at(b);
    }
  }
  opt->load_state(state);
}

}  // namespace kiln::train
