// SPDX-License-Identifier: Apache-2.0 OR BSD-3-Clause
/*
 * QEMU's pooled coroutine lifecycle, the peer of the coro-pool suite.
 *
 * The loop is tests/unit/test-coroutine.c's perf_lifecycle (create an
 * empty coroutine, enter it, it terminates and goes back to QEMU's pool),
 * linked against QEMU's own libqemuutil.a as QEMU's build compiled it
 * (util/qemu-coroutine.c with its per-thread and global pools,
 * util/coroutine-ucontext.c). Only the timing differs: thread CPU time, a
 * warm-up, and one line per round.
 *
 * Usage: qemu-lifecycle ITERATIONS ROUNDS
 */
#include <stdio.h>
#include <stdlib.h>
#include <time.h>

typedef struct Coroutine Coroutine;
typedef void CoroutineEntry(void *opaque);
Coroutine *qemu_coroutine_create(CoroutineEntry *entry, void *opaque);
void qemu_coroutine_enter(Coroutine *co);

/*
 * libqemuutil's main-loop.c and thread-context.c reference these QOM
 * functions from their QOM type registration, which nothing here runs.
 * Weak, so that a build that links the real QOM objects uses those.
 */
#define QOM_STUB(name)                                                  \
    void *name(void) __attribute__((weak));                             \
    void *name(void)                                                    \
    {                                                                   \
        fprintf(stderr, "qemu-lifecycle: QOM stub %s called\n", #name); \
        abort();                                                        \
    }
QOM_STUB(object_class_dynamic_cast_assert)
QOM_STUB(object_class_property_add)
QOM_STUB(object_dynamic_cast_assert)
QOM_STUB(object_get_canonical_path_component)
QOM_STUB(type_register_static)

static void empty_coroutine(void *opaque)
{
    (void)opaque;
}

static double cpu_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
    return ts.tv_sec * 1e9 + ts.tv_nsec;
}

int main(int argc, char **argv)
{
    unsigned long max = argc > 1 ? strtoul(argv[1], NULL, 10) : 1000000;
    int rounds = argc > 2 ? atoi(argv[2]) : 1;
    unsigned long i;
    int r;

    for (i = 0; i < 1000; i++) {
        qemu_coroutine_enter(qemu_coroutine_create(empty_coroutine, NULL));
    }
    for (r = 0; r < rounds; r++) {
        double start = cpu_ns();
        for (i = 0; i < max; i++) {
            Coroutine *coroutine = qemu_coroutine_create(empty_coroutine, NULL);
            qemu_coroutine_enter(coroutine);
        }
        printf("lifecycle_ns %.4f\n", (cpu_ns() - start) / max);
    }
    return 0;
}
