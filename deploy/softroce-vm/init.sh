#!/bin/busybox sh
# Stage 1 of a lab guest (PID 1 in the busybox initramfs built by setup.sh).
# Loads the virtio/9p/overlay modules, mounts the host's / read-only over 9p
# (tag hostroot) with a tmpfs overlay on top, mounts the read-write run share
# (tag labshare) at the same path as on the host, points /lib/modules/<ver> at
# the unpacked guest modules and switch_roots into stage 2 (guest-init.sh,
# run from the host root by bash).
# Kernel command line: lab.share=<path> lab.stage2=<path> lab.moddir=<path>
/bin/busybox --install -s /bin
export PATH=/bin
mount -t proc proc /proc
mount -t sysfs sysfs /sys
mount -t devtmpfs devtmpfs /dev
fail() { echo "lab-init: $*" > /dev/console; sleep 1; echo o > /proc/sysrq-trigger; sleep 10; }
for m in $(cat /mods/order); do insmod "/mods/$m" || fail "insmod $m"; done
for arg in $(cat /proc/cmdline); do
    case "$arg" in
        lab.share=*)  SHARE=${arg#lab.share=} ;;
        lab.stage2=*) STAGE2=${arg#lab.stage2=} ;;
        lab.moddir=*) MODDIR=${arg#lab.moddir=} ;;
    esac
done
[ -n "$SHARE" ] && [ -n "$STAGE2" ] && [ -n "$MODDIR" ] || fail "missing lab.* arguments"
mount -t 9p -o trans=virtio,version=9p2000.L,ro,msize=262144,cache=loose hostroot /lower \
    || fail "mount hostroot"
mount -t tmpfs -o mode=755,size=60% tmpfs /rw || fail "mount tmpfs"
mkdir -p /rw/upper /rw/work
mount -t overlay overlay -o lowerdir=/lower,upperdir=/rw/upper,workdir=/rw/work /newroot \
    || fail "mount overlay"
mount -t 9p -o trans=virtio,version=9p2000.L,rw,msize=262144 labshare "/newroot$SHARE" \
    || fail "mount labshare at $SHARE"
# /lib -> usr/lib on Debian 12: make /lib/modules/<ver> the unpacked modules.
KVER=$(uname -r)
mkdir -p /newroot/lib/modules
rm -rf "/newroot/lib/modules/$KVER"
ln -s "$MODDIR" "/newroot/lib/modules/$KVER"
mount --move /proc /newroot/proc
mount --move /sys /newroot/sys
mount --move /dev /newroot/dev
exec switch_root /newroot /bin/bash "$STAGE2"
