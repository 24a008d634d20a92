/*
 * An LD_PRELOAD shim that makes every fsync and fdatasync of the process take at least
 * SLOW_FSYNC_US extra microseconds (default 2000) before the real call. It stands in for a
 * disk whose flush is slow (a network volume, a busy array) so the durability benchmark can
 * show group commit where fsync, not CPU, is the bottleneck. Benchmark use only; built and
 * used by scripts/bench/slow-fsync.sh.
 */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <stdlib.h>
#include <time.h>
#include <unistd.h>

static long delay_us(void) {
    const char *value = getenv("SLOW_FSYNC_US");
    return value ? atol(value) : 2000;
}

static void pause_for_flush(void) {
    long us = delay_us();
    struct timespec wait = {us / 1000000, (us % 1000000) * 1000};
    while (nanosleep(&wait, &wait) != 0) {
    }
}

int fsync(int fd) {
    static int (*real)(int);
    if (!real) real = (int (*)(int))dlsym(RTLD_NEXT, "fsync");
    pause_for_flush();
    return real(fd);
}

int fdatasync(int fd) {
    static int (*real)(int);
    if (!real) real = (int (*)(int))dlsym(RTLD_NEXT, "fdatasync");
    pause_for_flush();
    return real(fd);
}
