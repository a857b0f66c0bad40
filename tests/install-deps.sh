#!/usr/bin/env bash
# Installs the Debian packages the tests need, only when one is missing.
# The tests run as root on a disposable machine (CI does so too).
set -euo pipefail
# command -> package
declare -A need=(
  [getent]=libc-bin      # owners resolve through the name service
  [gofmt]=""             # comes with Go
  [setpriv]=util-linux   # the hostile-user tests drop to another uid
  [flock]=util-linux     # another process holding a lock (store, enrolment)
  [losetup]=mount        # the power-cut test and the chaos run: the control side's disk, an image through a loop device
  [mkfs.ext4]=e2fsprogs  # the filesystem of that image
  # tests/lab: disposable machines with a real init as PID 1
  [nsenter]=util-linux   # commands run inside a lab's namespaces
  [ip]=iproute2          # the veth between two labs
  [ping]=iputils-ping    # one lab pings the other
  [busctl]=systemd       # D-Bus calls to a lab's systemd from the host
  [openrc-init]=openrc   # OpenRC as a lab's PID 1 (never the host's init)
  [runit]=runit          # runit as a lab's PID 1; --no-install-recommends keeps
                         # runit-run (a host runit.service) out
  [s6-svscan]=s6         # s6 as a lab's PID 1
  # tests/machines profile_test.go: each capability produced for real in a lab
  [podman]=podman        # container-runtime: podman.socket answers _ping in a lab
  [runc]=runc            # podman's runtime in labs (crun's setrlimit needs CAP_SYS_RESOURCE)
  [nft]=nftables         # firewall: `nft list tables` in a lab's netns
  [iptables-nft]=iptables  # opening: iptables-nft found instead of native nftables
  [Xvfb]=xvfb            # graphical-session: an X server on /tmp/.X11-unix
  [wireguard-go]=wireguard-go  # overlay: userspace WireGuard (no kernel module here)
  [wg]=wireguard-tools   # overlay: `wg show` asserts the tunnel from outside the executor
  [perl]=perl-base       # package-manager: holds dpkg's fcntl lock (flock(1) cannot)
  [pkill]=procps         # graphical-session: Xvfb killed, its socket left behind
  # tests/machines pacman_test.go: the pacman backend against a repository of its own
  [pacman]=pacman-package-manager
  # tests/lab apktools.go: Alpine's apk built from the vendored apk-tools
  # source (static; its libraries' headers and archives are checked below)
  [cc]=gcc
  [meson]=meson
  [ninja]=ninja-build
  [pkg-config]=pkg-config
  # tests/lab busybox.go: Alpine's busybox (adduser, addgroup, and httpd,
  # which serves the lab's apk repository), built from Debian's busybox
  # source package, which apt-get source fetches
  [dpkg-source]=dpkg-dev
  [bzip2]=bzip2
  [make]=make
  # selinux/selinux_test.go: the policy compiled, linked in a store of its own, searched
  [policygentool]=selinux-policy-dev  # /usr/share/selinux/devel/Makefile
  [checkmodule]=checkpolicy           # the Makefile's compiler
  [semodule_unpackage]=semodule-utils # the .pp's file contexts read back
  [semodule]=policycoreutils          # semodule -p: a policy root of the test's own
  [sesearch]=setools                  # the linked policy's allow rules
  [matchpathcon]=selinux-utils        # the linked file contexts
  # cmdline: the completions generated for each binary, read by each shell
  [zsh]=zsh
  [fish]=fish
  # tests/packages_test.go: make deb, apk, arch and tarball, each package listed
  [dpkg-deb]=dpkg        # the .deb
  [zstd]=zstd            # the Arch package (tar --zstd)
  # control: the status page (serve --ui) loaded in a real headless browser
  [chromium-headless-shell]=chromium-headless-shell
)
missing=()
for cmd in "${!need[@]}"; do
  pkg=${need[$cmd]}
  if ! command -v "$cmd" >/dev/null 2>&1; then
    if [ -z "$pkg" ]; then echo "install-deps: $cmd is missing and has no package here (install Go)" >&2; exit 1; fi
    missing+=("$pkg")
  fi
done
# apk-tools links zlib, OpenSSL and zstd statically: their -dev packages
# ship no command either.
[ -f /usr/include/zlib.h ] || missing+=(zlib1g-dev)
[ -f /usr/include/openssl/ssl.h ] || missing+=(libssl-dev)
[ -f /usr/include/zstd.h ] || missing+=(libzstd-dev)
# selinux/selinux_test.go links against Debian's policy: it ships no command.
[ -d /usr/share/selinux/default ] || missing+=(selinux-policy-default)
if getent passwd nobody >/dev/null; then :; else
  echo "install-deps: the tests need the user 'nobody' (uid 65534)" >&2; exit 1
fi
# openrc's postinst leaves its state dir /run/openrc on a host that OpenRC did
# not boot; anything that detects the init by it would take this host for an
# OpenRC one. Labs make their own /run, so remove it when the install made it.
openrc_run_was_there=$([ -e /run/openrc ] && echo y || true)
if [ ${#missing[@]} -gt 0 ]; then
  echo "install-deps: installing ${missing[*]}"
  export DEBIAN_FRONTEND=noninteractive
  apt-get install -y --no-install-recommends -o DPkg::Lock::Timeout=900 "${missing[@]}" || {
    apt-get update -o DPkg::Lock::Timeout=900 && apt-get install -y --no-install-recommends -o DPkg::Lock::Timeout=900 "${missing[@]}"
  }
fi
if [ -z "$openrc_run_was_there" ] && [ -d /run/openrc ] && [ "$(cat /proc/1/comm 2>/dev/null)" != openrc-init ]; then
  rm -rf /run/openrc
fi
