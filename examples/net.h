/*
 * net.h — the network switch of the example programs.
 *
 * Every network call of the examples goes through a `struct net_ops`, so
 * the same binary runs on kernel sockets (`kernel_ops`) or through a tcps
 * TCP server (`tcps_ops`, tcps.h). Later variants (asynchronous sends,
 * registered buffers) are added here, in one place.
 */
#ifndef TCPS_EXAMPLES_NET_H
#define TCPS_EXAMPLES_NET_H

#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include "tcps.h"

struct net_ops {
    const char *name;
    int (*socket)(int domain, int type, int protocol);
    int (*bind)(int s, const struct sockaddr *addr, socklen_t len);
    int (*listen)(int s, int backlog);
    int (*accept)(int s, struct sockaddr *addr, socklen_t *len);
    int (*connect)(int s, const struct sockaddr *addr, socklen_t len);
    ssize_t (*send)(int s, const void *buf, size_t len, int flags);
    ssize_t (*recv)(int s, void *buf, size_t len, int flags);
    int (*close)(int s);
    int (*setsockopt)(int s, int level, int name, const void *val, socklen_t len);
    int (*shutdown)(int s, int how);
    int (*getsockname)(int s, struct sockaddr *addr, socklen_t *len);
};

static inline int k_socket(int d, int t, int p) { return socket(d, t, p); }
static inline int k_bind(int s, const struct sockaddr *a, socklen_t l) { return bind(s, a, l); }
static inline int k_listen(int s, int b) { return listen(s, b); }
static inline int k_accept(int s, struct sockaddr *a, socklen_t *l) { return accept(s, a, l); }
static inline int k_connect(int s, const struct sockaddr *a, socklen_t l) { return connect(s, a, l); }
/* MSG_NOSIGNAL: a peer reset is an EPIPE, not a SIGPIPE, as through tcps. */
static inline ssize_t k_send(int s, const void *b, size_t n, int f)
{
    return send(s, b, n, f | MSG_NOSIGNAL);
}
static inline ssize_t k_recv(int s, void *b, size_t n, int f) { return recv(s, b, n, f); }
static inline int k_close(int s) { return close(s); }
static inline int k_setsockopt(int s, int lv, int nm, const void *v, socklen_t l)
{
    return setsockopt(s, lv, nm, v, l);
}
static inline int k_shutdown(int s, int how) { return shutdown(s, how); }
static inline int k_getsockname(int s, struct sockaddr *a, socklen_t *l)
{
    return getsockname(s, a, l);
}

static const struct net_ops kernel_ops = {
    .name = "kernel",
    .socket = k_socket,
    .bind = k_bind,
    .listen = k_listen,
    .accept = k_accept,
    .connect = k_connect,
    .send = k_send,
    .recv = k_recv,
    .close = k_close,
    .setsockopt = k_setsockopt,
    .shutdown = k_shutdown,
    .getsockname = k_getsockname,
};

static const struct net_ops tcps_ops = {
    .name = "tcps",
    .socket = tcps_socket,
    .bind = tcps_bind,
    .listen = tcps_listen,
    .accept = tcps_accept,
    .connect = tcps_connect,
    .send = tcps_send,
    .recv = tcps_recv,
    .close = tcps_close,
    .setsockopt = tcps_setsockopt,
    .shutdown = tcps_shutdown,
    .getsockname = tcps_getsockname,
};

/* The ops named by a --net argument ("kernel" or "tcps"), or NULL. */
static inline const struct net_ops *net_ops_by_name(const char *name)
{
    if (strcmp(name, "kernel") == 0)
        return &kernel_ops;
    if (strcmp(name, "tcps") == 0)
        return &tcps_ops;
    return NULL;
}

#endif
