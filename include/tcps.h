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
 * socket named by $TCPS_SOCKET, else /run/tcps/tcps.sock. If no server answers, calls fail with ECONNREFUSED
 * (or the errno of the refusal, e.g. EAGAIN when admission control refuses
 * the host); tcps_strerror_last() tells why in words.
 *
 * If the server dies, a call waiting on it fails within a second with
 * ECONNRESET, and later calls fail with ENOTCONN (EPIPE for send).
 *
 * A signal handler that runs while a call waits (accept, recv, a blocking
 * send, connect, tcps_poll, ...) ends the wait: the call fails with EINTR,
 * or returns the bytes it already moved, whatever SA_RESTART says (retry
 * it if you want it restarted). A signal that arrives before the wait
 * began, or a blocked one, interrupts nothing.
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
/* Balancing (`tcps server --balance`): when the TCP server is the
 * bottleneck and this process has idle CPU, the server may hand new
 * connections over as kernel sockets ("direct"). A program that can serve
 * a connection on a kernel socket with ordinary system calls asks for them
 * once, then accepts with tcps_accept_any: it returns a tcps socket
 * (*is_kernel = 0) or a kernel descriptor of this process (*is_kernel =
 * 1; close it with close(2)). Without tcps_take_direct_connections, and
 * with tcps_accept, every connection is a tcps socket. 0 or -1/errno. */
int tcps_take_direct_connections(void);
int tcps_accept_any(int s, struct sockaddr *addr, socklen_t *addrlen, int flags, int *is_kernel);
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
    unsigned long long bytes_sent;     /* bytes the server sent for us (async: when queued) */
    unsigned long long bytes_received; /* bytes the server received for us */
    unsigned long long async_sends;    /* asynchronous sends queued */
    unsigned long long async_fallbacks;/* ... run synchronously (no queue free) */
    unsigned long long kicks;          /* async sends that had to notify the server */
    unsigned long long registered_misuse; /* TCPS_DEBUG_REGISTERED: buffers written in flight */
    /* Appended with process-ahead (protocol version 3): */
    unsigned long long round_trips;    /* calls that waited for a completion */
    unsigned long long ring_recvs;     /* recvs answered from a receive ring (no request) */
    unsigned long long ring_accepts;   /* accepts answered from an accept ring */
    unsigned long long recv_kicks;     /* notifications to resume a ring / start accepting ahead */
};
int tcps_stats(struct tcps_stats *out);

/* ---- Process-ahead: tcps' own socket options ----------------------------
 *
 * The TCP server can work ahead of the application: accept connections on a
 * listener before accept() is called (an accept ring: accept() then takes a
 * connection with no round trip), and receive a connection's bytes before
 * recv() is called (push: into a receive ring the library copies from with
 * no round trip; pull: into a buffer at the server, so recv() is answered
 * at once). Whether it does is a server-wide default (`tcps server
 * --eager-accept --eager-recv --setup-with-accept ...`) that a socket can
 * override with tcps_setsockopt(s, TCPS_SOL_TCPS, name, &int_value, sizeof(int)):
 *
 *   TCPS_OPT_EAGER_RECV         0 off, 1 pull, 2 push. On a listener: what its
 *                               accepted connections get. EBUSY once the
 *                               socket's ring is bound.
 *   TCPS_OPT_EAGER_ACCEPT       on a listener, before listen(): 0 off, else
 *                               the most connections accepted ahead.
 *   TCPS_OPT_SETUP_WITH_ACCEPT  on a listener: 0/1, set up each accepted
 *                               connection's asynchronous send queue and
 *                               receive ring with the accept.
 *   TCPS_OPT_EAGER_RECV_SIZE    bytes read ahead per connection in pull mode.
 *   TCPS_OPT_BALANCE            on a listener: 0/1 (default 1), whether the
 *                               server may hand new connections to the host
 *                               as kernel sockets when it is the bottleneck
 *                               (balancing). Only hosts that take direct
 *                               connections get any: today the preload
 *                               library (tcps run); libtcps keeps every
 *                               connection offloaded.
 *
 * tcps_getsockopt reads them back. Semantics of the calls do not change:
 * O_NONBLOCK, SO_RCVTIMEO, MSG_PEEK/WAITALL/TRUNC/DONTWAIT, end of stream
 * and errors behave as without process-ahead (a ring has no urgent data:
 * MSG_OOB on such a socket is EINVAL).
 */
#define TCPS_SOL_TCPS                0x74637073 /* "tcps" */
#define TCPS_OPT_EAGER_RECV          1
#define TCPS_OPT_EAGER_ACCEPT        2
#define TCPS_OPT_SETUP_WITH_ACCEPT   3
#define TCPS_OPT_EAGER_RECV_SIZE     4
#define TCPS_OPT_BALANCE             5

/* Zero-copy receive from a socket's receive ring (eager receive push):
 * tcps_recv_view waits like tcps_recv (O_NONBLOCK: EAGAIN; SO_RCVTIMEO),
 * then sets *ptr to the first pending bytes and returns how many (at most
 * max; contiguous, so possibly fewer than are pending where the ring
 * wraps); 0 at end of stream; -1/errno on a connection error (once),
 * EOPNOTSUPP if the socket has no receive ring (use tcps_recv). The bytes
 * stay valid and unchanged until tcps_recv_consume(s, n) releases the first
 * n of them (EINVAL if fewer are pending). Nothing is copied. */
ssize_t tcps_recv_view(int s, const void **ptr, size_t max);
int tcps_recv_consume(int s, size_t n);

