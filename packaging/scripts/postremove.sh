#!/bin/sh
# nox-mesh-host, after its files went (.deb postrm, .apk post-deinstall,
# Arch post_remove): systemd forgets the units. Nothing else is removed: the
# state directories and the user mesh-agent stay, even on purge, because
# the executor's store says what the host made on this machine.
if [ -d /run/systemd/system ] && command -v systemctl >/dev/null 2>&1; then
	systemctl daemon-reload || true
fi
true
