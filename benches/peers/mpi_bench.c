/*
 * mpi_bench: the Open MPI peer of symm-bench (benches/src/bin/symm-bench.rs), measured the
 * same way so that the two tables can be put side by side (scripts/peers.sh does).
 *
 *   mpirun -np N mpi_bench <op> [-b minbytes] [-e maxbytes] [-f factor] [-d float|double]
 *                               [-n iters] [-w warmup] [-c 0|1] [--pin 0|1] [--touch 0|1] [--csv]
 *
 * <op> and the MPI call of each form (out of place / in place):
 *   all_reduce      MPI_Allreduce(sum)             / MPI_Allreduce(MPI_IN_PLACE)
 *   reduce_scatter  MPI_Reduce_scatter_block(sum)  / same with MPI_IN_PLACE (MPI's in-place
 *                   form: input = the whole receive buffer, result in its first part)
 *   all_gather      MPI_Allgather                  / MPI_Allgather(MPI_IN_PLACE): own part
 *                   already at its place in the output
 *   alltoall        MPI_Alltoall                   (one form)
 *   sendrecv        MPI_Sendrecv ring: send to rank+1, receive from rank-1, both at once
 *   broadcast       MPI_Bcast, root 0              (one form, in the out-of-place columns)
 *   pingpong        MPI_Send / MPI_Recv between ranks 0 and 1 (others idle); time =
 *                   one-way latency = round trip / 2
 *
 * Everything else follows symm-bench exactly:
 * - sizes: min, min x f, ... <= max (K/M/G = 2^10/2^20/2^30). S is the total buffer size in
 *   bytes; for reduce_scatter, all_gather and alltoall S is the total of the N parts, rounded
 *   down to whole parts, and `count` is the elements of one part; otherwise count = S / dtype.
 * - iterations: -n (default 20), from 1 MiB on min(n, max(3, 2^28 / S)); warm-ups: -w
 *   (default 5), min(w, max(1, 2^26 / S)).
 * - timing of a form: barrier, warm-ups, barrier, then -n iterations timed together; the
 *   time is the mean per iteration, the maximum over the ranks (an MPI_Allreduce(MAX) after
 *   the timed loops). Out of place first, then in place.
 * - algbw = S / time, busbw = algbw x 2(n-1)/n (all_reduce), (n-1)/n (reduce_scatter,
 *   all_gather, alltoall) or 1 (broadcast, sendrecv, pingpong); GB/s = 1e9 B/s.
 * - buffers: two, allocated once for the largest size (page aligned) and touched at once;
 *   before each size the used parts are filled with rank-dependent small integers.
 * - check (-c 1, default): after each form's timed loop, untimed: inputs filled with
 *   pattern(rank, element) (integers below 97), outputs poisoned with byte 0xA5, one more
 *   call, every output element compared exactly with the expected value (sums of small
 *   integers are exact in float). #wrong = mismatches summed over ranks; exit status 3 if any.
 * - pinning (--pin 1, default): after MPI_Init rank r pins itself to allowed CPU r % #allowed,
 *   like symm-bench. Launch with `mpirun --bind-to none` to let it choose, or let mpirun bind.
 * - the memory-bound columns of symm-bench are not computed here.
 *
 * Build: mpicc -O2 -o mpi_bench mpi_bench.c
 */
#define _GNU_SOURCE
#include <mpi.h>
#include <sched.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <unistd.h>

#define POISON 0xA5
#define EXACT (1u << 24) /* integers below this are exact in float (and double) */

enum op { ALL_REDUCE, REDUCE_SCATTER, ALL_GATHER, ALLTOALL, SENDRECV, BROADCAST, PINGPONG, NOPS };
static const char *const OP_NAMES[NOPS] = {"all_reduce", "reduce_scatter", "all_gather", "alltoall",
                                           "sendrecv",   "broadcast",      "pingpong"};

enum form { OOP = 0, IP = 1 };

struct options {
    enum op op;
    size_t min_bytes, max_bytes, factor;
    int iters, warmup, check, pin, touch, csv;
    int dbl; /* 0: float, 1: double */
};

static int n_ranks, me;
static struct options o;
static unsigned char *A, *B; /* buffer roles as in symm-bench's Bench::a / Bench::b */
static MPI_Datatype DT;
static size_t DSIZE;

