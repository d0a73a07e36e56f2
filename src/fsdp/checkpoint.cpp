// Sharded checkpoints: one safetensors file per rank with its real rows of each tensor, and an
// index (written last, by rank 0) with the world size and every tensor's whole shape. Loading maps
// the rows a rank needs at its world size onto the writers' files, so any world size (or none:
// load_sharded_full) can read it.
#include <algorithm>
#include <filesystem>
#include <map>
#include <nlohmann/json.hpp>

#include "fsdp/fsdp_state.h"
#include "kiln/autograd.h"

namespace kiln::dist {

namespace {

namespace fs = std::filesystem;
using json = nlohmann::json;
constexpr const char* kIndex = "index.json";

std::string shard_file(int rank, int world) {
  return "shard-" + std::to_string(rank) + "-of-" + std::to_string(world) + ".safetensors";
}

int64_t rows_of(const Shape& s) { return s.empty() ? 1 : s[0]; }
int64_t per_rank(const Shape& s, int world) { return (rows_of(s) + world - 1) / world; }
int64_t valid_rows(const Shape& s, int world, int r) {
  return std::clamp<int64_t>(rows_of(s) - r * per_rank(s, world), 0, per_rank(s, world));
}

struct Index {
  int world = 0;
  std::map<std::string, Shape> shapes;
  io::Metadata metadata;
};

Index read_index(const std::string& dir, const char* op) {
  const fs::path path = fs::path(dir) / kIndex;
  KILN_CHECK(fs::exists(path), op, "no ", kIndex, " in ", dir, " (not a sharded checkpoint, or its save did not finish)");
  const std::string text = io::read_small_file(path.string(), 64u << 20);
  json j;
  try {
    j = json::parse(text);
  } catch (const json::exception& e) {
    KILN_FAIL(op, path.string(), " is not valid JSON: ", e.what());
  }
  KILN_CHECK(j.value("format", "") == "kiln-fsdp", op, path.string(), " is not a kiln sharded checkpoint index");
  Index idx;
  idx.world = j.at("world_size").get<int>();
  KILN_CHECK(idx.world >= 1, op, path.string(), ": bad world_size");
  for (auto& [name, shape] : j.at("tensors").items()) idx.shapes[name] = shape.get<Shape>();
  if (j.contains("metadata")) idx.metadata = j["metadata"].get<io::Metadata>();
  return idx;
}

// The writers' files, loaded on first use; a missing one is named.
class ShardFiles {
 public:
  ShardFiles(std::string dir, int world, const char* op) : dir_(std::move(dir)), world_(world), op_(op) {}
  const io::TensorDict& file(int rank) {
    auto it = files_.find(rank);
    if (it != files_.end()) return it->second;
    const fs::path path = fs::path(dir_) / shard_file(rank, world_);
    KILN_CHECK(fs::exists(path), op_, "checkpoint ", dir_, " is missing ", path.filename().string(),
               " (the shard of rank ", rank, " of ", world_, ")");
    return files_.emplace(rank, io::load(path.string()).tensors).first->second;
  }
  // Rows [start, start + count) of `name` (whole shape `shape`), gathered from the writers' files.
  Tensor rows(const std::string& name, const Shape& shape, int64_t start, int64_t count, const Tensor& out) {
    const int64_t c = per_rank(shape, world_);
    for (int k = 0; k < world_ && count > 0; ++k) {
      const int64_t lo = std::max(start, k * c), hi = std::min(start + count, k * c + valid_rows(shape, world_, k));
      if (lo >= hi) continue;
      const io::TensorDict& f = file(k);
      KILN_CHECK(f.contains(name), op_, shard_file(k, world_), " in ", dir_, " has no tensor '", name, "'");
      Tensor src = f.at(name);
      if (shape.empty()) src = src.reshape({1});
      out.narrow(0, lo - start, hi - lo).copy_(src.narrow(0, lo - k * c, hi - lo));
    }
    return out;
  }

