// TCPStore: a small key-value server (one poll() thread in the hosting process) and its clients.
// Frames are [u32 length][payload]; a request's payload starts with its command byte, a reply's
// with a status byte. Blocking gets and waits are parked on the server until their keys appear or
// their deadline passes, so no client polls.
#include <fcntl.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cstring>
#include <map>
#include <mutex>
#include <thread>
#include <unordered_map>

#include "dist/socket.h"
#include "kiln/dist.h"

namespace kiln::dist {

namespace {

using net::Clock;
using std::chrono::milliseconds;
constexpr const char* kOp = "TCPStore";

enum Cmd : uint8_t { kSet = 1, kGet, kAdd, kCas, kCheck, kWait, kDelete, kMultiGet };
enum Status : uint8_t { kOk = 0, kMissing, kTimedOut, kBad };
constexpr uint32_t kMaxFrame = 1u << 30;

struct Writer {
  std::string buf = std::string(4, '\0');
  void u8(uint8_t v) { buf.push_back(static_cast<char>(v)); }
  void i64(int64_t v) { buf.append(reinterpret_cast<const char*>(&v), 8); }
  void str(const std::string& s) {
    const auto n = static_cast<uint32_t>(s.size());
    buf.append(reinterpret_cast<const char*>(&n), 4);
    buf += s;
  }
  void strs(const std::vector<std::string>& v) {
    i64(static_cast<int64_t>(v.size()));
    for (const auto& s : v) str(s);
  }
  const std::string& frame() {
    const auto n = static_cast<uint32_t>(buf.size() - 4);
    std::memcpy(buf.data(), &n, 4);
    return buf;
  }
};

struct Reader {
  const char* p;
  const char* end;
  struct Malformed : CommError {
    Malformed() : CommError("[TCPStore] malformed message") {}
  };
  void need(size_t n) const {
    if (static_cast<size_t>(end - p) < n) throw Malformed{};
  }
  uint8_t u8() {
    need(1);
    return static_cast<uint8_t>(*p++);
  }
  int64_t i64() {
    need(8);
    int64_t v;
    std::memcpy(&v, p, 8);
    p += 8;
    return v;
  }
  std::string str() {
    need(4);
    uint32_t n;
    std::memcpy(&n, p, 4);
    p += 4;
    need(n);
    std::string s(p, n);
    p += n;
    return s;
  }
  std::vector<std::string> strs() {
    const int64_t n = i64();
    if (n < 0 || n > (1 << 24)) throw Malformed{};
    std::vector<std::string> v;
    for (int64_t i = 0; i < n; ++i) v.push_back(str());
    return v;
  }
};

int64_t parse_count(const std::string& key, const std::string& v) {
  if (v.empty()) return 0;
  char* end = nullptr;
  const long long x = std::strtoll(v.c_str(), &end, 10);
  if (*end != 0) throw CommError("[TCPStore] add: the value of '" + key + "' is not an integer");
  return x;
}

}  // namespace

// ---- server ----

struct TCPStore::Server {
  net::Socket listener;
  int port = 0;
  int wake[2] = {-1, -1};
  std::atomic<bool> stop{false};
  std::thread thread;

  struct Conn {
    net::Socket sock;
    std::string in;
  };
  struct Waiter {
    int fd;
    std::vector<std::string> keys;
    Clock::time_point deadline;
    bool is_get;
  };
  std::map<int, Conn> conns;
  std::vector<Waiter> waiters;
  std::unordered_map<std::string, std::string> data;

  explicit Server(int want_port) {
    listener = net::listen_tcp(want_port, &port, kOp);
    if (::pipe2(wake, O_CLOEXEC) != 0) throw CommError(std::string("[TCPStore] pipe: ") + std::strerror(errno));
    thread = std::thread([this] { loop(); });
  }
  ~Server() {
    stop = true;
    const char b = 1;
    (void)!::write(wake[1], &b, 1);
    if (thread.joinable()) thread.join();
    ::close(wake[0]);
    ::close(wake[1]);
  }