static int reduces(enum op op) { return op == ALL_REDUCE || op == REDUCE_SCATTER; }
static int has_in_place(enum op op) { return op == ALL_REDUCE || op == REDUCE_SCATTER || op == ALL_GATHER; }
static int split(enum op op) { return op == REDUCE_SCATTER || op == ALL_GATHER || op == ALLTOALL; }

static double bus_factor(enum op op, int n) {
    switch (op) {
    case ALL_REDUCE: return 2.0 * (n - 1) / n;
    case REDUCE_SCATTER:
    case ALL_GATHER:
    case ALLTOALL: return (double)(n - 1) / n;
    default: return 1.0;
    }
}

/* Strips a trailing "_perf", '_' and '-', lower case: symm-bench's op-name matching. */
static void norm(const char *in, char *out, size_t cap) {
    size_t j = 0, len = strlen(in);
    if (len >= 5 && strcmp(in + len - 5, "_perf") == 0)
        len -= 5;
    for (size_t i = 0; i < len && j + 1 < cap; i++)
        if (in[i] != '_' && in[i] != '-')
            out[j++] = (char)((in[i] >= 'A' && in[i] <= 'Z') ? in[i] + 32 : in[i]);
    out[j] = 0;
}

static int parse_op(const char *s, enum op *op) {
    char a[64], b[64];
    norm(s, a, sizeof a);
    for (int k = 0; k < NOPS; k++) {
        norm(OP_NAMES[k], b, sizeof b);
        if (strcmp(a, b) == 0) {
            *op = (enum op)k;
            return 0;
        }
    }
    return -1;
}

static int parse_size(const char *s, size_t *out) {
    char *end;
    unsigned long long v = strtoull(s, &end, 10);
    if (end == s)
        return -1;
    int shift;
    if (!*end || !strcasecmp(end, "B")) shift = 0;
    else if (!strcasecmp(end, "K") || !strcasecmp(end, "KB") || !strcasecmp(end, "KiB")) shift = 10;
    else if (!strcasecmp(end, "M") || !strcasecmp(end, "MB") || !strcasecmp(end, "MiB")) shift = 20;
    else if (!strcasecmp(end, "G") || !strcasecmp(end, "GB") || !strcasecmp(end, "GiB")) shift = 30;
    else return -1;
    if (v == 0 || v > (SIZE_MAX >> shift))
        return -1;
    *out = (size_t)v << shift;
    return 0;
}

static int parse_int(const char *s, int min, int *out) {
    char *end;
    long v = strtol(s, &end, 10);
    if (end == s || *end || v < min || v > 1000000000)
        return -1;
    *out = (int)v;
    return 0;
}

static const char *USAGE =
    "usage: mpirun -np N mpi_bench <op> [options]\n"
    "  <op>          all_reduce | reduce_scatter | all_gather | alltoall | sendrecv | broadcast | pingpong\n"
    "  -b SIZE       smallest size in bytes, K/M/G suffixes (default 8)\n"
    "  -e SIZE       largest size in bytes (default 64M)\n"
    "  -f FACTOR     size multiplication factor (default 2)\n"
    "  -d DTYPE      float or double (default float)\n"
    "  -n ITERS      timed iterations per size (default 20; fewer from 1 MiB up)\n"
    "  -w ITERS      warm-up iterations per size (default 5; fewer from 16 MiB up)\n"
    "  -c 0|1        check results (default 1)\n"
    "  --pin 0|1     pin rank r to allowed CPU r % count (default 1)\n"
    "  --touch 0|1   rewrite one byte per 64-byte line of the input before every call (default 0)\n"
    "  --csv         symm-bench's CSV rows on stdout (comments go to stderr)\n";