 private:
  std::string dir_;
  int world_;
  const char* op_;
  std::map<int, io::TensorDict> files_;
};

}  // namespace

void save_sharded(const std::string& dir, const std::vector<ShardSpec>& tensors, Communicator& comm,
                  const io::Metadata& metadata) {
  NoGradGuard no_grad;
  const int rank = comm.get_rank(), world = comm.get_size();
  std::error_code ec;
  fs::create_directories(dir, ec);
  KILN_CHECK(!ec, "save_sharded", "cannot create ", dir, ": ", ec.message());
  io::TensorDict mine;
  json shapes = json::object();
  for (const ShardSpec& t : tensors) {
    const int64_t n = valid_rows(t.full_shape, world, rank);
    KILN_CHECK(t.shard.defined() && t.shard.dim() >= 1 && t.shard.size(0) == per_rank(t.full_shape, world),
               "save_sharded", "'", t.name, "' is not a shard of ", shape_str(t.full_shape), " for ", world, " ranks");
    mine.insert(t.name, t.shard.narrow(0, 0, n).contiguous().cpu());
    shapes[t.name] = t.full_shape;
  }
  io::save((fs::path(dir) / shard_file(rank, world)).string(), mine, {{"format", "kiln-fsdp-shard"}}, /*checksums=*/true);
  comm.barrier();  // every shard is on disk before the index says the checkpoint is whole
  if (rank == 0) {
    const std::string text =
        json{{"format", "kiln-fsdp"}, {"world_size", world}, {"tensors", shapes}, {"metadata", metadata}}.dump(1);
    io::write_file_atomic((fs::path(dir) / kIndex).string(), text.data(), text.size());
  }
  comm.barrier();
}

void load_sharded(const std::string& dir, const std::vector<ShardSpec>& into, Communicator& comm) {
  NoGradGuard no_grad;
  const Index idx = read_index(dir, "load_sharded");
  const int rank = comm.get_rank(), world = comm.get_size();
  ShardFiles files(dir, idx.world, "load_sharded");
  for (const ShardSpec& t : into) {
    auto it = idx.shapes.find(t.name);
    KILN_CHECK(it != idx.shapes.end(), "load_sharded", "checkpoint ", dir, " has no tensor '", t.name, "'");
    KILN_CHECK(it->second == t.full_shape, "load_sharded", "'", t.name, "' is ", shape_str(it->second),
               " in the checkpoint but ", shape_str(t.full_shape), " in the model");
    const int64_t c = per_rank(t.full_shape, world), n = valid_rows(t.full_shape, world, rank);
    Tensor staged = zeros(t.shard.sizes(), t.shard.dtype());
    if (n > 0) files.rows(t.name, t.full_shape, rank * c, n, staged.narrow(0, 0, n));
    t.shard.detach().copy_(staged);
  }
}

io::TensorDict load_sharded_full(const std::string& dir) {
  const Index idx = read_index(dir, "load_sharded_full");
  ShardFiles files(dir, idx.world, "load_sharded_full");
  io::TensorDict out;
  for (const auto& [name, shape] : idx.shapes) {
    const io::TensorDict& first = files.file(0);
    KILN_CHECK(first.contains(name), "load_sharded_full", shard_file(0, idx.world), " has no tensor '", name, "'");
    Tensor whole = empty(shape.empty() ? Shape{1} : shape, first.at(name).dtype());
    files.rows(name, shape, 0, rows_of(shape), whole);
    out.insert(name, shape.empty() ? whole.reshape({}) : whole);
  }
  return out;
}

io::Metadata sharded_metadata(const std::string& dir) { return read_index(dir, "sharded_metadata").metadata; }

std::vector<ShardSpec> FSDPModule::shard_specs() const {
  std::vector<ShardSpec> out;
  for (detail::FsdpUnit* u : unit_->group->units) {
    if (!is_root() && u != unit_.get()) continue;
    const std::string prefix = is_root() && !u->prefix.empty() ? u->prefix + "." : "";
    for (const detail::ShardedParam& p : u->params) out.push_back({prefix + p.name, p.shape, p.shard});
  }
  return out;
}

}  // namespace kiln::dist
