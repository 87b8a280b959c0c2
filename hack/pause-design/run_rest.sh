#!/bin/sh
# The remaining measurements, one after another under the integration lock.
cd "$(dirname "$0")"
for v in 7 10; do for m in 256 1024; do python3 exp_a.py $v $m 0 0,3 0 > results/a-q$v-$m-idle.txt 2>&1; done; done
python3 exp_c.py 256 3 > results/c-256.txt 2>&1
python3 exp_c.py 1024 3 > results/c-1024.txt 2>&1
python3 exp_b.py 1024 2 /mnt/pd-xfs > results/b-xfs-1024.txt 2>&1
python3 exp_b.py 4096 2 /mnt/pd-xfs > results/b-xfs-4096.txt 2>&1
python3 exp_2.py 3 > results/2-q10-3clones.txt 2>&1
echo done > results/rest.done
