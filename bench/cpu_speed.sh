#!/bin/bash
# cpu_speed.sh - the CPU speed figures of docs/BENCHMARKS_CPU.md ("CPU speed"), in
# one run: ROUNDS rounds of [read bandwidth (membw), `vllm bench` of the fast
# path (bf16 weights, batch 1 and 4, 512-token prompts, 64 output tokens),
# read bandwidth again, the bf16 dot kernel's peak (cpu_ops)], each round's
# decode roofline ratio (its own bandwidth, the mean of the two around the
# bench) and prefill GEMM FLOP/s against that round's kernel peak, and the
# medians; then the reference path once (VLLM_CPU_REFERENCE=1) for the
# end-to-end speed-up. The machine is shared: read the medians and the
# per-round ratios.
#
# Usage: bench/cpu_speed.sh [ROUNDS (default 5)] [BUILD (default build)] [MODEL]
set -euo pipefail
cd "$(dirname "$0")/.."
rounds=${1:-5}
build=${2:-build}
model=${3:-bench/configs/rand_moe}
threads=2
in_len=512
out_len=64
bench() { # prints: prefill1 decode1 prefill4 decode4
    "$build/vllm" bench --model "$model" --load-format dummy --threads $threads --dtype bf16 --batch-sizes 1,4 \
        --input-len $in_len --output-len $out_len --json |
        sed 's/.*"results": \[//; s/}, {/\n/g' |
        sed -n 's/.*"prefill_tok_s": \([0-9.]*\), "decode_tok_s": \([0-9.]*\).*/\1 \2/p' | tr '\n' ' '
}
median() { tr ' ' '\n' | grep -v '^$' | sort -g | awk '{v[NR] = $1} END {print (NR % 2) ? v[(NR + 1) / 2] : (v[NR / 2] + v[NR / 2 + 1]) / 2}'; }

# bytes per decode token at the middle of the decode (context in_len + out_len / 2)
cost=$("$build/nh_cost" "$model" bf16 $((in_len + out_len / 2)))
bytes=$(echo "$cost" | tail -2 | head -1)
flops=$(echo "$cost" | tail -1)
echo "$cost" | head -2
echo "kernels: $("$build/cpu_ops" $threads 1 none | head -1)"
printf "%5s %6s %8s %8s %6s %8s %9s %7s %7s %6s\n" round "GB/s" decode1 roofline ratio decode4 prefill1 "GF/s" peak ratio
bw_all="" d1_all="" d4_all="" p1_all="" ratio_all="" gf_all="" pk_all="" pr_all=""
for r in $(seq 1 "$rounds"); do
    bw1=$("$build/membw" $threads 1024 5 | sed 's/read bandwidth: \([0-9.]*\).*/\1/')
    read -r p1 d1 p4 d4 <<<"$(bench)"
    bw2=$("$build/membw" $threads 1024 5 | sed 's/read bandwidth: \([0-9.]*\).*/\1/')
    bw=$(awk -v a="$bw1" -v b="$bw2" 'BEGIN {print (a + b) / 2}')
    roof=$(awk -v bw="$bw" -v by="$bytes" 'BEGIN {printf "%.1f", bw * 1e9 / by}')
    ratio=$(awk -v d="$d1" -v r="$roof" 'BEGIN {printf "%.2f", d / r}')
    peak=$("$build/cpu_ops" $threads 1 peak | sed -n 's/.*on 1 thread, \([0-9.]*\) on.*/\1/p')
    peak=${peak:-0}
    gf=$(awk -v p="$p1" -v f="$flops" 'BEGIN {printf "%.1f", p * f / 1e9}')
    pr=$(awk -v g="$gf" -v k="$peak" 'BEGIN {printf "%.2f", (k > 0) ? g / k : 0}')
    printf "%5d %6.1f %8.1f %8.1f %6s %8.1f %9.1f %7.1f %7.1f %6s\n" "$r" "$bw" "$d1" "$roof" "$ratio" "$d4" "$p1" "$gf" "$peak" "$pr"
    bw_all+=" $bw" d1_all+=" $d1" d4_all+=" $d4" p1_all+=" $p1" ratio_all+=" $ratio" gf_all+=" $gf" pk_all+=" $peak" pr_all+=" $pr"
done
printf "%5s %6.1f %8.1f %8s %6s %8.1f %9.1f %7.1f %7.1f %6s\n" median "$(echo "$bw_all" | median)" "$(echo "$d1_all" | median)" "" \
    "$(echo "$ratio_all" | median)" "$(echo "$d4_all" | median)" "$(echo "$p1_all" | median)" "$(echo "$gf_all" | median)" \
    "$(echo "$pk_all" | median)" "$(echo "$pr_all" | median)"
if [ "${CPU_SPEED_NO_REF:-0}" != 1 ]; then
    read -r rp1 rd1 rp4 rd4 <<<"$(VLLM_CPU_REFERENCE=1 bench)"
    echo "reference path (VLLM_CPU_REFERENCE=1, bf16 values in fp32): decode1 $rd1, decode4 $rd4, prefill1 $rp1 tok/s"
    awk -v a="$(echo "$d1_all" | median)" -v b="$rd1" -v c="$(echo "$d4_all" | median)" -v d="$rd4" \
        -v e="$(echo "$p1_all" | median)" -v f="$rp1" \
        'BEGIN {printf "speed-up of the fast path (medians over the reference run): decode1 x%.1f, decode4 x%.1f, prefill1 x%.1f\n", a / b, c / d, e / f}'
fi
