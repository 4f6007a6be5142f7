// SPDX-License-Identifier: Apache-2.0 OR BSD-3-Clause
/*
 * Guest side of the live-migration scenario (ci/guest/migrate.sh): a
 * workload that keeps files open, a POSIX lock held and a shared writable
 * mmap on the share while the host migrates the guest to another QEMU and
 * server, and checks all of it on the destination.
 *
 *   migrate DIR MARKER SECONDS_AFTER
 *     1. takes a POSIX write lock (F_SETLKW) on all of DIR/lockfile and
 *        writes "locked <pid>" into it: "MG-LOCK ok pid=P";
 *     2. maps DIR/mapped (MAP_SIZE bytes, MAP_SHARED, read-write): the
 *        first half gets pattern 1 and msync(MS_SYNC), the second half
 *        pattern 2 and no msync (dirty pages that cross the migration in
 *        guest memory): "MG-MMAP written";
 *     3. opens IO_FILES files DIR/io-N and keeps them open; prints
 *        "MG-READY" and loops: each round rewrites one file through its
 *        open fd with a fresh pattern, fsyncs, reads it back and compares,
 *        and compares the mapping with what was written into it. It
 *        prints "MG-IO-PROGRESS rounds=R" every 2 s and checks for MARKER
 *        (the host creates it once the guest runs on the destination);
 *     4. SECONDS_AFTER seconds after MARKER appeared, the checks: the
 *        mapping still holds patterns 1 and 2 and the file reads back the
 *        same; msync, then pattern 3 over the first quarter through the
 *        mapping, msync, read back ("MG-MMAP ok ... fnv=H", H the FNV-1a
 *        64 of the whole file, for the host); a child process's F_GETLK
 *        shows the lock held by this process and its F_SETLK is refused
 *        ("MG-GETLK ok"); the lock file still reads "locked <pid>" through
 *        the locking fd ("MG-HELD ok"); then "MG-IO ok rounds=R
 *        before=B after=A bytes=N max_gap_ms=G" (G: the longest round, the
 *        pause the guest saw) and, last, the unlock ("MG-UNLOCK ok").
 *   Any failure prints "MG-<STEP> FAIL why" and the exit status is 1.
 *
 * Every output line is one write(2), so lines of concurrent tools do not
 * mix on the console. Built with `gcc -static` by ci/guest/migrate.sh.
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
#define MAP_SIZE (256 * 1024)
#define PROGRESS_MS 2000.0

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

static uint64_t fnv1a(const unsigned char *buf, size_t len)
{
    uint64_t h = 0xcbf29ce484222325ull;
    for (size_t i = 0; i < len; i++) {
        h ^= buf[i];
        h *= 0x100000001b3ull;
    }
    return h;
}

/* First differing byte of a and b (len bytes), or -1 when they match. */
static long differs(const unsigned char *a, const unsigned char *b, size_t len)
{
    if (memcmp(a, b, len) == 0)
        return -1;
    size_t i = 0;
    while (a[i] == b[i])
        i++;
    return (long)i;
}

static int pwrite_all(int fd, const unsigned char *buf, size_t len)
{
    size_t done = 0;
    while (done < len) {
        ssize_t w = pwrite(fd, buf + done, len - done, (off_t)done);
        if (w < 0 && errno == EINTR)
            continue;
        if (w <= 0) {
            if (w == 0)
                errno = EIO;
            return -1;
        }
        done += (size_t)w;
    }
    return 0;
}

/* Reads len bytes at 0; returns the count read (short at end of file). */
static ssize_t pread_all(int fd, unsigned char *buf, size_t len)
{
    size_t done = 0;
    while (done < len) {
        ssize_t r = pread(fd, buf + done, len - done, (off_t)done);
        if (r < 0 && errno == EINTR)
            continue;
        if (r < 0)
            return -1;
        if (r == 0)
            break;
        done += (size_t)r;
    }
    return (ssize_t)done;
}

static int lock_range(int fd, short type, int cmd)
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

