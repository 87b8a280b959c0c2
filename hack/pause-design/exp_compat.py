"""Item 3: does a snapshot made by QEMU 7.2 (x-ignore-shared device state
plus the shared RAM file, as cryo stores it) restore and run on QEMU 10.0
with the same versioned machine?"""
import sys, time; sys.path.insert(0, "."); from pd import *
ram, copy, dev = "/dev/shm/pd-cp-src.ram", "/dev/shm/pd-cp-snap.ram", "/dev/shm/pd-cp.dev"
src = VM("cpsrc", 512, ram, memw="128,16,8", qemu=Q7, machine="pc-q35-7.2"); dst = None
try:
    src.wait_console("FILLED"); time.sleep(2)
    src.qmp("migrate-set-capabilities", capabilities=[{"capability": "x-ignore-shared", "state": True}])
    src.qmp("stop"); src.qmp("migrate", uri=f"exec:cat > {dev}"); src.wait_migration()
    shutil.copyfile(ram, copy); h0 = sha(copy); src.close(); src = None
    dst = VM("cpdst", 512, copy, qemu=Q10, incoming="defer", machine="pc-q35-7.2")
    dst.qmp("migrate-set-capabilities", capabilities=[{"capability": "x-ignore-shared", "state": True}])
    dst.qmp("migrate-incoming", uri=f"exec:cat {dev}")
    for _ in range(300):
        s = dst.qmp("query-status")["status"]
        if s != "inmigrate": break
        time.sleep(0.1)
    st = dst.qmp("query-migrate"); c0 = dst.console_at(); dst.qmp("cont"); time.sleep(3)
    r = dst.rates(c0)
    print(f"7.2 snapshot on 10.0 (pc-q35-7.2): incoming {st.get('status')}, status {s}; guest running after cont: {len(r)} samples, median {statistics.median(r) if r else None} pages/s", flush=True)
finally:
    if src: src.close()
    if dst: dst.close()
    for f in [ram, copy, dev]:
        if os.path.exists(f): os.remove(f)
