"""Candidate (a): today's pause vs QEMU's background-snapshot, with memw
writing (or idle), and a restore check of a background snapshot taken while
the guest writes. Usage: exp_a.py QEMU(7|10) INUSE_MIB WRITE_MIB SAMPLES VERIFY(0|1)"""
import sys, time; sys.path.insert(0, "."); from pd import *
qv, inuse, wr, n, verify = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), sys.argv[4], sys.argv[5] == "1"
nt, n = (int(x) for x in (n.split(",") if "," in n else (n, n)))
q = Q10 if qv == "10" else Q7
mem = inuse + (256 if inuse <= 1024 else 768)
ram = f"/dev/shm/pd-a{qv}.ram"
vm = VM(f"a{qv}", mem, ram, memw=f"{inuse},{wr},8", qemu=q)
t = time.time()
try: vm.wait_console("FILLED")
except Exception: vm.close(); os.remove(ram); raise
print(f"qemu{qv} mem={mem}MiB inuse={inuse} write={wr}: filled in {time.time()-t:.1f}s", flush=True)
time.sleep(2)
vm.qmp("migrate-set-parameters", **{"max-bandwidth": 1 << 40})

def caps(ignore, bg):
    vm.qmp("migrate-set-capabilities", capabilities=[{"capability": "x-ignore-shared", "state": ignore}, {"capability": "background-snapshot", "state": bg}])

def today():
    caps(True, False)
    t0 = time.time(); vm.qmp("stop")
    vm.qmp("migrate", uri="exec:cat > /dev/shm/pd-devstate")
    st = vm.wait_migration(poll=0.002); t1 = time.time()
    subprocess.run(["cp", "--sparse=always", ram, "/dev/shm/pd-ckpt.ram"], check=True); t2 = time.time()
    vm.qmp("cont"); t3 = time.time()
    ds = os.path.getsize("/dev/shm/pd-devstate"); os.remove("/dev/shm/pd-ckpt.ram")
    return dict(pause_ms=(t3-t0)*1e3, devstate_ms=(t1-t0)*1e3, copy_ms=(t2-t1)*1e3, devstate_kib=ds>>10, status=st["status"])

def bg(img="/dev/shm/pd-bg.img", prestopped=False):
    caps(False, True)
    e0 = len(vm.events); c0 = vm.console_at(); t0 = time.time()
    vm.qmp("migrate", uri=f"exec:cat > {img}")
    if prestopped:
        # QEMU 10 leaves a VM stopped before the snapshot stopped: once RAM
        # pages stream (write tracking is on), let the guest run and write.
        while not os.path.exists(img) or os.path.getsize(img) < (16 << 20): time.sleep(0.001)
        if vm.qmp("query-status")["status"] != "running": vm.qmp("cont"); print("verify: cont by harness", flush=True)
    st = vm.wait_migration(poll=0.002); t1 = time.time(); c1 = vm.console_at()
    time.sleep(0.5)
    evs = vm.events[e0:]
    stop = [ev_ts(e) for e in evs if e["event"] == "STOP"]; res = [ev_ts(e) for e in evs if e["event"] == "RESUME"]
    pause = (res[0]-stop[0])*1e3 if stop and res else None
    during = vm.rates(c0, c1); before = vm.rates(max(0, c0-400), c0)
    r = dict(status=st["status"], err=st.get("error-desc"), pause_ms=pause, downtime_ms=st.get("downtime"), complete_ms=(t1-t0)*1e3,
             qemu_total_ms=st.get("total-time"), img_mib=os.path.getsize(img)>>20 if os.path.exists(img) else None,
             stop_after_ms=(stop[0]-t0)*1e3 if stop else None,
             rate_before=statistics.median(before) if before else None,
             rate_during_med=statistics.median(during) if during else None, rate_during_min=min(during) if during else None, samples_during=len(during))
    return r

try:
    for i in range(nt):
        print("today", today(), flush=True); time.sleep(2)
    for i in range(n):
        r = bg(); print("bg", r, flush=True); time.sleep(2)
        if r["status"] != "completed": break
    if verify:
        vm.qmp("stop"); h0 = sha(ram); c0 = vm.console_at()
        r = bg(img="/dev/shm/pd-verify.img", prestopped=True)
        time.sleep(1); vm.qmp("stop"); h1 = sha(ram); c1 = vm.console_at()
        print("verify bg", r, "guest wrote after pause:", len(vm.rates(c0, c1)), "samples; src changed since pause:", h0 != h1, flush=True)
        vm.close(); vm = None
        dram = f"/dev/shm/pd-a{qv}-dst.ram"
        d = VM(f"a{qv}dst", mem, dram, qemu=q, incoming="exec:cat /dev/shm/pd-verify.img")
        for _ in range(600):
            s = d.qmp("query-status")["status"]
            if s != "inmigrate": break
            time.sleep(0.1)
        st = d.qmp("query-migrate"); h2 = sha(dram)
        print(f"verify restore: dest status={s} migrate={st.get('status')} ram at pause == restored ram: {h0 == h2} ({h0[:12]} vs {h2[:12]})", flush=True)
        d.close(); os.remove(dram); os.remove("/dev/shm/pd-verify.img")
finally:
    if vm: vm.close()
    for f in [ram, "/dev/shm/pd-bg.img", "/dev/shm/pd-devstate"]:
        if os.path.exists(f): os.remove(f)
