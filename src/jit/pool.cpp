// Worker processes for the compile pool. The worker executable is embedded in the library
// (CMakeLists.txt: kiln_compile_worker); it is copied once into an anonymous memory file and started
// from there with posix_spawn (no fork of a possibly multi-threaded caller, no file to install).
// Each worker talks over one socket pair (the request in, the response out: a worker that dies
// mid-read gives the parent an error, never SIGPIPE) and a pipe for its stderr; one poll loop drives
// every worker of a call without threads.
#include "jit/pool.h"

#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <spawn.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <chrono>
#include <cstring>
#include <mutex>
#include <sstream>
#include <algorithm>

#include "core/embedded.h"
#include "jit/protocol.h"
#include "kiln/error.h"

extern char** environ;

namespace kiln::detail::embedded_files_data {
extern const EmbeddedFile kiln_compile_worker_binary;  // generated from the worker's build
}

namespace kiln::jit::detail {
namespace {

constexpr const char* kOp = "jit";
constexpr size_t kStderrKeep = 4096;  // the tail of a worker's stderr kept for messages

std::atomic<int64_t> g_started{0};

// "/proc/self/fd/N" of the memory file holding the worker, created on first use; `recreate`
// writes a new one (the program closed the old descriptor, as daemons closing every fd do).
std::string worker_path(bool recreate = false) {
  static std::mutex mu;
  static std::string path;
  std::lock_guard<std::mutex> lock(mu);
  if (!path.empty() && !recreate) return path;
  const std::string_view elf = kiln::detail::embedded_files_data::kiln_compile_worker_binary.text;
  const int fd = memfd_create("kiln-compile-worker", MFD_CLOEXEC);
  KILN_CHECK(fd >= 0, kOp, "could not create the compile worker's memory file: ", std::strerror(errno));
  size_t done = 0;
  while (done < elf.size()) {
    const ssize_t n = write(fd, elf.data() + done, elf.size() - done);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) {
      const int err = errno;
      close(fd);
      KILN_FAIL(kOp, "could not write the compile worker: ", std::strerror(err));
    }
    done += static_cast<size_t>(n);
  }
  path = "/proc/self/fd/" + std::to_string(fd);  // kept open for the life of the process
  return path;
}

std::string signal_text(int sig) {
  const char* d = strsignal(sig);
  return "signal " + std::to_string(sig) + (d ? std::string(" (") + d + ")" : "");
}

struct Running {
  size_t job = 0;
  pid_t pid = -1;
  int sock = -1, err = -1;
  size_t sent = 0;
  std::string out, errtext;
  std::chrono::steady_clock::time_point deadline;
  bool timed_out = false;
};

void set_nonblocking(int fd) { fcntl(fd, F_SETFL, fcntl(fd, F_GETFL) | O_NONBLOCK); }

Running start(const WorkerJob& job, size_t index, double timeout_s) {
  int sv[2], ep[2];
  KILN_CHECK(socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, sv) == 0, kOp, "socketpair failed: ",
             std::strerror(errno));
  if (pipe2(ep, O_CLOEXEC) != 0) {
    const int e = errno;
    close(sv[0]), close(sv[1]);
    KILN_FAIL(kOp, "pipe failed: ", std::strerror(e));
  }
  posix_spawn_file_actions_t fa;
  posix_spawn_file_actions_init(&fa);
  posix_spawn_file_actions_adddup2(&fa, sv[1], 0);
  posix_spawn_file_actions_adddup2(&fa, sv[1], 1);
  posix_spawn_file_actions_adddup2(&fa, ep[1], 2);
  posix_spawnattr_t attr;
  posix_spawnattr_init(&attr);
  sigset_t none, defaults;
  sigemptyset(&none);
  sigemptyset(&defaults);
  sigaddset(&defaults, SIGPIPE);
  sigaddset(&defaults, SIGSEGV);
  posix_spawnattr_setsigmask(&attr, &none);
  posix_spawnattr_setsigdefault(&attr, &defaults);
  posix_spawnattr_setflags(&attr, POSIX_SPAWN_SETSIGMASK | POSIX_SPAWN_SETSIGDEF);
  const std::string fault = job.fault == WorkerFault::crash  ? "--fault=crash"
                            : job.fault == WorkerFault::hang ? "--fault=hang"
                                                             : "";
  std::vector<char*> argv{const_cast<char*>("kiln-compile-worker")};
  if (!fault.empty()) argv.push_back(const_cast<char*>(fault.c_str()));
  argv.push_back(nullptr);
  Running r;
  r.job = index;
  int rc = posix_spawn(&r.pid, worker_path().c_str(), &fa, &attr, argv.data(), environ);
  if (rc == ENOENT || rc == EACCES || rc == ENOEXEC)  // the memory file is gone: write it again
    rc = posix_spawn(&r.pid, worker_path(true).c_str(), &fa, &attr, argv.data(), environ);
  posix_spawn_file_actions_destroy(&fa);
  posix_spawnattr_destroy(&attr);
  close(sv[1]), close(ep[1]);
  if (rc != 0) {
    close(sv[0]), close(ep[0]);
    KILN_FAIL(kOp, "could not start the compile worker for '", job.name, "': ", std::strerror(rc));
  }
  ++g_started;
  r.sock = sv[0], r.err = ep[0];
  set_nonblocking(r.sock);
  set_nonblocking(r.err);
  r.deadline = std::chrono::steady_clock::now() +
               std::chrono::duration_cast<std::chrono::steady_clock::duration>(std::chrono::duration<double>(timeout_s));
  return r;
}