/* Returns NULL on success, else an error message ("" asks for the usage text). */
static const char *parse_args(int argc, char **argv) {
    static char err[256];
    int have_op = 0;
    o = (struct options){.op = ALL_REDUCE, .min_bytes = 8, .max_bytes = 64u << 20, .factor = 2,
                         .iters = 20, .warmup = 5, .check = 1, .pin = 1, .csv = 0, .dbl = 0};
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        if (!strcmp(a, "-h") || !strcmp(a, "--help"))
            return "";
        if (!strcmp(a, "--csv")) {
            o.csv = 1;
            continue;
        }
        if (a[0] != '-') {
            if (have_op || parse_op(a, &o.op)) {
                snprintf(err, sizeof err, "unexpected or unknown op \"%s\"", a);
                return err;
            }
            have_op = 1;
            continue;
        }
        if (i + 1 >= argc) {
            snprintf(err, sizeof err, "%s expects a value", a);
            return err;
        }
        const char *v = argv[++i];
        int x, bad = 0;
        if (!strcmp(a, "-b")) bad = parse_size(v, &o.min_bytes);
        else if (!strcmp(a, "-e")) bad = parse_size(v, &o.max_bytes);
        else if (!strcmp(a, "-f")) { bad = parse_int(v, 2, &x); o.factor = (size_t)x; }
        else if (!strcmp(a, "-n")) bad = parse_int(v, 1, &o.iters);
        else if (!strcmp(a, "-w")) bad = parse_int(v, 0, &o.warmup);
        else if (!strcmp(a, "-c")) bad = parse_int(v, 0, &o.check) || o.check > 1;
        else if (!strcmp(a, "--pin")) bad = parse_int(v, 0, &o.pin) || o.pin > 1;
        else if (!strcmp(a, "--touch")) bad = parse_int(v, 0, &o.touch) || o.touch > 1;
        else if (!strcmp(a, "-d")) {
            if (!strcasecmp(v, "float")) o.dbl = 0;
            else if (!strcasecmp(v, "double")) o.dbl = 1;
            else bad = 1;
        } else {
            snprintf(err, sizeof err, "unknown option \"%s\"", a);
            return err;
        }
        if (bad) {
            snprintf(err, sizeof err, "%s \"%s\": bad value", a, v);
            return err;
        }
    }
    if (!have_op)
        return "missing <op>";
    if (o.min_bytes > o.max_bytes)
        return "-b is larger than -e";
    return NULL;
}

/* ---- sizes, shapes, iterations: as symm-bench's sizes / shape / iters_for / warmup_for ---- */

struct shape { size_t bytes, count; };

static struct shape shape_of(size_t size) {
    size_t unit = split(o.op) ? (size_t)n_ranks * DSIZE : DSIZE;
    size_t count = size / unit;
    return (struct shape){count * unit, count};
}

/* Elements of buffers A and B for a count. */
static void capacities(size_t c, size_t *ca, size_t *cb) {
    size_t n = (size_t)n_ranks;
    switch (o.op) {
    case REDUCE_SCATTER: *ca = n * c; *cb = c; break;
    case ALL_GATHER: *ca = c; *cb = n * c; break;
    case ALLTOALL: *ca = n * c; *cb = n * c; break;
    case BROADCAST: *ca = c; *cb = 0; break;
    default: *ca = c; *cb = c; break;
    }
}

static int iters_for(size_t bytes) {
    if (bytes < (1u << 20))
        return o.iters;
    size_t k = ((size_t)1 << 28) / bytes;
    if (k < 3) k = 3;
    return (size_t)o.iters < k ? o.iters : (int)k;
}

static int warmup_for(size_t bytes) {
    size_t k = ((size_t)1 << 26) / (bytes ? bytes : 1);
    if (k < 1) k = 1;
    return (size_t)o.warmup < k ? o.warmup : (int)k;
}

/* ---- values: symm-bench's pattern / modulus / reduced (sum) ---- */

static unsigned modulus(void) {
    unsigned m = reduces(o.op) ? EXACT / (unsigned)n_ranks : EXACT;
    return m < 2 ? 2 : m > 97 ? 97 : m;
}

static double pattern(unsigned m, unsigned salt, size_t rank, size_t i) {
    return (double)((rank * 7 + i * 13 + (uint64_t)salt * 29 + 1) % m);
}

static void fill(unsigned char *buf, size_t at, size_t len, unsigned m, unsigned salt, size_t rank) {
    for (size_t i = 0; i < len; i++) {
        double v = pattern(m, salt, rank, i);
        if (o.dbl) ((double *)buf)[at + i] = v;
        else ((float *)buf)[at + i] = (float)v;
    }
}

static double elem(const unsigned char *buf, size_t i) {
    return o.dbl ? ((const double *)buf)[i] : (double)((const float *)buf)[i];
}

/* The sum over ranks, in rank order, rounded once to the dtype. */
static double reduced(unsigned m, unsigned salt, size_t i) {
    double acc = 0;
    for (int r = 0; r < n_ranks; r++)
        acc += pattern(m, salt, (size_t)r, i);
    return o.dbl ? acc : (double)(float)acc;
}

