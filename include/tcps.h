/*
 * tcps.h — the native tcps socket API (libtcps.so).
 *
 * Socket calls made through these functions are executed by a tcps TCP
 * server (`tcps server`) on real kernel TCP sockets; the host process only
 * writes requests into shared memory and reads completions back. In steady
 * state with a polling server no call makes a system call on the host.
 *
 * Semantics are BSD sockets: a call returns -1 and sets errno on error, and
 * errno is the errno the call got at the TCP server. Socket descriptors
 * returned here are tcps descriptors: small non-negative integers valid only
 * for tcps_* calls (they are not kernel file descriptors; do not pass them to
 * read(2), close(2) or poll(2)). An unknown descriptor gives EBADF.
 *
 * The library attaches to the TCP server on the first call, at the control
 * socket named by $TCPS_SOCKET, else $XDG_RUNTIME_DIR/tcps.sock, else
 * /run/tcps/tcps.sock. If no server answers, calls fail with ECONNREFUSED
 * (or the errno of the refusal, e.g. EAGAIN when admission control refuses
 * the host); tcps_strerror_last() tells why in words.
 *
 * If the server dies, a call waiting on it fails within a second with
 * ECONNRESET, and later calls fail with ENOTCONN (EPIPE for send).
 *
 * All functions are thread-safe.
 *
 * Waiting for the server: a call spins briefly (no system call) when the
 * server polls on cores of its own (`tcps server --cpus`), else it sleeps on
 * a futex at once and the server wakes it. Environment:
 *   TCPS_SOCKET    control socket of the server (see above)
 *   TCPS_SPIN_US   longest spin in microseconds (default 50 with a dedicated
 *                  server, 0 otherwise); the budget adapts below it
 *   TCPS_SPINNERS  how many threads of the process may spin at once (1)
 */
#ifndef TCPS_H
#define TCPS_H

#include <poll.h>
#include <stddef.h>
#include <sys/socket.h>
#include <sys/types.h>

#ifdef __cplusplus
extern "C" {
#endif

/* Attaches explicitly to the server at `path` (NULL: the default lookup
 * above). Optional: every call attaches on demand. Returns 0 or -1/errno. */
int tcps_attach(const char *path);
/* Detaches: closes every socket of this process at the server. */
void tcps_detach(void);
/* A description of the last attach failure in this process ("" if none). */
const char *tcps_strerror_last(void);

int tcps_socket(int domain, int type, int protocol);
int tcps_bind(int s, const struct sockaddr *addr, socklen_t addrlen);
int tcps_listen(int s, int backlog);
int tcps_accept(int s, struct sockaddr *addr, socklen_t *addrlen);
/* flags: SOCK_NONBLOCK (SOCK_CLOEXEC is accepted and ignored). */
int tcps_accept4(int s, struct sockaddr *addr, socklen_t *addrlen, int flags);
int tcps_connect(int s, const struct sockaddr *addr, socklen_t addrlen);
/* A blocking send sends everything (in chunks as large as the channel's
 * data arena); a non-blocking one may send less, or fail with EAGAIN. */
ssize_t tcps_send(int s, const void *buf, size_t len, int flags);
ssize_t tcps_recv(int s, void *buf, size_t len, int flags);
int tcps_shutdown(int s, int how);
int tcps_close(int s);
int tcps_setsockopt(int s, int level, int name, const void *value, socklen_t len);
int tcps_getsockopt(int s, int level, int name, void *value, socklen_t *len);
int tcps_getsockname(int s, struct sockaddr *addr, socklen_t *addrlen);
int tcps_getpeername(int s, struct sockaddr *addr, socklen_t *addrlen);
/* Like poll(2) over tcps descriptors (fds[i].fd are tcps sockets; a
 * negative fd is ignored). timeout_ms < 0 waits forever. */
int tcps_poll(struct pollfd *fds, nfds_t nfds, int timeout_ms);
/* F_GETFL and F_SETFL (O_NONBLOCK). `arg` is ignored for F_GETFL. */
int tcps_fcntl(int s, int cmd, long arg);

/* Counters of this process's attachment (all zero before it attaches).
 * bytes_copied / (bytes_sent + bytes_received) is the host's memory traffic
 * per network byte: about 1 for the copying calls above. */
struct tcps_stats {
    unsigned long long calls;          /* request/completion exchanges */
    unsigned long long doorbells;      /* times the server had to be woken */
    unsigned long long sleeps;         /* futex sleeps while waiting */
    unsigned long long bytes_copied;   /* bytes the library copied */
    unsigned long long bytes_sent;     /* bytes the server sent for us */
    unsigned long long bytes_received; /* bytes the server received for us */
};
int tcps_stats(struct tcps_stats *out);

#ifdef __cplusplus
}
#endif

#endif /* TCPS_H */
