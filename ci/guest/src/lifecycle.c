// SPDX-License-Identifier: Apache-2.0 OR BSD-3-Clause
/*
 * Guest side of the lifecycle scenarios (ci/guest/lifecycle.sh): checksummed
 * I/O that runs while the host pauses, resets or rebinds the 9p device, and
 * a POSIX lock waiter that measures how long the grant takes.
 *
 *   lifecycle fill DIR N KIB SEED
 *       writes DIR/fixed-NNN (N files of KIB KiB, content from SEED + i),
 *       fsyncs each; prints "LC-FILL ok ..." or "LC-FILL FAIL ...".
 *   lifecycle verify DIR N KIB SEED
 *       reads the same files back and compares; "LC-VERIFY ok|FAIL ...".
 *   lifecycle io DIR SECONDS [STOPFILE...]
 *       continuous I/O: each round rewrites one of 4 files of 256 KiB with
 *       a fresh pattern, fsyncs, reads it back and compares. Ends when a
 *       STOPFILE exists (checked every round) or after SECONDS; prints
 *       "LC-IO-PROGRESS rounds=R" every 2 s and "LC-IO ok rounds=R bytes=B"
 *       or "LC-IO FAIL round R ...: why" at the end (exit 1).
 *   lifecycle lockwait LABEL FILE MARKER
 *       takes a POSIX write lock on all of FILE with F_SETLKW while a child
 *       stats MARKER every 5 ms (the host creates it right after it
 *       releases its own lock on FILE). Prints "LC-LOCK LABEL waiting
 *       pid=P" (P: the proc_id of its Tlock), then "LC-LOCK LABEL ok
 *       latency_ms=L waited_ms=W" (L: grant time minus the time the
 *       marker was first seen, both in the guest; negative when the grant
 *       came first, by a poll interval or, for a server that ignores host
 *       locks, by as long as the host kept its lock), or "LC-LOCK LABEL ok
 *       granted-before-release waited_ms=W" when no marker appeared within
 *       5 s of the grant, or "LC-LOCK LABEL FAIL why". Whether the grant
 *       came before the host's release is for the host to judge (it looks
 *       for this line before it releases).
 *
 * Every output line is one write(2), so lines of concurrent tools do not
 * mix on the console. Built with `gcc -static` by ci/guest/prepare.sh.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/types.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#define IO_FILES 4
#define IO_BYTES (256 * 1024)
#define CHUNK (64 * 1024)

/* Prints one line with a single write(2). */
static void say(const char *fmt, ...)
{
    char line[1024];
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

static double now_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec * 1000.0 + (double)ts.tv_nsec / 1e6;
}

static void fill_pattern(unsigned char *buf, size_t len, uint32_t seed)
{
    uint32_t x = seed * 2654435761u + 1;
    for (size_t i = 0; i < len; i++) {
        x ^= x << 13;
        x ^= x >> 17;
        x ^= x << 5;
        buf[i] = (unsigned char)x;
    }
}

/* Writes buf as FILE, in CHUNK-sized writes, and fsyncs it. */
static int write_file(const char *path, const unsigned char *buf, size_t len, char *why, size_t wlen)
{
    int fd = open(path, O_CREAT | O_TRUNC | O_WRONLY, 0644);
    if (fd < 0) {
        snprintf(why, wlen, "open %s for writing: %s", path, strerror(errno));
        return -1;
    }
    size_t done = 0;
    while (done < len) {
        size_t n = len - done < CHUNK ? len - done : CHUNK;
        ssize_t w = write(fd, buf + done, n);
        if (w < 0 && errno == EINTR)
            continue;
        if (w <= 0) {
            snprintf(why, wlen, "write %s at %zu: %s", path, done, w < 0 ? strerror(errno) : "wrote 0");
            close(fd);
            return -1;
        }
        done += (size_t)w;
    }
    if (fsync(fd) < 0) {
        snprintf(why, wlen, "fsync %s: %s", path, strerror(errno));
        close(fd);
        return -1;
    }
    if (close(fd) < 0) {
        snprintf(why, wlen, "close %s: %s", path, strerror(errno));
        return -1;
    }
    return 0;
}

