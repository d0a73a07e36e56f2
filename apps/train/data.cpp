// Corpus discovery, packing and the window loader.
#include "data.h"

#include <algorithm>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <sstream>

#include "kiln/error.h"

namespace fs = std::filesystem;

namespace kiln::train {
namespace {

std::string read_file(const fs::path& p) {
  std::ifstream f(p, std::ios::binary);
  std::stringstream ss;
  ss << f.rdbuf();
  return ss.str();
}

// Text: no NUL bytes in the first 8 KiB.
bool looks_like_text(const std::string& s) {
  return s.find('\0') == std::string::npos || s.find('\0') > 8192;
}

std::string python_stdlib() {
  // The interpreter's own stdlib path first (pyenv, venvs), then the system's.
  if (FILE* p = popen("python3 -c \"import sysconfig; print(sysconfig.get_paths()['stdlib'])\" 2>/dev/null", "r")) {
    char buf[4096];
    std::string out;
    while (fgets(buf, sizeof(buf), p)) out += buf;
    pclose(p);
    while (!out.empty() && (out.back() == '\n' || out.back() == '\r')) out.pop_back();
    if (!out.empty() && fs::exists(fs::path(out) / "os.py")) return out;
  }
  std::vector<std::string> found;
  std::error_code ec;
  for (const auto& e : fs::directory_iterator("/usr/lib", ec)) {
    const std::string name = e.path().filename().string();
    if (name.rfind("python3", 0) == 0 && fs::exists(e.path() / "os.py")) found.push_back(e.path().string());
  }
  std::sort(found.begin(), found.end());
  return found.empty() ? std::string() : found.back();
}

}  // namespace

std::string default_corpus_path() {
  const std::string p = python_stdlib();
  KILN_CHECK(!p.empty(), "train", "no default corpus: the Python standard library was not found; pass --data PATH");
  return p;
}

std::vector<Document> load_documents(const std::string& path, int64_t max_bytes) {
  KILN_CHECK(fs::exists(path), "train", "data path does not exist: ", path);
  std::vector<fs::path> files;
  if (fs::is_directory(path)) {
    // The default corpus is the stdlib's top level only (a few MB); a user's folder is walked fully.
    const bool stdlib = fs::exists(fs::path(path) / "os.py");
    if (stdlib) {
      for (const auto& e : fs::directory_iterator(path))
        if (e.is_regular_file() && e.path().extension() == ".py") files.push_back(e.path());
    } else {
      for (const auto& e : fs::recursive_directory_iterator(path, fs::directory_options::skip_permission_denied))
        if (e.is_regular_file()) files.push_back(e.path());
    }
  } else {
    files.push_back(path);
  }
  std::sort(files.begin(), files.end());
  std::vector<Document> docs;
  int64_t total = 0;
  for (const auto& f : files) {
    std::string text = read_file(f);
    if (text.empty() || !looks_like_text(text)) continue;
    total += static_cast<int64_t>(text.size());
    docs.push_back({fs::relative(f, fs::is_directory(path) ? fs::path(path) : f.parent_path()).string(),
                    std::move(text)});
    if (max_bytes > 0 && total >= max_bytes) break;
  }
  KILN_CHECK(!docs.empty(), "train", "no text files found under ", path);
  return docs;
}

void split_documents(const std::vector<Document>& docs, int64_t heldout_every, std::vector<Document>& train,
                     std::vector<Document>& heldout) {
  train.clear();
  heldout.clear();
  if (docs.size() == 1) {
    // One file: the last tenth (cut at a line break) is held out.
    const std::string& t = docs[0].text;
    size_t cut = t.size() - t.size() / 10;
    const size_t nl = t.find('\n', cut);
    if (nl != std::string::npos) cut = nl + 1;
    train.push_back({docs[0].name, t.substr(0, cut)});
    heldout.push_back({docs[0].name + ":heldout", t.substr(cut)});
    return;
  }
  for (size_t i = 0; i < docs.size(); ++i) {
    const bool held = heldout_every > 0 && static_cast<int64_t>(i) % heldout_every == heldout_every / 2;
    (held ? heldout : train).push_back(docs[i]);
  }
  if (heldout.empty()) {
    heldout.push_back(train.back());
    train.pop_back();
  }
}

TokenStream pack(const std::vector<Document>& docs, const Tokenizer& tok) {
  TokenStream s;
  for (size_t d = 0; d < docs.size(); ++d) {
    std::vector<int32_t> ids = tok.encode(docs[d].text);
    ids.push_back(Tokenizer::kEot);
    s.tokens.insert(s.tokens.end(), ids.begin(), ids.end());
    s.doc.insert(s.doc.end(), ids.size(), static_cast<int32_t>(d));
  }
  return s;
}

Loader::Loader(const TokenStream& stream, int64_t seq_len, uint64_t seed, bool shuffle)
    : stream_(&stream), seq_len_(seq_len), seed_(seed), shuffle_(shuffle) {
  KILN_CHECK(seq_len > 0, "train", "seq_len must be positive");
  // Each window needs seq_len + 1 tokens (the last target).
  num_windows_ = (static_cast<int64_t>(stream.tokens.size()) - 1) / seq_len;
  KILN_CHECK(num_windows_ > 0, "train", "the corpus (", stream.tokens.size(), " tokens) is shorter than one sequence of ",
             seq_len + 1, " tokens");
  reshuffle();
}

void Loader::reshuffle() {
  order_.resize(static_cast<size_t>(num_windows_));
  for (int64_t i = 0; i < num_windows_; ++i) order_[static_cast<size_t>(i)] = i;
  if (!shuffle_) return;
  std::mt19937_64 rng(seed_ * 0x9E3779B97F4A7C15ull + static_cast<uint64_t>(epoch_) + 1);
  // Fisher-Yates with our own bounded draw (std::shuffle's distribution is implementation-defined).
  for (int64_t i = num_windows_ - 1; i > 0; --i) {
    const int64_t j = static_cast<int64_t>(rng() % static_cast<uint64_t>(i + 1));
    std::swap(order_[static_cast<size_t>(i)], order_[static_cast<size_t>(j)]);
  }
}

void Loader::set_position(int64_t epoch, int64_t cursor) {
  KILN_CHECK(epoch >= 0 && cursor >= 0 && cursor <= num_windows_, "train", "bad data position (", epoch, ", ",
             cursor, ")");
  epoch_ = epoch;
  cursor_ = cursor;
  reshuffle();
}

Batch Loader::next(int64_t batch_size) {
  std::vector<int64_t> w;
  for (int64_t i = 0; i < batch_size; ++i) {
    if (cursor_ >= num_windows_) {
      ++epoch_;
      cursor_ = 0;
      reshuffle();
    }
    w.push_back(order_[static_cast<size_t>(cursor_++)]);
  }
  return window_batch(w);
}

Batch Loader::window_batch(const std::vector<int64_t>& windows) const {
  const int64_t B = static_cast<int64_t>(windows.size()), T = seq_len_;
  Batch b;
  b.input = empty({B, T}, kInt64);
  b.target = empty({B, T}, kInt64);
  b.doc_ids = empty({B, T}, kInt32);
  int64_t* in = b.input.data_ptr<int64_t>();
  int64_t* tg = b.target.data_ptr<int64_t>();
  int32_t* dd = b.doc_ids.data_ptr<int32_t>();
  const auto& tok = stream_->tokens;
  const auto& doc = stream_->doc;
  for (int64_t r = 0; r < B; ++r) {
    const size_t start = static_cast<size_t>(windows[static_cast<size_t>(r)] * T);
    const int32_t first_doc = doc[start];
    for (int64_t t = 0; t < T; ++t) {
      const size_t p = start + static_cast<size_t>(t);
      in[r * T + t] = tok[p];
      const bool same = doc[p + 1] == doc[p];
      tg[r * T + t] = same ? tok[p + 1] : -100;
      b.tokens += same ? 1 : 0;
      dd[r * T + t] = doc[p] - first_doc;
    }
  }
  return b;
}

TokenStream synthetic_stream(int64_t n_tokens, int64_t vocab, int64_t mean_doc_len, uint64_t seed) {
  KILN_CHECK(n_tokens > 0 && vocab > 1 && mean_doc_len >= 1, "train", "synthetic data needs tokens > 0, vocab > 1 and a ",
             "mean document length >= 1, got ", n_tokens, ", ", vocab, ", ", mean_doc_len);
  std::mt19937_64 rng(seed ^ 0x73796e7468ULL);
  std::uniform_int_distribution<int32_t> token(0, static_cast<int32_t>(vocab - 1));
  std::uniform_int_distribution<int64_t> length(1, 2 * mean_doc_len - 1);
  TokenStream s;
  s.tokens.resize(static_cast<size_t>(n_tokens));
  s.doc.resize(static_cast<size_t>(n_tokens));
  int32_t doc = 0;
  int64_t left = length(rng);
  for (size_t i = 0; i < s.tokens.size(); ++i) {
    if (left-- == 0) {
      ++doc;
      left = length(rng) - 1;
    }
    s.tokens[i] = token(rng);
    s.doc[i] = doc;
  }
  return s;
}

}  // namespace kiln::train
