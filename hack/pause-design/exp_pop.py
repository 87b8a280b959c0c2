"""Does background-snapshot populate a shared tmpfs RAM file's holes (RAM
the guest never touched)? A guest of MEM MiB with 256 MiB in use.
Usage: exp_pop.py QEMU(7|10) MEM_MIB"""
import sys, time; sys.path.insert(0, "."); from pd import *
qv, mem = sys.argv[1], int(sys.argv[2]); q = Q10 if qv == "10" else Q7
ram = f"/dev/shm/pd-pop{qv}.ram"
def du(p): return os.stat(p).st_blocks * 512 >> 20
vm = VM(f"pop{qv}", mem, ram, memw="256,0,8", qemu=q)
try:
    vm.wait_console("FILLED"); time.sleep(2)
    print(f"qemu{qv} guest {mem} MiB, 256 MiB in use: ram file allocated before {du(ram)} MiB", flush=True)
    vm.qmp("migrate-set-parameters", **{"max-bandwidth": 1 << 40})
    vm.qmp("migrate-set-capabilities", capabilities=[{"capability": "background-snapshot", "state": True}])
    e0 = len(vm.events); t0 = time.time(); vm.qmp("migrate", uri="exec:cat > /dev/shm/pd-pop.img"); st = vm.wait_migration(); t1 = time.time()
    time.sleep(0.3); evs = vm.events[e0:]
    stop = [ev_ts(e) for e in evs if e["event"] == "STOP"]; res = [ev_ts(e) for e in evs if e["event"] == "RESUME"]
    print(f"bg: {st['status']} pause {(res[0]-stop[0])*1e3:.1f} ms, stop {(stop[0]-t0)*1e3:.0f} ms after migrate, complete {(t1-t0)*1e3:.0f} ms, image {os.path.getsize('/dev/shm/pd-pop.img')>>20} MiB; ram file allocated after {du(ram)} MiB", flush=True)
finally:
    vm.close(); os.remove(ram)
    if os.path.exists("/dev/shm/pd-pop.img"): os.remove("/dev/shm/pd-pop.img")