/* A child asks F_GETLK and tries F_SETLK: the lock must be ours. */
static int check_lock_from_child(const char *path)
{
    pid_t me = getpid();
    pid_t c = fork();
    if (c < 0) {
        say("MG-GETLK FAIL fork: %s", strerror(errno));
        return -1;
    }
    if (c == 0) {
        int fd = open(path, O_RDWR);
        if (fd < 0) {
            say("MG-GETLK FAIL child open %s: %s", path, strerror(errno));
            _exit(1);
        }
        struct flock fl;
        memset(&fl, 0, sizeof(fl));
        fl.l_type = F_WRLCK;
        fl.l_whence = SEEK_SET;
        if (fcntl(fd, F_GETLK, &fl) < 0) {
            say("MG-GETLK FAIL F_GETLK: %s", strerror(errno));
            _exit(1);
        }
        if (fl.l_type != F_WRLCK || fl.l_pid != me) {
            say("MG-GETLK FAIL F_GETLK shows type %d pid %d, want a write lock of pid %d", fl.l_type,
                (int)fl.l_pid, (int)me);
            _exit(1);
        }
        memset(&fl, 0, sizeof(fl));
        fl.l_type = F_WRLCK;
        fl.l_whence = SEEK_SET;
        if (fcntl(fd, F_SETLK, &fl) == 0) {
            say("MG-GETLK FAIL a second process got the lock");
            _exit(1);
        }
        if (errno != EAGAIN && errno != EACCES) {
            say("MG-GETLK FAIL F_SETLK: %s (want EAGAIN)", strerror(errno));
            _exit(1);
        }
        say("MG-GETLK ok holder pid=%d", (int)me);
        _exit(0);
    }
    int st = 0;
    while (waitpid(c, &st, 0) < 0 && errno == EINTR)
        ;
    return WIFEXITED(st) && WEXITSTATUS(st) == 0 ? 0 : -1;
}

