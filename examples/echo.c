/*
 * echo.c — a small echo server and client, on kernel sockets or through tcps.
 *
 *   echo --net kernel|tcps [--addr A] --port P          server: echoes every
 *                                                        connection (a thread each)
 *   echo --net kernel|tcps --connect HOST:PORT --bytes N client: sends N pseudo-
 *                                                        random bytes, reads them
 *                                                        back, compares
 *
 * The client exits 0 only if every byte came back unchanged. It works in lock
 * step (send a chunk, read the chunk back) so it never deadlocks on full
 * buffers and never has a send and a recv outstanding on one socket at once.
 *
 * Build: see the top-level Makefile (`make examples`).
 */
#define _GNU_SOURCE
#include <arpa/inet.h>
#include <errno.h>
#include <getopt.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <pthread.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#include "net.h"

static const struct net_ops *net = &kernel_ops;
static const char *opt_addr = "0.0.0.0";
static int opt_port = 7007;
static const char *opt_connect = NULL;
static unsigned long long opt_bytes = 1 << 20;
static size_t opt_chunk = 16384;
static unsigned long opt_repeat = 1;
static unsigned long long opt_seed = 1;
static int opt_quiet = 0;

static void usage(FILE *f)
{
    fprintf(f, "usage: echo [--net kernel|tcps] [--addr A] [--port P] [--quiet]      (server)\n"
               "       echo [--net kernel|tcps] --connect HOST:PORT [--bytes N]\n"
               "            [--chunk C] [--repeat K] [--seed S]                    (client)\n"
               "\n"
               "server: echoes back everything each connection sends (one thread per\n"
               "        connection); prints 'listening on ADDR:PORT (net=...)' to stderr.\n"
               "        Defaults: --addr 0.0.0.0 --port 7007 (0 picks a free port).\n"
               "client: sends N pseudo-random bytes (default 1048576) in chunks of C\n"
               "        (default 16384), reads each chunk back and compares; K connections\n"
               "        one after another (default 1). Exits 0 only if all bytes match.\n"
               "--net tcps goes through the tcps TCP server at $TCPS_SOCKET.\n");
}

static unsigned long long parse_u(const char *opt, const char *s, unsigned long long min,
                                  unsigned long long max)
{
    char *end;
    errno = 0;
    unsigned long long v = strtoull(s, &end, 10);
    if (errno || end == s || *end || *s == '-' || v < min || v > max) {
        fprintf(stderr, "echo: invalid %s '%s' (expected %llu..%llu)\n", opt, s, min, max);
        exit(2);
    }
    return v;
}

/* Splits "HOST:PORT" / "[V6]:PORT" and resolves it (passive if host empty). */
static int resolve(const char *host, const char *port, int passive, struct sockaddr_storage *ss,
                   socklen_t *len)
{
    struct addrinfo hints, *res;
    memset(&hints, 0, sizeof hints);
    hints.ai_family = AF_UNSPEC;
    hints.ai_socktype = SOCK_STREAM;
    hints.ai_flags = passive ? AI_PASSIVE : 0;
    int rc = getaddrinfo(host, port, &hints, &res);
    if (rc != 0) {
        fprintf(stderr, "echo: %s:%s: %s\n", host ? host : "*", port, gai_strerror(rc));
        return -1;
    }
    memcpy(ss, res->ai_addr, res->ai_addrlen);
    *len = res->ai_addrlen;
    freeaddrinfo(res);
    return 0;
}

static void strip_brackets(const char *in, size_t n, char *out, size_t cap)
{
    if (n >= 2 && in[0] == '[' && in[n - 1] == ']') {
        in++;
        n -= 2;
    }
    if (n >= cap)
        n = cap - 1;
    memcpy(out, in, n);
    out[n] = 0;
}

static void format_addr(const struct sockaddr_storage *ss, char *out, size_t cap)
{
    char ip[INET6_ADDRSTRLEN] = "?";
    if (ss->ss_family == AF_INET6) {
        const struct sockaddr_in6 *a = (const struct sockaddr_in6 *)ss;
        inet_ntop(AF_INET6, &a->sin6_addr, ip, sizeof ip);
        snprintf(out, cap, "[%s]:%u", ip, ntohs(a->sin6_port));
    } else {
        const struct sockaddr_in *a = (const struct sockaddr_in *)ss;
        inet_ntop(AF_INET, &a->sin_addr, ip, sizeof ip);
        snprintf(out, cap, "%s:%u", ip, ntohs(a->sin_port));
    }
}

static int send_all(int s, const unsigned char *p, size_t len)
{
    while (len > 0) {
        ssize_t n = net->send(s, p, len, 0);
        if (n < 0 && errno == EINTR)
            continue;
        if (n <= 0)
            return -1;
        p += n;
        len -= (size_t)n;
    }
    return 0;
}