// Reads what is there; false at EOF or on an error.
bool drain(int fd, std::string& into, size_t keep = 0) {
  char buf[1 << 16];
  for (;;) {
    const ssize_t n = read(fd, buf, sizeof(buf));
    if (n > 0) {
      into.append(buf, static_cast<size_t>(n));
      if (keep && into.size() > 2 * keep) into.erase(0, into.size() - keep);
      continue;
    }
    if (n < 0 && errno == EINTR) continue;
    return n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK);
  }
}

std::string trimmed(std::string s) {
  while (!s.empty() && (s.back() == '\n' || s.back() == ' ')) s.pop_back();
  return s;
}

WorkerOutcome finish(Running& r, const WorkerJob& job, double timeout_s) {
  if (r.sock >= 0) close(r.sock);
  if (r.err >= 0) close(r.err);
  if (r.timed_out) kill(r.pid, SIGKILL);
  // A worker that closed its output exits at once; one that lingers is killed at its deadline.
  int status = 0;
  pid_t got;
  for (;;) {
    got = waitpid(r.pid, &status, r.timed_out ? 0 : WNOHANG);
    if (got < 0 && errno == EINTR) continue;
    if (got != 0) break;
    if (std::chrono::steady_clock::now() >= r.deadline) {
      r.timed_out = true;
      kill(r.pid, SIGKILL);
      continue;
    }
    usleep(1000);
  }
  const bool known = got == r.pid;  // ECHILD where the program reaps its children itself
  WorkerOutcome o;
  const std::string who = "compiling kernel '" + job.name + "': ";
  const std::string tail = r.errtext.empty() ? "" : "\nworker stderr: " + trimmed(r.errtext);
  if (r.timed_out) {
    std::ostringstream os;
    os << who << "the compile did not finish within " << timeout_s
       << " s (CompileOptions::timeout_s, KILN_JIT_TIMEOUT); its worker was killed";
    o.error = os.str();
    return o;
  }
  if (known && WIFSIGNALED(status)) {
    o.error = who + "the compile worker was killed by " + signal_text(WTERMSIG(status)) + tail;
    return o;
  }
  std::vector<std::string> parts;
  if (!protocol::decode(r.out, parts) || parts.size() != 3) {
    o.error = who + "the compile worker " +
              (known && WIFEXITED(status) ? "exited with status " + std::to_string(WEXITSTATUS(status)) : "ended") +
              " without an answer" + tail;
    return o;
  }
  o.ok = parts[0] == "ok";
  if (o.ok) {
    o.binary = std::move(parts[2]);
  } else {
    o.error = who + "NVRTC failed:\n" + trimmed(parts[1]);
  }
  return o;
}

}  // namespace

