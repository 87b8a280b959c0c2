#!/bin/sh
# RAM 4 GiB in use, the guest writing 256 MiB of it: does the pause follow RAM or the writes?
cd "$(dirname "$0")"
python3 exp_c.py 4096 3 256 > results/c-4096-w256.txt 2>&1
python3 exp_a.py 7 4096 256 0,3 0 > results/a-q7-4096-w256.txt 2>&1
python3 exp_c.py 256 3 256 > results/c-256-w256-again.txt 2>&1
echo done > results/rest4.done
