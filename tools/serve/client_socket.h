// Whether the client of a request is still connected, for a handler that
// httplib 0.11.4 gives no socket and no such check: only a streamed answer
// has one (DataSink::is_writable); a handler that builds a whole answer runs
// blind to its client. The handler runs on the thread that owns the
// connection, so the connection's socket stays open while it runs and can
// be found among the process's descriptors by its addresses.
#pragma once
#include <string>

namespace dsv4::serve {

// The descriptor of this process's TCP socket connected from
// remote_addr:remote_port to local_addr:local_port, addresses written as
// httplib writes them (getnameinfo's numeric host, IPv4 or IPv6); -1 when
// there is none.
int find_connected_socket(const std::string& remote_addr, int remote_port, const std::string& local_addr,
                          int local_port);

// Whether the peer of the connected socket `fd` has closed its side or the
// connection failed, without waiting or taking any byte: httplib's own
// DataSink::is_writable test, so a whole answer and a stream judge a client
// alike (a client that half-closes after its request counts as gone; one
// that already sent its next request does not).
bool peer_closed(int fd);

}  // namespace dsv4::serve
