#!/usr/bin/env bash
# Where the time goes in one rdma WRITE at a time: ringraft-fabric-bench
# --backend rdma (8 B, event mode and --busy-poll) next to perftest's
# `ib_write_bw -s 8 -t 1` (one WRITE in flight, completion to completion),
# in one Soft-RoCE guest (rxe0 on a dummy device), with perf system-wide in
# the guest so that the guest kernel's rxe work shows too.
#
#   deploy/softroce-vm/fabric-profile.sh            (as root)
#
# Host: builds the bench as fabric-bench.sh does. Guest (one boot, default
# kernel, whose version matches the host's perf): first plain runs for the
# per-WRITE figures (no perf), then for each of ours-event, ours-busy and
# perftest two runs under `perf record -a` whose events are enabled only
# while the 8 B WRITEs run (from the bench's "inline" line to its
# write_lat_8B line; from perftest's results header to its result line,
# through perf's --control fifo and wall-clock sample times):
#   1. perf record -a -k realtime -e cpu-clock -g (software clock: TCG has
#      no PMU), from before the command starts (started with its events
#      disabled, perf 6.1 would miss the command's exec and mmaps), then
#      `perf report --stdio --sort comm,dso,sym --time <window>` and
#      `perf script --time <window>` there;
#   2. perf stat -a, events enabled only in the window: context switches,
#      migrations, syscalls (all, and write/read/ioctl/epoll_wait/futex/
#      sched_yield) per WRITE, whole guest.
# The host then sorts every sample (its kernel call chain, or its user DSO
# and symbol) into components and prints a table (also summary.md).
# If perf cannot record in the guest, the script says so (perf-check.log)
# and fails after the plain runs.
#
# Settings: PROFILE_ITERATIONS (20000: 8 B WRITEs per profiled run),
# BENCH_ITERATIONS (2000: plain runs), PROFILE_PERIOD_NS (1000000: one
# cpu-clock sample per ms of CPU), LAB_TIMEOUT (540 s for the guest).
# Results (perf.data, reports, scripts, perf stat counts, summary.md) go to a mktemp
# folder under /tmp printed at the end; nothing is written into the repo
# (but target/ and the lab's cache/runs, as for fabric-bench.sh).
set -uo pipefail
HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
REPO=$(cd "$HERE/../.." && pwd)
# shellcheck source=lib.sh
. "$HERE/lib.sh"
: "${LAB_TIMEOUT:=540}"
N=${PROFILE_ITERATIONS:-20000}
CLEAN_N=${BENCH_ITERATIONS:-2000}
PERIOD=${PROFILE_PERIOD_NS:-1000000}

cd "$REPO" || exit 1
cargo build --release --locked -p ringraft-transport --features rdma,tools --bins || exit 1
BIN=$REPO/target/release/ringraft-fabric-bench
RESULTS=$(mktemp -d /tmp/fabric-profile.XXXXXX)

