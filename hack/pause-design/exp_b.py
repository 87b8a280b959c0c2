"""Candidate (b): the RAM file on XFS with reflinks; the pause is stop,
(fsync), FICLONE of the RAM file, cont. Usage: exp_b.py INUSE_MIB SAMPLES DIR"""
import sys, time, fcntl; sys.path.insert(0, "."); from pd import *
FICLONE = 0x40049409
inuse, n, d = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3]
mem = inuse + (256 if inuse <= 1024 else 768)
ram = f"{d}/pd-b.ram"
vm = VM("b", mem, ram, memw=f"{inuse},{inuse},8")
try:
    t = time.time(); vm.wait_console("FILLED"); print(f"xfs ram mem={mem}MiB inuse={inuse}: filled in {time.time()-t:.1f}s", flush=True)
    time.sleep(3); c = vm.console_at(); time.sleep(3); print("write rate, ram on xfs, steady:", statistics.median(vm.rates(c)), flush=True)
    def clone(presync):
        fd = os.open(ram, os.O_RDWR); dst = f"{d}/pd-b-clone.ram"
        t0 = time.time()
        if presync: os.fsync(fd)
        t1 = time.time(); c0 = vm.console_at()
        vm.qmp("stop"); t2 = time.time()
        os.fsync(fd); t3 = time.time()
        out = os.open(dst, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        fcntl.ioctl(out, FICLONE, fd); t4 = time.time()
        vm.qmp("cont"); t5 = time.time(); os.close(out); os.close(fd)
        time.sleep(3); c1 = vm.console_at(); r = vm.rates(c0, c1)
        os.remove(dst)
        return dict(presync_ms=(t1-t0)*1e3, pause_ms=(t5-t1)*1e3, fsync_in_pause_ms=(t3-t2)*1e3, ficlone_ms=(t4-t3)*1e3,
                    rate_after_first_s=statistics.median(r[:10]) if r else None, rate_after_med=statistics.median(r) if r else None)
    for presync in (False, True):
        for i in range(n):
            print("clone presync=%s" % presync, clone(presync), flush=True); time.sleep(2)
finally:
    vm.close(); os.remove(ram)