/* ---- server ---- */

static void *echo_conn(void *arg)
{
    int s = (int)(intptr_t)arg;
    unsigned char *buf = malloc(65536);
    if (buf) {
        for (;;) {
            ssize_t n = net->recv(s, buf, 65536, 0);
            if (n < 0 && errno == EINTR)
                continue;
            if (n <= 0)
                break;
            if (send_all(s, buf, (size_t)n) < 0)
                break;
        }
    }
    free(buf);
    net->close(s);
    return NULL;
}

static int run_server(void)
{
    char host[256];
    char port[16];
    strip_brackets(opt_addr, strlen(opt_addr), host, sizeof host);
    snprintf(port, sizeof port, "%d", opt_port);
    struct sockaddr_storage ss;
    socklen_t sl;
    if (resolve(host, port, 1, &ss, &sl) != 0)
        return 1;
    int ls = net->socket(ss.ss_family, SOCK_STREAM, 0);
    if (ls < 0) {
        fprintf(stderr, "echo: socket: %s\n", strerror(errno));
        return 1;
    }
    int one = 1;
    net->setsockopt(ls, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
    if (net->bind(ls, (struct sockaddr *)&ss, sl) != 0 || net->listen(ls, 1024) != 0) {
        fprintf(stderr, "echo: bind/listen %s:%s: %s\n", host, port, strerror(errno));
        return 1;
    }
    char where[INET6_ADDRSTRLEN + 16];
    struct sockaddr_storage b;
    socklen_t bl = sizeof b;
    if (net->getsockname(ls, (struct sockaddr *)&b, &bl) == 0 && b.ss_family == ss.ss_family)
        format_addr(&b, where, sizeof where);
    else
        format_addr(&ss, where, sizeof where);
    fprintf(stderr, "listening on %s (net=%s)\n", where, net->name);
    fflush(stderr);

    pthread_attr_t attr;
    pthread_attr_init(&attr);
    pthread_attr_setdetachstate(&attr, PTHREAD_CREATE_DETACHED);
    pthread_attr_setstacksize(&attr, 256 * 1024);
    for (;;) {
        int s = net->accept(ls, NULL, NULL);
        if (s < 0) {
            int e = errno;
            if (e == EINTR || e == ECONNABORTED || e == EMFILE || e == ENFILE || e == ENOBUFS ||
                e == ENOMEM || e == EAGAIN) {
                struct timespec ts = {0, 10 * 1000 * 1000};
                nanosleep(&ts, NULL);
                continue;
            }
            fprintf(stderr, "echo: accept: %s\n", strerror(e));
            return 1;
        }
        pthread_t t;
        if (pthread_create(&t, &attr, echo_conn, (void *)(intptr_t)s) != 0) {
            if (!opt_quiet)
                fprintf(stderr, "echo: pthread_create failed; dropping a connection\n");
            net->close(s);
        }
    }
}

/* ---- client ---- */

static uint64_t xorshift(uint64_t *st)
{
    uint64_t x = *st;
    x ^= x << 13;
    x ^= x >> 7;
    x ^= x << 17;
    return *st = x;
}

static int run_client_once(const struct sockaddr_storage *ss, socklen_t sl, unsigned long iter,
                           unsigned char *out, unsigned char *in)
{
    int s = net->socket(ss->ss_family, SOCK_STREAM, 0);
    if (s < 0) {
        fprintf(stderr, "echo: socket: %s\n", strerror(errno));
        return -1;
    }
    if (net->connect(s, (const struct sockaddr *)ss, sl) != 0) {
        fprintf(stderr, "echo: connect %s: %s\n", opt_connect, strerror(errno));
        net->close(s);
        return -1;
    }
    int one = 1;
    net->setsockopt(s, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
    uint64_t st = (opt_seed * 0x9E3779B97F4A7C15ull) ^ (iter + 1) ^ 0x5DEECE66Dull;
    if (st == 0)
        st = 1;
    unsigned long long done = 0;
    while (done < opt_bytes) {
        size_t chunk = opt_bytes - done < opt_chunk ? (size_t)(opt_bytes - done) : opt_chunk;
        for (size_t i = 0; i < chunk; i++)
            out[i] = (unsigned char)(xorshift(&st) >> 24);
        if (send_all(s, out, chunk) < 0) {
            fprintf(stderr, "echo: send: %s\n", strerror(errno));
            net->close(s);
            return -1;
        }
        size_t got = 0;
        while (got < chunk) {
            ssize_t n = net->recv(s, in + got, chunk - got, 0);
            if (n < 0 && errno == EINTR)
                continue;
            if (n <= 0) {
                fprintf(stderr, "echo: recv after %llu bytes: %s\n", done + got,
                        n == 0 ? "connection closed" : strerror(errno));
                net->close(s);
                return -1;
            }
            got += (size_t)n;
        }
        if (memcmp(out, in, chunk) != 0) {
            size_t i = 0;
            while (out[i] == in[i])
                i++;
            fprintf(stderr, "echo: MISMATCH at byte %llu: sent 0x%02x, got 0x%02x\n", done + i,
                    out[i], in[i]);
            net->close(s);
            return -1;
        }
        done += chunk;
    }
    net->shutdown(s, SHUT_WR);
    net->close(s);
    return 0;
}

static int run_client(void)
{
    const char *colon = strrchr(opt_connect, ':');
    if (!colon || colon == opt_connect || !colon[1]) {
        fprintf(stderr, "echo: --connect expects HOST:PORT, got '%s'\n", opt_connect);
        return 2;
    }
    char host[256];
    strip_brackets(opt_connect, (size_t)(colon - opt_connect), host, sizeof host);
    struct sockaddr_storage ss;
    socklen_t sl;
    if (resolve(host, colon + 1, 0, &ss, &sl) != 0)
        return 1;
    unsigned char *out = malloc(opt_chunk), *in = malloc(opt_chunk);
    if (!out || !in) {
        fprintf(stderr, "echo: out of memory\n");
        return 1;
    }
    struct timespec t0, t1;
    clock_gettime(CLOCK_MONOTONIC, &t0);
    for (unsigned long i = 0; i < opt_repeat; i++)
        if (run_client_once(&ss, sl, i, out, in) != 0)
            return 1;
    clock_gettime(CLOCK_MONOTONIC, &t1);
    double secs = (double)(t1.tv_sec - t0.tv_sec) + (double)(t1.tv_nsec - t0.tv_nsec) / 1e9;
    if (!opt_quiet)
        fprintf(stderr, "echo: %lu x %llu bytes echoed intact in %.3f s (%.1f MB/s, net=%s)\n",
                opt_repeat, opt_bytes, secs,
                secs > 0 ? (double)opt_bytes * (double)opt_repeat / secs / 1e6 : 0.0, net->name);
    free(out);
    free(in);
    return 0;
}

int main(int argc, char **argv)
{
    enum { O_NET = 256, O_ADDR, O_PORT, O_CONNECT, O_BYTES, O_CHUNK, O_REPEAT, O_SEED, O_QUIET };
    static const struct option longopts[] = {
        {"net", required_argument, NULL, O_NET},
        {"addr", required_argument, NULL, O_ADDR},
        {"port", required_argument, NULL, O_PORT},
        {"connect", required_argument, NULL, O_CONNECT},
        {"bytes", required_argument, NULL, O_BYTES},
        {"chunk", required_argument, NULL, O_CHUNK},
        {"repeat", required_argument, NULL, O_REPEAT},
        {"seed", required_argument, NULL, O_SEED},
        {"quiet", no_argument, NULL, O_QUIET},
        {"help", no_argument, NULL, 'h'},
        {NULL, 0, NULL, 0},
    };
    int c;
    while ((c = getopt_long(argc, argv, "h", longopts, NULL)) != -1) {
        switch (c) {
        case O_NET:
            net = net_ops_by_name(optarg);
            if (!net) {
                fprintf(stderr, "echo: --net must be kernel or tcps, not '%s'\n", optarg);
                return 2;
            }
            break;
        case O_ADDR: opt_addr = optarg; break;
        case O_PORT: opt_port = (int)parse_u("--port", optarg, 0, 65535); break;
        case O_CONNECT: opt_connect = optarg; break;
        case O_BYTES: opt_bytes = parse_u("--bytes", optarg, 0, 1ull << 40); break;
        case O_CHUNK: opt_chunk = (size_t)parse_u("--chunk", optarg, 1, 1 << 20); break;
        case O_REPEAT: opt_repeat = (unsigned long)parse_u("--repeat", optarg, 1, 1000000); break;
        case O_SEED: opt_seed = parse_u("--seed", optarg, 0, ~0ull); break;
        case O_QUIET: opt_quiet = 1; break;
        case 'h': usage(stdout); return 0;
        default: usage(stderr); return 2;
        }
    }
    if (optind < argc) {
        fprintf(stderr, "echo: unexpected argument '%s'\n", argv[optind]);
        return 2;
    }
    signal(SIGPIPE, SIG_IGN);
    if (net == &tcps_ops && tcps_attach(NULL) != 0) {
        int e = errno;
        const char *why = tcps_strerror_last();
        fprintf(stderr, "echo: cannot attach to the tcps TCP server: %s%s%s\n", strerror(e),
                why && *why ? ": " : "", why ? why : "");
        return 1;
    }
    int rc = opt_connect ? run_client() : run_server();
    if (net == &tcps_ops)
        tcps_detach();
    return rc;
}
