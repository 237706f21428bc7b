/* Signals against blocking socket calls: run on kernel sockets and under
 * `tcps run`, the output must be the same (crates/cli/tests/preload_signals.rs).
 * Each case prints one line: what the call returned, the errno name, and
 * how many times the handler ran. Peers are threads of this process that
 * block every signal, so process-directed signals reach the main thread. */
#define _GNU_SOURCE
#include <arpa/inet.h>
#include <errno.h>
#include <netinet/in.h>
#include <poll.h>
#include <pthread.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/select.h>
#include <sys/sendfile.h>
#include <sys/signalfd.h>
#include <sys/socket.h>
#include <sys/time.h>
#include <time.h>
#include <unistd.h>

static volatile sig_atomic_t handled;
static volatile sig_atomic_t info_ok;

static void on_sig(int s) { (void)s; handled++; }
static void on_info(int s, siginfo_t *si, void *ctx) {
    (void)ctx;
    handled++;
    if (si && si->si_signo == s) info_ok = 1;
}

static const char *ename(int e) {
    switch (e) {
    case 0: return "ok";
    case EINTR: return "EINTR";
    case EAGAIN: return "EAGAIN";
    default: return strerror(e);
    }
}

static void set_handler(int sig, int restart, int siginfo) {
    struct sigaction sa;
    memset(&sa, 0, sizeof sa);
    sigemptyset(&sa.sa_mask);
    sa.sa_flags = restart ? SA_RESTART : 0;
    if (siginfo) {
        sa.sa_flags |= SA_SIGINFO;
        sa.sa_sigaction = on_info;
    } else {
        sa.sa_handler = on_sig;
    }
    if (sigaction(sig, &sa, NULL) < 0) { perror("sigaction"); exit(1); }
    /* The old action is the program's own handler, never a wrapper. */
    struct sigaction back;
    sigaction(sig, NULL, &back);
    void *want = siginfo ? (void *)on_info : (void *)on_sig;
    void *got = siginfo ? (void *)back.sa_sigaction : (void *)back.sa_handler;
    if (got != want || !!(back.sa_flags & SA_SIGINFO) != !!siginfo ||
        !!(back.sa_flags & SA_RESTART) != !!restart) {
        printf("sigaction reports a handler that is not the program's\n");
        exit(1);
    }
    handled = 0;
}

static void alarm_ms(int ms) {
    struct itimerval it = {{0, 0}, {ms / 1000, (ms % 1000) * 1000}};
    setitimer(ITIMER_REAL, &it, NULL);
}

static void interval_us(int us) {
    struct itimerval it = {{0, us}, {0, us}};
    setitimer(ITIMER_REAL, &it, NULL);
}

static void sleep_ms(int ms) {
    struct timespec ts = {ms / 1000, (ms % 1000) * 1000000L};
    while (nanosleep(&ts, &ts) < 0 && errno == EINTR) {}
}