# ------------------------------------------------------------- guest side
GUEST_SCRIPT=$(cat <<'GUEST'
set -u
W=/tmp/prof; mkdir -p "$W"
log() { echo "[profile $(cut -d' ' -f1 /proc/uptime)] $*"; }
{ uname -a; perf --version; echo "paranoid before: $(cat /proc/sys/kernel/perf_event_paranoid)"; nproc; } > "$W/env.txt" 2>&1
echo -1 > /proc/sys/kernel/perf_event_paranoid
echo 0 > /proc/sys/kernel/kptr_restrict
mountpoint -q /sys/kernel/tracing || mount -t tracefs nodev /sys/kernel/tracing
mountpoint -q /sys/kernel/debug || mount -t debugfs nodev /sys/kernel/debug
cat "$W/env.txt"

# ---- plain runs: per-WRITE figures of this boot
log "plain runs ($CLEAN_N WRITEs)"
pt_pair 120 ib_write_bw -s 8 -n "$CLEAN_N" -t 1 > "$W/plain_bw8_t1.txt" 2>&1
for mode in "" --busy-poll; do
    timeout 300 "$B" --backend rdma --device "$LAB_RXE" --listen "$LAB_IP:0" --iterations "$CLEAN_N" \
        --bw-writes 16 $mode --json | grep '^{' >> "$W/plain_rdma.jsonl"
done
tail -n 3 "$W/plain_bw8_t1.txt"; cat "$W/plain_rdma.jsonl"

# ---- can perf record here?
PERF_OK=0
if perf record -a -e cpu-clock -g -o "$W/check.data" -- sleep 0.5 > "$W/perf-check.log" 2>&1 &&
   perf report -i "$W/check.data" --stdio --sort comm > /dev/null 2>> "$W/perf-check.log"; then
    PERF_OK=1
fi
cat "$W/perf-check.log"; log "perf works: $PERF_OK"
echo "$PERF_OK" > "$W/perf_ok"

# windowed <name> <start regex> <stop regex> <perf command and args...> -- <cmd...>
# perf (record or stat, -a) runs from before the command; its events are
# enabled when the command prints a line matching <start> (perf stat starts
# with them disabled: -D -1) and disabled at <stop>, whose wall-clock times
# go to <name>.window; the command is
# then ended when WINDOW_KILL=1 (the rest of our bench's run is not wanted;
# perftest's client is left to finish, or its server would wait for it).
windowed() {
    local name=$1 start=$2 stop=$3 pargs=() perf_pid cmd_pid line state=0 C A t0=0 t1=0
    shift 3
    while [ "$1" != -- ]; do pargs+=("$1"); shift; done; shift
    rm -f "$W/ctl" "$W/ack" "$W/pipe"; mkfifo "$W/ctl" "$W/ack" "$W/pipe"
    exec {C}<> "$W/ctl" {A}<> "$W/ack"
    perf "${pargs[@]}" --control "fifo:$W/ctl,$W/ack" > "$W/$name.perf.log" 2>&1 &
    perf_pid=$!
    echo "${READY_CMD:-disable}" >&"$C"         # answered once perf is ready
    read -r -t 120 -u "$A" _ || log "$name: perf did not answer"
    "$@" > "$W/pipe" 2> "$W/$name.stderr" &
    cmd_pid=$!
    while IFS= read -r line; do
        printf '%s\n' "$line" >> "$W/$name.out"
        if [ "$state" = 0 ] && [[ $line =~ $start ]]; then
            echo enable >&"$C"; read -r -t 30 -u "$A" _; t0=$EPOCHREALTIME; state=1
        elif [ "$state" = 1 ] && [[ $line =~ $stop ]]; then
            t1=$EPOCHREALTIME; echo disable >&"$C"; read -r -t 30 -u "$A" _; state=2
            [ "${WINDOW_KILL:-0}" = 1 ] && kill "$cmd_pid" 2> /dev/null
        fi
    done < "$W/pipe"
    wait "$cmd_pid"
    kill -INT "$perf_pid"; wait "$perf_pid"
    exec {C}>&- {A}>&-
    echo "$t0 $t1" > "$W/$name.window"
    log "$name: window $(awk -v a="$t0" -v b="$t1" 'BEGIN{printf "%.3f", b-a}') s (state $state)"
}

pt_srv_wait() {   # perftest server in the background, until it listens
    timeout -k 5 180 ib_write_bw -d "$LAB_RXE" -x "$LAB_GID_INDEX" -F -s 8 -n "$N" -t 1 > "$W/pt_server.log" 2>&1 &
    SRV=$!
    for _ in $(seq 200); do ss -Hltn 'sport = :18515' | grep -q . && return 0; sleep 0.1; done
    log "perftest server not listening"
}
PT_CLIENT=(timeout -k 5 180 stdbuf -oL ib_write_bw -d "$LAB_RXE" -x "$LAB_GID_INDEX" -F -s 8 -n "$N" -t 1 "$LAB_IP")
OURS=(timeout -k 5 300 "$B" --backend rdma --device "$LAB_RXE" --listen "$LAB_IP:0" --iterations "$N" --bw-writes 16)
OURS_START='^rdma +inline'; OURS_STOP='^rdma +write_lat_8B'
PT_START='#bytes'; PT_STOP='^ *8 +[0-9]+ +[0-9.]+'

if [ "$PERF_OK" = 1 ]; then
    SC=syscalls:sys_enter_
    STAT_EV=context-switches,cpu-migrations,raw_syscalls:sys_enter,${SC}write,${SC}read,${SC}ioctl,${SC}epoll_wait,${SC}futex,${SC}sched_yield
    for kind in cpu stat; do
        if [ "$kind" = cpu ]; then
            P=(record -a -N -k realtime -e cpu-clock -c "$PERIOD" -g); RC=enable
        else
            P=(stat -a -D -1 -x, -e "$STAT_EV"); RC=disable
        fi
        log "profile ($kind): ours, event mode"
        READY_CMD=$RC WINDOW_KILL=1 windowed "ours_event_$kind" "$OURS_START" "$OURS_STOP" \
            "${P[@]}" -o "$W/ours_event_$kind.data" -- "${OURS[@]}"
        log "profile ($kind): ours, busy-poll"
        READY_CMD=$RC WINDOW_KILL=1 windowed "ours_busy_$kind" "$OURS_START" "$OURS_STOP" \
            "${P[@]}" -o "$W/ours_busy_$kind.data" -- "${OURS[@]}" --busy-poll
        log "profile ($kind): perftest ib_write_bw -s 8 -t 1"
        pt_srv_wait
        READY_CMD=$RC windowed "perftest_$kind" "$PT_START" "$PT_STOP" \
            "${P[@]}" -o "$W/perftest_$kind.data" -- "${PT_CLIENT[@]}"
        wait "$SRV"
    done
    log "reports"
    for r in ours_event ours_busy perftest; do
        read -r t0 t1 < "$W/${r}_cpu.window"
        T=(-i "$W/${r}_cpu.data" --time "$t0,$t1")
        perf report "${T[@]}" --stdio --no-children --sort comm,dso,sym -g none \
            --percent-limit 0.3 > "$W/${r}_report_sym.txt" 2> /dev/null
        perf report "${T[@]}" --stdio --no-children --sort comm,dso -g none \
            > "$W/${r}_report_dso.txt" 2> /dev/null
        perf script "${T[@]}" -F comm,tid,period,ip,sym,dso > "$W/${r}_cpu.script" 2> /dev/null
        log "$r reported"
    done
    cp /proc/modules "$W/modules"
else
    log "perf cannot record in this guest (see perf-check.log): no profile"
fi
rm -f "$W/ctl" "$W/ack" "$W/pipe" "$W/check.data"
cp -r "$W"/. "$LAB_RESULTS/prof/"
log done
GUEST
)