  // Replies go out with a bound: a client that stopped reading is dropped, never waited on.
  void reply(int fd, Writer& w) {
    try {
      const std::string& f = w.frame();
      net::send_all(fd, f.data(), f.size(), Clock::now() + std::chrono::seconds(10), kOp);
    } catch (const CommError&) {
      ::shutdown(fd, SHUT_RDWR);
    }
  }
  void reply_status(int fd, Status s) {
    Writer w;
    w.u8(s);
    reply(fd, w);
  }
  bool has_all(const std::vector<std::string>& keys) const {
    return std::all_of(keys.begin(), keys.end(), [&](const std::string& k) { return data.count(k) > 0; });
  }
  void answer_waiter(const Waiter& wt) {
    Writer w;
    w.u8(kOk);
    if (wt.is_get) w.str(data.at(wt.keys[0]));
    reply(wt.fd, w);
  }
  // After a write: answer the parked requests whose keys now all exist.
  void wake_waiters() {
    for (size_t i = 0; i < waiters.size();) {
      if (has_all(waiters[i].keys)) {
        answer_waiter(waiters[i]);
        waiters.erase(waiters.begin() + static_cast<std::ptrdiff_t>(i));
      } else {
        ++i;
      }
    }
  }
  void expire_waiters() {
    const auto now = Clock::now();
    for (size_t i = 0; i < waiters.size();) {
      if (waiters[i].deadline <= now) {
        reply_status(waiters[i].fd, kTimedOut);
        waiters.erase(waiters.begin() + static_cast<std::ptrdiff_t>(i));
      } else {
        ++i;
      }
    }
  }
  void park(int fd, std::vector<std::string> keys, int64_t wait_ms, bool is_get) {
    Waiter wt{fd, std::move(keys), Clock::now() + milliseconds(std::max<int64_t>(wait_ms, 0)), is_get};
    if (has_all(wt.keys)) return answer_waiter(wt);
    if (wait_ms <= 0) return reply_status(fd, is_get ? kMissing : kTimedOut);
    waiters.push_back(std::move(wt));
  }

  void handle(int fd, Reader r) {
    Writer w;
    switch (r.u8()) {
      case kSet: {
        std::string k = r.str();
        data[k] = r.str();
        reply_status(fd, kOk);
        return wake_waiters();
      }
      case kGet: {
        std::string k = r.str();
        const int64_t wait_ms = r.i64();
        return park(fd, {std::move(k)}, wait_ms, true);
      }
      case kAdd: {
        const std::string k = r.str();
        const int64_t delta = r.i64();
        int64_t v = 0;
        try {
          v = parse_count(k, data.count(k) ? data[k] : "") + delta;
        } catch (const CommError&) {
          return reply_status(fd, kBad);
        }
        data[k] = std::to_string(v);
        w.u8(kOk);
        w.i64(v);
        reply(fd, w);
        return wake_waiters();
      }
      case kCas: {
        const std::string k = r.str(), expected = r.str(), desired = r.str();
        auto it = data.find(k);
        const std::string current = it == data.end() ? std::string() : it->second;
        const bool swap = current == expected;
        if (swap) data[k] = desired;
        w.u8(kOk);
        w.str(swap ? desired : current);
        reply(fd, w);
        if (swap) wake_waiters();
        return;
      }
      case kCheck: {
        const auto keys = r.strs();
        w.u8(has_all(keys) ? kOk : kMissing);
        return reply(fd, w);
      }
      case kWait: {
        auto keys = r.strs();
        const int64_t wait_ms = r.i64();
        return park(fd, std::move(keys), wait_ms, false);
      }
      case kDelete: {
        const bool erased = data.erase(r.str()) > 0;
        return reply_status(fd, erased ? kOk : kMissing);
      }
      case kMultiGet: {
        const auto keys = r.strs();
        w.u8(kOk);
        for (const auto& k : keys) {
          auto it = data.find(k);
          w.u8(it != data.end());
          w.str(it != data.end() ? it->second : std::string());
        }
        return reply(fd, w);
      }
      default:
        throw Reader::Malformed{};
    }
  }

