#!/bin/sh
# nox-mesh-host, after its files are in place. One script for the three
# packages: .deb postinst (configure [OLD-VERSION]), .apk post-install (no
# arguments) and Arch post_install (NEW-VERSION; pacman pastes this into a
# function, so it never calls exit). Upgrades run no script of ours
# that stops or starts anything: the host upgrades itself through the
# package manager and exits 0 afterwards; the launcher starts the new
# binary. The init is never asked to restart it.

nmh_user() {
	id -u mesh-agent >/dev/null 2>&1 && return 0
	if command -v systemd-sysusers >/dev/null 2>&1 && [ -f /usr/lib/sysusers.d/nox-mesh-host.conf ]; then
		systemd-sysusers nox-mesh-host.conf && return 0
	fi
	nologin=/usr/sbin/nologin
	[ -x "$nologin" ] || nologin=/sbin/nologin
	if command -v useradd >/dev/null 2>&1; then
		useradd --system --user-group --no-create-home --home-dir /var/lib/mesh-host/agent \
			--shell "$nologin" --comment "nox-mesh-host link agent" mesh-agent
	else
		# busybox (Alpine)
		addgroup -S mesh-agent 2>/dev/null
		adduser -S -D -H -h /var/lib/mesh-host/agent -s "$nologin" -G mesh-agent \
			-g "nox-mesh-host link agent" mesh-agent
	fi
}

nmh_dirs() {
	install -d -m 0755 -o root -g root /var/lib/mesh-host
	install -d -m 0700 -o root -g root /var/lib/mesh-host/executor
	install -d -m 0700 -o mesh-agent -g mesh-agent /var/lib/mesh-host/agent
}

nmh_enable() {
	# $1: "start" to start as well (Debian's idiom); Alpine and Arch
	# enable only, and the operator's second line starts
	# (rc-service, systemctl start).
	if command -v systemctl >/dev/null 2>&1 && [ -f /usr/lib/systemd/system/mesh-executor.service ]; then
		if [ -d /run/systemd/system ]; then
			systemctl daemon-reload
		fi
		systemctl enable mesh-executor.service mesh-agent.service
		if [ "$1" = start ] && [ -d /run/systemd/system ]; then
			systemctl start mesh-executor.service mesh-agent.service
		fi
	elif command -v rc-update >/dev/null 2>&1 && [ -x /etc/init.d/mesh-executor ]; then
		rc-update add mesh-executor default
		rc-update add mesh-agent default
	fi
}

nmh_upgrade=
nmh_start=
case "$1" in
configure)
	# Debian: configure OLD-VERSION is an upgrade (or a reinstall).
	[ -n "$2" ] && nmh_upgrade=yes
	nmh_start=start
	;;
abort-upgrade | abort-remove | abort-deconfigure)
	nmh_upgrade=yes
	;;
esac

if nmh_user && nmh_dirs; then
	if [ -z "$nmh_upgrade" ]; then
		nmh_enable "$nmh_start"
	elif [ -d /run/systemd/system ]; then
		systemctl daemon-reload
	fi
else
	echo "nox-mesh-host: could not create the user mesh-agent or the state directories" >&2
	false
fi
