#!/usr/bin/env bash
# deleted_working_folder.sh MPT: mpt started from a folder deleted while the shell was in it says so and
# exits 3 (before: oneMKL's "Cannot load libtorch_cpu.so" and exit 2), for a command that loads LibTorch
# (`mpt underflow`) and one that does not need it (`mpt list`).
set -u
mpt=$(realpath "$1")
tmp=$(mktemp -d); trap 'rm -rf "$tmp"' EXIT
status=0
for args in "list" "underflow -q --out $tmp/r.json"; do
  mkdir "$tmp/gone"
  # shellcheck disable=SC2086
  (cd "$tmp/gone" && rmdir "$tmp/gone" && exec "$mpt" $args) > "$tmp/out" 2> "$tmp/err"
  code=$?
  if [ $code -ne 3 ] || ! grep -q "the working folder no longer exists" "$tmp/err"; then
    echo "FAIL: mpt $args from a deleted folder: exit $code (expected 3), stderr:"; cat "$tmp/err"; status=1
  elif [ -e "$tmp/r.json" ]; then
    echo "FAIL: mpt $args wrote a result file"; status=1
  else
    echo "ok: mpt $args from a deleted folder: exit 3, $(head -c 80 "$tmp/err")"
  fi
done
exit $status
