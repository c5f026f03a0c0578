#!/usr/bin/env bash
# Soft-RoCE VM lab: one-time (idempotent) host setup.
#
#  * installs the Debian packages the lab needs (apt-get, only if missing);
#  * fetches two guest kernels with `apt-get download`: "default" (the package
#    linux-image-amd64 depends on, 6.1 on Debian 12) and "current" (the newest
#    linux-image-6.12.*+deb12-amd64 of bookworm-security), unpacks each with
#    `dpkg -x` into cache/kernel/<version>/ and runs `depmod -b` there (the
#    package ships no modules.dep);
#  * builds a small busybox initramfs per kernel (cache/initramfs-<version>.cpio.gz)
#    holding init.sh and the modules needed to mount the host root over 9p;
#  * writes cache/kernel-<name>.env (and cache/kernel.env = default), which
#    lib.sh loads according to LAB_GUEST_KERNEL.
#
# Nothing is installed into the host's /lib/modules or /boot.
# Re-running with everything cached only checks and takes a second or two.
#
# Environment:
#   LAB_CACHE      cache folder (default: <this dir>/cache)
#   LAB_KERNELS    which kernels to prepare (default: "default current")
#   LAB_KPKG       package of the default kernel (default: what linux-image-amd64
#                  depends on; if apt knows none, the newest other one cached)
#   LAB_KPKG_CURRENT     package of the current kernel (default: the newest
#                  package matching LAB_KPKG_CURRENT_RE that apt can fetch)
#   LAB_KPKG_CURRENT_RE  default '^linux-image-6\.12\.[0-9]+\+deb12-amd64$'
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

# ---------------------------------------------------------- guest kernels
# Two kernels, each unpacked once into cache/kernel/<version>/ with its own
# initramfs and env file (cache/kernel-<name>.env):
#   default  what linux-image-amd64 depends on (Debian 12: 6.1), or LAB_KPKG;
#   current  the newest package the apt index has whose name matches
#            LAB_KPKG_CURRENT_RE (Debian 12's bookworm-security 6.12), or
#            LAB_KPKG_CURRENT. On >= 6.5 a page-cache file mapping cannot be
#            registered for remote write: the lab runs its storage tests there.
# A test picks one with LAB_GUEST_KERNEL=default|current (lib.sh).
LAB_KERNELS=${LAB_KERNELS:-default current}
LAB_KPKG_CURRENT_RE=${LAB_KPKG_CURRENT_RE:-'^linux-image-6\.12\.[0-9]+\+deb12-amd64$'}