static double as_dtype(double v) { return o.dbl ? v : (double)(float)v; }

/* ---- the operation ---- */

/* As symm-bench --touch: one byte per 64-byte line of len elements at buf + at, rewritten. */
static void touch(unsigned char *buf, size_t at, size_t len) {
    volatile unsigned char *p = buf + at * DSIZE;
    for (size_t i = 0; i < len * DSIZE; i += 64)
        p[i] = p[i];
}

/* This rank's input of one call (as symm-bench's), rewritten when --touch 1. */
static void touch_input(enum form f, size_t c) {
    size_t n = (size_t)n_ranks, r = (size_t)me;
    switch (o.op) {
    case ALL_REDUCE: case SENDRECV: touch(A, 0, c); break;
    case REDUCE_SCATTER: case ALLTOALL: touch(A, 0, n * c); break;
    case ALL_GATHER: if (f == OOP) touch(A, 0, c); else touch(B, r * c, c); break;
    case BROADCAST: if (me == 0) touch(A, 0, c); break;
    case PINGPONG: if (me < 2) touch(B, 0, c); break;
    default: break;
    }
}

static void once(enum form f, size_t c) {
    int n = n_ranks, ic = (int)c;
    if (o.touch) touch_input(f, c);
    int next = (me + 1) % n, prev = (me + n - 1) % n;
    switch (o.op) {
    case ALL_REDUCE:
        if (f == OOP) MPI_Allreduce(A, B, ic, DT, MPI_SUM, MPI_COMM_WORLD);
        else MPI_Allreduce(MPI_IN_PLACE, A, ic, DT, MPI_SUM, MPI_COMM_WORLD);
        break;
    case REDUCE_SCATTER:
        if (f == OOP) MPI_Reduce_scatter_block(A, B, ic, DT, MPI_SUM, MPI_COMM_WORLD);
        else MPI_Reduce_scatter_block(MPI_IN_PLACE, A, ic, DT, MPI_SUM, MPI_COMM_WORLD);
        break;
    case ALL_GATHER:
        if (f == OOP) MPI_Allgather(A, ic, DT, B, ic, DT, MPI_COMM_WORLD);
        else MPI_Allgather(MPI_IN_PLACE, 0, DT, B, ic, DT, MPI_COMM_WORLD);
        break;
    case ALLTOALL: MPI_Alltoall(A, ic, DT, B, ic, DT, MPI_COMM_WORLD); break;
    case BROADCAST: MPI_Bcast(A, ic, DT, 0, MPI_COMM_WORLD); break;
    case SENDRECV:
        MPI_Sendrecv(A, ic, DT, next, 1, B, ic, DT, prev, 1, MPI_COMM_WORLD, MPI_STATUS_IGNORE);
        break;
    case PINGPONG: /* B is sent, A receives (symm-bench: source b, target a) */
        if (me == 0) {
            MPI_Send(B, ic, DT, 1, 2, MPI_COMM_WORLD);
            MPI_Recv(A, ic, DT, 1, 2, MPI_COMM_WORLD, MPI_STATUS_IGNORE);
        } else if (me == 1) {
            MPI_Recv(A, ic, DT, 0, 2, MPI_COMM_WORLD, MPI_STATUS_IGNORE);
            MPI_Send(B, ic, DT, 0, 2, MPI_COMM_WORLD);
        }
        break;
    default: break;
    }
}

/* Seconds per iteration on this rank (one-way for pingpong). */
static double time_form(enum form f, size_t c, int iters, int warmup) {
    MPI_Barrier(MPI_COMM_WORLD);
    for (int i = 0; i < warmup; i++)
        once(f, c);
    MPI_Barrier(MPI_COMM_WORLD);
    double t0 = MPI_Wtime();
    for (int i = 0; i < iters; i++)
        once(f, c);
    double per_iter = (MPI_Wtime() - t0) / iters;
    return o.op == PINGPONG ? per_iter / 2 : per_iter;
}

/* Fills the parts used at count c (untimed; faults pages in before the warm-ups). */
static void prepare(size_t c) {
    size_t ca, cb;
    capacities(c, &ca, &cb);
    unsigned m = modulus();
    fill(A, 0, ca, m, 0, (size_t)me);
    fill(B, 0, cb, m, 0, (size_t)me);
}

static void poison(unsigned char *buf, size_t at, size_t len) { memset(buf + at * DSIZE, POISON, len * DSIZE); }

