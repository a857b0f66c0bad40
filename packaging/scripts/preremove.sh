#!/bin/sh
# nox-mesh-host, before its files go. .deb prerm (remove | upgrade NEW |
# deconfigure ...), .apk pre-deinstall (no arguments), Arch pre_remove
# (OLD-VERSION; pasted into a function, so it never calls exit). On an
# upgrade nothing is stopped: the host upgrades itself and restarts onto the
# new binary by exiting. On removal the units are stopped and disabled; the
# state directories and the user stay (what the host owns on this machine
# is recorded there).

case "$1" in
upgrade | failed-upgrade) ;;
*)
	if command -v systemctl >/dev/null 2>&1 && [ -f /usr/lib/systemd/system/mesh-executor.service ]; then
		# The control side, when the carried bundle raised it here: its
		# binary goes with the package.
		if [ -d /run/systemd/system ]; then
			systemctl stop mesh-agent.service mesh-executor.service mesh-control.service || true
		fi
		systemctl disable mesh-agent.service mesh-executor.service mesh-control.service || true
	elif command -v rc-service >/dev/null 2>&1 && [ -x /etc/init.d/mesh-executor ]; then
		rc-service mesh-agent stop || true
		rc-service mesh-executor stop || true
		rc-service -i mesh-control stop 2>/dev/null || true
		rc-update del mesh-agent default || true
		rc-update del mesh-executor default || true
		rc-update del mesh-control default 2>/dev/null || true
	fi
	;;
esac
true