kpkg_default_from_apt() {
    apt-cache depends linux-image-amd64 2>/dev/null \
        | awk '/Depends: linux-image-[0-9]/ {print $2; exit}'
}
# The newest matching package that apt can fetch (a candidate version).
kpkg_current_from_apt() {
    local p policy
    for p in $(apt-cache search --names-only "$LAB_KPKG_CURRENT_RE" 2>/dev/null | awk '{print $1}' \
                 | grep -E "$LAB_KPKG_CURRENT_RE" | sort -rV); do
        # (not piped into grep -q: under pipefail its early exit fails the pipe)
        policy=$(apt-cache policy "$p" 2>/dev/null) || continue
        grep -Eq '^[[:space:]]*Candidate:[[:space:]]*[^([:space:]]' <<< "$policy" && { echo "$p"; return 0; }
    done
    return 1
}
# The newest unpacked kernel in the cache whose package name matches <re>
# (or, with -v, does not).
kpkg_cached() {
    local d inv=; [ "$1" = -v ] && { inv=-v; shift; }
    for d in $(ls -1d "$LAB_CACHE"/kernel/*/.done 2>/dev/null | sort -rV); do
        d=linux-image-$(basename "$(dirname "$d")")
        grep -Eq $inv -- "$1" <<< "$d" && { echo "$d"; return 0; }
    done
    return 1
}
# pick_kpkg <name>: sets KPKG to the package of kernel <name>. Runs
# apt-get update only when neither the package lists nor the cache know one.
pick_kpkg() {
    local name=$1 from_apt cached
    case "$name" in
        default) KPKG=${LAB_KPKG:-}; from_apt=kpkg_default_from_apt; cached=(-v "$LAB_KPKG_CURRENT_RE") ;;
        current) KPKG=${LAB_KPKG_CURRENT:-}; from_apt=kpkg_current_from_apt; cached=("$LAB_KPKG_CURRENT_RE") ;;
        *) die "unknown kernel name $name in LAB_KERNELS (default, current)" ;;
    esac
    [ -n "$KPKG" ] && return 0
    KPKG=$($from_apt || true)
    [ -n "$KPKG" ] && return 0
    KPKG=$(kpkg_cached "${cached[@]}" || true)
    if [ -n "$KPKG" ]; then
        log "apt knows no package for kernel '$name'; using cached $KPKG"
        return 0
    fi
    [ "${LAB_NO_APT:-0}" = 1 ] || { apt_update_once; KPKG=$($from_apt || true); }
    [ -n "$KPKG" ] || die "cannot tell which package kernel '$name' is (apt-cache found none)"
}

# prepare_kernel <name> <package>: unpack (cached), depmod, initramfs,
# cache/kernel-<name>.env.
prepare_kernel() {
    local name=$1 KPKG=$2 KVER KROOT deb MODDIR INITRD stamp_src m
    KVER=${KPKG#linux-image-}
    KROOT=$LAB_CACHE/kernel/$KVER
    if [ ! -e "$KROOT/.done" ]; then
        log "fetching $KPKG"
        rm -rf "$KROOT" "$KROOT.tmp" "$LAB_CACHE/debs.tmp"
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
    fi
    MODDIR=$KROOT/lib/modules/$KVER
    [ -f "$MODDIR/modules.dep" ] || die "$MODDIR/modules.dep missing"
    # What the guests load after boot (guest-init.sh, guest-lib.sh) comes from
    # the unpacked modules: check this kernel has them (as modules or built in).
    for m in rdma_rxe ib_uverbs rdma_ucm virtio_net virtio_blk dummy loop ext4; do
        modprobe -d "$KROOT" -S "$KVER" --show-depends "$m" > /dev/null 2>&1 \
            || die "kernel $KVER has no module $m"
    done

    # ------------------------------------------------------- initramfs
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
    cat > "$LAB_CACHE/kernel-$name.env.tmp" <<ENV
LAB_KVER=$KVER
LAB_KERNEL=$KROOT/boot/vmlinuz-$KVER
LAB_MODDIR=$MODDIR
LAB_INITRD=$INITRD
ENV
    mv "$LAB_CACHE/kernel-$name.env.tmp" "$LAB_CACHE/kernel-$name.env"
    [ "$name" = default ] && cp "$LAB_CACHE/kernel-$name.env" "$LAB_CACHE/kernel.env"   # older callers
    log "ready: kernel '$name' $KVER, initramfs $(du -h "$INITRD" | cut -f1)"
}

keep=()
for name in $LAB_KERNELS; do
    pick_kpkg "$name"
    prepare_kernel "$name" "$KPKG"
    keep+=("${KPKG#linux-image-}")
done
# The .debs are only needed to unpack again: keep those of the kernels in
# use. Superseded "current" kernels (a newer security release came out) go.
for f in "$LAB_CACHE"/debs/*.deb; do
    [ -e "$f" ] || continue
    k=$(basename "$f"); k=${k%%_*}; k=${k#linux-image-}
    [[ " ${keep[*]} " == *" $k "* ]] || rm -f "$f"
done
for d in "$LAB_CACHE"/kernel/*/; do
    [ -d "$d" ] || continue
    k=$(basename "$d")
    [[ " ${keep[*]} " == *" $k "* ]] && continue
    grep -Eq -- "$LAB_KPKG_CURRENT_RE" <<< "linux-image-$k" || continue
    log "removing superseded kernel $k"
    rm -rf "$d" "$LAB_CACHE/initramfs-$k.cpio.gz" "$LAB_CACHE/initramfs-$k.cpio.gz.stamp"
done