/* Runs form f once on fresh inputs and poisoned outputs; this rank's wrong elements. */
static long long check(enum form f, size_t c, unsigned salt) {
    size_t n = (size_t)n_ranks, r = (size_t)me, ca, cb;
    unsigned m = modulus();
    capacities(c, &ca, &cb);
    switch (o.op) {
    case ALL_REDUCE:
        fill(A, 0, c, m, salt, r);
        if (f == OOP) poison(B, 0, c);
        break;
    case REDUCE_SCATTER:
        fill(A, 0, n * c, m, salt, r);
        if (f == OOP) poison(B, 0, c);
        break;
    case ALL_GATHER:
        if (f == OOP) fill(A, 0, c, m, salt, r);
        poison(B, 0, n * c);
        if (f == IP) fill(B, r * c, c, m, salt, r);
        break;
    case ALLTOALL:
        fill(A, 0, n * c, m, salt, r);
        poison(B, 0, n * c);
        break;
    case BROADCAST:
        if (me == 0) fill(A, 0, c, m, salt, 0);
        else poison(A, 0, c);
        break;
    case SENDRECV:
        fill(A, 0, c, m, salt, r);
        poison(B, 0, c);
        break;
    case PINGPONG:
        fill(B, 0, c, m, salt, r);
        poison(A, 0, c);
        break;
    default: break;
    }
    MPI_Barrier(MPI_COMM_WORLD);
    once(f, c);
    MPI_Barrier(MPI_COMM_WORLD);
    long long wrong = 0;
    switch (o.op) {
    case ALL_REDUCE: {
        const unsigned char *out = f == OOP ? B : A;
        for (size_t i = 0; i < c; i++) wrong += elem(out, i) != reduced(m, salt, i);
        break;
    }
    case REDUCE_SCATTER: /* MPI in place: the result is the first c elements of A */
        for (size_t j = 0; j < c; j++) wrong += elem(f == OOP ? B : A, j) != reduced(m, salt, r * c + j);
        break;
    case ALL_GATHER:
        for (size_t i = 0; i < n * c; i++) wrong += elem(B, i) != as_dtype(pattern(m, salt, i / c, i % c));
        break;
    case ALLTOALL:
        for (size_t i = 0; i < n * c; i++) wrong += elem(B, i) != as_dtype(pattern(m, salt, i / c, r * c + i % c));
        break;
    case BROADCAST:
        for (size_t i = 0; i < c; i++) wrong += elem(A, i) != as_dtype(pattern(m, salt, 0, i));
        break;
    case SENDRECV:
        for (size_t i = 0; i < c; i++) wrong += elem(B, i) != as_dtype(pattern(m, salt, (r + n - 1) % n, i));
        break;
    case PINGPONG:
        if (me < 2)
            for (size_t i = 0; i < c; i++) wrong += elem(A, i) != as_dtype(pattern(m, salt, 1 - r, i));
        break;
    default: break;
    }
    return wrong;
}

/* ---- output: symm-bench's table (without the memory-bound columns) and CSV ---- */

