#!/usr/bin/env bash
# configs/<experiment>.json holds exactly the built-in defaults of every experiment
# (`mpt <experiment> --print-config`), and every other config file in configs/ is accepted
# by the experiment its name starts with (validated through --print-config, nothing runs).
set -u
mpt=$1
status=0
for e in $("$mpt" list | awk '{print $1}'); do
  f=configs/$e.json
  if [ ! -f "$f" ]; then echo "FAIL: $f is missing"; status=1; continue; fi
  "$mpt" "$e" --print-config > /tmp/mpt_defaults_$$.json
  if ! /usr/bin/python3 -c 'import json,sys; a,b=(json.load(open(p)) for p in sys.argv[1:]); sys.exit(a!=b)' "$f" /tmp/mpt_defaults_$$.json; then
    echo "FAIL: $f differs from \`mpt $e --print-config\`"; status=1
  else
    echo "ok: $f equals the built-in defaults"
  fi
  for v in configs/${e}_*.json; do
    [ -f "$v" ] || continue
    if "$mpt" "$e" --config "$v" --print-config > /dev/null; then echo "ok: $v is valid"; else echo "FAIL: $v rejected"; status=1; fi
  done
done
rm -f /tmp/mpt_defaults_$$.json
exit $status
