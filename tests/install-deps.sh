#!/usr/bin/env bash
# Installs the Debian packages the tests need, only when one is missing.
# The tests run as root on a disposable machine (CI does so too).
set -euo pipefail
# command -> package
declare -A need=(
  [getent]=libc-bin      # owners resolve through the name service
  [gofmt]=""             # comes with Go
  [setpriv]=util-linux   # the hostile-user tests drop to another uid
)
missing=()
for cmd in "${!need[@]}"; do
  pkg=${need[$cmd]}
  if ! command -v "$cmd" >/dev/null 2>&1; then
    if [ -z "$pkg" ]; then echo "install-deps: $cmd is missing and has no package here (install Go)" >&2; exit 1; fi
    missing+=("$pkg")
  fi
done
if getent passwd nobody >/dev/null; then :; else
  echo "install-deps: the tests need the user 'nobody' (uid 65534)" >&2; exit 1
fi
if [ ${#missing[@]} -gt 0 ]; then
  echo "install-deps: installing ${missing[*]}"
  export DEBIAN_FRONTEND=noninteractive
  apt-get install -y --no-install-recommends -o DPkg::Lock::Timeout=900 "${missing[@]}" || {
    apt-get update -o DPkg::Lock::Timeout=900 && apt-get install -y --no-install-recommends -o DPkg::Lock::Timeout=900 "${missing[@]}"
  }
fi