/* Reads FILE back and compares it with want (and its size with len). */
static int check_file(const char *path, const unsigned char *want, size_t len, unsigned char *got, char *why,
                      size_t wlen)
{
    int fd = open(path, O_RDONLY);
    if (fd < 0) {
        snprintf(why, wlen, "open %s for reading: %s", path, strerror(errno));
        return -1;
    }
    size_t done = 0;
    for (;;) {
        size_t room = len + 1 - done; /* one byte more to see a long file */
        ssize_t r = pread(fd, got + done, room < CHUNK ? room : CHUNK, (off_t)done);
        if (r < 0 && errno == EINTR)
            continue;
        if (r < 0) {
            snprintf(why, wlen, "read %s at %zu: %s", path, done, strerror(errno));
            close(fd);
            return -1;
        }
        if (r == 0 || done + (size_t)r > len) {
            done += (size_t)r;
            break;
        }
        done += (size_t)r;
    }
    close(fd);
    if (done != len) {
        snprintf(why, wlen, "%s has %zu bytes, want %zu", path, done, len);
        return -1;
    }
    if (memcmp(got, want, len) != 0) {
        size_t i = 0;
        while (got[i] == want[i])
            i++;
        snprintf(why, wlen, "checksum mismatch in %s: first differing byte at %zu", path, i);
        return -1;
    }
    return 0;
}

static long parse_num(const char *s, const char *what)
{
    char *end;
    errno = 0;
    long v = strtol(s, &end, 10);
    if (errno || *end || v < 0) {
        say("LC-USAGE FAIL bad %s '%s'", what, s);
        exit(2);
    }
    return v;
}

static int cmd_fixed(int verify, const char *dir, long n, long kib, long seed)
{
    const char *what = verify ? "LC-VERIFY" : "LC-FILL";
    size_t len = (size_t)kib * 1024;
    unsigned char *want = malloc(len), *got = malloc(len + 1);
    char path[4096], why[512];
    if (!want || !got) {
        say("%s FAIL out of memory", what);
        return 1;
    }
    for (long i = 0; i < n; i++) {
        snprintf(path, sizeof(path), "%s/fixed-%03ld", dir, i);
        fill_pattern(want, len, (uint32_t)(seed + i));
        int rc = verify ? check_file(path, want, len, got, why, sizeof(why))
                        : write_file(path, want, len, why, sizeof(why));
        if (rc < 0) {
            say("%s FAIL %s", what, why);
            return 1;
        }
    }
    say("%s ok files=%ld bytes=%ld", what, n, n * kib * 1024);
    return 0;
}

static int cmd_io(const char *dir, long seconds, char **stops, int nstops)
{
    unsigned char *want = malloc(IO_BYTES), *got = malloc(IO_BYTES + 1);
    char path[4096], why[512];
    struct stat st;
    if (!want || !got) {
        say("LC-IO FAIL out of memory");
        return 1;
    }
    double t0 = now_ms(), last = t0;
    uint32_t base = (uint32_t)time(NULL) ^ ((uint32_t)getpid() << 16);
    long rounds = 0;
    for (;;) {
        int stop = 0;
        for (int i = 0; i < nstops; i++)
            if (stat(stops[i], &st) == 0)
                stop = 1;
        double t = now_ms();
        if (stop || t - t0 > (double)seconds * 1000.0)
            break;
        if (t - last >= 2000.0) {
            say("LC-IO-PROGRESS rounds=%ld", rounds);
            last = t;
        }
        snprintf(path, sizeof(path), "%s/io-%ld", dir, rounds % IO_FILES);
        fill_pattern(want, IO_BYTES, base + (uint32_t)rounds);
        if (write_file(path, want, IO_BYTES, why, sizeof(why)) < 0 ||
            check_file(path, want, IO_BYTES, got, why, sizeof(why)) < 0) {
            say("LC-IO FAIL round %ld: %s", rounds, why);
            return 1;
        }
        rounds++;
    }
    say("LC-IO ok rounds=%ld bytes=%ld seconds=%.1f", rounds, rounds * (long)IO_BYTES * 2,
        (now_ms() - t0) / 1000.0);
    return 0;
}

