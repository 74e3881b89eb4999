#!/usr/bin/env bash
# Issue 39's GPU check (benchmarks/gpu_check.py says what it runs and prints).
#
#   bash benchmarks/gpu_check.sh prepare      here, where pip reaches a registry: fill .wheels/ (ignored by git)
#   bash benchmarks/gpu_check.sh [ARGS]       on a CUDA machine with no hub: install .wheels/, then the check
#                                             (ARGS go to gpu_check.py: --tiny, --columns 0,1, --budget S, ...)
#   make gpu-check [ARGS="..."]               the same
#
# The wheels go to a folder of their own (/tmp/gpu_check_site, first on PYTHONPATH): the machine's torch stays.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PY:-python3}
if [ "${1:-}" = prepare ]; then
  shift
  exec "$PY" benchmarks/gpu_check.py --prepare "$@"
fi
start=$(date +%s%N)
if compgen -G ".wheels/*.whl" >/dev/null; then
  site=/tmp/gpu_check_site
  "$PY" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target "$site" .wheels/*.whl
  export PYTHONPATH="$site${PYTHONPATH:+:$PYTHONPATH}"
else
  echo "gpu_check: no .wheels/*.whl here: using the packages this Python has (fill .wheels with: $0 prepare)" >&2
fi
ms=$(( ($(date +%s%N) - start) / 1000000 ))
setup=$((ms / 1000)).$(printf %03d $((ms % 1000)))
export HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 PYTHONUNBUFFERED=1
exec "$PY" benchmarks/gpu_check.py --setup-s "$setup" "$@"
