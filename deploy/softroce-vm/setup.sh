#!/usr/bin/env bash
# Soft-RoCE VM lab: one-time (idempotent) host setup.
#
#  * installs the Debian packages the lab needs (apt-get, only if missing);
#  * fetches the guest kernel (the package linux-image-amd64 depends on) with
#    `apt-get download`, unpacks it with `dpkg -x` into cache/kernel/<version>/
#    and runs `depmod -b` there (the package ships no modules.dep);
#  * builds a small busybox initramfs (cache/initramfs-<version>.cpio.gz)
#    holding init.sh and the modules needed to mount the host root over 9p.
#
# Nothing is installed into the host's /lib/modules or /boot.
# Re-running with everything cached only checks and takes a second or two.
#
# Environment:
#   LAB_CACHE      cache folder (default: <this dir>/cache)
#   LAB_KPKG       guest kernel package to use (default: what linux-image-amd64
#                  depends on; if apt knows none, the newest one in the cache)
#   LAB_NO_APT=1   do not run apt-get (fail if something is missing)
set -euo pipefail

LAB_DIR=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
LAB_CACHE=${LAB_CACHE:-$LAB_DIR/cache}
PKGS=(qemu-system-x86 busybox-static rdma-core ibverbs-utils ibverbs-providers
      perftest rdmacm-utils libibverbs-dev librdmacm-dev iproute2 iptables kmod cpio)

log() { printf '[setup] %s\n' "$*" >&2; }
die() { printf '[setup] ERROR: %s\n' "$*" >&2; exit 1; }

[ "$(id -u)" = 0 ] || die "run as root (apt-get, taps and bridges need it)"
mkdir -p "$LAB_CACHE"
# One setup at a time (CI and a developer may race on the cache).
exec 9>"$LAB_CACHE/.setup.lock"
flock -w 600 9 || die "another setup.sh holds $LAB_CACHE/.setup.lock"

apt_updated=0
apt_update_once() {
    [ "$apt_updated" = 1 ] && return 0
    log "apt-get update"
    apt-get update -qq >&2 || die "apt-get update failed"
    apt_updated=1
}

# ---------------------------------------------------------------- packages
missing=()
for p in "${PKGS[@]}"; do
    dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q 'install ok installed' || missing+=("$p")
