#!/bin/sh
cd "$(dirname "$0")"
python3 exp_2.py 3 > results/2-q10-3clones.txt 2>&1
python3 exp_pop.py 7 4096 > results/pop-q7.txt 2>&1
python3 exp_pop.py 10 4096 > results/pop-q10.txt 2>&1
echo done > results/rest2.done