/* ---- Asynchronous sends and registered memory ----------------------------
 *
 * Registered memory is memory the TCP server maps too: sends from it and
 * receives into it are not copied by the library, and the server's send(2)
 * and recv(2) use it in place. Get it with tcps_alloc_registered(), or
 * register existing page-aligned memory with tcps_register_memory() (the
 * range is moved onto shared memory in place: same addresses, same
 * contents; do not touch it during the call).
 *
 * An asynchronous send returns at once and reports the full length as sent
 * (thesis semantics). A socket has at most TCPS_PIPELINE (the server's
 * --sq-entries, default 64) asynchronous sends in flight: beyond that a
 * blocking socket waits, a non-blocking one (or MSG_DONTWAIT) gets EAGAIN.
 * Nothing is dropped. Sends on one socket go out in order, and a later
 * send, shutdown or close of the socket goes after them (close does not
 * discard them: the server sends them, then closes). The server keeps
 * sending while the application does other things.
 *
 * Errors: if an asynchronous send fails (e.g. the peer reset), the error is
 * returned once by the next call on that socket (send, recv, shutdown or
 * another asynchronous send), later asynchronous sends fail with EPIPE, and
 * the io handle of every send from the failed one on reports it.
 *
 * Memory ownership: the bytes of tcps_send_async() are copied before it
 * returns (into a registered staging pool; TCPS_ASYNC_POOL_KIB, default
 * 16 MiB). The bytes of tcps_send_async_registered() belong to the server
 * until its io handle is done: do not write them before tcps_io_done(io)
 * returns 1 (or tcps_io_wait returns 0). With TCPS_DEBUG_REGISTERED=1 the
 * library checksums each registered send and the server checks it when the
 * send finished: a buffer written in flight is reported on stderr and
 * counted in tcps_stats().registered_misuse. A registration can be ended
 * only when no send from it is in flight (EBUSY otherwise).
 */
typedef unsigned int tcps_mem_t;       /* a registration */
typedef unsigned long long tcps_io_t;  /* one asynchronous send */
#define TCPS_IO_DONE ((tcps_io_t)-1)   /* a send that completed at once */

/* Allocates len bytes (page rounded) of registered memory; NULL/errno on
 * error. Free with tcps_deregister_memory(handle). */
void *tcps_alloc_registered(size_t len, tcps_mem_t *handle);
/* Registers page-aligned [ptr, ptr+len) in place (EINVAL if unaligned). */
int tcps_register_memory(void *ptr, size_t len, tcps_mem_t *handle);
/* Ends a registration: EBUSY while a send from it is in flight. */
int tcps_deregister_memory(tcps_mem_t handle);

/* Copies buf and queues it; returns len. flags: MSG_DONTWAIT, MSG_MORE. */
ssize_t tcps_send_async(int s, const void *buf, size_t len, int flags);
/* Queues len bytes at buf, which must lie in registration mem (EINVAL
 * otherwise); no copy. *io (if io is not NULL) names the send. */
ssize_t tcps_send_async_registered(int s, const void *buf, size_t len, int flags,
                                   tcps_mem_t mem, tcps_io_t *io);
/* Synchronous send/recv straight from/into registered memory (no copy). */
ssize_t tcps_send_registered(int s, const void *buf, size_t len, int flags, tcps_mem_t mem);
ssize_t tcps_recv_registered(int s, void *buf, size_t len, int flags, tcps_mem_t mem);
/* 1 if the send finished, 0 if in flight, -1/errno if it failed. */
int tcps_io_done(tcps_io_t io);
/* Waits for the send: 0, or -1/errno (ETIMEDOUT, or the send's error).
 * timeout_ms < 0 waits forever. */
int tcps_io_wait(tcps_io_t io, int timeout_ms);
/* Waits until every asynchronous send of s finished: 0, or -1/errno. */
int tcps_flush(int s, int timeout_ms);

/* Connection events: a batched event queue over tcps sockets (the
 * host/adapter interface of seed 002 section 3), like epoll without
 * EPOLLET. Readiness comes from host memory (receive and accept rings,
 * send-queue room) and a wait with nothing ready sleeps on the host
 * doorbell: an event loop over sockets with rings makes no round trip.
 * EV_CLOSED and EV_ERROR are always reported. A socket closed meanwhile is
 * reported once with TCPS_EV_ERROR and then forgotten. */
#define TCPS_EV_ACCEPT 1u   /* a listener has a connection to accept */
#define TCPS_EV_DATA   2u   /* bytes to read */
#define TCPS_EV_ROOM   4u   /* room to send */
#define TCPS_EV_CLOSED 8u   /* the peer closed its side */
#define TCPS_EV_ERROR  16u  /* the connection failed */
#define TCPS_EV_ADD 1
#define TCPS_EV_DEL 2
struct tcps_event {
    unsigned int sock;            /* the tcps socket */
    unsigned int events;          /* TCPS_EV_* bits that hold */
    unsigned long long user;      /* the word given to tcps_events_ctl */
};
/* A new event queue: its number (>= 0), or -1/errno. */
int tcps_events_create(void);
/* TCPS_EV_ADD (or change) / TCPS_EV_DEL socket s; events: TCPS_EV_* bits. */
int tcps_events_ctl(int q, int op, int s, unsigned int events, unsigned long long user);
/* Up to max events into ev: how many (0 at the timeout), or -1/errno.
 * timeout_ms < 0 waits forever, 0 only looks. */
int tcps_events_wait(int q, struct tcps_event *ev, int max, int timeout_ms);
int tcps_events_close(int q);

#ifdef __cplusplus
}
#endif

#endif /* TCPS_H */