static int listener(uint16_t *port) {
    int l = socket(AF_INET, SOCK_STREAM, 0);
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
    int one = 1;
    setsockopt(l, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
    if (bind(l, (void *)&a, sizeof a) < 0 || listen(l, 16) < 0) { perror("listen"); exit(1); }
    socklen_t len = sizeof a;
    getsockname(l, (void *)&a, &len);
    *port = ntohs(a.sin_port);
    return l;
}

static int connect_to(uint16_t port) {
    int s = socket(AF_INET, SOCK_STREAM, 0);
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_port = htons(port),
                            .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
    while (connect(s, (void *)&a, sizeof a) < 0) {
        if (errno != EINTR) { perror("connect"); exit(1); }
    }
    return s;
}

static int accept_retry(int l) {
    int c;
    while ((c = accept(l, NULL, NULL)) < 0 && errno == EINTR) {}
    if (c < 0) { perror("accept"); exit(1); }
    return c;
}

/* A connected pair: *a is the accepted end, *b the connecting one. */
static void pair(int *a, int *b) {
    uint16_t port;
    int l = listener(&port);
    *b = connect_to(port);
    *a = accept_retry(l);
    close(l);
}

static void block_all(void) {
    sigset_t all;
    sigfillset(&all);
    pthread_sigmask(SIG_BLOCK, &all, NULL);
}

/* A peer thread: after `delay_ms`, connect to `port` (if set) or send
 * `len` bytes of `data` on `fd`. */
struct peer {
    int delay_ms;
    uint16_t port;
    int fd;
    const unsigned char *data;
    size_t len;
    int close_after;
    int conn;
};

static void *peer_main(void *arg) {
    struct peer *p = arg;
    block_all();
    sleep_ms(p->delay_ms);
    if (p->port) p->conn = connect_to(p->port);
    size_t off = 0;
    while (off < p->len) {
        ssize_t n = send(p->fd, p->data + off, p->len - off, MSG_NOSIGNAL);
        if (n < 0 && errno == EINTR) continue;
        if (n <= 0) { perror("peer send"); break; }
        off += n;
    }
    if (p->close_after) shutdown(p->fd, SHUT_WR);
    return NULL;
}

static pthread_t start_peer(struct peer *p) {
    pthread_t t;
    pthread_create(&t, NULL, peer_main, p);
    return t;
}

static void report(const char *what, long r, int e) {
    printf("%s: %s %s handled=%d\n", what, r < 0 ? "-1" : "ok", r < 0 ? ename(e) : "",
           (int)handled);
    fflush(stdout);
}

static void case_accept(int restart, int siginfo) {
    set_handler(SIGALRM, restart, siginfo);
    uint16_t port;
    int l = listener(&port);
    struct peer p = {.delay_ms = 1000, .port = port};
    pthread_t t = start_peer(&p);
    alarm_ms(500);
    int c = accept(l, NULL, NULL);
    int e = errno;
    char what[64];
    snprintf(what, sizeof what, "accept restart=%d siginfo=%d", restart, siginfo);
    report(what, c, e);
    if (siginfo) printf("siginfo passed: %d\n", (int)info_ok);
    pthread_join(t, NULL);
    if (c < 0) c = accept_retry(l);
    close(c);
    close(p.conn);
    close(l);
}

/* glibc's signal() (BSD: restarting) with siginterrupt(sig, 1), as
 * Python's signal.signal + signal.siginterrupt. */
static void case_signal_siginterrupt(void) {
    signal(SIGALRM, on_sig);
    siginterrupt(SIGALRM, 1);
    handled = 0;
    uint16_t port;
    int l = listener(&port);
    alarm_ms(500);
    int c = accept(l, NULL, NULL);
    report("accept signal()+siginterrupt", c, errno);
    siginterrupt(SIGALRM, 0);
    close(l);
}

static void case_recv(int restart, int timeo) {
    set_handler(SIGALRM, restart, 0);
    int a, b;
    pair(&a, &b);
    if (timeo) {
        struct timeval tv = {5, 0};
        setsockopt(a, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
    }
    struct peer p = {.delay_ms = 1000, .fd = b, .data = (const unsigned char *)"x", .len = 1};
    pthread_t t = start_peer(&p);
    alarm_ms(500);
    char buf[16];
    ssize_t n = recv(a, buf, sizeof buf, 0);
    char what[64];
    snprintf(what, sizeof what, "recv restart=%d rcvtimeo=%d -> %zd", restart, timeo, n);
    report(what, n, errno);
    pthread_join(t, NULL);
    close(a);
    close(b);
}

static void case_poll_family(const char *which) {
    set_handler(SIGALRM, 1, 0);
    int a, b;
    pair(&a, &b);
    alarm_ms(500);
    long r;
    if (!strcmp(which, "poll")) {
        struct pollfd pf = {.fd = a, .events = POLLIN};
        r = poll(&pf, 1, 5000);
    } else if (!strcmp(which, "epoll_wait")) {
        int ep = epoll_create1(0);
        struct epoll_event ev = {.events = EPOLLIN, .data.fd = a}, out;
        epoll_ctl(ep, EPOLL_CTL_ADD, a, &ev);
        r = epoll_wait(ep, &out, 1, 5000);
        int e = errno;
        close(ep);
        errno = e;
    } else if (!strcmp(which, "select")) {
        fd_set rs;
        FD_ZERO(&rs);
        FD_SET(a, &rs);
        struct timeval tv = {5, 0};
        r = select(a + 1, &rs, NULL, NULL, &tv);
    } else { /* ppoll with SIGALRM blocked outside the wait */
        sigset_t blk, old;
        sigemptyset(&blk);
        sigaddset(&blk, SIGALRM);
        pthread_sigmask(SIG_BLOCK, &blk, &old);
        sleep_ms(700); /* the alarm is pending when ppoll unblocks it */
        struct pollfd pf = {.fd = a, .events = POLLIN};
        struct timespec ts = {5, 0};
        r = ppoll(&pf, 1, &ts, &old);
        int e = errno;
        pthread_sigmask(SIG_SETMASK, &old, NULL);
        errno = e;
    }
    char what[64];
    snprintf(what, sizeof what, "%s SA_RESTART", which);
    report(what, r, errno);
    close(a);
    close(b);
}

/* pthread_kill to one thread interrupts only that thread's recv. */
struct waiter {
    int fd;
    ssize_t n;
    int err;
};

static void *waiter_main(void *arg) {
    struct waiter *w = arg;
    char buf[16];
    w->n = recv(w->fd, buf, sizeof buf, 0);
    w->err = errno;
    return NULL;
}

static void case_pthread_kill(void) {
    set_handler(SIGUSR1, 0, 0);
    int a1, b1, a2, b2;
    pair(&a1, &b1);
    pair(&a2, &b2);
    struct waiter w1 = {a1}, w2 = {a2};
    pthread_t t1, t2;
    pthread_create(&t1, NULL, waiter_main, &w1);
    pthread_create(&t2, NULL, waiter_main, &w2);
    sleep_ms(500);
    pthread_kill(t1, SIGUSR1);
    pthread_join(t1, NULL);
    sleep_ms(300);
    send(b2, "yz", 2, 0);
    pthread_join(t2, NULL);
    printf("pthread_kill: t1 %zd %s, t2 %zd %s, handled=%d\n", w1.n, ename(w1.n < 0 ? w1.err : 0),
           w2.n, ename(w2.n < 0 ? w2.err : 0), (int)handled);
    fflush(stdout);
    close(a1); close(b1); close(a2); close(b2);
}

/* A signalfd program blocks the signal: its recv is not interrupted. */
struct killer {
    int fd;
};

static void *killer_main(void *arg) {
    struct killer *k = arg;
    block_all();
    sleep_ms(300);
    kill(getpid(), SIGUSR2);
    sleep_ms(500);
    send(k->fd, "hello", 5, 0);
    return NULL;
}

static void case_signalfd(void) {
    set_handler(SIGUSR2, 0, 0);
    sigset_t m;
    sigemptyset(&m);
    sigaddset(&m, SIGUSR2);
    pthread_sigmask(SIG_BLOCK, &m, NULL);
    int sfd = signalfd(-1, &m, 0);
    int a, b;
    pair(&a, &b);
    struct killer k = {b};
    pthread_t t;
    pthread_create(&t, NULL, killer_main, &k);
    char buf[16];
    ssize_t n = recv(a, buf, sizeof buf, 0);
    int e = errno;
    pthread_join(t, NULL);
    struct signalfd_siginfo si;
    ssize_t r = read(sfd, &si, sizeof si);
    printf("signalfd: recv %zd %s, signalfd read %s, handled=%d\n", n, ename(n < 0 ? e : 0),
           r == sizeof si && si.ssi_signo == SIGUSR2 ? "SIGUSR2" : "nothing", (int)handled);
    fflush(stdout);
    pthread_sigmask(SIG_UNBLOCK, &m, NULL);
    close(sfd); close(a); close(b);
}

static uint64_t fnv(uint64_t h, const unsigned char *p, size_t n) {
    for (size_t i = 0; i < n; i++) h = (h ^ p[i]) * 1099511628211ULL;
    return h;
}

/* A MSG_WAITALL recv interrupted after data arrived returns the data; the
 * rest of the stream follows intact. */
static void case_waitall(void) {
    set_handler(SIGALRM, 0, 0);
    enum { FIRST = 50000, TOTAL = 1 << 20 };
    unsigned char *src = malloc(TOTAL), *dst = malloc(TOTAL);
    for (size_t i = 0; i < TOTAL; i++) src[i] = (unsigned char)(i * 7 + i / 251);
    int a, b;
    pair(&a, &b);
    struct peer p1 = {.delay_ms = 0, .fd = b, .data = src, .len = FIRST};
    pthread_t t = start_peer(&p1);
    pthread_join(t, NULL);
    alarm_ms(500);
    ssize_t first = recv(a, dst, TOTAL, MSG_WAITALL);
    int e = errno;
    struct peer p2 = {.delay_ms = 200, .fd = b, .data = src + FIRST, .len = TOTAL - FIRST,
                      .close_after = 1};
    t = start_peer(&p2);
    size_t got = first > 0 ? (size_t)first : 0;
    for (;;) {
        ssize_t n = recv(a, dst + got, TOTAL - got, 0);
        if (n < 0 && errno == EINTR) continue;
        if (n <= 0) break;
        got += n;
    }
    pthread_join(t, NULL);
    printf("waitall: first %zd %s, total %zu, intact %d, handled=%d\n", first,
           ename(first < 0 ? e : 0), got, got == TOTAL && fnv(1, src, TOTAL) == fnv(1, dst, got),
           (int)handled);
    fflush(stdout);
    free(src); free(dst);
    close(a); close(b);
}

/* A blocking send to a peer that does not read: interrupted after part of
 * it went, it returns the count, and exactly those bytes arrive. */
struct reader {
    int fd;
    size_t got;
    uint64_t h;
};

static uint64_t fnv(uint64_t h, const unsigned char *p, size_t n);

static void *reader_main(void *arg) {
    struct reader *r = arg;
    block_all();
    unsigned char buf[65536];
    r->h = 1;
    for (;;) {
        ssize_t n = recv(r->fd, buf, sizeof buf, 0);
        if (n < 0 && errno == EINTR) continue;
        if (n <= 0) break;
        r->h = fnv(r->h, buf, n);
        r->got += n;
    }
    return NULL;
}

/* What a send of `total` bytes returned. */
static const char *outcome(ssize_t n, int e, size_t total) {
    return n < 0 ? ename(e) : (size_t)n == total ? "all" : n > 0 ? "partial" : "zero";
}

/* Ends the stream on `a` and reads it to the end on `b`: whether exactly
 * the `n` first bytes of `src` arrived. */
static const char *arrived(int a, int b, const unsigned char *src, ssize_t n) {
    struct reader r = {b};
    pthread_t t;
    pthread_create(&t, NULL, reader_main, &r);
    shutdown(a, SHUT_WR);
    pthread_join(t, NULL);
    return n > 0 && r.got == (size_t)n && r.h == fnv(1, src, n) ? "exactly those bytes" : "other";
}

static void case_send(int restart) {
    set_handler(SIGALRM, restart, 0);
    enum { TOTAL = 64 << 20 };
    unsigned char *src = malloc(TOTAL);
    for (size_t i = 0; i < TOTAL; i++) src[i] = (unsigned char)(i * 5 + i / 1021);
    int a, b;
    pair(&a, &b);
    alarm_ms(500);
    ssize_t n = send(a, src, TOTAL, 0);
    int e = errno;
    printf("send restart=%d: %s, arrived %s, handled=%d\n", restart, outcome(n, e, TOTAL),
           arrived(a, b, src, n), (int)handled);
    fflush(stdout);
    free(src);
    close(a); close(b);
}

/* sendfile to a peer that does not read, the same way. */
static void case_sendfile(void) {
    set_handler(SIGALRM, 0, 0);
    enum { TOTAL = 64 << 20 };
    unsigned char *src = malloc(TOTAL);
    for (size_t i = 0; i < TOTAL; i++) src[i] = (unsigned char)(i * 3 + i / 4093);
    char path[] = "/tmp/tcps-signals-XXXXXX";
    int f = mkstemp(path);
    unlink(path);
    for (size_t off = 0; off < TOTAL;) {
        ssize_t n = write(f, src + off, TOTAL - off);
        if (n <= 0) { perror("write"); exit(1); }
        off += n;
    }
    int a, b;
    pair(&a, &b);
    alarm_ms(500);
    off_t pos = 0;
    ssize_t n = sendfile(a, f, &pos, TOTAL);
    int e = errno;
    printf("sendfile: %s, offset %s, arrived %s, handled=%d\n", outcome(n, e, TOTAL),
           n > 0 && pos == n ? "moved by the count" : "other", arrived(a, b, src, n),
           (int)handled);
    fflush(stdout);
    free(src);
    close(f); close(a); close(b);
}

/* A stream received while a timer fires every 2 ms: with SA_RESTART no
 * call sees EINTR; without, the program retries; no byte lost either way. */
static void case_storm(int restart) {
    set_handler(SIGALRM, restart, 0);
    enum { TOTAL = 8 << 20 };
    unsigned char *src = malloc(TOTAL), *dst = malloc(65536);
    for (size_t i = 0; i < TOTAL; i++) src[i] = (unsigned char)(i * 13 + i / 509);
    int a, b;
    pair(&a, &b);
    struct peer p = {.delay_ms = 0, .fd = b, .data = src, .len = TOTAL, .close_after = 1};
    interval_us(2000);
    pthread_t t = start_peer(&p);
    uint64_t h = 1;
    size_t got = 0;
    long eintr = 0;
    for (;;) {
        ssize_t n = recv(a, dst, 65536, 0);
        if (n < 0 && errno == EINTR) { eintr++; continue; }
        if (n <= 0) break;
        h = fnv(h, dst, n);
        got += n;
    }
    interval_us(0);
    pthread_join(t, NULL);
    printf("storm restart=%d: total %zu, intact %d, eintr seen %s\n", restart, got,
           got == TOTAL && h == fnv(1, src, TOTAL), restart ? (eintr ? "yes" : "no") : "any");
    fflush(stdout);
    free(src); free(dst);
    close(a); close(b);
}

int main(int argc, char **argv) {
    const char *only = argc > 1 ? argv[1] : NULL;
#define RUN(name, call) if (!only || !strcmp(only, name)) call
    RUN("accept", case_accept(0, 0));
    RUN("accept", case_accept(0, 1));
    RUN("accept", case_accept(1, 0));
    RUN("signal", case_signal_siginterrupt());
    RUN("recv", case_recv(0, 0));
    RUN("recv", case_recv(1, 0));
    RUN("recv", case_recv(1, 1));
    RUN("poll", case_poll_family("poll"));
    RUN("poll", case_poll_family("epoll_wait"));
    RUN("poll", case_poll_family("select"));
    RUN("poll", case_poll_family("ppoll"));
    RUN("pthread_kill", case_pthread_kill());
    RUN("signalfd", case_signalfd());
    RUN("waitall", case_waitall());
    RUN("send", case_send(0));
    RUN("send", case_send(1));
    RUN("sendfile", case_sendfile());
    RUN("storm", case_storm(1));
    RUN("storm", case_storm(0));
    printf("done\n");
    return 0;
}
