#!/bin/bash
# One decode run under a profiler: where a step's device time goes, per kernel.
#   CFG=nano30b (bench/configs/NAME)  ROWS=1 (sequences)  STEPS=32 (decode tokens)
# nsys with CUDA graphs traced per node (each kernel as the step runs it, PDL
# overlap included) where nsys exists, else ncu without graphs (each kernel
# alone at base clocks, so the sum is above the real step). Prints the kernel
# summary: nsys, launches per decode step (count / STEPS; prefill and load
# kernels show as fractions); ncu, the last full decode step's kernels.
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
else
    echo "no nsys: ncu without graphs"
    VLLM_NO_GRAPHS=1 timeout 300 ncu --metrics gpu__time_duration.sum --csv \
        build-cuda/vllm bench ${ARGS/--output-len $STEPS/--output-len 4} >"$OUT/ncu_$CFG.csv" 2>/dev/null
    # the last full decode step (between the last two k_sample launches), by kernel and grid
    python3 - "$OUT/ncu_$CFG.csv" <<'EOF2'
import csv, re, sys
txt = open(sys.argv[1], errors="replace").read()
rows = list(csv.DictReader(txt[txt.find('"ID"'):].splitlines()))
names = [re.sub(r"\(.*", "", r["Kernel Name"])[:60] for r in rows]
cut = [j for j, n in enumerate(names) if n == "k_sample"]
if len(cut) < 2: sys.exit("ncu: fewer than two k_sample launches")
a, b = cut[-2] + 1, cut[-1] + 1
ns = lambda r: float(r["Metric Value"].replace(",", ""))
agg = {}
for r, n in zip(rows[a:b], names[a:b]):
    k = f"{n} {r['Grid Size']}"
    c = agg.setdefault(k, [0, 0.0]); c[0] += 1; c[1] += ns(r)
tot = sum(c[1] for c in agg.values())
print(f"decode step: {b - a} kernels, {tot / 1e3:.1f} us (each alone, base clocks)")
for k, (n, t) in sorted(agg.items(), key=lambda kv: -kv[1][1])[:30]:
    print(f"{t / 1e3:9.1f} us {n:4d}x {t / n / 1e3:7.2f} us  {k}")
EOF2
    tail -c 2000000 "$OUT/ncu_$CFG.csv" > "$OUT/ncu_${CFG}_tail.csv"; rm -f "$OUT/ncu_$CFG.csv"
fi