  void drop(int fd) {
    waiters.erase(std::remove_if(waiters.begin(), waiters.end(), [&](const Waiter& w) { return w.fd == fd; }),
                  waiters.end());
    conns.erase(fd);
  }

  // Reads what arrived on a connection and handles every complete frame; false: drop it.
  bool service(Conn& c) {
    char buf[65536];
    for (;;) {
      const ssize_t rv = ::recv(c.sock.fd(), buf, sizeof(buf), MSG_DONTWAIT);
      if (rv > 0) {
        c.in.append(buf, static_cast<size_t>(rv));
        continue;
      }
      if (rv == 0) return false;
      if (errno == EINTR) continue;
      if (errno == EAGAIN || errno == EWOULDBLOCK) break;
      return false;
    }
    size_t pos = 0;
    while (c.in.size() - pos >= 4) {
      uint32_t n;
      std::memcpy(&n, c.in.data() + pos, 4);
      if (n > kMaxFrame) return false;
      if (c.in.size() - pos - 4 < n) break;
      const char* p = c.in.data() + pos + 4;
      try {
        handle(c.sock.fd(), Reader{p, p + n});
      } catch (const Reader::Malformed&) {
        return false;
      }
      pos += 4 + n;
    }
    c.in.erase(0, pos);
    return true;
  }

  void loop() {
    while (!stop) {
      std::vector<pollfd> fds{{wake[0], POLLIN, 0}, {listener.fd(), POLLIN, 0}};
      for (auto& [fd, c] : conns) fds.push_back({fd, POLLIN, 0});
      int wait_ms = 1000;
      const auto now = Clock::now();
      for (const auto& w : waiters)
        wait_ms = std::min<int>(wait_ms, static_cast<int>(std::max<int64_t>(
                                             0, std::chrono::duration_cast<milliseconds>(w.deadline - now).count() + 1)));
      const int rv = ::poll(fds.data(), fds.size(), wait_ms);
      if (stop) break;
      if (rv > 0) {
        if (fds[1].revents & POLLIN) {
          const int fd = ::accept4(listener.fd(), nullptr, nullptr, SOCK_NONBLOCK | SOCK_CLOEXEC);
          if (fd >= 0) conns[fd].sock = net::Socket(fd);
        }
        for (size_t i = 2; i < fds.size(); ++i) {
          if (!fds[i].revents) continue;
          auto it = conns.find(fds[i].fd);
          if (it != conns.end() && !service(it->second)) drop(fds[i].fd);
        }
      }
      expire_waiters();
    }
  }
};

// ---- client ----

struct TCPStore::Client {
  std::mutex mu;
  net::Socket sock;
  std::string host;
  int port;
  std::string broken;  // why the connection is unusable ("" while it is fine)

  Client(std::string h, int p, milliseconds timeout) : host(std::move(h)), port(p) {
    net::ignore_sigpipe_once();
    sock = net::connect_tcp(host, port, Clock::now() + timeout, kOp);
  }