lab_setup || exit 1
lab_run_loopback "
    B='$BIN'; N='$N'; CLEAN_N='$CLEAN_N'; PERIOD='$PERIOD'
    $GUEST_SCRIPT
" || { echo "guest run failed; see $LAB_RUN" >&2; exit 1; }
cp -r "$LAB_SHARE"/g1/prof/. "$RESULTS/"

# -------------------------------------------------------------- host side
python3 - "$RESULTS" "$N" "$PERIOD" <<'PY'
import json, os, re, sys, collections
d, N, period = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
out = []
p = out.append
env = open(os.path.join(d, "env.txt")).read().strip().splitlines()
p(f"Guest: `{env[0]}`; {env[1] if len(env) > 1 else ''}.")

# plain runs
def perftest_us(name):
    try:
        rows = [l.split() for l in open(os.path.join(d, name)) if re.match(r"^\s*\d+\s+\d+\s+[\d.]+", l)]
        # µs per WRITE from the message rate (Mpps, six decimals), not from
        # the bandwidth, which perftest prints to 0.01 MB/s.
        return 1 / float(rows[-1][4]) if rows else None
    except OSError:
        return None
plain_pt = perftest_us("plain_bw8_t1.txt")
plain = {}
for l in open(os.path.join(d, "plain_rdma.jsonl")):
    r = json.loads(l)
    if r["measure"] == "write_lat_8B":
        plain[r["busy_poll"]] = r
