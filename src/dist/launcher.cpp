// run_local (`kiln run`): children in one process group of their own, signals forwarded to it, the
// group ended when one child fails. Everything the children need (argv, environment) is built before fork, so the
// child only calls async-signal-safe functions before exec.
#include <signal.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstring>

#include "core/env.h"
#include "dist/socket.h"
#include "kiln/dist.h"

namespace kiln::dist {

namespace {

constexpr const char* kOp = "kiln run";

int free_port() {
  int port = 0;
  net::Socket s = net::listen_tcp(0, &port, kOp);
  return port;
}

int status_code(int st) {
  if (WIFEXITED(st)) return WEXITSTATUS(st);
  if (WIFSIGNALED(st)) return 128 + WTERMSIG(st);
  return 1;
}

}  // namespace

int run_local(const LaunchOptions& o) {
  KILN_CHECK(o.nproc >= 1 && o.nproc <= 4096, kOp, "--nproc must be in [1, 4096], got ", o.nproc);
  KILN_CHECK(!o.command.empty(), kOp, "no command to run (kiln run --nproc N -- CMD ...)");
  sigset_t forward, previous;
  sigemptyset(&forward);
  for (int sig : {SIGINT, SIGTERM, SIGHUP, SIGQUIT, SIGUSR1, SIGUSR2}) sigaddset(&forward, sig);
  // Blocked before the store's thread starts, so it inherits the mask and sigtimedwait sees them.
  pthread_sigmask(SIG_BLOCK, &forward, &previous);
  struct Restore {
    sigset_t mask;
    ~Restore() { pthread_sigmask(SIG_SETMASK, &mask, nullptr); }
  } restore{previous};

  TCPStore store("127.0.0.1", 0, true);
  const int master_port = free_port();
  const int n = o.nproc;
  std::vector<std::vector<std::string>> envs;
  for (int r = 0; r < n; ++r)
    envs.push_back(::kiln::detail::environment_with({{"RANK", std::to_string(r)},
                                             {"WORLD_SIZE", std::to_string(n)},
                                             {"LOCAL_RANK", std::to_string(r)},
                                             {"LOCAL_WORLD_SIZE", std::to_string(n)},
                                             {"GROUP_RANK", "0"},
                                             {"MASTER_ADDR", "127.0.0.1"},
                                             {"MASTER_PORT", std::to_string(master_port)},
                                             {"KILN_STORE_PORT", std::to_string(store.port())}}));
  std::vector<char*> argv;
  for (const auto& a : o.command) argv.push_back(const_cast<char*>(a.c_str()));
  argv.push_back(nullptr);

  std::vector<pid_t> pids(static_cast<size_t>(n), -1);
  pid_t group = 0;
  int first_failure = -1;
  // Signals go to the children's process group, so whatever they started themselves gets them too.
  auto kill_all = [&](int sig) {
    if (group > 0) ::kill(-group, sig);
  };
  for (int r = 0; r < n; ++r) {
    std::vector<char*> envp;
    for (auto& e : envs[r]) envp.push_back(e.data());
    envp.push_back(nullptr);
    const pid_t pid = ::fork();
    if (pid < 0) {
      first_failure = 1;
      break;
    }
    if (pid == 0) {
      ::setpgid(0, group);
      ::prctl(PR_SET_PDEATHSIG, SIGKILL);  // never outlive the launcher
      pthread_sigmask(SIG_SETMASK, &previous, nullptr);
      ::execvpe(argv[0], argv.data(), envp.data());
      const char* msg = "kiln run: cannot execute the command\n";
      (void)!::write(STDERR_FILENO, msg, std::strlen(msg));
      ::_exit(127);
    }
    ::setpgid(pid, group);
    if (group == 0) group = pid;
    pids[static_cast<size_t>(r)] = pid;
  }
  if (first_failure >= 0) kill_all(SIGKILL);

  using Clock = std::chrono::steady_clock;
  Clock::time_point kill_at = Clock::time_point::max();
  for (;;) {
    timespec tick{0, 20 * 1000 * 1000};
    siginfo_t info;
    const int sig = sigtimedwait(&forward, &info, &tick);
    if (sig > 0) kill_all(sig);
    int live = 0;
    for (auto& p : pids) {
      if (p <= 0) continue;
      int st = 0;
      const pid_t got = ::waitpid(p, &st, WNOHANG);
      if (got == 0 || (got < 0 && errno == EINTR)) {
        ++live;
        continue;
      }
      p = -1;
      const int code = got < 0 ? 1 : status_code(st);
      if (code != 0 && first_failure < 0) {
        first_failure = code;
        kill_all(SIGTERM);
        kill_at = Clock::now() + o.kill_grace;
      }
    }
    if (live == 0) break;
    if (Clock::now() >= kill_at) {
      kill_all(SIGKILL);
      kill_at = Clock::time_point::max();
    }
  }
  return first_failure < 0 ? 0 : first_failure;
}

}  // namespace kiln::dist
