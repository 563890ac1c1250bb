#!/bin/bash
# Mutation proof: applies each tests/mutations/*.patch alone, builds, runs the
# oracle gates, and checks that each breakage turns at least one gate red.
# A patch named noop_*.patch changes nothing the gates can see: it must stay
# GREEN, which checks this script's own count. Only failed tests count as red
# (skipped GPU tests are listed by ctest too, under "did not run").
# A patch that touches only src/backend/cuda/ breaks a CUDA kernel: the CPU
# gates cannot see it, and the GPU tests (op tests against the reference op,
# the fp32 gates) must turn red, so it needs a GPU (nvidia-smi); without one
# it is skipped, and says so (tools/device_run.sh MUTATE=NAME runs one there).
# Usage: tests/mutations/run.sh [NAME...]   (not part of `make test`: ~1 min each)
set -uo pipefail
cd "$(dirname "$0")/../.."
# The patches break the CPU reference ops (and the shared engine / runner), so
# the gates run on the reference path; the fast path is held to the reference
# op by op in tests/cpu.
export VLLM_CPU_REFERENCE=1
names=("$@")
[ ${#names[@]} -eq 0 ] && names=($(ls tests/mutations/*.patch | xargs -n1 basename | sed 's/\.patch$//'))
status=0
for n in "${names[@]}"; do
    regex='^gate_|ops_cpu|^rows$|^quant_|^kv_fp8'
    if ! grep '^+++ b/' tests/mutations/$n.patch | grep -qv '^+++ b/src/backend/cuda/'; then
        nvidia-smi >/dev/null 2>&1 || { echo "$n: skipped (a CUDA kernel's mutation: needs a GPU)"; continue; }
        regex='^gpu_(ops|attn|ssd|quant|moe_quant|kv_fp8|gate_fp32)'
    fi
    git apply tests/mutations/$n.patch || { echo "$n: patch does not apply"; status=1; continue; }
    make BUILD=build-mut >/dev/null 2>&1 || { echo "$n: build failed"; git apply -R tests/mutations/$n.patch; status=1; continue; }
    # the names listed after "The following tests FAILED:", and nothing else
    red=$(cd build-mut && ctest -R "$regex" -j "$(nproc)" 2>&1 |
          awk '/The following tests FAILED:/{f=1; next} /^[^ \t]/{f=0} f && $2 == "-" {print $3}' | tr '\n' ' ')
    git apply -R tests/mutations/$n.patch
    count=$(echo $red | wc -w)
    case "$n" in
    noop_*)
        if [ "$count" -eq 0 ]; then echo "$n: GREEN, as it must be"
        else echo "$n: RED ($count tests) - a patch that changes nothing turned gates red: $red"; status=1; fi ;;
    *)
        if [ "$count" -gt 0 ]; then echo "$n: RED ($count tests): $red"
        else echo "$n: still GREEN - no gate caught it"; status=1; fi ;;
    esac
done
make BUILD=build-mut >/dev/null 2>&1
exit $status
