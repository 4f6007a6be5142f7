// SPDX-License-Identifier: Apache-2.0 OR BSD-3-Clause
/*
 * Guest-side relay for the 9p socket transport: joins a virtio-serial port
 * (whose host end is the 9p server's unix socket) to a unix socket in the
 * guest, so the kernel can `mount -t 9p -o trans=unix SOCK`.
 * (trans=fd on the port itself does not work: the virtio console driver has
 * no write_iter.)
 *
 * Usage: relay PORT_DEVICE SOCKET_PATH
 * Listens on SOCKET_PATH and serves one connection at a time. Both
 * directions are buffered and every descriptor is non-blocking, so a full
 * queue in one direction never stalls the other (a blocking relay can
 * deadlock when both sides write at once). Exits when the port reaches end
 * of file.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#define BUF_SIZE (1024 * 1024)

struct buf {
    char *data;
    size_t head; /* first unsent byte */
    size_t tail; /* end of the buffered bytes */
};

static size_t buf_len(const struct buf *b) { return b->tail - b->head; }
static size_t buf_room(const struct buf *b) { return BUF_SIZE - b->tail; }

/* Reads what fits from fd. Returns 1 on progress or EAGAIN, 0 on EOF, -1 on error. */
static int fill(struct buf *b, int fd)
{
    if (b->head == b->tail)
        b->head = b->tail = 0;
    if (buf_room(b) == 0 && b->head > 0) {
        memmove(b->data, b->data + b->head, buf_len(b));
        b->tail -= b->head;
        b->head = 0;
    }
    if (buf_room(b) == 0)
        return 1;
    ssize_t n = read(fd, b->data + b->tail, buf_room(b));
    if (n < 0)
        return (errno == EINTR || errno == EAGAIN) ? 1 : -1;
    if (n == 0)
        return 0;
    b->tail += (size_t)n;
    return 1;
}

/* Writes what fd accepts. Returns 0 on progress or EAGAIN, -1 on error. */
static int drain(struct buf *b, int fd)
{
    if (buf_len(b) == 0)
        return 0;
    ssize_t n = write(fd, b->data + b->head, buf_len(b));
    if (n < 0)
        return (errno == EINTR || errno == EAGAIN) ? 0 : -1;
    b->head += (size_t)n;
    return 0;
}

static int set_nonblock(int fd)
{
    int fl = fcntl(fd, F_GETFL);
    return fl < 0 ? -1 : fcntl(fd, F_SETFL, fl | O_NONBLOCK);
}

int main(int argc, char **argv)
{
    if (argc != 3) {
        fprintf(stderr, "usage: %s PORT_DEVICE SOCKET_PATH\n", argv[0]);
        return 2;
    }
    int port = open(argv[1], O_RDWR | O_CLOEXEC | O_NONBLOCK);
    if (port < 0) {
        fprintf(stderr, "relay: open %s: %s\n", argv[1], strerror(errno));
        return 1;
    }
    struct sockaddr_un addr = {.sun_family = AF_UNIX};
    if (strlen(argv[2]) >= sizeof(addr.sun_path)) {
        fprintf(stderr, "relay: socket path too long\n");
        return 2;
    }
    strcpy(addr.sun_path, argv[2]);
    unlink(argv[2]);
    int lsock = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (lsock < 0 || bind(lsock, (struct sockaddr *)&addr, sizeof(addr)) < 0 || listen(lsock, 1) < 0) {
        fprintf(stderr, "relay: listen on %s: %s\n", argv[2], strerror(errno));
        return 1;
    }
    struct buf to_conn = {.data = malloc(BUF_SIZE)}, to_port = {.data = malloc(BUF_SIZE)};
    if (!to_conn.data || !to_port.data)
        return 1;
    for (;;) {
        int conn = accept4(lsock, NULL, NULL, SOCK_CLOEXEC);
        if (conn < 0) {
            if (errno == EINTR)
                continue;
            fprintf(stderr, "relay: accept: %s\n", strerror(errno));
            return 1;
        }
        if (set_nonblock(conn) < 0)
            return 1;
        to_conn.head = to_conn.tail = 0;
        int conn_open = 1;
        while (conn_open || buf_len(&to_port) > 0) {
            struct pollfd pfd[2] = {{.fd = port}, {.fd = conn_open ? conn : -1}};
            if (buf_room(&to_conn) > 0 || to_conn.head > 0)
                pfd[0].events |= POLLIN;
            if (buf_len(&to_port) > 0)
                pfd[0].events |= POLLOUT;
            if (buf_room(&to_port) > 0 || to_port.head > 0)
                pfd[1].events |= POLLIN;
            if (buf_len(&to_conn) > 0)
                pfd[1].events |= POLLOUT;
            if (poll(pfd, 2, -1) < 0) {
                if (errno == EINTR)
                    continue;
                return 1;
            }
            if (pfd[0].revents & (POLLIN | POLLHUP | POLLERR)) {
                int rc = fill(&to_conn, port);
                if (rc <= 0) {
                    fprintf(stderr, "relay: port %s\n", rc == 0 ? "closed" : strerror(errno));
                    return rc == 0 ? 0 : 1;
                }
            }
            if ((pfd[0].revents & POLLOUT) && drain(&to_port, port) < 0) {
                fprintf(stderr, "relay: port write: %s\n", strerror(errno));
                return 1;
            }
            if (!conn_open)
                continue;
            if (pfd[1].revents & (POLLIN | POLLHUP | POLLERR)) {
                if (fill(&to_port, conn) <= 0)
                    conn_open = 0; /* the mount went away; flush, then accept again */
            }
            if (conn_open && (pfd[1].revents & POLLOUT) && drain(&to_conn, conn) < 0)
                conn_open = 0;
        }
        close(conn);
    }
}
