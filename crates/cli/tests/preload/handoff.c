/* Hands an accepted TCP connection to /bin/cat as its stdin and stdout, the
 * way inetd, CGI runners and supervisors do, then talks to cat through the
 * connection's peer (a socket of this same process):
 *
 *   handoff MODE OUT    MODE: vfork_execv | fork_execl | fork_execlp |
 *                             fork_execle | fork_closeall | spawn |
 *                             clone_vm
 *
 * The parent closes its copy, sends a payload, shuts its writing side
 * down and reads cat's echo to EOF into the file OUT; cat must then see
 * EOF and exit 0. Stdout gets the parent's own lines only. SIGALRM bounds
 * the whole run (a hang is a failure).
 *
 * fork_closeall: the child closes every descriptor above 2 with close()
 * before execv, as daemons and older runtimes do.
 *
 * clone_vm: the child is made with clone(CLONE_VM|CLONE_VFORK), which the
 * preload cannot see: it shares the parent's memory, so through tcps its
 * exec is refused (status 127, the line "hand-off refused" on stdout and
 * nothing sent), and the parent's own descriptors must stay its own. */
#define _GNU_SOURCE
#include <arpa/inet.h>
#include <errno.h>
#include <sched.h>
#include <spawn.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

extern char **environ;

static void die(const char *what) { perror(what); exit(2); }

/* Set by the clone_vm child (it shares our memory) when its exec failed. */
static volatile int exec_failed;

/* The clone_vm child: cat with the socket as fd 0 and fd 1. */
static int clone_child(void *arg) {
    int s = *(int *)arg;
    if (dup2(s, 0) != 0 || dup2(s, 1) != 1) return 126;
    char *argv[] = {"cat", NULL};
    execv("/bin/cat", argv);
    exec_failed = errno;
    return 127;
}

/* Starts cat with `s` as fd 0 and fd 1. */
static pid_t start_cat(const char *mode, int s) {
    if (!strcmp(mode, "clone_vm")) {
        static char stack[256 * 1024];
        static int arg;
        arg = s;
        pid_t p = clone(clone_child, stack + sizeof stack, CLONE_VM | CLONE_VFORK | SIGCHLD, &arg);
        if (p < 0) die("clone");
        return p;
    }
    if (!strcmp(mode, "spawn")) {
        posix_spawn_file_actions_t fa;
        posix_spawn_file_actions_init(&fa);
        if (posix_spawn_file_actions_adddup2(&fa, s, 0) || posix_spawn_file_actions_adddup2(&fa, s, 1))
            die("adddup2");
        char *argv[] = {"cat", NULL};
        pid_t p;
        int e = posix_spawn(&p, "/bin/cat", &fa, NULL, argv, environ);
        if (e) { errno = e; die("posix_spawn"); }
        posix_spawn_file_actions_destroy(&fa);
        return p;
    }
    int use_vfork = !strncmp(mode, "vfork", 5);
    pid_t p = use_vfork ? vfork() : fork();
    if (p < 0) die("fork");
    if (p == 0) {
        if (dup2(s, 0) != 0 || dup2(s, 1) != 1) _exit(126);
        if (!strcmp(mode, "vfork_execv")) {
            char *argv[] = {"cat", NULL};
            execv("/bin/cat", argv);
        } else if (!strcmp(mode, "fork_execl")) {
            execl("/bin/cat", "cat", (char *)NULL);
        } else if (!strcmp(mode, "fork_execlp")) {
            execlp("cat", "cat", (char *)NULL);
        } else if (!strcmp(mode, "fork_closeall")) {
            for (int fd = 3; fd < 65536; fd++) close(fd);
            char *argv[] = {"cat", NULL};
            execv("/bin/cat", argv);
        } else if (!strcmp(mode, "fork_execle")) {
            execle("/bin/cat", "cat", (char *)NULL, environ);
        }
        _exit(127);
    }
    return p;
}

int main(int argc, char **argv) {
    if (argc != 3) { fprintf(stderr, "usage: handoff MODE OUT\n"); return 2; }
    alarm(20);
    int l = socket(AF_INET, SOCK_STREAM, 0);
    struct sockaddr_in a = {.sin_family = AF_INET};
    socklen_t al = sizeof a;
    inet_pton(AF_INET, "127.0.0.1", &a.sin_addr);
    if (bind(l, (void *)&a, sizeof a) || listen(l, 8) || getsockname(l, (void *)&a, &al)) die("listen");
    int c = socket(AF_INET, SOCK_STREAM, 0);
    if (connect(c, (void *)&a, sizeof a)) die("connect");
    int s = accept(l, NULL, NULL);
    if (s < 0) die("accept");
    pid_t p = start_cat(argv[1], s);
    /* CLONE_VFORK: the child has exec'd or given up by now. */
    int st;
    close(s);
    /* Right after the hand-off: a parent whose fd 1 was remapped would
     * send this line to the peer. */
    printf("parent stdout line\n");
    fflush(stdout);
    if (exec_failed) {
        if (waitpid(p, &st, 0) != p) die("waitpid");
        printf("hand-off refused: %s, status %d\n", strerror(exec_failed),
               WIFEXITED(st) ? WEXITSTATUS(st) : -1);
        return 0;
    }
    /* 48 KiB of a fixed pattern, in pieces. */
    static char buf[48 * 1024];
    for (size_t i = 0; i < sizeof buf; i++) buf[i] = (char)(i * 7 + i / 251);
    for (size_t off = 0; off < sizeof buf;) {
        ssize_t n = write(c, buf + off, sizeof buf - off > 4096 ? 4096 : sizeof buf - off);
        if (n <= 0) die("write");
        off += (size_t)n;
    }
    shutdown(c, SHUT_WR);
    FILE *out = fopen(argv[2], "w");
    if (!out) die("fopen");
    char r[8192];
    ssize_t n;
    while ((n = read(c, r, sizeof r)) > 0) fwrite(r, 1, (size_t)n, out);
    if (n < 0) die("read");
    fclose(out);
    close(c);
    if (waitpid(p, &st, 0) != p) die("waitpid");
    printf("cat: %s %d\n", WIFEXITED(st) ? "exit" : "signal",
           WIFEXITED(st) ? WEXITSTATUS(st) : WTERMSIG(st));
    return 0;
}
