// The hardware floor of a small message between two cores: two processes bounce a counter
// through two words of shared memory (on separate cache lines), each pinned to its own CPU,
// spinning with plain loads. Prints the one-way time (round trip / 2).
//
// On a VM the host may move the two vCPUs: run it a few times next to a benchmark to tell a
// slow library call from a slow placement (see docs/performance.md, "Host placement").
//
// Build and run: cc -O2 -o /tmp/line_pingpong benches/peers/line_pingpong.c && /tmp/line_pingpong [iterations]
#define _GNU_SOURCE
#include <sched.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

static double now(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return t.tv_sec + t.tv_nsec * 1e-9;
}

int main(int argc, char **argv) {
    long n = argc > 1 ? atol(argv[1]) : 200000, warm = 1000;
    if (n <= warm) n = warm + 1;
    // Two spinning processes on one CPU would take turns by time slices: nothing to measure.
    cpu_set_t both;
    CPU_ZERO(&both);
    CPU_SET(0, &both);
    CPU_SET(1, &both);
    if (sysconf(_SC_NPROCESSORS_ONLN) < 2 || sched_setaffinity(0, sizeof both, &both) != 0 ||
        sched_getaffinity(0, sizeof both, &both) != 0 || CPU_COUNT(&both) < 2) {
        printf("one-way n/a (needs CPUs 0 and 1)\n");
        return 0;
    }
    char *m = mmap(NULL, 1 << 16, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
    if (m == MAP_FAILED) return perror("mmap"), 1;
    // 4 KiB apart: different lines and no adjacent-line prefetch between them.
    volatile uint64_t *ping = (uint64_t *)m, *pong = (uint64_t *)(m + 4096);
    pid_t child = fork();
    if (child < 0) return perror("fork"), 1;
    cpu_set_t set;
    CPU_ZERO(&set);
    CPU_SET(child == 0 ? 1 : 0, &set);
    sched_setaffinity(0, sizeof set, &set);
    if (child == 0) {
        for (uint64_t i = 1; i <= (uint64_t)n; i++) {
            while (*ping < i) {}
            *pong = i;
        }
        _exit(0);
    }
    double t0 = 0;
    for (uint64_t i = 1; i <= (uint64_t)n; i++) {
        if (i == (uint64_t)warm) t0 = now();
        *ping = i;
        while (*pong < i) {}
    }
    double t = now() - t0;
    waitpid(child, NULL, 0);
    printf("one-way %.3f us\n", t / (double)(n - warm + 1) / 2 * 1e6);
    return 0;
}
