// The key-value stores: TCPStore (server and clients in one process), HashStore and PrefixStore
// under one contract; timeouts and unreachable servers raise, bounded in time.
#include <chrono>
#include <thread>

#include "dist/harness.h"

namespace kiln::dist::testing {

namespace {

using std::chrono::milliseconds;
using Clock = std::chrono::steady_clock;

double seconds_since(Clock::time_point t) { return std::chrono::duration<double>(Clock::now() - t).count(); }

// The contract every store keeps; `other` is a second handle on the same keys.
void check_store_contract(Store& s, Store& other) {
  s.set("a", "1");
  EXPECT_EQ(other.get("a"), "1");
  const std::string binary("x\0y\xff", 4);
  s.set("bin", binary);
  EXPECT_EQ(other.get("bin"), binary);
  EXPECT_EQ(s.add("n", 5), 5);
  EXPECT_EQ(other.add("n", -2), 3);
  EXPECT_EQ(s.get("n"), "3");
  // compare_set: swaps only on a match; absent counts as "".
  EXPECT_EQ(s.compare_set("c", "", "first"), "first");
  EXPECT_EQ(other.compare_set("c", "", "second"), "first");
  EXPECT_EQ(other.compare_set("c", "first", "third"), "third");
  EXPECT_TRUE(s.check({"a", "n", "c"}));
  EXPECT_FALSE(s.check({"a", "missing"}));
  const auto got = other.multi_get({"a", "missing", "c"});
  ASSERT_EQ(got.size(), 3u);
  EXPECT_TRUE(got[0].first);
  EXPECT_EQ(got[0].second, "1");
  EXPECT_FALSE(got[1].first);
  EXPECT_EQ(got[2].second, "third");
  EXPECT_TRUE(s.delete_key("a"));
  EXPECT_FALSE(other.delete_key("a"));
  EXPECT_FALSE(s.check({"a"}));
  // A blocking get is answered when another handle sets the key.
  std::thread later([&] {
    std::this_thread::sleep_for(milliseconds(150));
    other.set("late", "here");
  });
  const auto start = Clock::now();
  EXPECT_EQ(s.get("late"), "here");
  EXPECT_GE(seconds_since(start), 0.1);
  later.join();
  // A wait that cannot be met raises TimeoutError at its timeout.
  const auto t0 = Clock::now();
  EXPECT_THROW(s.wait({"late", "never"}, milliseconds(300)), TimeoutError);
  EXPECT_GE(seconds_since(t0), 0.25);
  EXPECT_LT(seconds_since(t0), 2.0);
  // Large values.
  const std::string big(3 << 20, 'z');
  s.set("big", big);
  EXPECT_EQ(other.get("big"), big);
}

}  // namespace

TEST(DistStore, TCPStoreKeepsTheContract) {
  TCPStore server("127.0.0.1", 0, true, std::chrono::seconds(5));
  ASSERT_GT(server.port(), 0);
  TCPStore client("127.0.0.1", server.port(), false, std::chrono::seconds(5));
  check_store_contract(server, client);
  auto clone = client.clone();
  EXPECT_EQ(clone->get("n"), "3");
}

TEST(DistStore, HashStoreKeepsTheContract) {
  HashStore s;
  auto other = s.clone();
  check_store_contract(s, *other);
}

TEST(DistStore, PrefixStoreIsolatesItsKeys) {
  auto base = std::make_shared<HashStore>();
  PrefixStore a("job/a", base), b("job/b", base);
  a.set("k", "from a");
  b.set("k", "from b");
  EXPECT_EQ(a.get("k"), "from a");
  EXPECT_EQ(base->get("job/b/k"), "from b");
  PrefixStore a2("job/a", base->clone());
  check_store_contract(a, a2);
}

TEST(DistStore, GetOfAMissingKeyTimesOut) {
  TCPStore server("127.0.0.1", 0, true, milliseconds(400));
  const auto start = Clock::now();
  try {
    server.get("nobody/sets/this");
    ADD_FAILURE() << "get of a missing key returned";
  } catch (const TimeoutError& e) {
    EXPECT_NE(std::string(e.what()).find("nobody/sets/this"), std::string::npos) << e.what();
  }
  EXPECT_LT(seconds_since(start), 2.0);
}

TEST(DistStore, UnreachableServerRaisesWithinTheTimeout) {
  int port;
  {
    TCPStore probe("127.0.0.1", 0, true);
    port = probe.port();
  }  // closed: nothing listens there now
  const auto start = Clock::now();
  try {
    TCPStore client("127.0.0.1", port, false, milliseconds(500));
    ADD_FAILURE() << "connected to a closed port";
  } catch (const CommError& e) {
    EXPECT_NE(std::string(e.what()).find("could not reach 127.0.0.1:" + std::to_string(port)), std::string::npos)
        << e.what();
  }
  EXPECT_GE(seconds_since(start), 0.45);
  EXPECT_LT(seconds_since(start), 2.0);
  EXPECT_THROW(TCPStore("no-such-host.invalid", 1234, false, milliseconds(300)), CommError);
}

TEST(DistStore, ServerThatWentAwayRaisesPromptly) {
  auto server = std::make_unique<TCPStore>("127.0.0.1", 0, true, std::chrono::seconds(5));
  TCPStore client("127.0.0.1", server->port(), false, std::chrono::seconds(5));
  client.set("x", "1");
  server.reset();
  const auto start = Clock::now();
  EXPECT_THROW(client.get("x"), CommError);
  EXPECT_THROW(client.set("y", "2"), CommError);  // the broken connection stays broken
  EXPECT_LT(seconds_since(start), 2.0);
}

}  // namespace kiln::dist::testing