done
if [ ${#missing[@]} -gt 0 ]; then
    [ "${LAB_NO_APT:-0}" = 1 ] && die "missing packages: ${missing[*]} (LAB_NO_APT=1)"
    log "installing: ${missing[*]}"
    if ! DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${missing[@]}" >&2; then
        apt_update_once
        DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${missing[@]}" >&2 \
            || die "apt-get install ${missing[*]} failed"
    fi
fi
for t in qemu-system-x86_64 busybox depmod modprobe cpio ip rdma iptables; do
    command -v "$t" >/dev/null || [ -x "/usr/sbin/$t" ] || [ -x "/sbin/$t" ] || die "$t not found after install"
done
BUSYBOX=$(command -v busybox)
file_is_static() { ! ldd "$1" >/dev/null 2>&1; }
file_is_static "$BUSYBOX" || BUSYBOX=/bin/busybox
file_is_static "$BUSYBOX" || die "$BUSYBOX is not static (busybox-static missing?)"

# ---------------------------------------------------------- guest kernel
kpkg_from_apt() {
    apt-cache depends linux-image-amd64 2>/dev/null \
        | awk '/Depends: linux-image-[0-9]/ {print $2; exit}'
}
KPKG=${LAB_KPKG:-}
if [ -z "$KPKG" ]; then
    KPKG=$(kpkg_from_apt || true)
    if [ -z "$KPKG" ]; then
        # No package lists yet (fresh machine): use the cache if it has a kernel,
        # else update the lists.
        cached=$(ls -1d "$LAB_CACHE"/kernel/*/.done 2>/dev/null | sort -V | tail -n1 || true)
        if [ -n "$cached" ] && [ "${LAB_NO_APT:-0}" != 1 ] ; then
            KPKG=linux-image-$(basename "$(dirname "$cached")")
            log "apt knows no linux-image-amd64; using cached $KPKG"
        else
            apt_update_once
            KPKG=$(kpkg_from_apt || true)
        fi
    fi
fi
[ -n "$KPKG" ] || die "cannot tell which kernel package linux-image-amd64 depends on"
KVER=${KPKG#linux-image-}
KROOT=$LAB_CACHE/kernel/$KVER
if [ ! -e "$KROOT/.done" ]; then
    log "fetching $KPKG"
    rm -rf "$KROOT" "$LAB_CACHE/debs.tmp"
    mkdir -p "$LAB_CACHE/debs" "$LAB_CACHE/debs.tmp"
    deb=$(ls -1 "$LAB_CACHE/debs/${KPKG}_"*.deb 2>/dev/null | tail -n1 || true)
    if [ -z "$deb" ]; then
        ( cd "$LAB_CACHE/debs.tmp" && apt-get download -q -o APT::Sandbox::User=root "$KPKG" >&2 ) || {
            apt_update_once
            ( cd "$LAB_CACHE/debs.tmp" && apt-get download -q -o APT::Sandbox::User=root "$KPKG" >&2 ) \
                || die "apt-get download $KPKG failed"
        }
        mv "$LAB_CACHE/debs.tmp/"*.deb "$LAB_CACHE/debs/"
        deb=$(ls -1 "$LAB_CACHE/debs/${KPKG}_"*.deb | tail -n1)
    fi
    rmdir "$LAB_CACHE/debs.tmp" 2>/dev/null || true
    log "unpacking $(basename "$deb")"
    mkdir -p "$KROOT.tmp"
    dpkg -x "$deb" "$KROOT.tmp"
    # Debian 12 kernels keep modules in /lib/modules (usr-merged ones in /usr/lib).
    if [ ! -d "$KROOT.tmp/lib/modules/$KVER" ] && [ -d "$KROOT.tmp/usr/lib/modules/$KVER" ]; then
        mkdir -p "$KROOT.tmp/lib/modules"
        mv "$KROOT.tmp/usr/lib/modules/$KVER" "$KROOT.tmp/lib/modules/"
    fi
    [ -f "$KROOT.tmp/boot/vmlinuz-$KVER" ] || die "no vmlinuz-$KVER in $deb"
    depmod -b "$KROOT.tmp" "$KVER"
    rm -rf "$KROOT"; mv "$KROOT.tmp" "$KROOT"
    touch "$KROOT/.done"
    # The .deb is only needed to unpack again: keep one, drop older ones.
    { ls -1 "$LAB_CACHE/debs/"*.deb 2>/dev/null | grep -v "/${KPKG}_" | xargs -r rm -f; } || true
fi
MODDIR=$KROOT/lib/modules/$KVER
[ -f "$MODDIR/modules.dep" ] || die "$MODDIR/modules.dep missing"

# ------------------------------------------------------------- initramfs
INITRD=$LAB_CACHE/initramfs-$KVER.cpio.gz
stamp_src=$(cat "$LAB_DIR/setup.sh" "$LAB_DIR/init.sh" "$BUSYBOX" "$MODDIR/modules.dep" | md5sum | cut -d' ' -f1)
if [ ! -f "$INITRD" ] || [ "$(cat "$INITRD.stamp" 2>/dev/null)" != "$stamp_src" ]; then
    log "building $(basename "$INITRD")"
    work=$(mktemp -d "$LAB_CACHE/initramfs.XXXXXX")
    trap 'rm -rf "$work"' EXIT
    mkdir -p "$work"/{bin,dev,proc,sys,mods,lower,rw,newroot}
    cp "$BUSYBOX" "$work/bin/busybox"
    cp "$LAB_DIR/init.sh" "$work/init"
    chmod 755 "$work/init" "$work/bin/busybox"
    : > "$work/mods/order"
    # insmod order (dependencies first), without duplicates.
    for m in $(modprobe -d "$KROOT" -S "$KVER" -a --show-depends virtio_pci 9pnet_virtio 9p overlay \
                 | awk '$1 == "insmod" {print $2}' | awk '!seen[$0]++'); do
        case "$m" in
            *.ko)    cp "$m" "$work/mods/" ;;
            *.ko.xz) xz -dc "$m" > "$work/mods/$(basename "${m%.xz}")"; m=${m%.xz} ;;
            *.ko.zst) zstd -qdc "$m" > "$work/mods/$(basename "${m%.zst}")"; m=${m%.zst} ;;
            *) die "unexpected module file $m" ;;
        esac
        basename "$m" >> "$work/mods/order"
    done
    ( cd "$work" && find . -mindepth 1 | LC_ALL=C sort | cpio -o -H newc --quiet ) | gzip -1 > "$INITRD.tmp"
    mv "$INITRD.tmp" "$INITRD"
    echo "$stamp_src" > "$INITRD.stamp"
    rm -rf "$work"; trap - EXIT
fi

# Where the rest of the lab finds things.
cat > "$LAB_CACHE/kernel.env.tmp" <<ENV
LAB_KVER=$KVER
LAB_KERNEL=$KROOT/boot/vmlinuz-$KVER
LAB_MODDIR=$MODDIR
LAB_INITRD=$INITRD
ENV
mv "$LAB_CACHE/kernel.env.tmp" "$LAB_CACHE/kernel.env"
log "ready: kernel $KVER, initramfs $(du -h "$INITRD" | cut -f1)"
