#!/bin/sh
# Completions (bash, zsh, fish) and man pages of the host's binaries, made
# by the binaries themselves from their own command definitions (cmdline):
# BINDIR holds binaries that run on this machine, OUTDIR/share receives
# bash/, zsh/, fish/, man1/ and man8/, which packaging/nfpm.yaml installs.
set -eu
bin=$1
out=$2/share
mkdir -p "$out/bash" "$out/zsh" "$out/fish" "$out/man1" "$out/man8"
for b in mesh-executor mesh-agent mesh-launch mesh-control; do
	"$bin/$b" completion bash >"$out/bash/$b"
	"$bin/$b" completion zsh >"$out/zsh/_$b"
	"$bin/$b" completion fish >"$out/fish/$b.fish"
done
"$bin/mesh-control" man >"$out/man1/mesh-control.1"
for b in mesh-executor mesh-agent mesh-launch; do
	"$bin/$b" man >"$out/man8/$b.8"
done
