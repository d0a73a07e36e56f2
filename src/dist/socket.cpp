#include "dist/socket.h"

#include <arpa/inet.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <csignal>
#include <cstring>
#include <mutex>
#include <thread>

#include "kiln/dist.h"

namespace kiln::dist::net {

namespace {

int64_t ms_left(Clock::time_point deadline) {
  return std::chrono::duration_cast<std::chrono::milliseconds>(deadline - Clock::now()).count();
}

[[noreturn]] void comm_fail(const char* op, const std::string& msg) {
  throw CommError(std::string("[") + op + "] " + msg);
}

// Waits until fd is readable / writable; false at the deadline.
bool wait_fd(int fd, short events, Clock::time_point deadline) {
  for (;;) {
    const int64_t left = ms_left(deadline);
    if (left <= 0) return false;
    pollfd p{fd, events, 0};
    const int rv = ::poll(&p, 1, static_cast<int>(std::min<int64_t>(left, 1 << 30)));
    if (rv > 0) return true;
    if (rv < 0 && errno != EINTR) return true;  // the following call reports the error
  }
}

}  // namespace

Socket& Socket::operator=(Socket&& o) noexcept {
  if (this != &o) {
    reset();
    fd_ = o.fd_;
    o.fd_ = -1;
  }
  return *this;
}

void Socket::reset() {
  if (fd_ >= 0) ::close(fd_);
  fd_ = -1;
}

void ignore_sigpipe_once() {
  static std::once_flag once;
  std::call_once(once, [] {
    struct sigaction old {};
    if (sigaction(SIGPIPE, nullptr, &old) == 0 && old.sa_handler == SIG_DFL) {
      struct sigaction ign {};
      ign.sa_handler = SIG_IGN;
      sigemptyset(&ign.sa_mask);
      sigaction(SIGPIPE, &ign, nullptr);
    }
  });
}

Socket connect_tcp(const std::string& host, int port, Clock::time_point deadline, const char* op) {
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  std::string last = "no attempt";
  const auto start = Clock::now();
  for (int attempt = 0;; ++attempt) {
    addrinfo* res = nullptr;
    const int gai = ::getaddrinfo(host.c_str(), std::to_string(port).c_str(), &hints, &res);
    if (gai != 0) {
      last = std::string("cannot resolve host: ") + gai_strerror(gai);
    } else {
      for (addrinfo* a = res; a; a = a->ai_next) {
        Socket s(::socket(a->ai_family, a->ai_socktype | SOCK_NONBLOCK | SOCK_CLOEXEC, a->ai_protocol));
        if (!s.valid()) {
          last = std::strerror(errno);
          continue;
        }
        int rv = ::connect(s.fd(), a->ai_addr, a->ai_addrlen);
        if (rv != 0 && errno == EINPROGRESS) {
          // Bound one attempt so a silently dropped SYN is retried rather than waited on to the end.
          const auto attempt_end = std::min(deadline, Clock::now() + std::chrono::seconds(2));
          if (wait_fd(s.fd(), POLLOUT, attempt_end)) {
            int err = 0;
            socklen_t len = sizeof(err);
            ::getsockopt(s.fd(), SOL_SOCKET, SO_ERROR, &err, &len);
            rv = err == 0 ? 0 : -1;
            errno = err;
          } else {
            errno = ETIMEDOUT;
          }
        }
        if (rv == 0) {
          ::freeaddrinfo(res);
          const int one = 1;
          ::setsockopt(s.fd(), IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
          return s;
        }
        last = std::strerror(errno);
      }
      ::freeaddrinfo(res);
    }
    if (ms_left(deadline) <= 0) break;
    // Short retries first (the server may be a moment behind), then every 100 ms.
    std::this_thread::sleep_for(std::chrono::milliseconds(attempt < 10 ? 10 : 100));
  }
  const auto waited = std::chrono::duration_cast<std::chrono::milliseconds>(Clock::now() - start).count();
  comm_fail(op, "could not reach " + host + ":" + std::to_string(port) + " within " + std::to_string(waited) +
                    " ms: " + last);
}

Socket listen_tcp(int port, int* bound_port, const char* op) {
  Socket s(::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0));
  if (!s.valid()) comm_fail(op, std::string("socket: ") + std::strerror(errno));
  const int one = 1;
  ::setsockopt(s.fd(), SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_ANY);
  addr.sin_port = htons(static_cast<uint16_t>(port));
  if (::bind(s.fd(), reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) != 0)
    comm_fail(op, "cannot listen on port " + std::to_string(port) + ": " + std::strerror(errno));
  if (::listen(s.fd(), 1024) != 0) comm_fail(op, std::string("listen: ") + std::strerror(errno));
  socklen_t len = sizeof(addr);
  ::getsockname(s.fd(), reinterpret_cast<sockaddr*>(&addr), &len);
  *bound_port = ntohs(addr.sin_port);
  return s;
}

void send_all(int fd, const void* data, size_t n, Clock::time_point deadline, const char* op) {
  const char* p = static_cast<const char*>(data);
  while (n > 0) {
    const ssize_t rv = ::send(fd, p, n, MSG_NOSIGNAL | MSG_DONTWAIT);
    if (rv > 0) {
      p += rv;
      n -= static_cast<size_t>(rv);
      continue;
    }
    if (rv < 0 && errno == EINTR) continue;
    if (rv < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) {
      if (!wait_fd(fd, POLLOUT, deadline)) comm_fail(op, "send timed out");
      continue;
    }
    comm_fail(op, std::string("connection lost: ") + std::strerror(errno));
  }
}

void recv_all(int fd, void* data, size_t n, Clock::time_point deadline, const char* op) {
  char* p = static_cast<char*>(data);
  while (n > 0) {
    const ssize_t rv = ::recv(fd, p, n, MSG_DONTWAIT);
    if (rv > 0) {
      p += rv;
      n -= static_cast<size_t>(rv);
      continue;
    }
    if (rv == 0) comm_fail(op, "connection closed by the peer");
    if (errno == EINTR) continue;
    if (errno == EAGAIN || errno == EWOULDBLOCK) {
      if (!wait_fd(fd, POLLIN, deadline)) comm_fail(op, "no answer before the deadline");
      continue;
    }
    comm_fail(op, std::string("connection lost: ") + std::strerror(errno));
  }
}

}  // namespace kiln::dist::net
