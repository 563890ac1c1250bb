#!/bin/bash
# Runs a GPU test command, or exits 77 (ctest: skipped, loudly) when this
# machine has no usable NVIDIA GPU.
if ! command -v nvidia-smi >/dev/null 2>&1 || ! nvidia-smi -L >/dev/null 2>&1; then
    echo "SKIP: no NVIDIA GPU on this machine (nvidia-smi -L failed): $*" >&2
    exit 77
fi
exec "$@"