  // One request and its reply; `wait` is how long the server may park it.
  std::string call(Writer& w, milliseconds wait, milliseconds timeout) {
    std::lock_guard<std::mutex> lock(mu);
    if (!broken.empty()) throw CommError("[TCPStore] the connection to " + where() + " was lost: " + broken);
    const auto deadline = Clock::now() + std::max(wait, milliseconds(0)) + timeout;
    try {
      const std::string& f = w.frame();
      net::send_all(sock.fd(), f.data(), f.size(), deadline, kOp);
      uint32_t n = 0;
      net::recv_all(sock.fd(), &n, 4, deadline, kOp);
      if (n == 0 || n > kMaxFrame) throw CommError("[TCPStore] malformed reply");
      std::string payload(n, '\0');
      net::recv_all(sock.fd(), payload.data(), n, deadline, kOp);
      return payload;
    } catch (const CommError& e) {
      broken = e.what();
      sock.reset();
      throw CommError("[TCPStore] " + where() + ": " + e.what());
    }
  }
  std::string where() const { return host + ":" + std::to_string(port); }
};

TCPStore::TCPStore(std::string host, int port, bool is_server, milliseconds timeout)
    : host_(std::move(host)), port_(port) {
  KILN_CHECK(port >= 0 && port <= 65535, kOp, "port ", port, " out of range");
  KILN_CHECK(is_server || port > 0, kOp, "a client needs the server's port");
  timeout_ = timeout;
  if (is_server) {
    server_ = std::make_shared<Server>(port);
    port_ = server_->port;
  }
  client_ = std::make_unique<Client>(host_, port_, timeout);
}

TCPStore::~TCPStore() {
  client_.reset();
  server_.reset();
}

std::shared_ptr<Store> TCPStore::clone() const {
  // A client of the same server; it keeps the server (if hosted here) alive as long as it lives.
  auto c = std::make_shared<TCPStore>(host_, port_, false, timeout_);
  c->server_ = server_;
  return c;
}

namespace {

Status status_of(const std::string& reply) { return static_cast<Status>(static_cast<uint8_t>(reply.at(0))); }

Reader body_of(const std::string& reply) { return Reader{reply.data() + 1, reply.data() + reply.size()}; }

[[noreturn]] void wait_timed_out(const std::vector<std::string>& keys, milliseconds t) {
  std::string list;
  for (const auto& k : keys) list += (list.empty() ? "'" : ", '") + k + "'";
  throw TimeoutError("[TCPStore] wait for " + list + " timed out after " + std::to_string(t.count()) + " ms");
}

}  // namespace

void TCPStore::set(const std::string& key, const std::string& value) {
  Writer w;
  w.u8(kSet);
  w.str(key);
  w.str(value);
  client_->call(w, milliseconds(0), timeout_);
}

std::string TCPStore::get(const std::string& key) {
  Writer w;
  w.u8(kGet);
  w.str(key);
  w.i64(timeout_.count());
  const std::string r = client_->call(w, timeout_, timeout_);
  if (status_of(r) != kOk) wait_timed_out({key}, timeout_);
  return body_of(r).str();
}

int64_t TCPStore::add(const std::string& key, int64_t delta) {
  Writer w;
  w.u8(kAdd);
  w.str(key);
  w.i64(delta);
  const std::string r = client_->call(w, milliseconds(0), timeout_);
  if (status_of(r) != kOk) throw CommError("[TCPStore] add: the value of '" + key + "' is not an integer");
  return body_of(r).i64();
}

std::string TCPStore::compare_set(const std::string& key, const std::string& expected, const std::string& desired) {
  Writer w;
  w.u8(kCas);
  w.str(key);
  w.str(expected);
  w.str(desired);
  return body_of(client_->call(w, milliseconds(0), timeout_)).str();
}

bool TCPStore::check(const std::vector<std::string>& keys) {
  Writer w;
  w.u8(kCheck);
  w.strs(keys);
  return status_of(client_->call(w, milliseconds(0), timeout_)) == kOk;
}

void TCPStore::wait(const std::vector<std::string>& keys, milliseconds timeout) {
  Writer w;
  w.u8(kWait);
  w.strs(keys);
  w.i64(timeout.count());
  if (status_of(client_->call(w, timeout, timeout_)) != kOk) wait_timed_out(keys, timeout);
}

bool TCPStore::delete_key(const std::string& key) {
  Writer w;
  w.u8(kDelete);
  w.str(key);
  return status_of(client_->call(w, milliseconds(0), timeout_)) == kOk;
}

std::vector<std::pair<bool, std::string>> TCPStore::multi_get(const std::vector<std::string>& keys) {
  Writer w;
  w.u8(kMultiGet);
  w.strs(keys);
  const std::string r = client_->call(w, milliseconds(0), timeout_);
  Reader rd = body_of(r);
  std::vector<std::pair<bool, std::string>> out;
  for (size_t i = 0; i < keys.size(); ++i) {
    const bool found = rd.u8() != 0;
    out.emplace_back(found, rd.str());
  }
  return out;
}

}  // namespace kiln::dist
