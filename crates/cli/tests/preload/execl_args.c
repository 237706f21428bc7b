/* execl, execlp and execle with argument lists longer than the argument
 * registers (the rest is read from the caller's stack) and an environment
 * after the list: the exec'd echo and env print them.
 *
 *   execl_args l | lp | le | l0 */
#include <string.h>
#include <unistd.h>

int main(int argc, char **argv) {
    char *env[] = {"A=1", "B=two", NULL};
    if (argc < 2) return 2;
    if (!strcmp(argv[1], "l"))
        execl("/bin/echo", "echo", "a1", "a2", "a3", "a4", "a5", "a6", "a7", "a8", "a9", "a10", (char *)0);
    if (!strcmp(argv[1], "lp")) execlp("echo", "echo", "p1", "p2", (char *)0);
    if (!strcmp(argv[1], "le"))
        execle("/usr/bin/env", "env", "-u", "X1", "-u", "X2", "-u", "X3", "-u", "X4", (char *)0, env);
    if (!strcmp(argv[1], "l0")) execl("/bin/echo", "echo", (char *)0);
    return 99;
}
