#!/bin/bash
# One device call that (re)makes the oracle fixtures with transformers on the
# GPU machine and packs them into $OUT/fixtures.tar.gz:
#   CASES=qwen3,llama3,...  (default: every case of make_family_fixtures.py)
#   PREFIX="nh_dense:NemotronHForCausalLM qwen3:Qwen3ForCausalLM" (shared-prefix prompt sets)
# Unpack here with: tar -xzf fixtures.tar.gz -C tests/fixtures
set -uo pipefail
OUT=${OUT:-/tmp/out}
mkdir -p "$OUT" /tmp/fx
export PYTHONUNBUFFERED=1
python3 tools/oracle/make_family_fixtures.py /tmp/fx ${CASES:-} 2>&1 | tee "$OUT/fixtures.log" | grep -v tensors:
for p in ${PREFIX:-}; do
    fx=${p%%:*} arch=${p##*:}
    src=/tmp/fx/$fx; [ -d "$src" ] || src=tests/fixtures/$fx
    mkdir -p /tmp/fx/$fx
    python3 tools/oracle/make_family_fixtures.py --prefix "$src" "$arch" /tmp/fx/$fx 2>&1 | tee -a "$OUT/fixtures.log"
done
tar -czf "$OUT/fixtures.tar.gz" -C /tmp/fx .
# the oracle's own modeling code, to read offline
site=$(python3 -c 'import transformers, os; print(os.path.dirname(transformers.__file__))')
tar -czf "$OUT/hf_models.tar.gz" -C "$site" modeling_rope_utils.py \
    $(cd "$site" && ls models/{qwen3,qwen3_moe,qwen2,llama,mamba2,kimi_linear,nemotron_h}/{modeling,configuration}_*.py 2>/dev/null)
ls -la "$OUT"
