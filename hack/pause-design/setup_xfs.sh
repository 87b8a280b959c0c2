#!/bin/sh -e
# An XFS (reflink=1) loop file system for exp_b.py; teardown: umount /mnt/pd-xfs; losetup -d; rm image.
truncate -s 16G /var/tmp/pd-xfs.img
mkfs.xfs -q -f -m reflink=1 /var/tmp/pd-xfs.img
mkdir -p /mnt/pd-xfs
mount -o loop /var/tmp/pd-xfs.img /mnt/pd-xfs
