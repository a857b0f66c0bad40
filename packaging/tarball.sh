#!/bin/sh
# packaging/tarball.sh BINDIR OUT BUNDLE [SHAREDIR]
#
# Makes the tarball OUT (…tar.gz) of the host for a machine with no
# package manager: the files at the paths the packages install them, so
# `tar -xzf OUT -C /` lays them where the units and the carried bundle
# expect them —
#
#   usr/bin/mesh-{executor,agent,launch[,control]}   from BINDIR
#   usr/lib/nox-mesh-host/foundation.lock            BUNDLE (when given and mesh-control is built)
#   usr/lib/systemd/system/mesh-*.service            init/systemd
#   usr/lib/{sysusers,tmpfiles}.d/nox-mesh-host.conf the agent's user, the state directories (systemd)
#   usr/share/nox-mesh-host/init/{openrc,runit,s6}/  the other inits' files, to copy where that init
#                                                   looks (they are not put in /etc: a systemd
#                                                   machine has no use for them there)
#   usr/share/doc/nox-mesh-host/                     operations.md, declaration.md, SECURITY.md
#   usr/share/man/man{1,8}/, the completions'        from SHAREDIR (packaging/gen-share.sh's,
#     directories (bash, zsh, fish)                 when given), where the packages put them
#
# The bundle's service is mesh-control.service, so a first node raised from
# the tarball needs mesh-control and its unit: both go in together or not
# at all. There is no postinstall: on systemd, systemd-sysusers and
# systemd-tmpfiles --create make the agent's user and the state directories
# from the files above; on the other inits mesh-launch makes them at its
# first start.
set -eu
bindir=$1 out=$2 bundle=${3:-} share=${4:-}
root=$(mktemp -d)
trap 'rm -rf "$root"' EXIT
install -d -m 0755 "$root/usr/bin" "$root/usr/lib/systemd/system" "$root/usr/share/nox-mesh-host/init" "$root/usr/share/doc/nox-mesh-host"
for b in mesh-executor mesh-agent mesh-launch mesh-control; do
	[ -f "$bindir/$b" ] && install -m 0755 "$bindir/$b" "$root/usr/bin/$b"
done
for u in mesh-executor mesh-agent; do
	install -m 0644 "init/systemd/$u.service" "$root/usr/lib/systemd/system/$u.service"
done
# systemd makes the agent's user and the state directories from these
# (systemd-sysusers, systemd-tmpfiles --create), as the packages' install
# does: the agent's unit names its user, which must be there first.
install -d -m 0755 "$root/usr/lib/sysusers.d" "$root/usr/lib/tmpfiles.d"
install -m 0644 packaging/sysusers.conf "$root/usr/lib/sysusers.d/nox-mesh-host.conf"
install -m 0644 packaging/tmpfiles.conf "$root/usr/lib/tmpfiles.d/nox-mesh-host.conf"
if [ -f "$bindir/mesh-control" ]; then
	install -m 0644 init/systemd/mesh-control.service "$root/usr/lib/systemd/system/mesh-control.service"
	if [ -n "$bundle" ]; then
		install -d -m 0755 "$root/usr/lib/nox-mesh-host"
		install -m 0644 "$bundle" "$root/usr/lib/nox-mesh-host/foundation.lock"
	fi
fi
for i in openrc runit s6; do
	cp -a "init/$i" "$root/usr/share/nox-mesh-host/init/$i"
done
for d in docs/operations.md docs/declaration.md SECURITY.md; do
	install -m 0644 "$d" "$root/usr/share/doc/nox-mesh-host/"
done
if [ -n "$share" ]; then
	# The man pages and completions, as packaging/nfpm.yaml installs them.
	for d in man/man1:man1 man/man8:man8 bash-completion/completions:bash zsh/site-functions:zsh fish/vendor_completions.d:fish; do
		install -d -m 0755 "$root/usr/share/${d%%:*}"
		install -m 0644 "$share/${d#*:}"/* "$root/usr/share/${d%%:*}/"
	done
fi
tar -C "$root" --owner=0 --group=0 --numeric-owner --sort=name -czf "$out" usr
