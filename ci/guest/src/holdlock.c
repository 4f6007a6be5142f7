// SPDX-License-Identifier: Apache-2.0 OR BSD-3-Clause
/*
 * Guest side of the kill -9 scenario (ci/guest/restart.sh --state): a
 * process that keeps a file open with a POSIX write lock on all of it
 * while the host kills and restarts the 9p daemon, and checks the open
 * file on demand.
 *
 *   holdlock FILE
 *       opens FILE read-write, takes the lock with F_SETLKW, writes
 *       "locked <pid>\n" at offset 0 and prints "CI-R LOCKED pid=P".
 *       Then, at each SIGUSR1, reads offset 0 back through the same open
 *       file and prints "CI-R HELD ok" or "CI-R HELD FAIL why"; at
 *       SIGTERM, unlocks and prints "CI-R UNLOCKED ok" (or FAIL), exit 0
 *       when every check passed.
 *
 * Every output line is one write(2). Built with `gcc -static` by
 * ci/guest/restart.sh (ci/guest/prepare.sh builds the other tools).
 */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

static void say(const char *fmt, ...)
{
    char line[512];
    va_list ap;
    va_start(ap, fmt);
    int n = vsnprintf(line, sizeof(line) - 1, fmt, ap);
    va_end(ap);
    if (n < 0)
        return;
    if (n > (int)sizeof(line) - 2)
        n = (int)sizeof(line) - 2;
    line[n++] = '\n';
    ssize_t w = write(STDOUT_FILENO, line, (size_t)n);
    (void)w;
}

static int lock(int fd, short type, int cmd)
{
    struct flock fl;
    memset(&fl, 0, sizeof(fl));
    fl.l_type = type;
    fl.l_whence = SEEK_SET;
    while (fcntl(fd, cmd, &fl) < 0) {
        if (errno != EINTR)
            return -1;
    }
    return 0;
}

int main(int argc, char **argv)
{
    if (argc != 2) {
        say("CI-R LOCKED FAIL usage: holdlock FILE");
        return 2;
    }
    int fd = open(argv[1], O_RDWR | O_CREAT, 0644);
    if (fd < 0) {
        say("CI-R LOCKED FAIL open %s: %s", argv[1], strerror(errno));
        return 1;
    }
    if (lock(fd, F_WRLCK, F_SETLKW) < 0) {
        say("CI-R LOCKED FAIL lock: %s", strerror(errno));
        return 1;
    }
    char want[64];
    int len = snprintf(want, sizeof(want), "locked %d\n", (int)getpid());
    if (ftruncate(fd, 0) < 0 || pwrite(fd, want, (size_t)len, 0) != len) {
        say("CI-R LOCKED FAIL write: %s", strerror(errno));
        return 1;
    }
    sigset_t set;
    sigemptyset(&set);
    sigaddset(&set, SIGUSR1);
    sigaddset(&set, SIGTERM);
    sigprocmask(SIG_BLOCK, &set, NULL);
    say("CI-R LOCKED pid=%d", (int)getpid());
    int failed = 0;
    for (;;) {
        int sig = 0;
        if (sigwait(&set, &sig) != 0)
            continue;
        if (sig == SIGTERM)
            break;
        char got[64];
        ssize_t n = pread(fd, got, sizeof(got), 0);
        if (n != len || memcmp(got, want, (size_t)len) != 0) {
            failed = 1;
            say("CI-R HELD FAIL read %zd bytes: %s", n, n < 0 ? strerror(errno) : "other content");
        } else {
            say("CI-R HELD ok");
        }
    }
    if (lock(fd, F_UNLCK, F_SETLK) < 0) {
        say("CI-R UNLOCKED FAIL %s", strerror(errno));
        return 1;
    }
    say("CI-R UNLOCKED ok");
    return failed;
}
