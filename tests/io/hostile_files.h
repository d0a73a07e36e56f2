#pragma once
// Generators of hostile checkpoints, each a few hundred bytes to a few dozen kilobytes, and a
// harness that runs a parse in a child process to prove it ends with a clear error in bounded time
// and memory (never a signal or a hang). The fuzz corpora in fuzz/corpus hold the same files.
#include <gtest/gtest.h>
#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <functional>
#include <string>
#include <vector>

#include "io/file_util.h"
#include "io/pickle.h"
#include "kiln/io.h"

namespace kiln::io::hostile {

inline std::vector<uint8_t> bytes_of(const std::string& s) { return std::vector<uint8_t>(s.begin(), s.end()); }

// A torch zip: data.pkl = `pickle`, a storage record data/0 of `record` bytes.
inline std::vector<uint8_t> torch_zip(const std::vector<uint8_t>& pickle, size_t record = 4,
                                      const std::string& byteorder = "little") {
  return detail::make_stored_zip({{"archive/data.pkl", pickle},
                                  {"archive/byteorder", bytes_of(byteorder)},
                                  {"archive/data/0", std::vector<uint8_t>(record, 0x3f)},
                                  {"archive/version", bytes_of("3\n")}});
}

// Pushes _rebuild_tensor_v2's argument tuple: (storage '0' of `numel` `storage_class`
// elements, offset, size, stride, False, OrderedDict()).
inline void rebuild_args(detail::Pickler& p, int64_t numel, const Shape& size, const Shape& stride,
                         const char* storage_class = "FloatStorage", int64_t offset = 0) {
  p.op('(');
  p.op('(');
  p.str("storage");
  p.global("torch", storage_class);
  p.str("0");
  p.str("cpu");
  p.integer(numel);
  p.op('t');
  p.op('Q');
  p.integer(offset);
  p.int_tuple(size);
  p.int_tuple(stride);
  p.boolean(false);
  p.global("collections", "OrderedDict");
  p.op(')');
  p.op('R');
  p.op('t');
}

// {"w": a view of `size` / `stride` over a storage of `numel` elements}.
inline std::vector<uint8_t> view_pickle(int64_t numel, const Shape& size, const Shape& stride,
                                        const char* storage_class = "FloatStorage") {
  detail::Pickler p;
  p.op('}');
  p.str("w");
  p.global("torch._utils", "_rebuild_tensor_v2");
  rebuild_args(p, numel, size, stride, storage_class);
  p.op('R');
  p.op('s');
  return p.finish();
}

// A one-float storage viewed as `size` with all strides 0 (case 3: [2^31, 2^31]; case 4: [2^30]).
inline std::vector<uint8_t> zero_stride_view(const Shape& size) {
  return torch_zip(view_pickle(1, size, Shape(size.size(), 0)), 4);
}

// {"w": _rebuild_from_type_v2 nested `depth` times around _rebuild_tensor_v2}. The two globals go
// to the memo once, so each level costs 7 bytes (case 1: 20,000 levels in 140 KB).
inline std::vector<uint8_t> nested_rebuild(int depth) {
  detail::Pickler p;
  p.op('}');
  p.str("w");
  p.global("torch._tensor", "_rebuild_from_type_v2");
  p.op('q');
  p.op(0);
  p.global("torch", "Tensor");
  p.op('q');
  p.op(1);
  p.op('0');  // pop: torch.Tensor is fetched from the memo below
  for (int k = 0; k < depth; ++k) {
    p.op('(');
    if (k + 1 < depth) {
      p.op('h');
      p.op(0);
    } else {
      p.global("torch._utils", "_rebuild_tensor_v2");
    }
    p.op('h');
    p.op(1);
  }
  rebuild_args(p, 1, {1}, {1});
  for (int k = 0; k < depth; ++k) {
    p.op('}');
    p.op('t');
  }
  p.op('R');
  p.op('s');
  return torch_zip(p.finish(), 4);
}

// {"x": L_levels} where L_0 = [1] and L_k = [L_{k-1}, L_{k-1}] through the memo (case 2: 40 levels
// in about 1 KB unfold to 2^40 leaves).
inline std::vector<uint8_t> memo_dag(int levels) {
  detail::Pickler p;
  p.op('}');
  p.str("x");
  p.op(']');
  p.integer(1);
  p.op('a');
  p.op('q');  // memo[0] = L_0
  p.op(0);
  p.op('0');
  for (int k = 1; k <= levels; ++k) {  // levels < 256: one-byte memo keys
    p.op('(');
    p.op('h');
    p.op(static_cast<uint8_t>(k - 1));
    p.op('h');
    p.op(static_cast<uint8_t>(k - 1));
    p.op('l');
    p.op('q');
    p.op(static_cast<uint8_t>(k));
    p.op('0');
  }
  p.op('h');
  p.op(static_cast<uint8_t>(levels));
  p.op('s');
  return torch_zip(p.finish(), 4);
}

// A safetensors file: the header text as given, then `data` bytes.
inline std::vector<uint8_t> safetensors(const std::string& header, size_t data) {
  std::vector<uint8_t> out;
  detail::put_le(out, header.size(), 8);
  out.insert(out.end(), header.begin(), header.end());
  out.resize(out.size() + data, 0x11);
  return out;
}

// The outcome of a parse run in a child process.
struct Outcome {
  bool exited = false;      // ended normally (no signal, no timeout)
  int signal = 0;           // the signal that ended it, if one did
  bool timed_out = false;
  bool threw_error = false; // a kiln::Error came out
  std::string message;      // its text
  double seconds = 0;
  long max_rss_kb = 0;      // the child's peak resident memory
};

inline long self_rss_kb() {
  long kb = 0;
  if (FILE* f = std::fopen("/proc/self/status", "r")) {
    char line[256];
    while (std::fgets(line, sizeof(line), f) != nullptr)
      if (std::sscanf(line, "VmRSS: %ld", &kb) == 1) break;
    std::fclose(f);
  }
  return kb;
}

// Runs `fn` in a forked child, killed after `limit_s`; reports how it ended.
inline Outcome run_isolated(const std::function<void()>& fn, double limit_s = 10.0) {
  int fds[2];
  if (pipe(fds) != 0) return {};
  const auto t0 = std::chrono::steady_clock::now();
  const pid_t pid = fork();
  if (pid == 0) {
    close(fds[0]);
    std::string msg;
    int code = 1;  // no error
    try {
      fn();
    } catch (const kiln::Error& e) {
      msg = e.what();
      code = 0;
    } catch (const std::exception& e) {
      msg = std::string("not a kiln::Error: ") + e.what();
      code = 2;
    }
    if (!msg.empty() && write(fds[1], msg.data(), msg.size()) < 0) code = 3;
    close(fds[1]);
    _exit(code);
  }
  close(fds[1]);
  Outcome o;
  std::string msg;
  char buf[4096];
  bool open = true;
  int status = 0;
  struct rusage ru {};
  while (true) {
    const double elapsed = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    if (elapsed > limit_s) {
      kill(pid, SIGKILL);
      o.timed_out = true;
    }
    if (open) {
      pollfd p{fds[0], POLLIN, 0};
      if (poll(&p, 1, 20) > 0) {
        const ssize_t n = read(fds[0], buf, sizeof(buf));
        if (n > 0) msg.append(buf, static_cast<size_t>(n));
        else open = false;
      }
    } else {
      usleep(2000);
    }
    const pid_t done = wait4(pid, &status, WNOHANG, &ru);
    if (done == pid) break;
  }
  close(fds[0]);
  o.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  o.max_rss_kb = ru.ru_maxrss;
  o.exited = WIFEXITED(status) && !o.timed_out;
  o.signal = WIFSIGNALED(status) ? WTERMSIG(status) : 0;
  o.threw_error = o.exited && WEXITSTATUS(status) == 0;
  o.message = msg;
  return o;
}

// Runs `fn` isolated and expects a kiln::Error containing `rule` within 2 s, using at most 512 MiB
// more than this process had (what the parent holds counts in the child's peak too).
inline void expect_bounded_error(const std::function<void()>& fn, const std::string& rule) {
  const long base_kb = self_rss_kb();
  const Outcome o = run_isolated(fn);
  EXPECT_FALSE(o.timed_out) << "hung (killed after 10 s); wanted an error naming '" << rule << "'";
  EXPECT_EQ(o.signal, 0) << "ended by signal " << o.signal << "; wanted an error naming '" << rule << "'";
  EXPECT_TRUE(o.threw_error) << "no kiln::Error; message: " << o.message << "; wanted '" << rule << "'";
  EXPECT_NE(o.message.find(rule), std::string::npos) << "message: " << o.message << "\nwanted: " << rule;
  EXPECT_LT(o.seconds, 2.0) << "took " << o.seconds << " s: " << o.message;
  EXPECT_LT(o.max_rss_kb - base_kb, 512L * 1024) << "peak memory " << o.max_rss_kb / 1024 << " MiB";
}

}  // namespace kiln::io::hostile