static int run(const char *dir, const char *marker, long after_s)
{
    char path[4096];
    int failed = 0;

    /* 1. The lock. */
    snprintf(path, sizeof(path), "%s/lockfile", dir);
    char lockpath[4096];
    snprintf(lockpath, sizeof(lockpath), "%s", path);
    int lfd = open(lockpath, O_RDWR | O_CREAT, 0644);
    if (lfd < 0 || lock_range(lfd, F_WRLCK, F_SETLKW) < 0) {
        say("MG-LOCK FAIL %s: %s", lockpath, strerror(errno));
        return 1;
    }
    char held[64];
    int hlen = snprintf(held, sizeof(held), "locked %d\n", (int)getpid());
    if (ftruncate(lfd, 0) < 0 || pwrite_all(lfd, (const unsigned char *)held, (size_t)hlen) < 0 ||
        fsync(lfd) < 0) {
        say("MG-LOCK FAIL write %s: %s", lockpath, strerror(errno));
        return 1;
    }
    say("MG-LOCK ok pid=%d", (int)getpid());

    /* 2. The shared writable mapping. */
    static unsigned char want_map[MAP_SIZE], got[IO_BYTES > MAP_SIZE ? IO_BYTES : MAP_SIZE];
    snprintf(path, sizeof(path), "%s/mapped", dir);
    int mfd = open(path, O_RDWR | O_CREAT | O_TRUNC, 0644);
    if (mfd < 0 || ftruncate(mfd, MAP_SIZE) < 0) {
        say("MG-MMAP FAIL create %s: %s", path, strerror(errno));
        return 1;
    }
    unsigned char *map = mmap(NULL, MAP_SIZE, PROT_READ | PROT_WRITE, MAP_SHARED, mfd, 0);
    if (map == MAP_FAILED) {
        say("MG-MMAP FAIL mmap %s: %s", path, strerror(errno));
        return 1;
    }
    fill_pattern(want_map, MAP_SIZE / 2, 1);
    fill_pattern(want_map + MAP_SIZE / 2, MAP_SIZE / 2, 2);
    memcpy(map, want_map, MAP_SIZE / 2);
    if (msync(map, MAP_SIZE / 2, MS_SYNC) < 0) {
        say("MG-MMAP FAIL msync: %s", strerror(errno));
        return 1;
    }
    memcpy(map + MAP_SIZE / 2, want_map + MAP_SIZE / 2, MAP_SIZE / 2);
    say("MG-MMAP written bytes=%d synced=%d", MAP_SIZE, MAP_SIZE / 2);

    /* 3. Files kept open, checksummed I/O until the marker, and after. */
    int fds[IO_FILES];
    for (int i = 0; i < IO_FILES; i++) {
        snprintf(path, sizeof(path), "%s/io-%d", dir, i);
        fds[i] = open(path, O_RDWR | O_CREAT | O_TRUNC, 0644);
        if (fds[i] < 0) {
            say("MG-IO FAIL open %s: %s", path, strerror(errno));
            return 1;
        }
    }
    static unsigned char buf[IO_BYTES];
    say("MG-READY");
    long rounds = 0, before = -1;
    unsigned long long bytes = 0;
    double t_prev = now_ms(), t_progress = t_prev, t_marker = 0, max_gap = 0;
    for (;;) {
        int i = (int)(rounds % IO_FILES);
        fill_pattern(buf, IO_BYTES, (uint32_t)(rounds + 1000));
        if (pwrite_all(fds[i], buf, IO_BYTES) < 0 || fsync(fds[i]) < 0) {
            say("MG-IO FAIL round %ld: write io-%d: %s", rounds, i, strerror(errno));
            failed = 1;
            break;
        }
        ssize_t r = pread_all(fds[i], got, IO_BYTES);
        if (r != IO_BYTES) {
            say("MG-IO FAIL round %ld: read io-%d: %s", rounds, i, r < 0 ? strerror(errno) : "short read");
            failed = 1;
            break;
        }
        long d = differs(got, buf, IO_BYTES);
        if (d >= 0) {
            say("MG-IO FAIL round %ld: checksum mismatch in io-%d at byte %ld", rounds, i, d);
            failed = 1;
            break;
        }
        d = differs(map, want_map, MAP_SIZE);
        if (d >= 0) {
            say("MG-MMAP FAIL round %ld: the mapping differs at byte %ld", rounds, d);
            failed = 1;
            break;
        }
        rounds++;
        bytes += 2ull * IO_BYTES;
        double t = now_ms();
        if (t - t_prev > max_gap)
            max_gap = t - t_prev;
        t_prev = t;
        if (t - t_progress >= PROGRESS_MS) {
            say("MG-IO-PROGRESS rounds=%ld", rounds);
            t_progress = t;
        }
        if (before < 0) {
            struct stat st;
            if (stat(marker, &st) == 0) {
                before = rounds;
                t_marker = t;
                say("MG-MARKER seen rounds=%ld", rounds);
            }
        } else if (t - t_marker >= (double)after_s * 1000.0) {
            break;
        }
    }

    /* 4. The checks on the destination. */
    if (!failed) {
        long d = differs(map, want_map, MAP_SIZE);
        ssize_t r = pread_all(mfd, got, MAP_SIZE);
        if (d >= 0) {
            say("MG-MMAP FAIL the mapping differs at byte %ld after the migration", d);
            failed = 1;
        } else if (msync(map, MAP_SIZE, MS_SYNC) < 0) {
            say("MG-MMAP FAIL msync after the migration: %s", strerror(errno));
            failed = 1;
        } else if ((r = pread_all(mfd, got, MAP_SIZE)) != MAP_SIZE) {
            say("MG-MMAP FAIL read back: %s", r < 0 ? strerror(errno) : "short read");
            failed = 1;
        } else if ((d = differs(got, want_map, MAP_SIZE)) >= 0) {
            say("MG-MMAP FAIL the file differs from the mapping at byte %ld", d);
            failed = 1;
        } else {
            fill_pattern(want_map, MAP_SIZE / 4, 3);
            memcpy(map, want_map, MAP_SIZE / 4);
            if (msync(map, MAP_SIZE, MS_SYNC) < 0) {
                say("MG-MMAP FAIL msync of the new bytes: %s", strerror(errno));
                failed = 1;
            } else if ((r = pread_all(mfd, got, MAP_SIZE)) != MAP_SIZE ||
                       (d = differs(got, want_map, MAP_SIZE)) >= 0) {
                say("MG-MMAP FAIL the bytes written after the migration read back wrong (%zd, %ld)", r, d);
                failed = 1;
            } else {
                say("MG-MMAP ok bytes=%d fnv=%016llx", MAP_SIZE,
                    (unsigned long long)fnv1a(want_map, MAP_SIZE));
            }
        }
    }
    if (check_lock_from_child(lockpath) < 0)
        failed = 1;
    ssize_t r = pread(lfd, got, sizeof(held), 0);
    if (r != hlen || memcmp(got, held, (size_t)hlen) != 0) {
        say("MG-HELD FAIL the lock file read %zd bytes through the locking fd: %s", r,
            r < 0 ? strerror(errno) : "other content");
        failed = 1;
    } else {
        say("MG-HELD ok");
    }
    if (!failed)
        say("MG-IO ok rounds=%ld before=%ld after=%ld bytes=%llu max_gap_ms=%.0f", rounds, before,
            rounds - before, bytes, max_gap);
    for (int i = 0; i < IO_FILES; i++) {
        if (close(fds[i]) < 0) {
            say("MG-IO FAIL close io-%d: %s", i, strerror(errno));
            failed = 1;
        }
    }
    munmap(map, MAP_SIZE);
    close(mfd);
    if (lock_range(lfd, F_UNLCK, F_SETLK) < 0) {
        say("MG-UNLOCK FAIL %s", strerror(errno));
        failed = 1;
    } else {
        say("MG-UNLOCK ok");
    }
    close(lfd);
    return failed;
}

int main(int argc, char **argv)
{
    if (argc != 4) {
        say("MG-USAGE FAIL usage: migrate DIR MARKER SECONDS_AFTER");
        return 2;
    }
    char *end;
    long after = strtol(argv[3], &end, 10);
    if (*end || after < 0) {
        say("MG-USAGE FAIL bad SECONDS_AFTER '%s'", argv[3]);
        return 2;
    }
    return run(argv[1], argv[2], after);
}
