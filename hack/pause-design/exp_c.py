"""Candidate (c): a booted guest's RAM served by pagefs (a layered file over
zeros, /tmp/pd-pagefsram), as restored RAM is: the guest's write speed
against tmpfs, and the pause (sync, stop, sync, device state, seal, cont).
Usage: exp_c.py INUSE_MIB SAMPLES"""
import sys, time; sys.path.insert(0, "."); from pd import *
inuse, n = int(sys.argv[1]), int(sys.argv[2])
wr = int(sys.argv[3]) if len(sys.argv) > 3 else inuse
mem = inuse + (256 if inuse <= 1024 else 768)
mnt = "/tmp/pd-pagefs"; os.makedirs(mnt, exist_ok=True)
srv = subprocess.Popen(["/tmp/pd-pagefsram", "-dir", mnt, "-mib", str(mem)], stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=open(f"results/c-{inuse}-{wr}.server.log", "w"), text=True)
def cmd(c):
    srv.stdin.write(c + "\n"); srv.stdin.flush(); return srv.stdout.readline().strip()
print(srv.stdout.readline().strip(), flush=True)
vm = None
try:
    t = time.time(); vm = VM("c", mem, f"{mnt}/ram", memw=f"{inuse},{wr},8")
    vm.wait_console("FILLED"); print(f"pagefs ram mem={mem}MiB inuse={inuse} write={wr}: filled in {time.time()-t:.1f}s", flush=True)
    time.sleep(3); c = vm.console_at(); time.sleep(5); print("write rate, ram on pagefs, steady:", statistics.median(vm.rates(c)), flush=True)
    print("vmstat:", [l.strip() for l in open("/proc/vmstat") if l.startswith(("nr_dirty", "nr_writeback "))], flush=True)
    vm.qmp("migrate-set-parameters", **{"max-bandwidth": 1 << 40})
    vm.qmp("migrate-set-capabilities", capabilities=[{"capability": "x-ignore-shared", "state": True}])
    for i in range(n):
        t0 = time.time(); s1 = cmd("sync"); t1 = time.time(); c0 = vm.console_at()
        vm.qmp("stop"); s2 = cmd("sync"); t2 = time.time()
        vm.qmp("migrate", uri="exec:cat > /dev/shm/pd-c-devstate"); vm.wait_migration(poll=0.002); t3 = time.time()
        s3 = cmd("seal"); vm.qmp("cont"); t4 = time.time()
        time.sleep(4); c1 = vm.console_at(); r = vm.rates(c0, c1); cmd("close")
        lay = [f for f in os.listdir("/dev/shm") if f.startswith("pd-layer-")]
        lay_mib = sum(os.stat("/dev/shm/" + f).st_blocks * 512 for f in lay) >> 20
        rss = sum(int(l.split()[1]) for l in open(f"/proc/{vm.p.pid}/smaps_rollup") if l.startswith("Rss:")) >> 10
        print("memory: layer (tmpfs) allocated", lay_mib, "MiB; qemu Rss", rss, "MiB", flush=True)
        print(dict(presync_ms=(t1-t0)*1e3, pause_ms=(t4-t1)*1e3, sync_in_pause_ms=(t2-t1)*1e3, devstate_ms=(t3-t2)*1e3,
                   seal=s3, presync=s1[:40], rate_after_first_s=statistics.median(r[:10]) if r else None,
                   rate_after_med=statistics.median(r) if r else None), flush=True)
        time.sleep(2)
finally:
    if vm: vm.close()
    print(cmd("quit")); srv.wait()
    if os.path.exists("/dev/shm/pd-c-devstate"): os.remove("/dev/shm/pd-c-devstate")