int64_t workers_started() { return g_started; }

std::vector<WorkerOutcome> run_in_workers(const std::vector<WorkerJob>& jobs, int workers, double timeout_s) {
  std::vector<WorkerOutcome> out(jobs.size());
  std::vector<Running> running;
  size_t next = 0;
  const size_t limit = static_cast<size_t>(std::max(1, workers));
  try {
    while (next < jobs.size() || !running.empty()) {
      while (next < jobs.size() && running.size() < limit) {
        running.push_back(start(jobs[next], next, timeout_s));
        ++next;
      }
      std::vector<pollfd> fds;
      for (const Running& r : running) {
        const bool writing = r.sent < jobs[r.job].request.size();
        fds.push_back({r.sock, static_cast<short>(POLLIN | (writing ? POLLOUT : 0)), 0});
        fds.push_back({r.err, static_cast<short>(r.err >= 0 ? POLLIN : 0), 0});
      }
      auto now = std::chrono::steady_clock::now();
      auto soonest = running.front().deadline;
      for (const Running& r : running) soonest = std::min(soonest, r.deadline);
      const auto wait_ms = std::chrono::duration_cast<std::chrono::milliseconds>(soonest - now).count() + 1;
      const int n = poll(fds.data(), fds.size(), static_cast<int>(std::clamp<int64_t>(wait_ms, 0, 1000)));
      KILN_CHECK(n >= 0 || errno == EINTR, kOp, "poll failed: ", std::strerror(errno));
      now = std::chrono::steady_clock::now();
      for (size_t i = 0; i < running.size();) {
        Running& r = running[i];
        const pollfd& ps = fds[2 * i];
        const pollfd& pe = fds[2 * i + 1];
        const std::string& req = jobs[r.job].request;
        bool done = false;
        if (r.sent < req.size() && (ps.revents & (POLLOUT | POLLERR | POLLHUP))) {
          const ssize_t w = send(r.sock, req.data() + r.sent, req.size() - r.sent, MSG_NOSIGNAL);
          if (w > 0) r.sent += static_cast<size_t>(w);
          if (w < 0 && errno != EAGAIN && errno != EINTR) r.sent = req.size();  // the worker is gone
          if (r.sent == req.size()) shutdown(r.sock, SHUT_WR);                  // EOF ends its read
        }
        if (r.err >= 0 && (pe.revents & (POLLIN | POLLHUP | POLLERR)) && !drain(r.err, r.errtext, kStderrKeep)) {
          close(r.err);
          r.err = -1;
        }
        if (ps.revents & (POLLIN | POLLHUP | POLLERR)) done = !drain(r.sock, r.out);
        if (!done && now >= r.deadline) done = r.timed_out = true;
        if (done) {
          if (r.err >= 0) drain(r.err, r.errtext, kStderrKeep);
          out[r.job] = finish(r, jobs[r.job], timeout_s);
          running.erase(running.begin() + static_cast<std::ptrdiff_t>(i));
          fds.erase(fds.begin() + static_cast<std::ptrdiff_t>(2 * i), fds.begin() + static_cast<std::ptrdiff_t>(2 * i + 2));
        } else {
          ++i;
        }
      }
    }
  } catch (...) {
    for (Running& r : running) {
      r.timed_out = true;
      finish(r, jobs[r.job], timeout_s);
    }
    throw;
  }
  return out;
}

}  // namespace kiln::jit::detail
