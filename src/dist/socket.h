#pragma once
// Blocking TCP helpers with deadlines for the store (poll() bounds every wait; send never raises
// SIGPIPE). Failures raise CommError naming the op and the peer.
#include <chrono>
#include <cstddef>
#include <string>

namespace kiln::dist::net {

using Clock = std::chrono::steady_clock;

// An fd closed on destruction.
class Socket {
 public:
  Socket() = default;
  explicit Socket(int fd) : fd_(fd) {}
  ~Socket() { reset(); }
  Socket(Socket&& o) noexcept : fd_(o.fd_) { o.fd_ = -1; }
  Socket& operator=(Socket&& o) noexcept;
  Socket(const Socket&) = delete;
  Socket& operator=(const Socket&) = delete;
  int fd() const { return fd_; }
  bool valid() const { return fd_ >= 0; }
  void reset();

 private:
  int fd_ = -1;
};

// Connects to host:port, retrying refused / unreachable attempts until the deadline.
Socket connect_tcp(const std::string& host, int port, Clock::time_point deadline, const char* op);
// Listens on every interface at port (0: a free one); *bound_port gets the port.
Socket listen_tcp(int port, int* bound_port, const char* op);
void send_all(int fd, const void* data, size_t n, Clock::time_point deadline, const char* op);
void recv_all(int fd, void* data, size_t n, Clock::time_point deadline, const char* op);
// Writes ignore SIGPIPE only where the process has no handler of its own (Gloo's writev cannot
// pass MSG_NOSIGNAL): a peer that dies must raise an error here, not end this process.
void ignore_sigpipe_once();

}  // namespace kiln::dist::net
