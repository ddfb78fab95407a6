// The server's view of a request's client (tools/serve/client_socket.h): the
// accepted socket is found by the addresses httplib writes in a Request
// (IPv4 and IPv6), and a client that closes, half-closes or resets its
// connection is seen as gone, while one that is idle or has sent its next
// request is not.
#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <gtest/gtest.h>

#include <chrono>
#include <cstring>
#include <string>
#include <thread>

#include "serve/client_socket.h"

namespace dsv4::serve {
namespace {

// A loopback TCP connection: the client's socket, the server's accepted one,
// and each side's port. Closes what is still open when it goes.
struct Loopback {
  int listener = -1, client = -1, server = -1;
  int client_port = -1, server_port = -1;

  explicit Loopback(int family) {
    sockaddr_storage a = {};
    socklen_t len;
    if (family == AF_INET) {
      auto& v4 = reinterpret_cast<sockaddr_in&>(a);
      v4.sin_family = AF_INET;
      v4.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
      len = sizeof v4;
    } else {
      auto& v6 = reinterpret_cast<sockaddr_in6&>(a);
      v6.sin6_family = AF_INET6;
      v6.sin6_addr = in6addr_loopback;
      len = sizeof v6;
    }
    listener = socket(family, SOCK_STREAM, 0);
    if (listener < 0 || bind(listener, reinterpret_cast<sockaddr*>(&a), len) != 0 || listen(listener, 4) != 0) return;
    getsockname(listener, reinterpret_cast<sockaddr*>(&a), &len);
    client = socket(family, SOCK_STREAM, 0);
    if (connect(client, reinterpret_cast<sockaddr*>(&a), len) != 0) return;
    server = accept(listener, nullptr, nullptr);
    server_port = port_of(listener, getsockname);
    client_port = port_of(client, getsockname);
  }
  ~Loopback() {
    for (int fd : {listener, client, server})
      if (fd >= 0) close(fd);
  }
  bool ok() const { return server >= 0; }

  static int port_of(int fd, int (*get)(int, sockaddr*, socklen_t*)) {
    sockaddr_storage a = {};
    socklen_t len = sizeof a;
    get(fd, reinterpret_cast<sockaddr*>(&a), &len);
    return ntohs(a.ss_family == AF_INET ? reinterpret_cast<sockaddr_in&>(a).sin_port
                                        : reinterpret_cast<sockaddr_in6&>(a).sin6_port);
  }
};

// The FIN or RST crosses loopback at once; a second is room for a loaded machine.
bool seen_closed_within_a_second(int fd) {
  const auto end = std::chrono::steady_clock::now() + std::chrono::seconds(1);
  while (!peer_closed(fd))
    if (std::chrono::steady_clock::now() > end) return false;
    else std::this_thread::sleep_for(std::chrono::milliseconds(5));
  return true;
}

TEST(ServeClientSocket, FindsTheAcceptedSocketByItsAddresses) {
  Loopback c(AF_INET);
  ASSERT_TRUE(c.ok()) << std::strerror(errno);
  EXPECT_EQ(find_connected_socket("127.0.0.1", c.client_port, "127.0.0.1", c.server_port), c.server);
  // The client's own socket has the same addresses the other way round.
  EXPECT_EQ(find_connected_socket("127.0.0.1", c.server_port, "127.0.0.1", c.client_port), c.client);
  EXPECT_EQ(find_connected_socket("127.0.0.1", c.client_port + 1, "127.0.0.1", c.server_port), -1);
  EXPECT_EQ(find_connected_socket("127.0.0.2", c.client_port, "127.0.0.1", c.server_port), -1);
  EXPECT_EQ(find_connected_socket("127.0.0.1", c.client_port, "", -1), -1);
}

TEST(ServeClientSocket, FindsAnIPv6Socket) {
  Loopback c(AF_INET6);
  if (!c.ok()) GTEST_SKIP() << "no IPv6 loopback here: " << std::strerror(errno);
  EXPECT_EQ(find_connected_socket("::1", c.client_port, "::1", c.server_port), c.server);
  EXPECT_EQ(find_connected_socket("127.0.0.1", c.client_port, "127.0.0.1", c.server_port), -1);
}

TEST(ServeClientSocket, AnIdleClientOrOneWithItsNextRequestIsThere) {
  Loopback c(AF_INET);
  ASSERT_TRUE(c.ok()) << std::strerror(errno);
  EXPECT_FALSE(peer_closed(c.server));
  ASSERT_EQ(write(c.client, "GET / HTTP/1.1\r\n", 16), 16);
  std::this_thread::sleep_for(std::chrono::milliseconds(20));
  EXPECT_FALSE(peer_closed(c.server));
  char buf[16];
  EXPECT_EQ(read(c.server, buf, sizeof buf), 16) << "the check took no byte";
}

TEST(ServeClientSocket, AClientThatClosesIsGone) {
  Loopback c(AF_INET);
  ASSERT_TRUE(c.ok()) << std::strerror(errno);
  close(c.client);
  c.client = -1;
  EXPECT_TRUE(seen_closed_within_a_second(c.server));
}

TEST(ServeClientSocket, AClientThatHalfClosesIsGone) {
  Loopback c(AF_INET);
  ASSERT_TRUE(c.ok()) << std::strerror(errno);
  shutdown(c.client, SHUT_WR);
  EXPECT_TRUE(seen_closed_within_a_second(c.server));
}

TEST(ServeClientSocket, AClientThatResetsIsGone) {
  Loopback c(AF_INET);
  ASSERT_TRUE(c.ok()) << std::strerror(errno);
  const linger reset = {1, 0};  // close() sends RST instead of FIN
  setsockopt(c.client, SOL_SOCKET, SO_LINGER, &reset, sizeof reset);
  close(c.client);
  c.client = -1;
  EXPECT_TRUE(seen_closed_within_a_second(c.server));
}

}  // namespace
}  // namespace dsv4::serve
