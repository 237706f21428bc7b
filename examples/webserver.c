/*
 * webserver.c — the host application of the TCP Servers thesis (§6.1.2):
 * a small multi-threaded HTTP/1.0 and HTTP/1.1 web server that runs either on
 * kernel sockets or through tcps (the same binary, `--net kernel|tcps`).
 *
 * Each worker thread loops on a blocking accept on one shared listener and
 * then serves that connection (keep-alive, pipelining) until it closes.
 * Static files come from --root; /dynamic/N returns N bytes, each made by one
 * call to rand_r() (the WebStone 2.0.1 dynamic content the thesis used).
 * Response bodies are sent in --send-size chunks: the file is read into a
 * buffer with pread() and then sent chunk by chunk; the headers travel with
 * the first chunk.
 *
 * Every network call goes through `struct net_ops` (kernel_ops: libc;
 * tcps_ops: tcps.h). With --net tcps, --mode picks how response bytes are
 * sent (the thesis' variants, §6.1.2):
 *   copy              tcps_send: the library copies every byte (Sock)
 *   sync              tcps_send_registered from a registered file cache
 *                     (no copy; the call waits for the server's send) (Sync)
 *   async             tcps_send_async: copied, returns at once (AsyncSend)
 *   async-registered  tcps_send_async_registered from the registered file
 *                     cache: no copy and no wait (AsyncSend, zero copy)
 * The registered modes load every regular file under --root into memory
 * from tcps_alloc_registered() at start. The cache is never written while
 * serving, so its sends need no completion tracking.
 *
 * Build: see the top-level Makefile (`make examples`).
 */
#define _GNU_SOURCE
#include <arpa/inet.h>
#include <ctype.h>
#include <ftw.h>
#include <errno.h>
#include <fcntl.h>
#include <getopt.h>
#include <limits.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <pthread.h>
#include <signal.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/types.h>
#include <time.h>
#include <unistd.h>

#include "net.h"

/* ------------------------------------------------------------------------ */
/* The network switch.                                                       */
/* ------------------------------------------------------------------------ */

/* ------------------------------------------------------------------------ */
/* Configuration and global state.                                           */
/* ------------------------------------------------------------------------ */

#define RECV_BUF_SIZE (64 * 1024)  /* per-connection request buffer */
#define MAX_HEADER_BYTES (16 * 1024) /* larger request heads get 431 */
#define HDR_ROOM 1024              /* room for response headers */
#define MAX_PATH_BYTES 4096
#define DYNAMIC_MAX (10u * 1024u * 1024u) /* cap of /dynamic/N: 10 MiB */

static const struct net_ops *net = &kernel_ops;
static int opt_threads = 4;
static int opt_port = 8080;
static const char *opt_addr = "0.0.0.0";
static const char *opt_root = ".";
static size_t opt_send_size = 16384;
static int opt_backlog = 1024;
static int opt_quiet = 0;
/* --take-direct: with --net tcps, serve the connections the TCP server's
 * balancing hands over as kernel sockets (tcps_accept_any) with system
 * calls; `conn_kernel` says whether this thread's connection is one. */
static int opt_take_direct = 0;
static __thread int conn_kernel = 0;

/* The calls of this thread's connection: libc for a direct connection. */
static const struct net_ops *conn_net(void);

/* How response bytes are sent (--mode; see the top of the file). */
enum send_mode { MODE_COPY, MODE_SYNC, MODE_ASYNC, MODE_ASYNC_REG };
static const char *const mode_names[] = {"copy", "sync", "async", "async-registered"};
static enum send_mode opt_mode = MODE_COPY;
static size_t opt_cache_max = 512u * 1024u * 1024u; /* --cache-max, bytes */

/* The registered file cache (modes sync and async-registered). */
struct cached_file {
    char *rel;        /* path relative to --root, as target_to_path() makes it */
    const char *data; /* inside cache_mem */
    size_t size;
};
static struct cached_file *cache;
static size_t cache_n, cache_cap;
static char *cache_mem;
static tcps_mem_t cache_handle;
static size_t cache_bytes;

static int root_fd = -1;
static int listen_fd = -1;
static atomic_int stopping = 0;
static atomic_int workers_running = 0;
static atomic_int exit_status = 0;
/* Requests answered (the benchmarks divide the library's counters by it). */
static atomic_ullong requests_served = 0;

