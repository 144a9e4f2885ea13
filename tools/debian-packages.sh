#!/bin/bash
# Debian packages the tests need besides the pinned Go tools: each `package:command` below is
# installed with apt-get when its command is missing (root only; otherwise it says what to run).
#   knot:knotd  Knot DNS, the real server the RFC 2136 (dns.mode: rfc2136) tests update.
#   openssh-server:sshd  OpenSSH, the lab's Git-over-SSH server (lab/git_ssh_server.py) that Flux's
#                        source-controller reads with a deploy key.
# Test hooks (tests/unit/test_debian_packages.py): KONTINUUM_APT_GET (the apt-get to run),
# KONTINUUM_SBIN_DIRS (where system commands live besides PATH), KONTINUUM_UID (the user id).
set -euo pipefail

PACKAGES=(knot:knotd openssh-server:sshd)
APT_GET=${KONTINUUM_APT_GET:-apt-get}
SBIN_DIRS=${KONTINUUM_SBIN_DIRS:-/usr/sbin /sbin}
USER_ID=${KONTINUUM_UID:-$(id -u)}

present() {
  command -v "$1" >/dev/null 2>&1 && return 0
  local d
  for d in $SBIN_DIRS; do [[ -x "$d/$1" ]] && return 0; done
  return 1
}

missing=()
for pair in "${PACKAGES[@]}"; do
  present "${pair#*:}" || missing+=("${pair%%:*}")
done
[[ ${#missing[@]} -eq 0 ]] && exit 0

if [[ "$USER_ID" != 0 ]]; then
  echo "tools/debian-packages.sh: missing Debian package(s) ${missing[*]} (the tests run a real DNS server and a real SSH server);" \
       "install them: sudo apt-get install -y ${missing[*]}" >&2
  exit 1
fi
echo "tools/debian-packages.sh: installing ${missing[*]}" >&2
export DEBIAN_FRONTEND=noninteractive
if ! "$APT_GET" install -y --no-install-recommends "${missing[@]}" >&2; then
  # A fresh machine has no package lists yet.
  "$APT_GET" update >&2 && "$APT_GET" install -y --no-install-recommends "${missing[@]}" >&2 || {
    echo "tools/debian-packages.sh: apt-get could not install ${missing[*]}" >&2; exit 1; }
fi
for pair in "${PACKAGES[@]}"; do
  if ! present "${pair#*:}"; then
    echo "tools/debian-packages.sh: ${pair%%:*} is installed but ${pair#*:} is still not found" >&2
    exit 1
  fi
done
