#!/bin/bash
# One decode run under a profiler: where a step's device time goes, per kernel.
#   CFG=nano30b (bench/configs/NAME)  ROWS=1 (sequences)  STEPS=32 (decode tokens)
# nsys with CUDA graphs traced per node (each kernel as the step runs it, PDL
# overlap included) where nsys exists; else build-cuda/libktrace.so
# (tools/ktrace.c: CUPTI's kernel records, graphs on, the same view); else
# (or PROF=ncu) ncu without graphs (each kernel alone at base clocks, so the
# sum is above the real step). Prints the kernel summary: nsys, launches per
# decode step (count / STEPS; prefill and load kernels show as fractions);
# ktrace and ncu, the last full decode step's kernels (tools/profile_step.py).
# Assumes build-cuda is built.
set -uo pipefail
OUT=${OUT:-/tmp/out}
mkdir -p "$OUT"
[ -f .devdeps/unpack.sh ] && source .devdeps/unpack.sh >/dev/null
CFG=${CFG:-nano30b}; ROWS=${ROWS:-1}; STEPS=${STEPS:-32}
ARGS="--model bench/configs/$CFG --load-format dummy --device cuda --batch-sizes $ROWS --input-len 64 --output-len $STEPS"
if command -v nsys >/dev/null; then
    nsys profile -t cuda --cuda-graph-trace=node -o "$OUT/prof_$CFG" -f true \
        build-cuda/vllm bench $ARGS >"$OUT/prof_$CFG.log" 2>&1
    nsys stats -q --report cuda_gpu_kern_sum --format csv -o "$OUT/kern_$CFG" "$OUT/prof_$CFG.nsys-rep" >/dev/null 2>&1
    f="$OUT/kern_${CFG}_cuda_gpu_kern_sum.csv"
    # columns: Time(%), Total Time (ns), Instances, Avg, Med, Min, Max, StdDev, Name
    python3 - "$f" "$STEPS" <<'EOF'
import csv, sys
rows = list(csv.DictReader(open(sys.argv[1])))
steps = float(sys.argv[2])
tot = sum(float(r["Total Time (ns)"]) for r in rows)
print(f"all kernels {tot/1e6:.2f} ms; per decode step (all / {steps:.0f}) {tot/steps/1e3:.1f} us")
for r in rows[:40]:
    n = int(r["Instances"]); t = float(r["Total Time (ns)"])
    print(f"{t/tot*100:5.1f}%  {t/steps/1e3:8.1f} us/step  {n/steps:6.1f}/step  avg {float(r['Avg (ns)'])/1e3:7.2f} us  {r['Name'][:90]}")
EOF
    rm -f "$OUT/prof_$CFG.nsys-rep" "$OUT"/*.sqlite
elif [ -f build-cuda/libktrace.so ] && [ "${PROF:-}" != ncu ]; then
    echo "no nsys: ktrace (CUPTI), graphs on"
    KTRACE_OUT="$OUT/kt_$CFG.csv" LD_PRELOAD="$PWD/build-cuda/libktrace.so" timeout 300 \
        build-cuda/vllm bench $ARGS >"$OUT/kt_$CFG.log" 2>&1
    tail -2 "$OUT/kt_$CFG.log"
    python3 tools/profile_step.py ktrace "$OUT/kt_$CFG.csv"
else
    echo "no nsys: ncu without graphs"
    VLLM_NO_GRAPHS=1 timeout 300 ncu --metrics gpu__time_duration.sum --csv \
        build-cuda/vllm bench ${ARGS/--output-len $STEPS/--output-len 4} >"$OUT/ncu_$CFG.csv" 2>/dev/null
    python3 tools/profile_step.py ncu "$OUT/ncu_$CFG.csv"
    tail -c 2000000 "$OUT/ncu_$CFG.csv" > "$OUT/ncu_${CFG}_tail.csv"; rm -f "$OUT/ncu_$CFG.csv"
fi