struct shared {
    volatile double seen_ms; /* when the poller first saw the marker, 0 before */
    volatile int stop;
};

static int cmd_lockwait(const char *label, const char *file, const char *marker)
{
    struct shared *sh = mmap(NULL, sizeof(*sh), PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
    if (sh == MAP_FAILED) {
        say("LC-LOCK %s FAIL mmap: %s", label, strerror(errno));
        return 1;
    }
    sh->seen_ms = 0;
    sh->stop = 0;
    int fd = open(file, O_RDWR);
    if (fd < 0) {
        say("LC-LOCK %s FAIL open %s: %s", label, file, strerror(errno));
        return 1;
    }
    pid_t poller = fork();
    if (poller < 0) {
        say("LC-LOCK %s FAIL fork: %s", label, strerror(errno));
        return 1;
    }
    if (poller == 0) {
        struct stat st;
        struct timespec nap = {.tv_sec = 0, .tv_nsec = 5 * 1000 * 1000};
        while (!sh->stop) {
            if (stat(marker, &st) == 0) {
                sh->seen_ms = now_ms();
                say("LC-LOCK %s marker-seen", label);
                _exit(0);
            }
            nanosleep(&nap, NULL);
        }
        _exit(0);
    }
    say("LC-LOCK %s waiting pid=%d", label, (int)getpid());
    double t0 = now_ms();
    struct flock fl = {.l_type = F_WRLCK, .l_whence = SEEK_SET, .l_start = 0, .l_len = 0};
    int rc;
    do {
        rc = fcntl(fd, F_SETLKW, &fl);
    } while (rc < 0 && errno == EINTR);
    int err = errno;
    double granted = now_ms();
    int status = 0;
    if (rc < 0) {
        sh->stop = 1;
        waitpid(poller, &status, 0);
        say("LC-LOCK %s FAIL fcntl(F_SETLKW): %s after %.1f ms", label, strerror(err), granted - t0);
        return 1;
    }
    /* The grant may come before the marker is seen: by a poll and a stat
     * round trip (longer on a loaded host), or by much more when the server
     * ignores the host's lock. */
    while (sh->seen_ms == 0 && now_ms() - granted < 5000.0) {
        struct timespec nap = {.tv_sec = 0, .tv_nsec = 2 * 1000 * 1000};
        nanosleep(&nap, NULL);
    }
    double seen = sh->seen_ms;
    sh->stop = 1;
    waitpid(poller, &status, 0);
    if (seen == 0)
        say("LC-LOCK %s ok granted-before-release waited_ms=%.1f", label, granted - t0);
    else
        say("LC-LOCK %s ok latency_ms=%.1f waited_ms=%.1f", label, granted - seen, granted - t0);
    fl.l_type = F_UNLCK;
    if (fcntl(fd, F_SETLK, &fl) < 0) {
        say("LC-LOCK %s FAIL unlock: %s", label, strerror(errno));
        return 1;
    }
    close(fd);
    return 0;
}

static void usage(void)
{
    say("LC-USAGE FAIL usage: lifecycle fill|verify DIR N KIB SEED | io DIR SECONDS [STOPFILE...] | "
        "lockwait LABEL FILE MARKER");
    exit(2);
}

int main(int argc, char **argv)
{
    if (argc < 2)
        usage();
    const char *cmd = argv[1];
    if ((strcmp(cmd, "fill") == 0 || strcmp(cmd, "verify") == 0) && argc == 6)
        return cmd_fixed(cmd[0] == 'v', argv[2], parse_num(argv[3], "N"), parse_num(argv[4], "KIB"),
                         parse_num(argv[5], "SEED"));
    if (strcmp(cmd, "io") == 0 && argc >= 4)
        return cmd_io(argv[2], parse_num(argv[3], "SECONDS"), argv + 4, argc - 4);
    if (strcmp(cmd, "lockwait") == 0 && argc == 5)
        return cmd_lockwait(argv[2], argv[3], argv[4]);
    usage();
    return 2;
}
