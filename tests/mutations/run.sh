#!/bin/bash
# Mutation proof: applies each tests/mutations/*.patch alone, builds, runs the
# oracle gates, and checks that each breakage turns at least one gate red.
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
    git apply tests/mutations/$n.patch || { echo "$n: patch does not apply"; status=1; continue; }
    make BUILD=build-mut >/dev/null 2>&1 || { echo "$n: build failed"; git apply -R tests/mutations/$n.patch; status=1; continue; }
    red=$(cd build-mut && ctest -R 'gate_|ops_cpu' -j "$(nproc)" 2>&1 | grep -E '^\s+[0-9]+ - ' | awk '{print $3}' | tr '\n' ' ')
    git apply -R tests/mutations/$n.patch
    if [ -n "$red" ]; then echo "$n: RED ($(echo $red | wc -w) tests): $red"
    else echo "$n: still GREEN - no gate caught it"; status=1; fi
done
make BUILD=build-mut >/dev/null 2>&1
exit $status
