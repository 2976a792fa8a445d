#!/usr/bin/env bash
# symm against Open MPI, measured in one run: builds symm-bench and the C peer
# benches/peers/mpi_bench.c (same sizes, timing, checks and columns), then for each op runs
# symm-bench and mpi_bench one after the other on the same ranks and prints one table per op
# side by side. With -r N the pair runs N times, alternating, and each size shows the best
# (smallest) time of each program over the N runs.
#
# Usage: scripts/peers.sh [-b MIN] [-e MAX] [-f FACTOR] [-g RANKS] [-n ITERS] [-w WARMUP]
#                         [-r REPS] [--pin 0|1] [--touch 0|1] [--no-build] [op ...]
#   ops: all_reduce reduce_scatter all_gather alltoall sendrecv broadcast pingpong (default: all)
#   -b/-e/-f/-g/-n/-w/--pin/--touch mean what they mean to symm-bench (same defaults); both programs get
#   the same values. -r REPS: runs of each program per op, alternating (default 1); from 3 runs
#   on, a second table gives the spread of the ratio run by run (symm's run i against MPI's
#   run i, which ran right after it): median, lowest, highest.
#   --no-build uses the symm-bench binary already built.
#   MPI_OPTS (environment): the mpirun options; the default is the best measured on a 2-core
#   machine (see MPI_OPTS_DEFAULT). Raw CSV and logs are kept in target/peers/.
#   Each op's table notes the one-way time of benches/peers/line_pingpong.c (two processes
#   bouncing a word, no library) before and after its runs: compare ratios only between runs
#   whose readings agree (the host may move the vCPUs; see docs/performance.md).
#
# Example: scripts/peers.sh -b 8 -e 256M -f 32 -g 2 all_reduce all_gather
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/common.sh

ALL_OPS=(all_reduce reduce_scatter all_gather alltoall sendrecv broadcast pingpong)
# Shared memory only (ob1 + vader, single copies by CMA above the eager limit); eager limit
# 32 KiB instead of 4 KiB (faster from 4 to 32 KiB: docs/performance-log.md, "How the figures
# were taken");
# --bind-to none because mpi_bench pins rank r to CPU r % nproc itself, like symm-bench.
# --oversubscribe makes mpirun accept more ranks than cores (it then yields when idle).
MPI_OPTS_DEFAULT="--bind-to none --mca pml ob1 --mca btl self,vader --mca btl_vader_eager_limit 32768"
MPI_OPTS=${MPI_OPTS-$MPI_OPTS_DEFAULT}

usage() {
    sed -n '2,/^set -euo/p' "$0" | sed '$d; s/^# \{0,1\}//' >&2
    exit 2
}

min=8 max=64M factor=2 ranks=2 iters=20 warmup=5 pin=1 touch=0 build=1 reps=1
ops=()
while [ $# -gt 0 ]; do
    case "$1" in
        -b) min=$2; shift 2 ;;
        -e) max=$2; shift 2 ;;
        -f) factor=$2; shift 2 ;;
        -g) ranks=$2; shift 2 ;;
        -n) iters=$2; shift 2 ;;
        -w) warmup=$2; shift 2 ;;
        -r) reps=$2; shift 2 ;;
        --pin) pin=$2; shift 2 ;;
        --touch) touch=$2; shift 2 ;;
        --no-build) build=0; shift ;;
        -h | --help) usage ;;
        -*) echo "peers.sh: unknown option $1" >&2; usage ;;
        *)
            if [[ " ${ALL_OPS[*]} " != *" $1 "* ]]; then
                echo "peers.sh: unknown op $1 (known: ${ALL_OPS[*]})" >&2
                exit 2
            fi
            ops+=("$1"); shift ;;
    esac