p("")
p("Plain runs (no perf), same boot:")
if plain_pt:
    p(f"- perftest `ib_write_bw -s 8 -t 1`: {plain_pt:.1f} µs per WRITE (average).")
for busy, label in ((False, "event mode"), (True, "busy-poll")):
    r = plain.get(busy)
    if r:
        ratio = f", {r['mean_us'] / plain_pt:.2f}x perftest's" if plain_pt else ""
        p(f"- ours, 8 B, {label}: mean {r['mean_us']:.1f} µs, p50 {r['p50_us']:.1f} µs{ratio}.")

if open(os.path.join(d, "perf_ok")).read().strip() != "1":
    p("")
    p("perf could not record in the guest: no profile (see perf-check.log).")
    print("\n".join(out)); open(os.path.join(d, "summary.md"), "w").write("\n".join(out) + "\n")
    sys.exit(1)

RUNS = [("ours_event", "ours, event"), ("ours_busy", "ours, busy-poll"), ("perftest", "perftest")]
OURS_COMMS = ("ringraft-fabric", "tokio-rt-worker", "tokio-runtime-w")
def writes_in_window(r):
    # ours: the window holds the warm-up (N/10) and the N measured WRITEs;
    # perftest: its N WRITEs (and its few warm-up WRITEs).
    return N + max(N // 10, 10) if r.startswith("ours") else N
def window_s(r):
    try:
        a, b = open(os.path.join(d, f"{r}_cpu.window")).read().split()
        return float(b) - float(a)
    except (OSError, ValueError):
        return None

NET = re.compile(r"^(ip_|ip6_|__ip_|udp|__udp|dev_|__dev_|netif_|__netif_|net_rx|napi|skb_|__skb|kfree_skb|consume_skb|alloc_skb|__alloc_skb|dummy_|neigh_|__neigh|nf_|ipt_|iptable|fib_|__fib|dst_|sk_|sock_|__sock|inet_|rt_|ipv4_|ipv6_|eth_|validate_xmit|sch_direct|qdisc|__qdisc|pfifo|__napi|process_backlog|__netif|packet_|tcp_|__tcp)")
SCHED = re.compile(r"^(schedule|__schedule|preempt_schedule|try_to_wake_up|wake_up|__wake_up|ttwu_|sched_|finish_task_switch|pick_next|__pick|put_prev|enqueue_|dequeue_|update_|select_task_rq|set_next|check_preempt|resched|psi_|activate_task|deactivate_task|switch_mm|__switch_to|switch_fpu|native_sched|yield|do_sched_yield|__x64_sys_sched_yield|futex_|__futex|do_futex|__x64_sys_futex|ep_|do_epoll|__x64_sys_epoll|eventfd_|__x64_sys_eventfd|default_wake_function|autoremove_wake|pollwake|do_nanosleep|hrtimer_nanosleep|__x64_sys_clock_nanosleep|schedule_hrtimeout|native_queued|cpuacct|account_)")
IDLE = re.compile(r"^(default_idle|native_safe_halt|cpuidle|do_idle|cpu_startup_entry|acpi_idle|mwait_idle|intel_idle|arch_cpu_idle|start_secondary|rest_init|poll_idle|__cpuidle)")
ENTRY = re.compile(r"^(entry_SYSCALL|do_syscall_64|syscall_exit|syscall_enter|exit_to_user_mode|__x64_sys_|ksys_|__fdget|fput|__fget|vfs_read|vfs_write|rw_verify|security_file|apparmor|__audit|syscall_trace|__sys_|__do_sys)")
IRQ = re.compile(r"^(__sysvec|sysvec_|asm_sysvec|irq_|__irq|hrtimer_|__hrtimer|tick_|__run_hrtimer|timerqueue|lapic|native_apic|rcu_|__rcu|run_timer|__do_softirq|do_softirq|__local_bh|handle_softirqs|tasklet_|perf_|__perf|task_tick|scheduler_tick|smp_call|flush_smp)")
def kclass(sym, dso):
    # perf in the guest may show module symbols under [kernel.kallsyms]: by name too
    if "rdma_rxe" in dso or sym.startswith("rxe_"): return "kernel: rxe (rdma_rxe)"
    if "ib_uverbs" in dso or "ib_core" in dso or sym.startswith("ib_") or sym.startswith("uverbs_"):
        return "kernel: verbs syscalls (ib_uverbs/ib_core)"
    if IDLE.match(sym): return "idle"
    if NET.match(sym): return "kernel: networking (ip/udp/dummy)"
    if SCHED.match(sym): return "kernel: scheduler, wake-ups, epoll/futex"
    return None
def kclass_fallback(chain):
    for sym, dso in chain:
        if ENTRY.match(sym): return "kernel: syscall entry/exit, vfs"
        if IRQ.match(sym): return "kernel: interrupts, timers, softirq, perf"
    return "kernel: other"
def uclass(sym, dso, comm):
    base = os.path.basename(dso)
    if base.startswith("librxe"): return "user: librxe provider"
    if base.startswith("libibverbs"): return "user: libibverbs"
    if base.startswith("libc.so") or base.startswith("libc-"): return "user: libc"
    if base.startswith("ld-linux"): return "user: ld.so"
    if "ringraft-fabric-bench" in base:
        if sym.startswith("tokio::") or "tokio::" in sym[:80]: return "user: tokio runtime"
        if "ringraft_transport" in sym: return "user: our transport code"
        return "user: other Rust (std, alloc, hdrhistogram, bench)"
    if "ib_write_bw" in base: return "user: perftest"
    if base in ("[vdso]",): return "user: vdso (clock_gettime)"
    if base == "[unknown]": return "user: unknown"
    return f"user: {base}"

def parse_script(path):
    """Yields (comm, period, frames[(sym, dso)]) per sample."""
    head = None; frames = []
    hdr = re.compile(r"^\s*(\S.*?)\s+(\d+)\s+(\d+)\s*$")
    frame = re.compile(r"^\s+([0-9a-f]+)\s+(.*?)\s+\((.*)\)\s*$")
    for line in open(path, errors="replace"):
        line = line.rstrip("\n")
        if not line.strip():
            if head: yield head[0], head[1], frames
            head = None; frames = []
            continue
        m = frame.match(line)
        if not m:
            if head: yield head[0], head[1], frames
            m = hdr.match(line)
            head = (m.group(1).strip(), int(m.group(3))) if m else None
            frames = []
            continue
        if m:
            m = re.match(r"^\s+[0-9a-f]+\s+(.*?)\s+\((.*)\)\s*$", line)
            sym = re.sub(r"\+0x[0-9a-f]+$", "", m.group(1))
            frames.append((sym, m.group(2)))
    if head: yield head[0], head[1], frames

def group(comm, r):
    if comm in OURS_COMMS or comm.startswith("ib_write_bw"): return "the benchmark process"
    if comm.startswith("swapper"): return "idle (swapper)"
    if comm.startswith("perf"): return "other: perf itself"
    if comm.startswith("ksoftirqd") or comm.startswith("kworker") or comm.startswith("rxe"): return "other: kernel threads (" + comm.split("/")[0] + ")"
    return "other: processes (" + comm + ")"

tables = {}
for r, label in RUNS:
    path = os.path.join(d, f"{r}_cpu.script")
    if not os.path.exists(path): continue
    per = collections.Counter(); bycomm = collections.Counter(); kuser = collections.Counter()
    for comm, per_ns, frames in parse_script(path):
        if not frames: continue
        g = group(comm, r)
        bycomm[g] += per_ns
        sym0, dso0 = frames[0]
        in_kernel = dso0.startswith("[kernel") or dso0.startswith("[") and dso0 not in ("[vdso]", "[unknown]")
        if g == "idle (swapper)":
            per["idle"] += per_ns; continue
        if g != "the benchmark process":
            per[f"{g}"] += per_ns; continue
        if in_kernel:
            kuser["kernel"] += per_ns
            kframes = [f for f in frames if f[1].startswith("[") and f[1] not in ("[vdso]", "[unknown]")]
            c = None
            for sym, dso in kframes:
                c = kclass(sym, dso)
                if c: break
            per[c or kclass_fallback(kframes)] += per_ns
        else:
            kuser["user"] += per_ns
            per[uclass(sym0, dso0, comm)] += per_ns
    tables[r] = (per, bycomm, kuser)

# syscalls and context switches per WRITE (perf stat -a, window only)
stat = {}
for r, label in RUNS:
    path = os.path.join(d, f"{r}_stat.data")
    if not os.path.exists(path): continue
    c = {}
    for l in open(path):
        f = l.strip().split(",")
        if len(f) >= 3 and f[0].replace(".", "").isdigit():
            c[f[2].replace("syscalls:sys_enter_", "syscall ")] = float(f[0])
    stat[r] = c

p("")
p(f"Profiled runs: perf record -a, events on only during the {N} (+ warm-up) 8 B WRITEs; cpu-clock, one sample per {period/1e6:g} ms of CPU.")
for r, label in RUNS:
    w = window_s(r)
    if w: p(f"- {label}: window {w:.2f} s, {1e6 * w / writes_in_window(r):.1f} µs per WRITE under perf.")
cats = sorted({c for r in tables for c in tables[r][0]}, key=lambda c: (not c.startswith("kernel:"), not c.startswith("user:"), c))
p("")
p("CPU time per WRITE (µs) inside the window, all CPUs of the guest (2 vCPUs), by component:")
p("")
p("| component | " + " | ".join(l for r, l in RUNS if r in tables) + " |")
p("|---|" + "---:|" * len(tables))
def us(r, ns): return ns / 1e3 / writes_in_window(r)
for c in cats:
    p(f"| {c} | " + " | ".join(f"{us(r, tables[r][0][c]):.1f}" for r, l in RUNS if r in tables) + " |")
p("| **benchmark process, kernel** | " + " | ".join(f"{us(r, tables[r][2]['kernel']):.1f}" for r, l in RUNS if r in tables) + " |")
p("| **benchmark process, user** | " + " | ".join(f"{us(r, tables[r][2]['user']):.1f}" for r, l in RUNS if r in tables) + " |")
p("")
p("Shares of the benchmark process's own CPU time (%):")
p("")
p("| component | " + " | ".join(l for r, l in RUNS if r in tables) + " |")
p("|---|" + "---:|" * len(tables))
for c in cats:
    if not (c.startswith("kernel:") or c.startswith("user:")): continue
    cells = []
    for r, l in RUNS:
        if r not in tables: continue
        tot = tables[r][2]["kernel"] + tables[r][2]["user"]
        cells.append(f"{100 * tables[r][0][c] / tot:.1f}" if tot else "—")
    p(f"| {c} | " + " | ".join(cells) + " |")
if stat:
    p("")
    p("perf stat -a over the window (whole guest: includes perf, the lab agent, idle switches), per WRITE:")
    p("")
    p("| event | " + " | ".join(l for r, l in RUNS if r in stat) + " |")
    p("|---|" + "---:|" * len(stat))
    evs = []
    for r in stat:
        for e in stat[r]:
            if e not in evs: evs.append(e)
    for e in evs:
        p(f"| {e} | " + " | ".join(f"{stat[r].get(e, float('nan')) / writes_in_window(r):.2f}" for r, l in RUNS if r in stat) + " |")
text = "\n".join(out)
print(text)
open(os.path.join(d, "summary.md"), "w").write(text + "\n")
PY
echo "raw results: $RESULTS"