static void note(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
static void note(const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    vfprintf(o.csv ? stderr : stdout, fmt, ap);
    va_end(ap);
    fputc('\n', o.csv ? stderr : stdout);
}

static void fmt_time(double us, char *buf, size_t cap) {
    if (us >= 10000.0) snprintf(buf, cap, "%.0f", us);
    else if (us >= 100.0) snprintf(buf, cap, "%.1f", us);
    else if (us >= 1.0) snprintf(buf, cap, "%.2f", us);
    else snprintf(buf, cap, "%.3f", us); /* as symm-bench: a third decimal below 1 us */
}

static const char *type_name(void) { return o.dbl ? "double" : "float"; }
static const char *redop_name(void) { return reduces(o.op) ? "sum" : "none"; }
static int root_of(void) { return o.op == BROADCAST ? 0 : -1; }

struct row {
    struct shape sh;
    int iters, warmup, forms;
    double time[2];     /* seconds, max over ranks */
    long long wrong[2]; /* summed over ranks */
};

static void print_row(const struct row *w) {
    double busf = bus_factor(o.op, n_ranks);
    if (o.csv) {
        printf("%s,%d,%s,%s,%d,%zu,%zu,%d,%d", OP_NAMES[o.op], n_ranks, type_name(), redop_name(), root_of(),
               w->sh.bytes, w->sh.count, w->iters, w->warmup);
        for (int k = 0; k < 2; k++) {
            if (k < w->forms) {
                double t = w->time[k], alg = (double)w->sh.bytes / (t > 1e-12 ? t : 1e-12) / 1e9;
                printf(",%.4f,%.4f,%.4f,", t * 1e6, alg, alg * busf);
                if (o.check) printf("%lld", w->wrong[k]);
            } else {
                printf(",,,,");
            }
        }
        /* oop/ip bound, %bound: not measured here */
        printf(",,,,,host,%d\n", o.pin);
    } else {
        printf("%12zu  %12zu  %8s  %6s  %6d", w->sh.bytes, w->sh.count, type_name(), redop_name(), root_of());
        for (int k = 0; k < 2; k++) {
            if (k < w->forms) {
                double t = w->time[k], alg = (double)w->sh.bytes / (t > 1e-12 ? t : 1e-12) / 1e9;
                char ts[32], ws[32] = "N/A";
                fmt_time(t * 1e6, ts, sizeof ts);
                if (o.check) snprintf(ws, sizeof ws, "%lld", w->wrong[k]);
                printf("  %7s  %6.2f  %6.2f  %6s", ts, alg, alg * busf, ws);
            } else {
                printf("  %7s  %6s  %6s  %6s", "N/A", "N/A", "N/A", "N/A");
            }
        }
        printf("\n");
    }
    fflush(stdout);
}

static void pin_self(void) {
    cpu_set_t set;
    CPU_ZERO(&set);
    if (sched_getaffinity(0, sizeof set, &set) != 0) {
        fprintf(stderr, "mpi_bench: rank %d: not pinned (sched_getaffinity failed)\n", me);
        return;
    }
    int cpus[CPU_SETSIZE], k = 0;
    for (int c = 0; c < CPU_SETSIZE; c++)
        if (CPU_ISSET(c, &set)) cpus[k++] = c;
    if (k == 0)
        return;
    int cpu = cpus[me % k];
    CPU_ZERO(&set);
    CPU_SET(cpu, &set);
    if (sched_setaffinity(0, sizeof set, &set) != 0)
        fprintf(stderr, "mpi_bench: rank %d: not pinned to cpu %d\n", me, cpu);
}

static void *alloc_touched(size_t elems) {
    size_t bytes = elems * DSIZE;
    void *p = NULL;
    if (posix_memalign(&p, 4096, bytes ? bytes : 4096) != 0) {
        fprintf(stderr, "mpi_bench: rank %d: cannot allocate %zu bytes\n", me, bytes);
        MPI_Abort(MPI_COMM_WORLD, 2);
    }
    memset(p, 0, bytes); /* fault every page in once, before any timing */
    return p;
}

int main(int argc, char **argv) {
    MPI_Init(&argc, &argv);
    MPI_Comm_size(MPI_COMM_WORLD, &n_ranks);
    MPI_Comm_rank(MPI_COMM_WORLD, &me);
    const char *err = parse_args(argc, argv);
    if (!err && (o.op == SENDRECV || o.op == PINGPONG) && n_ranks < 2)
        err = "sendrecv and pingpong need at least 2 ranks";
    if (err) {
        if (me == 0) {
            if (*err) fprintf(stderr, "mpi_bench: %s\n", err);
            fputs(USAGE, stderr);
        }
        MPI_Finalize();
        return *err ? 2 : 0;
    }
    if (o.pin)
        pin_self();
    DT = o.dbl ? MPI_DOUBLE : MPI_FLOAT;
    DSIZE = o.dbl ? sizeof(double) : sizeof(float);

    /* Buffers for the largest count. */
    size_t maxc = 0;
    for (size_t s = o.min_bytes; s <= o.max_bytes; s *= o.factor) {
        size_t c = shape_of(s).count;
        if (c > maxc) maxc = c;
        if (s > SIZE_MAX / o.factor) break;
    }
    if (maxc > (size_t)INT32_MAX) {
        if (me == 0) fprintf(stderr, "mpi_bench: counts above 2^31-1 elements are not supported\n");
        MPI_Finalize();
        return 2;
    }
    size_t ca, cb;
    capacities(maxc, &ca, &cb);
    A = alloc_touched(ca);
    B = alloc_touched(cb);

    if (me == 0) {
        int len;
        char lib[MPI_MAX_LIBRARY_VERSION_STRING];
        MPI_Get_library_version(lib, &len);
        char *nl = strchr(lib, '\n');
        if (nl) *nl = 0;
        note("# mpi_bench %s: ranks %d, dtype %s, op %s, iters %d, warmup %d, pinned %s, buffers host, inputs %s",
             OP_NAMES[o.op], n_ranks, type_name(), redop_name(), o.iters, o.warmup, o.pin ? "yes" : "no",
             o.touch ? "rewritten before every call (--touch 1)" : "unchanged between calls");
        note("# library: %s", lib);
        note("# machine: nproc %ld", sysconf(_SC_NPROCESSORS_ONLN));
        note("# sizes %zu .. %zu B x%zu, iters scaled from 1 MiB (min(n, max(3, 2^28/size))), check %s", o.min_bytes,
             o.max_bytes, o.factor, o.check ? "yes" : "no");
        if (o.op == BROADCAST) note("# broadcast: root 0; one form only, in the first columns");
        if (o.op == PINGPONG) note("# pingpong: time = one-way latency (round trip / 2) of MPI_Send + MPI_Recv");
        if (o.op == REDUCE_SCATTER) note("# reduce_scatter in place: MPI_IN_PLACE, result in the first part of the buffer");
        if (o.csv) {
            printf("op,ranks,dtype,redop,root,size_bytes,count,iters,warmup,oop_time_us,oop_algbw_gbps,"
                   "oop_busbw_gbps,oop_wrong,ip_time_us,ip_algbw_gbps,ip_busbw_gbps,ip_wrong,oop_bound_us,ip_bound_us,"
                   "oop_pct_bound,ip_pct_bound,buffers,pinned\n");
        } else {
            note("#");
            note("#%50s%s%s", "", "             out-of-place             ", "               in-place               ");
            note("#%11s  %12s  %8s  %6s  %6s  %7s  %6s  %6s  %6s  %7s  %6s  %6s  %6s", "size", "count", "type", "redop",
                 "root", "time", "algbw", "busbw", "#wrong", "time", "algbw", "busbw", "#wrong");
            note("#%11s  %12s  %8s  %6s  %6s  %7s  %6s  %6s  %6s  %7s  %6s  %6s  %6s", "(B)", "(elements)", "", "", "",
                 "(us)", "(GB/s)", "(GB/s)", "", "(us)", "(GB/s)", "(GB/s)", "");
        }
        fflush(stdout);
    }

    long long total_wrong = 0;
    double bus_sum = 0;
    int bus_n = 0;
    unsigned index = 0;
    for (size_t s = o.min_bytes; s <= o.max_bytes; index++) {
        struct row w = {.sh = shape_of(s)};
        w.iters = iters_for(w.sh.bytes);
        w.warmup = warmup_for(w.sh.bytes);
        w.forms = has_in_place(o.op) ? 2 : 1;
        prepare(w.sh.count);
        for (int k = 0; k < w.forms; k++) {
            w.time[k] = time_form((enum form)k, w.sh.count, w.iters, w.warmup);
            w.wrong[k] = o.check ? check((enum form)k, w.sh.count, 1 + 2 * index + (unsigned)k) : 0;
        }
        /* Outside the timed loops: the slowest rank's time, the total of wrong elements. */
        MPI_Allreduce(MPI_IN_PLACE, w.time, 2, MPI_DOUBLE, MPI_MAX, MPI_COMM_WORLD);
        MPI_Allreduce(MPI_IN_PLACE, w.wrong, 2, MPI_LONG_LONG, MPI_SUM, MPI_COMM_WORLD);
        for (int k = 0; k < w.forms; k++) {
            total_wrong += w.wrong[k];
            double t = w.time[k];
            bus_sum += (double)w.sh.bytes / (t > 1e-12 ? t : 1e-12) / 1e9 * bus_factor(o.op, n_ranks);
            bus_n++;
        }
        if (me == 0)
            print_row(&w);
        if (s > SIZE_MAX / o.factor) break;
        s *= o.factor;
    }
    if (me == 0) {
        note("# Out of bounds values : %lld %s", total_wrong, total_wrong ? "FAILED" : "OK");
        note("# Avg bus bandwidth    : %.4f ", bus_n ? bus_sum / bus_n : 0.0);
        note("#");
    }
    free(A);
    free(B);
    MPI_Finalize();
    return total_wrong ? 3 : 0;
}
