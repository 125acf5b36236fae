#!/usr/bin/env bash
# fp8_parity.sh MPT PYTHON REF [mpt args...]: run_parity.sh with tests/parity/REF (fp8_ref.py for the
# MLP, fp8_gpt_ref.py for the tiny GPT), skipped (77)
# with a visible message when PYTHON's torch has no float8 dtypes (Debian's 1.13: the twin
# quantizes with torch.float8_e4m3fn / float8_e5m2 casts).
set -u
mpt=$1 py=$2 ref=$3; shift 3
if "$py" -c 'import torch' 2>/dev/null && ! "$py" -c 'import torch; torch.float8_e4m3fn' 2>/dev/null; then
  echo "SKIPPED: $("$py" -c 'import torch; print("torch", torch.__version__)') has no float8 dtypes (the twin casts with torch.float8_e4m3fn)"
  exit 77
fi
exec bash "$(dirname "$0")/run_parity.sh" "$mpt" "$py" "$(dirname "$0")/$ref" "$@"
