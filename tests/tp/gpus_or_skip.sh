#!/bin/bash
# gpus_or_skip.sh N CMD...: runs a tensor-parallel GPU test, or exits 77
# (ctest: skipped, loudly) when this machine shows fewer than N NVIDIA GPUs.
# NVLink multicast (NVLS) stays off on the machines we are lent.
n=$1
shift
have=$(nvidia-smi -L 2>/dev/null | grep -c '^GPU ')
if [ "${have:-0}" -lt "$n" ]; then
    echo "SKIP: $n GPUs needed, ${have:-0} here: $*" >&2
    exit 77
fi
export NCCL_NVLS_ENABLE=0
exec "$@"