done
[ ${#ops[@]} -gt 0 ] || ops=("${ALL_OPS[@]}")
[[ $reps =~ ^[1-9][0-9]*$ ]] || { echo "peers.sh: -r $reps: expected a count >= 1" >&2; exit 2; }

if ! command -v mpicc >/dev/null 2>&1 || ! command -v mpirun >/dev/null 2>&1; then
    cat >&2 <<'MSG'
peers.sh: Open MPI (mpicc, mpirun) is not installed. On Debian or Ubuntu:
    apt-get install openmpi-bin libopenmpi-dev
then run this script again.
MSG
    exit 2
fi

out=target/peers
mkdir -p "$out"
if [ "$build" = 1 ]; then
    ensure_cargo
    cargo build --release -p symm-benches --bin symm-bench
fi
mpicc -O2 -o "$out/mpi_bench" benches/peers/mpi_bench.c
# The hardware floor of a message between two cores, read before and after each op's runs:
# on a VM the host moves the vCPUs between placements whose floors differ by 4x or more, so
# ratios are comparable only between runs made in the same placement.
mpicc -O2 -o "$out/line_pingpong" benches/peers/line_pingpong.c
floor() { "$out/line_pingpong" 100000 | sed -n 's/^one-way //p'; }
symm=target/release/symm-bench
[ -x "$symm" ] || { echo "peers.sh: $symm is missing (run without --no-build)" >&2; exit 2; }

common=(-b "$min" -e "$max" -f "$factor" -n "$iters" -w "$warmup" --pin "$pin" --touch "$touch" --csv)
# shellcheck disable=SC2206 # MPI_OPTS is a list of words
mpirun=(mpirun --allow-run-as-root --oversubscribe -np "$ranks" $MPI_OPTS)

# Runs "$@" with stdout to $1.csv and stderr to $1.log (after the file stem); 0, or 3 for
# wrong results; any other failure stops the script.
run() {
    local stem=$1 rc=0
    shift
    "$@" >"$stem.csv" 2>"$stem.log" || rc=$?
    if [ "$rc" != 0 ] && [ "$rc" != 3 ]; then
        echo "peers.sh: failed (exit $rc): $*" >&2
        cat "$stem.log" >&2
        exit 1
    fi
    return "$rc"
}

# Prints the side-by-side rows from CSV files (symm-bench's columns; mpi_bench writes the
# same), symm's named *-symm*, MPI's *-mpi*: per size and program the smallest time over the
# files (and its busbw); in-place columns only if $1 is 1.
table() {
    local ip=$1
    shift
    awk -F, -v ip="$ip" '
        function t(us) { return us >= 10000 ? sprintf("%.0f", us) : us >= 100 ? sprintf("%.1f", us) : us >= 1 ? sprintf("%.2f", us) : sprintf("%.3f", us) }
        function cols(k,   s, m) {   # k: the time column, 10 out of place, 14 in place
            s = best["symm", $6, k]; m = best["mpi", $6, k]
            if (s == "" || m == "") return sprintf("  %9s %9s %7s %7s %8s", "N/A", "N/A", "N/A", "N/A", "N/A")
            return sprintf("  %9s %9s %7.2f %7.2f %8s", t(s), t(m), bus["symm", $6, k], bus["mpi", $6, k],
                           (s > 0 && m > 0) ? sprintf("%.2f", m / s) : "N/A")
        }
        FNR == 1 { next }
        {
            who = FILENAME ~ /-symm/ ? "symm" : "mpi"
            if (who == "symm" && !($6 in seen)) { seen[$6]; order[++n] = $6 }
            for (k = 10; k <= 14; k += 4)
                if ($k != "" && (best[who, $6, k] == "" || $k + 0 < best[who, $6, k])) {
                    best[who, $6, k] = $k + 0; bus[who, $6, k] = $(k + 2)
                }
            wrong += $13 + $17
        }
        END {
            for (i = 1; i <= n; i++) { $0 = ""; $6 = order[i]; printf "%12s%s%s\n", $6, cols(10), ip ? cols(14) : "" }
            if (wrong) printf "# WRONG RESULTS: %d elements (see the logs)\n", wrong
        }
    ' "$@"
}

# Prints, per size, the spread of the paired ratios mpi/symm: run i of symm against run i of
# MPI, which ran right after it (a slow period of the machine then hits both of a pair). Median,
# lowest and highest over the pairs; in-place columns only if $1 is 1. Files: symm.1 mpi.1
# symm.2 mpi.2 ... in that order.
pairs() {
    local ip=$1
    shift
    awk -F, -v ip="$ip" '
        function sorted_median(a, n,   i, j, t) {
            for (i = 2; i <= n; i++) for (j = i; j > 1 && a[j - 1] > a[j]; j--) { t = a[j]; a[j] = a[j - 1]; a[j - 1] = t }
            return n % 2 ? a[(n + 1) / 2] : (a[n / 2] + a[n / 2 + 1]) / 2
        }
        function cols(k,   i, n, r, med) {   # k: the time column, 10 out of place, 14 in place
            n = 0
            for (i = 1; i <= runs; i++)
                if (time["symm", i, $6, k] > 0 && time["mpi", i, $6, k] > 0) r[++n] = time["mpi", i, $6, k] / time["symm", i, $6, k]
            if (n == 0) return sprintf("  %7s %7s %7s", "N/A", "N/A", "N/A")
            med = sorted_median(r, n)   # sorts r: lowest and highest are then r[1] and r[n]
            return sprintf("  %7.2f %7.2f %7.2f", med, r[1], r[n])
        }
        FNR == 1 { who = FILENAME ~ /-symm/ ? "symm" : "mpi"; if (who == "symm") runs++; next }
        {
            if (who == "symm" && !($6 in seen)) { seen[$6]; order[++m] = $6 }
            for (k = 10; k <= 14; k += 4) if ($k != "") time[who, runs, $6, k] = $k + 0
        }
        END { for (i = 1; i <= m; i++) { $0 = ""; $6 = order[i]; printf "%12s%s%s\n", $6, cols(10), ip ? cols(14) : "" } }
    ' "$@"
}

# The header of the paired ratios; in-place columns only if $1 is 1.
pairs_header() {
    local a
    a=$(printf "  %7s %7s %7s" "median" "lowest" "highest")
    if [ "$1" = 1 ]; then
        printf "# paired symm/mpi, run by run (up to %s pairs)\n#%11s  %-25s%s\n#%11s%s%s\n" "$reps" "" "out-of-place" "in-place" "size(B)" "$a" "$a"
    else
        printf "# paired symm/mpi, run by run (up to %s pairs)\n#%11s%s\n" "$reps" "size(B)" "$a"
    fi
}

# The table's header; in-place columns only if $1 is 1.
header() {
    local a b
    a=$(printf "  %9s %9s %7s %7s %8s" "symm(us)" "mpi(us)" "symm" "mpi" "symm/mpi")
    b=$(printf "  %9s %9s %7s %7s %8s" "" "" "busbw" "busbw" "")
    if [ "$1" = 1 ]; then
        printf "#%11s  %-53s%s\n" "" "out-of-place" "in-place"
        printf "#%11s%s%s\n#%11s%s%s\n" "size(B)" "$a" "$a" "" "$b" "$b"
    else
        printf "#%11s%s\n#%11s%s\n" "size(B)" "$a" "" "$b"
    fi
}

lib=$( ("${mpirun[@]}" "$out/mpi_bench" broadcast -b 8 -e 8 -c 0 --pin 0 2>&1 || true) | sed -n 's/^# library: //p' | cut -d, -f1)
echo "# symm vs MPI: ranks $ranks, sizes $min .. $max x$factor, iters $iters, warmup $warmup, pinned $pin, touched inputs $touch, dtype float"
echo "# machine: nproc $(nproc), $(sed -n 's/^model name\s*: //p' /proc/cpuinfo | head -1)"
echo "# symm: $symm (symmetric-heap buffers); MPI: ${lib:-Open MPI}, mpirun ${mpirun[*]:1}"
echo "# time: mean per iteration, slowest rank (us), best of $reps run(s) each, alternating; busbw in GB/s"
echo "# symm/mpi = mpi time / symm time = symm busbw / mpi busbw: above 1 symm is faster"
echo "# raw CSV and logs: $out/"
status=0
for op in "${ops[@]}"; do
    stem="$out/$op-g$ranks"
    files=()
    floor_before=$(floor)
    for ((i = 1; i <= reps; i++)); do
        run "$stem-symm.$i" "$symm" "$op" -g "$ranks" "${common[@]}" || status=3
        run "$stem-mpi.$i" "${mpirun[@]}" "$out/mpi_bench" "$op" "${common[@]}" || status=3
        files+=("$stem-symm.$i.csv" "$stem-mpi.$i.csv")
    done
    case $op in all_reduce | reduce_scatter | all_gather) ip=1 ;; *) ip=0 ;; esac
    echo
    echo "## $op, $ranks ranks ($(sed -n 's/^# memcpy: /memcpy /p' "$stem-symm.1.log"))"
    echo "# line ping-pong (benches/peers/line_pingpong.c), one way: $floor_before before these runs, $(floor) after"
    header "$ip"
    table "$ip" "${files[@]}"
    if [ "$reps" -ge 3 ]; then
        pairs_header "$ip"
        pairs "$ip" "${files[@]}"
    fi
done
exit "$status"
