#!/bin/sh
# (c) at 4 GiB written with the node's dirty limits raised for the run only
# (vm.dirty_background_ratio 10 -> 50, vm.dirty_ratio 20 -> 80), restored on exit.
cd "$(dirname "$0")"
bg=$(sysctl -n vm.dirty_background_ratio); r=$(sysctl -n vm.dirty_ratio)
trap 'sysctl -q vm.dirty_ratio=$r vm.dirty_background_ratio=$bg' EXIT INT TERM
sysctl -q vm.dirty_ratio=80 vm.dirty_background_ratio=50
python3 exp_c.py 4096 3 > results/c-4096-dirty50-80.txt 2>&1
