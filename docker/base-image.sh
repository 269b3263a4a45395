#!/usr/bin/env bash
# Make a local Debian bookworm base image (Debian's Python 3.11 with venv) for sites that
# cannot pull a public Python image: debootstrap from a Debian mirror, then `docker import`.
#
#   bash docker/base-image.sh [NAME]      default NAME: ssfl-base:bookworm
#   ARCH=arm64 bash docker/base-image.sh ssfl-base:bookworm-arm64
#
# ARCH: Debian's name of the image's architecture (default: this machine's); another one
# runs debootstrap's second stage under emulation (apt-get install qemu-user-static).
# DEBIAN_MIRROR: the package mirror (default http://deb.debian.org/debian). Needs
# debootstrap, root (else sudo) and a Docker engine. An image NAME that already exists is
# kept as it is.
set -euo pipefail

NAME=${1:-ssfl-base:bookworm}
MIRROR=${DEBIAN_MIRROR:-http://deb.debian.org/debian}
ARCH=${ARCH:-$(dpkg --print-architecture)}

die() {
  echo "base-image.sh: $1" >&2
  exit 2
}

# Reuse the image when it is there: it only changes with Debian's point releases.
if docker image inspect "$NAME" >/dev/null 2>&1; then
  echo "base-image.sh: $NAME exists, kept"
  exit 0
fi
command -v debootstrap >/dev/null || PATH=$PATH:/usr/sbin:/sbin
command -v debootstrap >/dev/null || die "no debootstrap: apt-get install -y debootstrap"
SUDO=$([ "$(id -u)" = 0 ] || echo sudo)

ROOTFS=$(mktemp -d)
# A failed debootstrap may leave /proc and /sys mounted inside the folder: never delete
# across mounts.
trap '$SUDO umount -q "$ROOTFS/proc" "$ROOTFS/sys" 2>/dev/null || true; $SUDO rm -rf --one-file-system "$ROOTFS"' EXIT

# The smallest Debian that runs the app: minbase plus Python and its venv module (pip).
$SUDO debootstrap --arch="$ARCH" --variant=minbase --include=python3,python3-venv bookworm "$ROOTFS" "$MIRROR" \
  >"$ROOTFS.log" 2>&1 || die "debootstrap failed, see $ROOTFS.log"
rm -f "$ROOTFS.log"
# Package lists and caches are of no use in the image.
$SUDO sh -c "rm -rf '$ROOTFS'/var/cache/apt/archives/*.deb '$ROOTFS'/var/lib/apt/lists/*"

# The folder becomes the image's single layer.
$SUDO tar -C "$ROOTFS" -c . | docker import --platform "linux/$ARCH" \
  --change 'ENV PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin' \
  --change 'ENV LANG=C.UTF-8' \
  --change 'CMD ["python3"]' - "$NAME" >/dev/null
# Another architecture's Python runs through the host's QEMU binfmt handler.
echo "base-image.sh: $NAME ($(docker run --rm "$NAME" python3 -c \
  'import platform; print("Python", platform.python_version(), "on", platform.machine())'))"