static void warnx_(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
static void warnx_(const char *fmt, ...)
{
    if (opt_quiet)
        return;
    char line[512];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(line, sizeof line, fmt, ap);
    va_end(ap);
    fprintf(stderr, "webserver: %s\n", line);
}

/* ------------------------------------------------------------------------ */
/* Sending.                                                                  */
/* ------------------------------------------------------------------------ */

/* The send call of transient buffers: tcps_send_async in the asynchronous
 * modes (the bytes are copied before it returns, so the buffer may be
 * reused at once), else the network's send. */
static ssize_t send_call(int s, const void *p, size_t len, int flags)
{
    if (conn_kernel)
        return kernel_ops.send(s, p, len, flags);
    if (opt_mode == MODE_ASYNC || opt_mode == MODE_ASYNC_REG)
        return tcps_send_async(s, p, len, flags);
    return net->send(s, p, len, flags);
}

/* Sends all `len` bytes; returns 0, or -1 with errno set. */
static int send_all_flags(int s, const char *p, size_t len, int flags)
{
    while (len > 0) {
        ssize_t n = send_call(s, p, len, flags);
        if (n < 0) {
            if (errno == EINTR)
                continue;
            return -1;
        }
        if (n == 0) {
            errno = EPIPE;
            return -1;
        }
        p += n;
        len -= (size_t)n;
    }
    return 0;
}

static int send_all(int s, const char *p, size_t len) { return send_all_flags(s, p, len, 0); }

/* Sends all `len` bytes of registered memory `mem` at `p`: synchronously
 * with tcps_send_registered (MODE_SYNC), or queued with
 * tcps_send_async_registered (MODE_ASYNC_REG; only for memory that is never
 * written again, as no completion is awaited). 0, or -1 with errno set. */
static int send_registered_all(int s, const char *p, size_t len, int flags, tcps_mem_t mem)
{
    while (len > 0) {
        ssize_t n;
        if (conn_kernel)
            n = kernel_ops.send(s, p, len, flags); /* a kernel socket copies */
        else if (opt_mode == MODE_ASYNC_REG)
            n = tcps_send_async_registered(s, p, len, flags, mem, NULL);
        else
            n = tcps_send_registered(s, p, len, flags, mem);
        if (n < 0) {
            if (errno == EINTR)
                continue;
            return -1;
        }
        if (n == 0) {
            errno = EPIPE;
            return -1;
        }
        p += n;
        len -= (size_t)n;
    }
    return 0;
}

/* ------------------------------------------------------------------------ */
/* HTTP.                                                                     */
/* ------------------------------------------------------------------------ */

struct request {
    char method[16];
    int method_ok; /* GET or HEAD */
    int head;      /* HEAD */
    int minor;     /* HTTP/1.minor */
    int keep_alive;
    unsigned long long content_length;
    int chunked; /* request has a Transfer-Encoding: we cannot skip it */
    char target[MAX_PATH_BYTES + 1];
    int target_too_long;
};

static const char *reason(int status)
{
    switch (status) {
    case 200: return "OK";
    case 400: return "Bad Request";
    case 403: return "Forbidden";
    case 404: return "Not Found";
    case 431: return "Request Header Fields Too Large";
    case 500: return "Internal Server Error";
    case 501: return "Not Implemented";
    case 505: return "HTTP Version Not Supported";
    default: return "Unknown";
    }
}

static int header_block(char *out, size_t cap, int status, const char *ctype,
                        unsigned long long length, int keep_alive)
{
    int n = snprintf(out, cap,
                     "HTTP/1.1 %d %s\r\n"
                     "Server: tcps-webserver\r\n"
                     "Content-Type: %s\r\n"
                     "Content-Length: %llu\r\n"
                     "Connection: %s\r\n"
                     "\r\n",
                     status, reason(status), ctype, length, keep_alive ? "keep-alive" : "close");
    if (n < 0 || (size_t)n >= cap)
        return -1;
    return n;
}

/* Sends a short error response; its body is "<status> <reason>\n". */
static int send_error(int s, int status, int keep_alive, int head)
{
    char buf[HDR_ROOM + 128];
    char body[96];
    int blen = snprintf(body, sizeof body, "%d %s\n", status, reason(status));
    int n = header_block(buf, HDR_ROOM, status, "text/plain", (unsigned long long)blen, keep_alive);
    if (n < 0)
        return -1;
    if (!head) {
        memcpy(buf + n, body, (size_t)blen);
        n += blen;
    }
    return send_all(s, buf, (size_t)n);
}

static int token_eq(const char *p, size_t n, const char *tok)
{
    return strlen(tok) == n && strncasecmp(p, tok, n) == 0;
}

/* Looks for "close" / "keep-alive" in a comma-separated Connection value. */
static void connection_tokens(const char *v, size_t n, int *close_tok, int *ka_tok)
{
    size_t i = 0;
    while (i < n) {
        while (i < n && (v[i] == ' ' || v[i] == '\t' || v[i] == ','))
            i++;
        size_t start = i;
        while (i < n && v[i] != ',')
            i++;
        size_t end = i;
        while (end > start && (v[end - 1] == ' ' || v[end - 1] == '\t'))
            end--;
        if (token_eq(v + start, end - start, "close"))
            *close_tok = 1;
        else if (token_eq(v + start, end - start, "keep-alive"))
            *ka_tok = 1;
    }
}

/*
 * Parses one request head from buf[0..len).
 * Returns the number of bytes of the head (request line + headers + blank
 * line) when complete, 0 if more bytes are needed, -status on a malformed
 * request (-400, -431, -505).
 */
static long parse_request(const char *buf, size_t len, struct request *rq)
{
    size_t pos = 0;
    /* Tolerate empty lines before the request line (RFC 9112 §2.2). */
    while (pos < len && (buf[pos] == '\r' || buf[pos] == '\n'))
        pos++;
    /* Find the end of the head. */
    size_t end = 0;
    for (size_t i = pos; i < len; i++) {
        if (buf[i] != '\n')
            continue;
        if (i + 1 < len && buf[i + 1] == '\n') {
            end = i + 2;
            break;
        }
        if (i + 2 < len && buf[i + 1] == '\r' && buf[i + 2] == '\n') {
            end = i + 3;
            break;
        }
    }
    if (end == 0)
        return len - pos > MAX_HEADER_BYTES ? -431 : 0;
    if (end - pos > MAX_HEADER_BYTES)
        return -431;

    memset(rq, 0, sizeof *rq);
    int close_tok = 0, ka_tok = 0, have_cl = 0;

    /* Request line: METHOD SP target SP HTTP/1.x */
    const char *line = buf + pos;
    const char *eol = memchr(line, '\n', end - pos);
    size_t llen = (size_t)(eol - line);
    if (llen > 0 && line[llen - 1] == '\r')
        llen--;
    const char *sp1 = memchr(line, ' ', llen);
    if (!sp1 || sp1 == line || (size_t)(sp1 - line) >= sizeof rq->method)
        return -400;
    for (const char *c = line; c < sp1; c++)
        if (!isupper((unsigned char)*c) && *c != '-' && *c != '_')
            return -400;
    memcpy(rq->method, line, (size_t)(sp1 - line));
    rq->method[sp1 - line] = 0;
    const char *tgt = sp1 + 1;
    const char *sp2 = memchr(tgt, ' ', llen - (size_t)(tgt - line));
    if (!sp2 || sp2 == tgt)
        return -400;
    size_t tlen = (size_t)(sp2 - tgt);
    if (tlen > MAX_PATH_BYTES)
        rq->target_too_long = 1;
    else {
        memcpy(rq->target, tgt, tlen);
        rq->target[tlen] = 0;
        if (memchr(rq->target, 0, tlen))
            return -400;
    }
    const char *ver = sp2 + 1;
    size_t vlen = llen - (size_t)(ver - line);
    if (vlen != 8 || memcmp(ver, "HTTP/", 5) != 0 || !isdigit((unsigned char)ver[5]) ||
        ver[6] != '.' || !isdigit((unsigned char)ver[7]))
        return -400;
    if (ver[5] != '1')
        return -505;
    rq->minor = ver[7] - '0';

    /* Header fields. */
    const char *p = eol + 1;
    const char *hend = buf + end;
    for (;;) {
        const char *nl = memchr(p, '\n', (size_t)(hend - p));
        size_t n = (size_t)(nl - p);
        if (n > 0 && p[n - 1] == '\r')
            n--;
        if (n == 0)
            break; /* the blank line */
        const char *colon = memchr(p, ':', n);
        if (!colon || colon == p)
            return -400;
        for (const char *c = p; c < colon; c++)
            if (*c == ' ' || *c == '\t')
                return -400;
        size_t nlen = (size_t)(colon - p);
        const char *v = colon + 1;
        size_t vl = n - nlen - 1;
        while (vl > 0 && (*v == ' ' || *v == '\t'))
            v++, vl--;
        while (vl > 0 && (v[vl - 1] == ' ' || v[vl - 1] == '\t'))
            vl--;
        if (token_eq(p, nlen, "connection")) {
            connection_tokens(v, vl, &close_tok, &ka_tok);
        } else if (token_eq(p, nlen, "content-length")) {
            if (vl == 0 || vl > 18)
                return -400;
            unsigned long long cl = 0;
            for (size_t i = 0; i < vl; i++) {
                if (!isdigit((unsigned char)v[i]))
                    return -400;
                cl = cl * 10 + (unsigned long long)(v[i] - '0');
            }
            if (have_cl && cl != rq->content_length)
                return -400;
            have_cl = 1;
            rq->content_length = cl;
        } else if (token_eq(p, nlen, "transfer-encoding")) {
            rq->chunked = 1;
        }
        p = nl + 1;
    }

    if (rq->minor >= 1)
        rq->keep_alive = !close_tok;
    else
        rq->keep_alive = ka_tok && !close_tok;
    rq->head = strcmp(rq->method, "HEAD") == 0;
    rq->method_ok = rq->head || strcmp(rq->method, "GET") == 0;
    return (long)end;
}

static int hexval(int c)
{
    if (c >= '0' && c <= '9')
        return c - '0';
    if (c >= 'a' && c <= 'f')
        return c - 'a' + 10;
    if (c >= 'A' && c <= 'F')
        return c - 'A' + 10;
    return -1;
}

/*
 * Turns a request target into a path relative to the root (no leading '/').
 * Returns 0, or an HTTP status (400 malformed, 403 for "..").
 */
static int target_to_path(const char *target, char *out, size_t cap)
{
    const char *t = target;
    /* absolute-form: http://host[:port]/path */
    if (strncasecmp(t, "http://", 7) == 0 || strncasecmp(t, "https://", 8) == 0) {
        t = strstr(t, "://") + 3;
        t = strchr(t, '/');
        if (!t)
            t = "/";
    }
    if (*t != '/')
        return 400;
    size_t o = 0;
    for (const char *c = t + 1; *c && *c != '?' && *c != '#'; c++) {
        int ch = (unsigned char)*c;
        if (ch == '%') {
            int hi = hexval((unsigned char)c[1]);
            int lo = hi < 0 ? -1 : hexval((unsigned char)c[2]);
            if (hi < 0 || lo < 0)
                return 400;
            ch = hi * 16 + lo;
            c += 2;
            if (ch == 0)
                return 400;
        }
        if (o + 1 >= cap)
            return 400;
        out[o++] = (char)ch;
    }
    out[o] = 0;
    /* Reject any ".." segment; drop empty and "." segments. */
    char tmp[MAX_PATH_BYTES + 1];
    size_t w = 0;
    const char *s = out;
    while (*s) {
        const char *e = strchr(s, '/');
        size_t n = e ? (size_t)(e - s) : strlen(s);
        if (n == 2 && s[0] == '.' && s[1] == '.')
            return 403;
        if (n > 0 && !(n == 1 && s[0] == '.')) {
            if (w > 0)
                tmp[w++] = '/';
            memcpy(tmp + w, s, n);
            w += n;
        }
        s += n;
        if (*s == '/')
            s++;
    }
    /* A trailing '/' (or the bare root) means the directory's index.html. */
    int dir = o == 0 || out[o - 1] == '/';
    tmp[w] = 0;
    if (dir) {
        const char *idx = w ? "/index.html" : "index.html";
        if (w + strlen(idx) >= sizeof tmp)
            return 400;
        strcpy(tmp + w, idx);
        w += strlen(idx);
    }
    if (w + 1 > cap)
        return 400;
    memcpy(out, tmp, w + 1);
    return 0;
}

static const char *content_type(const char *path)
{
    const char *dot = strrchr(path, '.');
    const char *slash = strrchr(path, '/');
    if (!dot || (slash && dot < slash))
        return "application/octet-stream";
    dot++;
    static const struct {
        const char *ext, *type;
    } types[] = {
        {"html", "text/html"},        {"htm", "text/html"},         {"txt", "text/plain"},
        {"css", "text/css"},          {"js", "text/javascript"},    {"json", "application/json"},
        {"png", "image/png"},         {"jpg", "image/jpeg"},        {"jpeg", "image/jpeg"},
        {"gif", "image/gif"},         {"svg", "image/svg+xml"},     {"ico", "image/x-icon"},
        {"pdf", "application/pdf"},   {"xml", "application/xml"},   {"bin", "application/octet-stream"},
    };
    for (size_t i = 0; i < sizeof types / sizeof types[0]; i++)
        if (strcasecmp(dot, types[i].ext) == 0)
            return types[i].type;
    return "application/octet-stream";
}

/* Per-worker state. */
struct worker {
    int index;
    pthread_t tid;
    unsigned int seed;  /* rand_r() state for /dynamic */
    char *rbuf;         /* RECV_BUF_SIZE */
    char *sbuf;         /* HDR_ROOM + send size; registered in MODE_SYNC */
    tcps_mem_t sbuf_mem; /* its registration (MODE_SYNC) */
};

/* Sends w->sbuf[0, len): from registered memory in MODE_SYNC (the call
 * returns after the server's send, so sbuf may be reused at once), else
 * with send_call(). */
static int send_sbuf(struct worker *w, int s, size_t len, int flags)
{
    if (opt_mode == MODE_SYNC)
        return send_registered_all(s, w->sbuf, len, flags, w->sbuf_mem);
    return send_all_flags(s, w->sbuf, len, flags);
}

/* Result of serving one request. */
enum { SERVE_KEEP = 0, SERVE_CLOSE = 1, SERVE_ERROR = -1 };

/* Answers `rq` with an error status; the connection stays if it may. */
static int reply_error(int s, const struct request *rq, int status)
{
    if (send_error(s, status, rq->keep_alive, rq->head) < 0)
        return SERVE_ERROR;
    return rq->keep_alive ? SERVE_KEEP : SERVE_CLOSE;
}

/* /dynamic/N: N bytes, one rand_r() call per byte. */
static int serve_dynamic(struct worker *w, int s, const struct request *rq, const char *num)
{
    size_t n = 0;
    if (!*num || strlen(num) > 9)
        return reply_error(s, rq, 400);
    for (const char *c = num; *c; c++) {
        if (!isdigit((unsigned char)*c))
            return reply_error(s, rq, 400);
        n = n * 10 + (size_t)(*c - '0');
    }
    if (n > DYNAMIC_MAX)
        return reply_error(s, rq, 400);
    int h = header_block(w->sbuf, HDR_ROOM, 200, "text/plain", n, rq->keep_alive);
    if (h < 0)
        return SERVE_ERROR;
    size_t fill = (size_t)h;
    size_t left = rq->head ? 0 : n;
    do {
        size_t chunk = left < opt_send_size ? left : opt_send_size;
        char *p = w->sbuf + fill;
        for (size_t i = 0; i < chunk; i++)
            p[i] = (char)('a' + rand_r(&w->seed) % 26);
        if (send_sbuf(w, s, fill + chunk, 0) < 0)
            return SERVE_ERROR;
        left -= chunk;
        fill = 0;
    } while (left > 0);
    return rq->keep_alive ? SERVE_KEEP : SERVE_CLOSE;
}

static int serve_file(struct worker *w, int s, const struct request *rq, const char *rel)
{
    int ka = rq->keep_alive;
    int fd = openat(root_fd, rel, O_RDONLY | O_CLOEXEC);
    struct stat st;
    if (fd >= 0 && fstat(fd, &st) == 0 && S_ISDIR(st.st_mode)) {
        /* A directory without a trailing slash: serve its index.html. */
        int dfd = fd;
        fd = openat(dfd, "index.html", O_RDONLY | O_CLOEXEC);
        close(dfd);
        rel = "index.html";
    }
    if (fd < 0) {
        int status = (errno == ENOENT || errno == ENOTDIR || errno == ENAMETOOLONG ||
                      errno == ELOOP)
                         ? 404
                     : errno == EACCES ? 403
                                       : 500;
        return reply_error(s, rq, status);
    }
    if (fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) {
        close(fd);
        return reply_error(s, rq, 404);
    }
    size_t size = (size_t)st.st_size;
    int h = header_block(w->sbuf, HDR_ROOM, 200, content_type(rel), size, ka);
    if (h < 0) {
        close(fd);
        return SERVE_ERROR;
    }
    size_t fill = (size_t)h;
    size_t left = rq->head ? 0 : size;
    off_t off = 0;
    int rc = ka ? SERVE_KEEP : SERVE_CLOSE;
    do {
        size_t chunk = left < opt_send_size ? left : opt_send_size;
        size_t got = 0;
        while (got < chunk) {
            ssize_t r = pread(fd, w->sbuf + fill + got, chunk - got, off + (off_t)got);
            if (r < 0 && errno == EINTR)
                continue;
            if (r <= 0) {
                /* The file shrank or failed: the promised length cannot be
                 * delivered, so the connection must end. */
                warnx_("read %s: %s", rel, r < 0 ? strerror(errno) : "file shrank");
                close(fd);
                return SERVE_ERROR;
            }
            got += (size_t)r;
        }
        if (send_sbuf(w, s, fill + chunk, 0) < 0) {
            rc = SERVE_ERROR;
            break;
        }
        off += (off_t)chunk;
        left -= chunk;
        fill = 0;
    } while (left > 0);
    close(fd);
    return rc;
}

static int cached_cmp(const void *a, const void *b)
{
    return strcmp(((const struct cached_file *)a)->rel, ((const struct cached_file *)b)->rel);
}

static const struct cached_file *cache_lookup(const char *rel)
{
    if (cache_n == 0)
        return NULL;
    struct cached_file key = {.rel = (char *)rel};
    return bsearch(&key, cache, cache_n, sizeof *cache, cached_cmp);
}

/* A file of the registered cache: the headers from sbuf (MSG_MORE, so they
 * leave with the body), then the body in --send-size pieces straight from
 * the cache. */
static int serve_cached(struct worker *w, int s, const struct request *rq,
                        const struct cached_file *f)
{
    int ka = rq->keep_alive;
    int h = header_block(w->sbuf, HDR_ROOM, 200, content_type(f->rel), f->size, ka);
    if (h < 0)
        return SERVE_ERROR;
    size_t left = rq->head ? 0 : f->size;
    if (send_sbuf(w, s, (size_t)h, left > 0 ? MSG_MORE : 0) < 0)
        return SERVE_ERROR;
    const char *p = f->data;
    while (left > 0) {
        size_t chunk = left < opt_send_size ? left : opt_send_size;
        if (send_registered_all(s, p, chunk, 0, cache_handle) < 0)
            return SERVE_ERROR;
        p += chunk;
        left -= chunk;
    }
    return ka ? SERVE_KEEP : SERVE_CLOSE;
}

static int serve_request(struct worker *w, int s, const struct request *rq)
{
    atomic_fetch_add_explicit(&requests_served, 1, memory_order_relaxed);
    if (!rq->method_ok)
        return reply_error(s, rq, 501);
    if (rq->target_too_long)
        return reply_error(s, rq, 400);
    char rel[MAX_PATH_BYTES + 1];
    int status = target_to_path(rq->target, rel, sizeof rel);
    if (status)
        return reply_error(s, rq, status);
    if (strncmp(rel, "dynamic/", 8) == 0)
        return serve_dynamic(w, s, rq, rel + 8);
    if (cache_n > 0) {
        const struct cached_file *f = cache_lookup(rel);
        if (!f) {
            /* A directory named without its trailing slash. */
            char idx[MAX_PATH_BYTES + 16];
            if ((size_t)snprintf(idx, sizeof idx, "%s/index.html", rel) < sizeof idx)
                f = cache_lookup(idx);
        }
        if (f)
            return serve_cached(w, s, rq, f);
        /* Not cached (new since the start, or over --cache-max): read it. */
    }
    return serve_file(w, s, rq, rel);
}

/* Serves one connection until it closes. */
static void serve_connection(struct worker *w, int s)
{
    char *buf = w->rbuf;
    size_t start = 0, len = 0;     /* unconsumed bytes are buf[start, start+len) */
    unsigned long long skip = 0;   /* request body bytes still to discard */
    int graceful = 0;

    for (;;) {
        if (skip > 0 && len > 0) {
            size_t take = skip < len ? (size_t)skip : len;
            start += take;
            len -= take;
            skip -= take;
        }
        long r = 0;
        struct request rq;
        if (skip == 0 && len > 0)
            r = parse_request(buf + start, len, &rq);
        if (r < 0) {
            send_error(s, (int)-r, 0, 0);
            graceful = 1;
            break;
        }
        if (r == 0) {
            /* Need more bytes: compact, then read. */
            if (start > 0) {
                memmove(buf, buf + start, len);
                start = 0;
            }
            if (len == RECV_BUF_SIZE) {
                send_error(s, 431, 0, 0);
                graceful = 1;
                break;
            }
            ssize_t n;
            do {
                n = conn_net()->recv(s, buf + len, RECV_BUF_SIZE - len, 0);
            } while (n < 0 && errno == EINTR && !atomic_load(&stopping));
            if (n <= 0)
                break; /* closed by the peer, or an error */
            len += (size_t)n;
            continue;
        }
        start += (size_t)r;
        len -= (size_t)r;
        if (rq.chunked) {
            /* We cannot skip a chunked body: answer and close. */
            rq.keep_alive = 0;
        }
        int rc = serve_request(w, s, &rq);
        if (rc == SERVE_ERROR)
            break;
        if (rc == SERVE_CLOSE) {
            graceful = 1;
            break;
        }
        skip = rq.content_length;
    }
    if (graceful)
        conn_net()->shutdown(s, SHUT_WR);
    conn_net()->close(s);
}

static const struct net_ops *conn_net(void) { return conn_kernel ? &kernel_ops : net; }

/* ------------------------------------------------------------------------ */
/* Workers, listener, main.                                                  */
/* ------------------------------------------------------------------------ */

static int accept_error_is_transient(int e)
{
    return e == EINTR || e == ECONNABORTED || e == EMFILE || e == ENFILE || e == ENOBUFS ||
           e == ENOMEM || e == EAGAIN || e == EPROTO || e == EPERM || e == ETIMEDOUT ||
           e == EHOSTUNREACH || e == ENETUNREACH || e == ENETDOWN || e == EHOSTDOWN ||
           e == ENONET || e == EOPNOTSUPP;
}

static void *worker_main(void *arg)
{
    struct worker *w = arg;
    while (!atomic_load(&stopping)) {
        int s;
        conn_kernel = 0;
        if (opt_take_direct)
            s = tcps_accept_any(listen_fd, NULL, NULL, 0, &conn_kernel);
        else
            s = net->accept(listen_fd, NULL, NULL);
        if (s < 0) {
            int e = errno;
            if (atomic_load(&stopping))
                break;
            if (accept_error_is_transient(e)) {
                if (e != EINTR && e != ECONNABORTED) {
                    struct timespec ts = {0, 10 * 1000 * 1000};
                    nanosleep(&ts, NULL);
                }
                continue;
            }
            /* The listener is gone (or the TCP server died): stop the process. */
            if (!atomic_exchange(&stopping, 1)) {
                fprintf(stderr, "webserver: accept: %s\n", strerror(e));
                atomic_store(&exit_status, 1);
                kill(getpid(), SIGTERM);
            }
            break;
        }
        /* TCP_NODELAY comes from the listener (Linux copies it to accepted
           sockets): no call between accept and the reply. */
        serve_connection(w, s);
    }
    atomic_fetch_sub(&workers_running, 1);
    return NULL;
}

/* ------------------------------------------------------------------------ */
/* The registered file cache.                                                */
/* ------------------------------------------------------------------------ */

static size_t root_prefix_len;

static int cache_visit(const char *path, const struct stat *st, int type, struct FTW *ftw)
{
    (void)ftw;
    if (type != FTW_F || !S_ISREG(st->st_mode))
        return 0;
    const char *rel = path + root_prefix_len;
    while (*rel == '/')
        rel++;
    if (!*rel || strlen(rel) > MAX_PATH_BYTES)
        return 0;
    size_t size = (size_t)st->st_size;
    if (cache_bytes + size > opt_cache_max) {
        warnx_("cache: %s not cached (--cache-max %zu reached); it is read per request", rel,
               opt_cache_max);
        return 0;
    }
    if (cache_n == cache_cap) {
        size_t cap = cache_cap ? cache_cap * 2 : 64;
        struct cached_file *n = realloc(cache, cap * sizeof *n);
        if (!n)
            return -1;
        cache = n;
        cache_cap = cap;
    }
    char *r = strdup(rel);
    if (!r)
        return -1;
    cache[cache_n].rel = r;
    cache[cache_n].data = NULL;
    cache[cache_n].size = size;
    cache_n++;
    cache_bytes += (size + 63) & ~(size_t)63;
    return 0;
}

/* Loads every regular file under --root into one registration. */
static int cache_load(void)
{
    root_prefix_len = strlen(opt_root);
    if (nftw(opt_root, cache_visit, 64, 0) != 0) {
        fprintf(stderr, "webserver: cache: walking %s: %s\n", opt_root, strerror(errno));
        return -1;
    }
    if (cache_n == 0)
        return 0;
    cache_mem = tcps_alloc_registered(cache_bytes, &cache_handle);
    if (!cache_mem) {
        fprintf(stderr, "webserver: cache: tcps_alloc_registered(%zu): %s\n", cache_bytes,
                strerror(errno));
        return -1;
    }
    size_t off = 0;
    for (size_t i = 0; i < cache_n; i++) {
        struct cached_file *f = &cache[i];
        int fd = openat(root_fd, f->rel, O_RDONLY | O_CLOEXEC);
        if (fd < 0) {
            fprintf(stderr, "webserver: cache: %s: %s\n", f->rel, strerror(errno));
            return -1;
        }
        size_t got = 0;
        while (got < f->size) {
            ssize_t r = pread(fd, cache_mem + off + got, f->size - got, (off_t)got);
            if (r < 0 && errno == EINTR)
                continue;
            if (r <= 0) {
                fprintf(stderr, "webserver: cache: reading %s: %s\n", f->rel,
                        r < 0 ? strerror(errno) : "file shrank");
                close(fd);
                return -1;
            }
            got += (size_t)r;
        }
        close(fd);
        f->data = cache_mem + off;
        off += (f->size + 63) & ~(size_t)63;
    }
    qsort(cache, cache_n, sizeof *cache, cached_cmp);
    return 0;
}

/* One line of the library's counters (at exit, --net tcps). */
static void print_stats(void)
{
    struct tcps_stats st;
    if (tcps_stats(&st) != 0) {
        fprintf(stderr, "webserver: tcps_stats: %s\n", strerror(errno));
        return;
    }
    fprintf(stderr,
            "webserver: tcps_stats: mode=%s bytes_copied=%llu bytes_sent=%llu bytes_received=%llu "
            "async_sends=%llu async_fallbacks=%llu kicks=%llu calls=%llu registered_misuse=%llu "
            "round_trips=%llu ring_recvs=%llu ring_accepts=%llu requests=%llu\n",
            mode_names[opt_mode], st.bytes_copied, st.bytes_sent, st.bytes_received,
            st.async_sends, st.async_fallbacks, st.kicks, st.calls, st.registered_misuse,
            st.round_trips, st.ring_recvs, st.ring_accepts,
            (unsigned long long)atomic_load(&requests_served));
}

static void usage(FILE *f)
{
    fprintf(f,
            "usage: webserver [options]\n"
            "\n"
            "A multi-threaded HTTP/1.0 and HTTP/1.1 web server (keep-alive, pipelining)\n"
            "that runs on kernel sockets or through a tcps TCP server.\n"
            "\n"
            "options:\n"
            "  --net kernel|tcps   network: libc sockets or tcps_* calls (default kernel).\n"
            "                      tcps attaches to the TCP server at $TCPS_SOCKET.\n"
            "  --mode M            how responses are sent with --net tcps (default copy):\n"
            "                        copy              tcps_send: the library copies\n"
            "                                          every byte (thesis 'Sock')\n"
            "                        sync              tcps_send_registered from a\n"
            "                                          registered file cache: no copy,\n"
            "                                          waits for the server's send ('Sync')\n"
            "                        async             tcps_send_async: copied, returns\n"
            "                                          at once ('AsyncSend')\n"
            "                        async-registered  tcps_send_async_registered from\n"
            "                                          the registered cache: no copy, no\n"
            "                                          wait (AsyncSend, zero copy)\n"
            "                      sync and async-registered load every file under --root\n"
            "                      at start (files added later, or beyond --cache-max, are\n"
            "                      read per request; changes to cached files are not seen).\n"
            "                      Headers and /dynamic bodies are built per request: sent\n"
            "                      from a registered buffer (sync) or with tcps_send_async\n"
            "                      (async modes). --net kernel takes only copy.\n"
            "  --cache-max BYTES   most bytes the registered cache holds (default 512 MiB)\n"
            "  --take-direct       (--net tcps) take the connections the TCP server's\n"
            "                      balancing hands over as kernel sockets and serve them\n"
            "                      with system calls (tcps_accept_any)\n"
            "  --addr A            address to listen on, IPv4 or IPv6 (default 0.0.0.0)\n"
            "  --port P            port to listen on (default 8080; 0 picks a free one)\n"
            "  --threads N         worker threads; each accepts and serves one\n"
            "                      connection at a time (default 4)\n"
            "  --root DIR          directory of static files (default .)\n"
            "  --send-size S       bytes per send call for response bodies (default 16384)\n"
            "  --backlog N         listen backlog (default 1024)\n"
            "  --quiet             no warnings on stderr (the 'listening on' line stays)\n"
            "  -h, --help          this help\n"
            "\n"
            "URLs:\n"
            "  /dynamic/N          N bytes (at most %u), each made by one rand_r() call\n"
            "                      (WebStone-style dynamic content), text/plain\n"
            "  /PATH               the file DIR/PATH ('..' is refused; '/' -> index.html)\n"
            "\n"
            "Only GET and HEAD are implemented (others: 501). Every response carries\n"
            "Content-Length. Prints 'listening on ADDR:PORT (...)' to stderr when ready;\n"
            "SIGINT or SIGTERM stops it; with --net tcps it then prints one line of\n"
            "tcps_stats() counters (bytes_copied, bytes_sent, async_sends, kicks, ...).\n",
            DYNAMIC_MAX);
}

static long parse_num(const char *opt, const char *s, long min, long max)
{
    char *end;
    errno = 0;
    long v = strtol(s, &end, 10);
    if (errno || end == s || *end || v < min || v > max) {
        fprintf(stderr, "webserver: invalid %s '%s' (expected %ld..%ld)\n", opt, s, min, max);
        exit(2);
    }
    return v;
}

static void parse_args(int argc, char **argv)
{
    enum { O_NET = 256, O_ADDR, O_PORT, O_THREADS, O_ROOT, O_SEND, O_BACKLOG, O_QUIET, O_MODE,
           O_CACHE_MAX, O_TAKE_DIRECT };
    static const struct option longopts[] = {
        {"net", required_argument, NULL, O_NET},
        {"addr", required_argument, NULL, O_ADDR},
        {"port", required_argument, NULL, O_PORT},
        {"threads", required_argument, NULL, O_THREADS},
        {"root", required_argument, NULL, O_ROOT},
        {"send-size", required_argument, NULL, O_SEND},
        {"backlog", required_argument, NULL, O_BACKLOG},
        {"quiet", no_argument, NULL, O_QUIET},
        {"mode", required_argument, NULL, O_MODE},
        {"cache-max", required_argument, NULL, O_CACHE_MAX},
        {"take-direct", no_argument, NULL, O_TAKE_DIRECT},
        {"help", no_argument, NULL, 'h'},
        {NULL, 0, NULL, 0},
    };
    int c;
    while ((c = getopt_long(argc, argv, "h", longopts, NULL)) != -1) {
        switch (c) {
        case O_NET:
            net = net_ops_by_name(optarg);
            if (!net) {
                fprintf(stderr, "webserver: --net must be kernel or tcps, not '%s'\n", optarg);
                exit(2);
            }
            break;
        case O_ADDR: opt_addr = optarg; break;
        case O_PORT: opt_port = (int)parse_num("--port", optarg, 0, 65535); break;
        case O_THREADS: opt_threads = (int)parse_num("--threads", optarg, 1, 4096); break;
        case O_ROOT: opt_root = optarg; break;
        case O_SEND:
            opt_send_size = (size_t)parse_num("--send-size", optarg, 1, 64L * 1024 * 1024);
            break;
        case O_BACKLOG: opt_backlog = (int)parse_num("--backlog", optarg, 1, 65535); break;
        case O_QUIET: opt_quiet = 1; break;
        case O_TAKE_DIRECT: opt_take_direct = 1; break;
        case O_MODE: {
            size_t i = 0;
            while (i < sizeof mode_names / sizeof mode_names[0] && strcmp(optarg, mode_names[i]))
                i++;
            if (i == sizeof mode_names / sizeof mode_names[0]) {
                fprintf(stderr,
                        "webserver: --mode must be copy, sync, async or async-registered, not "
                        "'%s'\n",
                        optarg);
                exit(2);
            }
            opt_mode = (enum send_mode)i;
            break;
        }
        case O_CACHE_MAX:
            opt_cache_max = (size_t)parse_num("--cache-max", optarg, 0, LONG_MAX);
            break;
        case 'h': usage(stdout); exit(0);
        default: usage(stderr); exit(2);
        }
    }
    if (net != &tcps_ops && opt_mode != MODE_COPY) {
        fprintf(stderr, "webserver: --mode %s needs --net tcps\n", mode_names[opt_mode]);
        exit(2);
    }
    if (optind < argc) {
        fprintf(stderr, "webserver: unexpected argument '%s'\n", argv[optind]);
        usage(stderr);
        exit(2);
    }
}

/* Resolves --addr/--port; accepts "1.2.3.4", "::1", "[::1]" and host names. */
static int resolve(struct sockaddr_storage *ss, socklen_t *len)
{
    char host[256];
    size_t n = strlen(opt_addr);
    if (n >= sizeof host)
        return -1;
    if (n >= 2 && opt_addr[0] == '[' && opt_addr[n - 1] == ']') {
        memcpy(host, opt_addr + 1, n - 2);
        host[n - 2] = 0;
    } else {
        memcpy(host, opt_addr, n + 1);
    }
    struct addrinfo hints, *res;
    memset(&hints, 0, sizeof hints);
    hints.ai_family = AF_UNSPEC;
    hints.ai_socktype = SOCK_STREAM;
    hints.ai_flags = AI_PASSIVE;
    int rc = getaddrinfo(host, NULL, &hints, &res);
    if (rc != 0) {
        fprintf(stderr, "webserver: --addr '%s': %s\n", opt_addr, gai_strerror(rc));
        return -1;
    }
    memcpy(ss, res->ai_addr, res->ai_addrlen);
    *len = res->ai_addrlen;
    freeaddrinfo(res);
    if (ss->ss_family == AF_INET)
        ((struct sockaddr_in *)ss)->sin_port = htons((uint16_t)opt_port);
    else if (ss->ss_family == AF_INET6)
        ((struct sockaddr_in6 *)ss)->sin6_port = htons((uint16_t)opt_port);
    else
        return -1;
    return 0;
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

static void on_signal(int sig) { (void)sig; }

int main(int argc, char **argv)
{
    parse_args(argc, argv);

    signal(SIGPIPE, SIG_IGN);
    /* SIGINT/SIGTERM are taken by sigwait() in the main thread only. A
     * handler is installed first because a shell starts background jobs with
     * SIGINT ignored, and an ignored signal never reaches sigwait(). */
    struct sigaction sa;
    memset(&sa, 0, sizeof sa);
    sa.sa_handler = on_signal;
    sigemptyset(&sa.sa_mask);
    sigaction(SIGINT, &sa, NULL);
    sigaction(SIGTERM, &sa, NULL);
    sigset_t sigs;
    sigemptyset(&sigs);
    sigaddset(&sigs, SIGINT);
    sigaddset(&sigs, SIGTERM);
    pthread_sigmask(SIG_BLOCK, &sigs, NULL);

    root_fd = open(opt_root, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    if (root_fd < 0) {
        fprintf(stderr, "webserver: --root '%s': %s\n", opt_root, strerror(errno));
        return 1;
    }

    if (net == &tcps_ops && tcps_attach(NULL) != 0) {
        int e = errno;
        const char *why = tcps_strerror_last();
        fprintf(stderr, "webserver: cannot attach to the tcps TCP server: %s%s%s\n", strerror(e),
                why && *why ? ": " : "", why ? why : "");
        return 1;
    }
    if (opt_take_direct && (net != &tcps_ops || tcps_take_direct_connections() != 0)) {
        fprintf(stderr, "webserver: --take-direct: %s\n",
                net != &tcps_ops ? "needs --net tcps" : strerror(errno));
        return 2;
    }

    if ((opt_mode == MODE_SYNC || opt_mode == MODE_ASYNC_REG) && cache_load() != 0)
        return 1;

    struct sockaddr_storage ss;
    socklen_t sslen;
    if (resolve(&ss, &sslen) != 0)
        return 1;
    listen_fd = net->socket(ss.ss_family, SOCK_STREAM, 0);
    if (listen_fd < 0) {
        fprintf(stderr, "webserver: socket: %s\n", strerror(errno));
        return 1;
    }
    int one = 1;
    if (net->setsockopt(listen_fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one) != 0)
        warnx_("setsockopt(SO_REUSEADDR): %s", strerror(errno));
    /* Inherited by every accepted connection. */
    if (net->setsockopt(listen_fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one) != 0)
        warnx_("setsockopt(TCP_NODELAY): %s", strerror(errno));
    char where[INET6_ADDRSTRLEN + 16];
    format_addr(&ss, where, sizeof where);
    if (net->bind(listen_fd, (struct sockaddr *)&ss, sslen) != 0) {
        fprintf(stderr, "webserver: bind %s: %s\n", where, strerror(errno));
        return 1;
    }
    if (net->listen(listen_fd, opt_backlog) != 0) {
        fprintf(stderr, "webserver: listen: %s\n", strerror(errno));
        return 1;
    }
    struct sockaddr_storage bound;
    socklen_t blen = sizeof bound;
    if (net->getsockname(listen_fd, (struct sockaddr *)&bound, &blen) == 0 &&
        bound.ss_family == ss.ss_family)
        format_addr(&bound, where, sizeof where);

    struct worker *workers = calloc((size_t)opt_threads, sizeof *workers);
    if (!workers) {
        fprintf(stderr, "webserver: out of memory\n");
        return 1;
    }
    unsigned int base_seed = (unsigned int)time(NULL) ^ (unsigned int)getpid();
    for (int i = 0; i < opt_threads; i++) {
        struct worker *w = &workers[i];
        w->index = i;
        w->seed = base_seed + (unsigned int)i * 2654435761u;
        w->rbuf = malloc(RECV_BUF_SIZE);
        if (opt_mode == MODE_SYNC) {
            w->sbuf = tcps_alloc_registered(HDR_ROOM + opt_send_size, &w->sbuf_mem);
            if (!w->sbuf) {
                fprintf(stderr, "webserver: tcps_alloc_registered: %s\n", strerror(errno));
                return 1;
            }
        } else {
            w->sbuf = malloc(HDR_ROOM + opt_send_size);
        }
        if (!w->rbuf || !w->sbuf) {
            fprintf(stderr, "webserver: out of memory\n");
            return 1;
        }
    }
    atomic_store(&workers_running, opt_threads);
    for (int i = 0; i < opt_threads; i++) {
        int rc = pthread_create(&workers[i].tid, NULL, worker_main, &workers[i]);
        if (rc != 0) {
            fprintf(stderr, "webserver: pthread_create: %s\n", strerror(rc));
            _exit(1);
        }
    }

    fprintf(stderr, "listening on %s (net=%s, mode=%s, threads=%d, send-size=%zu", where,
            net->name, mode_names[opt_mode], opt_threads, opt_send_size);
    if (cache_n > 0)
        fprintf(stderr, ", cache=%zu files, %zu bytes", cache_n, cache_bytes);
    fprintf(stderr, ")\n");
    fflush(stderr);

    int sig = 0;
    while (sigwait(&sigs, &sig) != 0)
        ;
    atomic_store(&stopping, 1);
    if (!opt_quiet && atomic_load(&exit_status) == 0)
        fprintf(stderr, "webserver: %s, stopping\n", sig == SIGINT ? "SIGINT" : "SIGTERM");
    /* Wake the workers blocked in accept (shutdown does that for kernel
     * listeners; close alone does not), then give them a short grace. */
    net->shutdown(listen_fd, SHUT_RDWR);
    net->close(listen_fd);
    for (int i = 0; i < 100 && atomic_load(&workers_running) > 0; i++) {
        struct timespec ts = {0, 10 * 1000 * 1000};
        nanosleep(&ts, NULL);
    }
    int status = atomic_load(&exit_status);
    if (net == &tcps_ops)
        print_stats();
    if (atomic_load(&workers_running) > 0) {
        /* Workers still blocked (an idle keep-alive connection, or a tcps
         * accept): there is nothing left for them to finish. */
        fflush(NULL);
        _exit(status);
    }
    for (int i = 0; i < opt_threads; i++) {
        pthread_join(workers[i].tid, NULL);
        free(workers[i].rbuf);
        if (opt_mode == MODE_SYNC)
            tcps_deregister_memory(workers[i].sbuf_mem);
        else
            free(workers[i].sbuf);
    }
    free(workers);
    if (net == &tcps_ops)
        tcps_detach();
    close(root_fd);
    return status;
}
