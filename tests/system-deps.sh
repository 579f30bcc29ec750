#!/usr/bin/env bash
# System packages that some tests need, installed by `make test` when missing (Debian, as root).
# Usage: tests/system-deps.sh COMMAND:PACKAGE ...   (PACKAGE is installed when COMMAND is not on PATH)
# Where they cannot be installed, the tests that need them are skipped and say why; nothing fails here.
set -u
missing=()
for spec in "$@"; do
  command -v "${spec%%:*}" >/dev/null 2>&1 || missing+=("${spec#*:}")
done
[ ${#missing[@]} -eq 0 ] && exit 0
if [ "$(id -u)" != 0 ] || ! command -v apt-get >/dev/null 2>&1; then
  echo "system-deps: missing ${missing[*]} (install as root with apt-get); the tests that need them are skipped"
  exit 0
fi
echo "system-deps: installing ${missing[*]} with apt-get..."
if ! { apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends \
  "${missing[@]}" >/dev/null; }; then
  echo "system-deps: could not install ${missing[*]}; the tests that need them are skipped"
fi
exit 0
