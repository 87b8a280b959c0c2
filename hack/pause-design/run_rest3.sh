#!/bin/sh
cd "$(dirname "$0")"
for i in 1 2; do
python3 exp_rate.py 1024 >> results/rate-tmpfs-vs-pagefs.txt 2>&1
python3 exp_c.py 1024 1 2>&1 | grep -E 'steady|memory' >> results/rate-tmpfs-vs-pagefs.txt
done
python3 exp_c.py 4096 3 > results/c-4096.txt 2>&1
echo done > results/rest3.done
