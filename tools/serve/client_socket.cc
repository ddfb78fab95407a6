#include "serve/client_socket.h"

#include <arpa/inet.h>
#include <dirent.h>
#include <netdb.h>
#include <poll.h>
#include <sys/socket.h>

#include <cerrno>
#include <cstdlib>

namespace dsv4::serve {

namespace {

// Compared as text, through the very call httplib fills Request's addresses
// with, so that every spelling (an IPv6 scope, an IPv4-mapped address)
// matches itself.
bool address_is(const sockaddr_storage& a, socklen_t len, const std::string& host, int port) {
  in_port_t p;
  if (a.ss_family == AF_INET)
    p = reinterpret_cast<const sockaddr_in&>(a).sin_port;
  else if (a.ss_family == AF_INET6)
    p = reinterpret_cast<const sockaddr_in6&>(a).sin6_port;
  else
    return false;
  if (ntohs(p) != port) return false;
  char name[NI_MAXHOST];
  return getnameinfo(reinterpret_cast<const sockaddr*>(&a), len, name, sizeof name, nullptr, 0, NI_NUMERICHOST) == 0 &&
         host == name;
}

bool connects(int fd, const std::string& remote_addr, int remote_port, const std::string& local_addr,
              int local_port) {
  sockaddr_storage a = {};
  socklen_t len = sizeof a;
  // The peer first: every connection of the server shares its local address.
  if (getpeername(fd, reinterpret_cast<sockaddr*>(&a), &len) != 0 || !address_is(a, len, remote_addr, remote_port))
    return false;
  len = sizeof a;
  return getsockname(fd, reinterpret_cast<sockaddr*>(&a), &len) == 0 && address_is(a, len, local_addr, local_port);
}

}  // namespace

int find_connected_socket(const std::string& remote_addr, int remote_port, const std::string& local_addr,
                          int local_port) {
  if (remote_port < 0 || local_port < 0) return -1;
  DIR* dir = opendir("/proc/self/fd");
  if (!dir) return -1;
  int found = -1;
  while (const dirent* e = readdir(dir)) {
    char* end = nullptr;
    const long fd = std::strtol(e->d_name, &end, 10);
    if (end == e->d_name || *end != '\0' || fd == dirfd(dir)) continue;
    if (connects(int(fd), remote_addr, remote_port, local_addr, local_port)) {
      found = int(fd);
      break;
    }
  }
  closedir(dir);
  return found;
}

bool peer_closed(int fd) {
  pollfd p = {fd, POLLIN | POLLRDHUP, 0};
  int n;
  do n = poll(&p, 1, 0);
  while (n < 0 && errno == EINTR);
  if (n <= 0) return false;  // nothing to read, or no answer: as before, the client is assumed there
  if (p.revents & (POLLERR | POLLHUP)) return true;
  if (!(p.revents & (POLLIN | POLLRDHUP))) return false;
  // Readable: the end of its data (0), a reset, or its next request (kept for httplib).
  char c;
  const ssize_t r = recv(fd, &c, 1, MSG_PEEK | MSG_DONTWAIT);
  return r == 0 || (r < 0 && errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR);
}

}  // namespace dsv4::serve
